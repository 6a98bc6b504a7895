//! The tuple profiles of bursty tracing (`--record values,targets`):
//! `values.pb.gz` and `targets.pb.gz` at the end of a session (every
//! process with tuples of the kind, label `pid`; none when no process
//! had any), each process's error against its exact copies when it had
//! them (logged), and the indirect calls of its call-target profile for
//! the edge profiles (`edges*.fdata`, [`crate::export::fdata::indirect_calls`]);
//! per interval `values-<time>.pb.gz` and `targets-<time>.pb.gz` of the
//! tuples in it (published on `/debug/pprof/values` and
//! `/debug/pprof/targets`, pushed as `APP.values` and `APP.targets`); and
//! for a `/debug/pprof/values?seconds=N` (`targets`) window. An
//! interval's or a window's profile is each process's profile now less
//! its profile when it began ([`TupleMark`], [`super::tuple_window::delta`]).
use std::collections::HashMap;
use std::time::SystemTime;

use tracing::{info, warn};

use super::Session;
use super::tuple_window::{TupleMark, TupleWindow};
use crate::bursts::decode::TupleKind;
use crate::bursts::traced::Traced;
use crate::bursts::tracer::Finished;
use crate::bursts::tuples::{ErrorOptions, Tuples, profile_error};
use crate::export::fdata::Fdata;
use crate::export::tuples::{add_summaries, file_name, tuples_builder};
use burstyd_common::addr::{Avma, FrameAddress, Pid};

/// The kinds of tuple profile, each its own file.
const KINDS: [TupleKind; 2] = [TupleKind::Value, TupleKind::Target];

/// One process's tuples in a profile: its facts and the tuples to export
/// (all, an interval's, a window's).
struct TuplePart<'a> {
    traced: &'a Traced,
    tuples: TupleMark,
}

/// The profile of `kind` of `parts` (gzip'd pprof of `span`; `None` when
/// none has tuples of the kind).
fn build_tuples(
    kind: TupleKind,
    parts: &[TuplePart],
    span: (SystemTime, SystemTime),
    procs: &crate::stacks::table::ProcessTable,
    symbolizer: &mut crate::stacks::symbolize::Symbolizer,
) -> Option<std::io::Result<Vec<u8>>> {
    if !parts.iter().any(|p| p.tuples.has(kind)) {
        return None;
    }
    let reference = parts.iter().any(|p| !p.tuples.exact.is_empty());
    let nanos = |t: SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
    };
    let mut b = tuples_builder(kind, reference);
    b.set_time(nanos(span.0), nanos(span.1) - nanos(span.0));
    for p in parts.iter().filter(|p| p.tuples.has(kind)) {
        let TupleMark { sampled, exact } = &p.tuples;
        add_summaries(&mut b, p.traced, sampled, exact, kind, reference, |addrs| {
            foreign_names(procs, symbolizer, p.traced.pid, addrs)
        });
    }
    Some(crate::export::pprof::encode_gzip(&b.finish()))
}

/// Every process with tuple profiles: traced now, then released.
fn tuple_sources<'a>(
    bursts: &'a crate::bursts::tracers::Bursts,
    released: &'a super::Released,
) -> Vec<(&'a Traced, &'a Tuples)> {
    let live = bursts
        .tracers()
        .iter()
        .filter_map(|t| Some((t.traced(), t.tuples()?)));
    let gone = released
        .finished
        .iter()
        .filter_map(|f| Some((&f.traced, f.tuples.as_ref()?)));
    live.chain(gone).collect()
}

