//! The tuple profiles of bursty tracing (`--record values,targets`) at
//! the end of a session: `values.pb.gz` and `targets.pb.gz` (every
//! process with tuples of the kind, label `pid`; none when no process
//! had any), each process's error against its exact copies when it had
//! them (logged), and the indirect calls of its call-target profile for
//! the edge profiles (`edges*.fdata`, [`crate::export::fdata::indirect_calls`]).
//! Not per interval: the profiles are the run's.
use std::collections::HashMap;

use tracing::{info, warn};

use super::Session;
use crate::bursts::decode::TupleKind;
use crate::bursts::tracer::Finished;
use crate::bursts::tuples::{ErrorOptions, Tuples, profile_error};
use crate::export::fdata::Fdata;
use crate::export::tuples::{add_tuples, file_name, tuples_builder};
use burstyd_common::addr::{Avma, FrameAddress, Pid};

impl Session {
    /// Writes `values.pb.gz` and `targets.pb.gz` of the processes that
    /// had tuples, and logs each one's error against its reference.
    pub(super) fn write_tuple_profiles(&mut self, finished: &[Finished]) {
        let with: Vec<_> = finished
            .iter()
            .filter_map(|f| Some((&f.traced, f.tuples.as_ref()?)))
            .collect();
        if with.is_empty() {
            return;
        }
        let reference = with.iter().any(|(_, t)| !t.exact.is_empty());
        let output = self.opts.output.clone();
        let nanos = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64)
        };
        let (start, end) = (
            nanos(self.out.session_start),
            nanos(std::time::SystemTime::now()),
        );
        for kind in [TupleKind::Value, TupleKind::Target] {
            let of_kind: Vec<_> = with
                .iter()
                .filter(|(_, t)| t.sampled.has(kind) || t.exact.has(kind))
                .collect();
            if of_kind.is_empty() {
                continue;
            }
            let mut b = tuples_builder(kind, reference);
            b.set_time(start, end - start);
            for (traced, t) in of_kind {
                let (procs, symbolizer) = (&self.pipe.procs, &mut self.symbolizer);
                add_tuples(&mut b, traced, t, kind, reference, |addrs| {
                    foreign_names(procs, symbolizer, traced.pid, addrs)
                });
                if !t.exact.is_empty() {
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
            }
            let name = file_name(kind);
            let written = crate::export::pprof::encode_gzip(&b.finish())
                .and_then(|gz| crate::export::write_atomic(&output, name, &gz));
            match written {
                Ok(p) => info!("wrote {}", p.display()),
                Err(e) => warn!("writing {}: {e}", output.join(name).display()),
            }
        }
        self.write_convergence(&with);
        for (traced, t) in &with {
            if t.dropped() > 0 {
                info!(
                    pid = %traced.pid,
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
                    (!m.is_exe).then(|| m.name().to_owned()),
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