impl Session {
    /// Writes `values.pb.gz` and `targets.pb.gz` of the processes that
    /// had tuples, and logs each one's error against its reference.
    pub(super) fn write_tuple_profiles(&mut self, finished: &[Finished]) {
        let parts: Vec<TuplePart> = finished
            .iter()
            .filter_map(|f| {
                Some(TuplePart {
                    traced: &f.traced,
                    tuples: TupleMark::of(f.tuples.as_ref()?),
                })
            })
            .collect();
        if parts.is_empty() {
            return;
        }
        let output = self.opts.output.clone();
        let span = (self.out.session_start, SystemTime::now());
        for kind in KINDS {
            let (procs, symbolizer) = (&self.pipe.procs, &mut self.symbolizer);
            let Some(gz) = build_tuples(kind, &parts, span, procs, symbolizer) else {
                continue;
            };
            for (traced, t) in finished
                .iter()
                .filter_map(|f| Some((&f.traced, f.tuples.as_ref()?)))
                .filter(|(_, t)| !t.exact.is_empty() && (t.sampled.has(kind) || t.exact.has(kind)))
            {
                let e = profile_error(
                    &t.sampled.summaries(),
                    &t.exact.summaries(),
                    kind,
                    &ErrorOptions::default(),
                );
                let pct =
                    |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{:.2}%", 100.0 * x));
                info!(
                    pid = %traced.pid,
                    "{} profile against its exact copies: error {} over {} invariant tuples of {} sites (sites of 1000 executions or more, tuples of 10% of theirs, sites 40% covered by them); {} over every tuple of the {} sites of 1000 executions or more",
                    if kind == TupleKind::Target { "call-target" } else { "value" },
                    pct(e.error),
                    e.tuples,
                    e.sites,
                    pct(e.total_error),
                    e.total_sites,
                );
            }
            let name = file_name(kind);
            match gz.and_then(|gz| crate::export::write_atomic(&output, name, &gz).map(|p| (p, gz)))
            {
                Ok((p, gz)) => {
                    info!("wrote {}", p.display());
                    crate::service::http::set_tuple_profile(kind, gz);
                }
                Err(e) => warn!("writing {}: {e}", output.join(name).display()),
            }
        }
        let with: Vec<_> = finished
            .iter()
            .filter_map(|f| Some((&f.traced, f.tuples.as_ref()?)))
            .collect();
        self.write_convergence(&with);
        for f in finished {
            let Some(t) = &f.tuples else {
                continue;
            };
            if t.dropped() > 0 {
                info!(
                    pid = %f.traced.pid,
                    "tuple profiles: {} of {} tuple records left out ({} beyond the bound on sites, {} outside the traced functions, {} of an unknown kind)",
                    t.dropped(),
                    t.records,
                    t.sampled.dropped + t.exact.dropped,
                    t.unplaced,
                    t.unknown
                );
            }
        }
    }

    /// Each process's tuple profiles now.
    fn tuple_marks_now(&self) -> HashMap<Pid, TupleMark> {
        tuple_sources(&self.bursts, &self.released)
            .into_iter()
            .map(|(traced, t)| (traced.pid, TupleMark::of(t)))
            .collect()
    }

    /// The profile of `kind` of every process's tuples since `from` (a
    /// process not in it: all it has), of `span`; `None` when there are
    /// none.
    fn tuples_since(
        &mut self,
        kind: TupleKind,
        from: &HashMap<Pid, TupleMark>,
        now: &HashMap<Pid, TupleMark>,
        span: (SystemTime, SystemTime),
    ) -> Option<std::io::Result<Vec<u8>>> {
        let parts: Vec<TuplePart> = tuple_sources(&self.bursts, &self.released)
            .into_iter()
            .filter_map(|(traced, _)| {
                let tuples = now.get(&traced.pid)?.since(from.get(&traced.pid));
                Some(TuplePart { traced, tuples })
            })
            .collect();
        build_tuples(kind, &parts, span, &self.pipe.procs, &mut self.symbolizer)
    }

    /// The indirect calls each process's call-target profile gained in
    /// the interval (since its tuple marks), per module, named as the
    /// interval's edge files name it (the file name of the library or of
    /// the executable): they go with the interval's branches.
    pub(super) fn interval_indirect_calls(&self) -> Vec<(String, Fdata)> {
        let mut out = Vec::new();
        for (traced, t) in tuple_sources(&self.bursts, &self.released) {
            if !t.sampled.has(TupleKind::Target) {
                continue;
            }
            let now = t.sampled.summaries();
            let since = match self.tuple_marks.get(&traced.pid) {
                Some(m) => super::tuple_window::delta(&now, &m.sampled),
                None => now,
            };
            for m in &traced.modules {
                let (calls, _) = crate::export::fdata::indirect_calls(traced, m, &since);
                if !calls.is_empty() {
                    out.push((m.name().to_owned(), calls));
                }
            }
        }
        out
    }

    /// Every interval: the tuple profiles of the tuples made in it, as
    /// `values-<time>.pb.gz` and `targets-<time>.pb.gz` (none of a kind
    /// without its tuples), published on `/debug/pprof/values` and
    /// `/debug/pprof/targets` and pushed as `APP.values`, `APP.targets`.
    pub(super) fn write_interval_tuples(&mut self, start: SystemTime, end: SystemTime) {
        let now = self.tuple_marks_now();
        let marks = std::mem::replace(&mut self.tuple_marks, now.clone());
        let ts = super::files::timestamp(end);
        for kind in KINDS {
            let bytes = match self.tuples_since(kind, &marks, &now, (start, end)) {
                None => continue,
                Some(Ok(b)) => b,
                Some(Err(e)) => {
                    warn!("encoding the interval's {}: {e}", file_name(kind));
                    continue;
                }
            };
            let name = format!("{}-{ts}.pb.gz", file_name(kind).trim_end_matches(".pb.gz"));
            let output = &self.opts.output;
            match crate::export::write_atomic(output, &name, &bytes) {
                Ok(p) => info!("wrote {}", p.display()),
                Err(e) => warn!(
                    "cannot write the interval tuple profile {}: {e}",
                    output.join(&name).display()
                ),
            }
            if let Some(p) = &self.svc.pusher {
                let family = match kind {
                    TupleKind::Target => crate::service::push::Family::Targets,
                    _ => crate::service::push::Family::Values,
                };
                super::intervals::push_own(p, &bytes, start, end, &self.out.meta, family);
            }
            crate::service::http::set_tuple_profile(kind, bytes);
        }
    }

    /// `/debug/pprof/values?seconds=N` (`targets`): from now, the tuple
    /// profile of `kind` of every process traced in bursts (503 while the
    /// first is being attached, 404 when none is, or when none made
    /// tuples of the kind in the window).
    pub(super) fn open_tuple_window(
        &mut self,
        kind: TupleKind,
        d: std::time::Duration,
        reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
    ) {
        if !self.bursts.active() {
            let _ = reply.send(Err(self.nothing_traced("in bursts", "")));
            return;
        }
        self.on_burst_tick();
        self.tuple_windows.push(TupleWindow {
            kind,
            start: SystemTime::now(),
            end: tokio::time::Instant::now() + d,
            before: self.tuple_marks_now(),
            reply,
        });
    }

    /// Answers the tuple windows whose time is up: each process's tuple
    /// profiles now less when the window opened.
    pub(super) fn finish_tuple_windows(&mut self) {
        let done = self.take_due(|s| &mut s.tuple_windows, |w| w.end);
        if done.is_empty() {
            return;
        }
        let marks = self.tuple_marks_now();
        for w in done {
            let span = (w.start, SystemTime::now());
            let answer = match self.tuples_since(w.kind, &w.before, &marks, span) {
                Some(gz) => gz.map_err(|e| e.to_string()),
                None => Err(format!(
                    "{}no process made {} tuples in the window (trace with --record {}, or a target's record = [\"{}\"])",
                    crate::service::http::NOT_FOUND,
                    if w.kind == TupleKind::Target {
                        "target"
                    } else {
                        "value"
                    },
                    if w.kind == TupleKind::Target {
                        "targets"
                    } else {
                        "values"
                    },
                    if w.kind == TupleKind::Target {
                        "targets"
                    } else {
                        "values"
                    },
                )),
            };
            let _ = w.reply.send(answer);
        }
    }
}

impl Session {
    /// Writes `tuple-convergence.json` (`--sampler-reference`): per
    /// process, the sampled profiles' error against their exact copies
    /// as the sampler's outputs doubled
    /// ([`crate::bursts::tuples::Convergence`]).
    fn write_convergence(&self, with: &[(&crate::bursts::traced::Traced, &Tuples)]) {
        let processes: Vec<_> = with
            .iter()
            .map(|(traced, t)| (traced.pid, t.convergence()))
            .filter(|(_, points)| !points.is_empty())
            .map(|(pid, points)| serde_json::json!({ "pid": pid.0, "points": points }))
            .collect();
        if processes.is_empty() {
            return;
        }
        let c = self
            .opts
            .bursts
            .as_ref()
            .map(|b| b.tuple_config)
            .unwrap_or_default();
        let json = serde_json::json!({
            "sampler": crate::bursts::options::sampler_name(c.sampler),
            "rate": c.weight(),
            "strata": c.strata,
            "processes": processes,
        });
        let text = serde_json::to_vec_pretty(&json).unwrap_or_default();
        match crate::export::write_atomic(&self.opts.output, CONVERGENCE_FILE, &text) {
            Ok(p) => info!("wrote {}", p.display()),
            Err(e) => warn!("writing {CONVERGENCE_FILE}: {e}"),
        }
    }
}

/// The convergence of sampled tuple profiles to their exact copies.
pub(crate) const CONVERGENCE_FILE: &str = "tuple-convergence.json";

/// Each module's indirect calls per process, as the call-target profiles
/// saw them: `(pid, library name or None for the executable, calls)`,
/// for the edge profiles (merged with their branches).
pub(super) fn indirect_calls(finished: &[Finished]) -> Vec<(Pid, Option<String>, Fdata)> {
    let mut out = Vec::new();
    for f in finished {
        let Some(t) = &f.tuples else {
            continue;
        };
        if !t.sampled.has(TupleKind::Target) {
            continue;
        }
        let targets = t.sampled.summaries();
        let mut elsewhere = 0;
        for m in &f.traced.modules {
            let (calls, skipped) = crate::export::fdata::indirect_calls(&f.traced, m, &targets);
            elsewhere += skipped;
            if !calls.is_empty() {
                out.push((
                    f.traced.pid,
                    crate::export::fdata::fdata_module(m, f.execd.is_some()),
                    calls,
                ));
            }
        }
        if elsewhere > 0 {
            info!(
                pid = %f.traced.pid,
                "edge profiles: {} of the call-target profile left out (a target in another module than its call, or in no traced function)",
                crate::words::count(elsewhere, "indirect call target", "indirect call targets")
            );
        }
    }
    out
}

/// The names of addresses of process `pid` outside its traced functions
/// (targets in other modules), as `context.pb.gz` names them: the
/// function that holds each (the outermost of its inlined frames).
fn foreign_names(
    procs: &crate::stacks::table::ProcessTable,
    symbolizer: &mut crate::stacks::symbolize::Symbolizer,
    pid: Pid,
    addrs: Vec<u64>,
) -> HashMap<u64, String> {
    if addrs.is_empty() {
        return HashMap::new();
    }
    let frame = |a: u64| FrameAddress::InstructionPointer(Avma(a));
    let resolved = symbolizer.resolve_users(procs, addrs.iter().map(|&a| (pid, frame(a))));
    addrs
        .into_iter()
        .filter_map(|a| {
            let f = resolved.get(&(pid, frame(a)))?.frames.last()?;
            Some((a, f.function.clone()))
        })
        .collect()
}
