//! The path profiles of bursty tracing: at the end (`paths.pb.gz`,
//! `edges.fdata`), per interval (`paths-<time>.pb.gz`, pushed with the
//! interval's profile), and for a `/debug/pprof/paths?seconds=N` window;
//! from the processes traced now and those released.
use std::collections::HashMap;

use tracing::{debug, info, warn};

use super::Session;
use super::path_window::PathWindow;
use super::summary::finished_summary;
use crate::bursts::counts::PathView;
use crate::bursts::tracer::Finished;
use crate::export::fdata::Fdata;
use crate::export::pprof::encode_gzip;
use crate::export::summary::{ProcessSummary, hot_weights};
use crate::sampling::sampler::KernelCounters;
use crate::service::metrics::METRICS;
use burstyd_common::addr::Pid;

impl Session {
    /// A window's answer when no process is traced `how` (`in bursts`,
    /// `in memory mode`): 503 while one is being attached (soon: worth
    /// asking again), else 404 with `hint`.
    pub(super) fn nothing_traced(&self, how: &str, hint: &str) -> String {
        match self.bursts.attaching_now() {
            Some(what) => format!(
                "{}{what}; no process is traced {how} yet",
                crate::service::http::UNAVAILABLE
            ),
            None => format!(
                "{}no process is traced {how} now{hint}",
                crate::service::http::NOT_FOUND
            ),
        }
    }

    /// `paths.pb.gz`, `edges.fdata` (and `edges-<pid>.fdata` with several
    /// processes; with the indirect calls of the call-target profiles) and
    /// each process's summary line; returns each one's summary for
    /// `summary.json`.
    pub(super) fn write_path_profiles(
        &mut self,
        finished: Vec<Finished>,
        counters: &KernelCounters,
    ) -> Vec<ProcessSummary> {
        if finished.is_empty() {
            return Vec::new();
        }
        let output = self.opts.output.clone();
        let tsc_hz = self.bursts.tsc_hz();
        let empty = HashMap::new();
        let parts: Vec<PathPart> = finished
            .iter()
            .map(|f| PathPart {
                traced: &f.traced,
                view: f.counts.all(),
                leaf: f.leaf(&self.pipe.leaf_weights).unwrap_or(&empty),
                execd: f.execd.is_some(),
            })
            .collect();
        let span = (self.out.session_start, std::time::SystemTime::now());
        let (paths, mut fdatas) = build_paths(
            &self.opts.event.name,
            tsc_hz,
            span,
            &parts,
            &self.pipe.procs,
            &mut self.symbolizer,
        );
        drop(parts);
        // The indirect calls the call-target profiles saw go with each
        // module's branches.
        for (pid, lib, calls) in super::tuple_profiles::indirect_calls(&finished) {
            match fdatas.iter_mut().find(|f| f.0 == pid && f.1 == lib) {
                Some(f) => f.2.merge(&calls),
                None => fdatas.push((pid, lib, calls)),
            }
        }
        let mut summaries = Vec::new();
        for f in &finished {
            let leaf = &self.pipe.leaf_weights;
            summaries.push(finished_summary(f, &self.released.attached, leaf, &empty));
        }
        for (
            Finished {
                traced,
                counts,
                stats,
                ..
            },
            summary,
        ) in finished.into_iter().zip(&summaries)
        {
            let pid = traced.pid;
            let c = counts.contexts();
            info!(
                %pid,
                "path contexts: {} of {} bursts began with their stack sample; {} of {} paths in a context up to the thread's root; {} context nodes ({} KiB){}{}",
                counts.joined,
                counts.joined + counts.unjoined,
                counts.rooted_paths,
                counts.paths,
                c.len(),
                c.bytes() / 1024,
                if c.overflow > 0 { format!(", {} contexts cut short (tree full)", c.overflow) } else { String::new() },
                if counts.dropped > 0 { format!(", {} paths dropped (too many distinct)", counts.dropped) } else { String::new() },
            );
            let stats = match stats {
                Ok(s) => s,
                Err(e) => {
                    warn!(%pid, "detaching: {e:#}");
                    continue;
                }
            };
            self.released.totals.add(&stats);
            super::summary::set_burst_metrics(&self.released.totals);
            let declined = counters
                .declined
                .reasons()
                .iter()
                .map(|(r, n)| format!("{} {n}", r.replace('_', " ")))
                .collect::<Vec<_>>()
                .join(", ");
            info!(
                %pid,
                "bursts: {} taken, {} truncated, {} declined by the handler (busy {}, PC not rewritten {}, --burst 0 {}, daemon behind {}), {} reaped; {} signals sent, {} overflows during a burst, signals not sent: {declined}; link-map changes {} signalled, {} not; functions rewritten {}, skipped {}; {} complete paths recorded (and {} partial ones left out), records lost: {}, bad records: {}",
                stats.bursts,
                stats.bursts_truncated,
                stats.declined(),
                stats.declined_busy,
                stats.declined_pc,
                stats.declined_budget,
                stats.declined_behind,
                stats.reaped,
                counters.burst_signals,
                counters.burst_busy,
                counters.link_signalled,
                counters.link_unsignalled,
                stats.functions_rewritten,
                stats.functions_skipped,
                stats.paths,
                stats.partial_paths,
                stats.records_lost,
                stats.bad_records
            );
            let hot = &summary.hot;
            for (c, w) in METRICS.hot_weight.iter().zip(hot_weights(hot)) {
                c.add(w);
            }
            info!(%pid, "{}", hot.describe(5));
            debug!(
                %pid,
                "burst records: {} read, {} malformed or with a path number out of range",
                stats.records,
                stats.bad_records
            );
        }
        let _ = std::fs::create_dir_all(&output);
        // edges.fdata is for one binary: the first process's executable;
        // each library's is edges-<library>.fdata; with several processes
        // each also gets edges-<pid>.fdata (edges-<pid>-<library>.fdata).
        let first = fdatas.first().map(|f| f.0);
        let several = fdatas.iter().any(|f| Some(f.0) != first);
        for (pid, lib, fdata) in &fdatas {
            let mut names = Vec::new();
            if Some(*pid) == first {
                names.push(match lib {
                    None => "edges.fdata".to_string(),
                    Some(l) => format!("edges-{l}.fdata"),
                });
            }
            if several {
                names.push(match lib {
                    None => format!("edges-{pid}.fdata"),
                    Some(l) => format!("edges-{pid}-{l}.fdata"),
                });
            }
            // An edge profile without a branch is not written: an empty
            // file would look like a profile (no record reached the
            // module's clones).
            for name in names.into_iter().filter(|_| !fdata.is_empty()) {
                if let Err(e) = crate::export::write_atomic(&output, &name, fdata.text().as_bytes())
                {
                    warn!("writing {}: {e}", output.join(name).display());
                }
            }
        }
        let path = output.join("paths.pb.gz");
        match paths {
            Ok(p) => match crate::export::write_atomic(&output, "paths.pb.gz", &p) {
                Ok(_) => {
                    info!("wrote {}", path.display());
                    crate::service::http::set_paths_profile(p);
                }
                Err(e) => warn!("writing {}: {e}", path.display()),
            },
            Err(e) => warn!("path profile: {e:#}"),
        }
        summaries
    }
}

/// How many released processes' counts the session keeps for its
/// `paths.pb.gz` once the interval files have them.
const MAX_RELEASED: usize = 64;

/// Where a process's counts are: traced now, or released.
#[derive(Clone, Copy)]
enum Source {
    Live(usize),
    Released(usize),
}

/// The traced facts and counts of `src`.
fn source<'a>(
    bursts: &'a crate::bursts::tracers::Bursts,
    released: &'a super::Released,
    src: Source,
) -> (
    &'a crate::bursts::traced::Traced,
    &'a crate::bursts::counts::PathCounts,
) {
    match src {
        Source::Live(i) => {
            let t = &bursts.tracers()[i];
            (t.traced(), t.counts())
        }
        Source::Released(i) => {
            let f = &released.finished[i];
            (&f.traced, &f.counts)
        }
    }
}

impl Session {
    /// Every process with counts: traced now, then released.
    fn sources(&self) -> Vec<Source> {
        (0..self.bursts.tracers().len())
            .map(Source::Live)
            .chain((0..self.released.finished.len()).map(Source::Released))
            .collect()
    }

    /// Every interval: each traced process's paths since the last one
    /// (which its totals now hold) as `paths-<time>.pb.gz` (all
    /// processes, label `pid`) and `edges-<module>-<time>.fdata` (per
    /// binary, summed over its processes: BOLT optimises a binary, not a
    /// process; with the interval's indirect calls from the call-target
    /// profiles), published on `/debug/pprof/paths` and pushed.
    pub(super) fn write_interval_paths(
        &mut self,
        start: std::time::SystemTime,
        end: std::time::SystemTime,
    ) {
        // The records so far, with their contexts.
        if self.bursts.active() {
            self.on_burst_tick();
        }
        let leaf = std::mem::take(&mut self.pipe.interval_leaf_weights);
        let mut intervals = Vec::new();
        for (i, t) in self.bursts.tracers_mut().iter_mut().enumerate() {
            intervals.push((Source::Live(i), t.counts_mut().take_interval()));
        }
        for (i, f) in self.released.finished.iter_mut().enumerate() {
            intervals.push((Source::Released(i), f.counts.take_interval()));
        }
        intervals.retain(|(_, iv)| !iv.is_empty());
        // Every released process's paths are in the interval files now:
        // beyond a bound, the oldest are forgotten (the session's
        // paths.pb.gz then leaves them out), so that a service restarted
        // over and over does not grow with it.
        let excess = self.released.finished.len().saturating_sub(MAX_RELEASED);
        if excess > 0 && intervals.iter().all(|(s, _)| matches!(s, Source::Live(_))) {
            for f in self.released.finished.drain(..excess) {
                info!(
                    pid = %f.traced.pid,
                    "its paths are in the interval profiles; more than {MAX_RELEASED} processes were released, so the session's paths.pb.gz leaves it out"
                );
            }
        }
        if intervals.is_empty() {
            return;
        }
        let empty = HashMap::new();
        let parts: Vec<PathPart> = intervals
            .into_iter()
            .map(|(src, iv)| {
                let (traced, counts) = source(&self.bursts, &self.released, src);
                PathPart {
                    traced,
                    execd: matches!(src, Source::Released(i) if self.released.finished[i].execd.is_some()),
                    view: counts.view(iv),
                    leaf: leaf.get(&traced.pid).unwrap_or(&empty),
                }
            })
            .collect();
        let exe_names: HashMap<Pid, String> = parts
            .iter()
            .map(|p| (p.traced.pid, p.traced.exe_module().name().to_owned()))
            .collect();
        let (gz, fdatas) = build_paths(
            &self.opts.event.name,
            self.bursts.tsc_hz(),
            (start, end),
            &parts,
            &self.pipe.procs,
            &mut self.symbolizer,
        );
        drop(parts);
        let ts = super::files::timestamp(end);
        let output = &self.opts.output;
        let mut edges: std::collections::BTreeMap<String, Fdata> = Default::default();
        for (pid, lib, fdata) in &fdatas {
            let name = lib
                .clone()
                .or_else(|| exe_names.get(pid).cloned())
                .unwrap_or_default();
            edges.entry(name).or_default().merge(fdata);
        }
        // The interval's indirect calls, from the call-target profiles.
        for (module, calls) in self.interval_indirect_calls() {
            edges.entry(module).or_default().merge(&calls);
        }
        for (module, fdata) in edges.iter().filter(|e| !e.1.is_empty()) {
            let name = format!("edges-{module}-{ts}.fdata");
            if let Err(e) = crate::export::write_atomic(output, &name, fdata.text().as_bytes()) {
                warn!("cannot write {}: {e}", output.join(&name).display());
            }
        }
        let bytes = match gz {
            Ok(b) => b,
            Err(e) => {
                warn!("interval path profile: {e:#}");
                return;
            }
        };
        let name = format!("paths-{ts}.pb.gz");
        match crate::export::write_atomic(output, &name, &bytes) {
            Ok(p) => {
                info!("wrote {}", p.display());
                METRICS.profiles_written.inc();
            }
            // Its paths stay in the totals for paths.pb.gz.
            Err(e) => warn!(
                "cannot write the interval path profile {}: {e}",
                output.join(&name).display()
            ),
        }
        if let Some(p) = &self.svc.pusher {
            super::intervals::push_paths(p, &bytes, start, end, &self.out.meta);
        }
        crate::service::http::set_paths_profile(bytes);
    }

    /// `/debug/pprof/paths?seconds=N`: from now, the paths of every process
    /// traced in bursts (503 while the first is being attached, 404 when
    /// none is).
    pub(super) fn open_path_window(
        &mut self,
        d: std::time::Duration,
        reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
    ) {
        if !self.bursts.active() {
            let _ = reply.send(Err(self.nothing_traced("in bursts", "")));
            return;
        }
        self.on_burst_tick();
        let before = self
            .bursts
            .tracers()
            .iter()
            .map(|t| (t.pid(), t.counts().snapshot()))
            .collect::<HashMap<_, _>>();
        let leaf_before = before
            .keys()
            .filter_map(|p| Some((*p, self.pipe.leaf_weights.get(p)?.clone())))
            .collect();
        self.path_windows.push(PathWindow {
            start: std::time::SystemTime::now(),
            end: tokio::time::Instant::now() + d,
            before,
            leaf_before,
            reply,
        });
    }

    /// Answers the path windows whose time is up: each process's counts
    /// now minus when the window opened.
    pub(super) fn finish_path_windows(&mut self) {
        let done = self.take_due(|s| &mut s.path_windows, |w| w.end);
        if done.is_empty() {
            return;
        }
        for w in done {
            let none = crate::bursts::counts::Tallies::default();
            let mut leaves = Vec::new();
            let mut views = Vec::new();
            for src in self.sources() {
                let (traced, counts) = source(&self.bursts, &self.released, src);
                let pid = traced.pid;
                // Released before the window opened: nothing new.
                if matches!(src, Source::Released(_)) && !w.before.contains_key(&pid) {
                    continue;
                }
                let d = crate::bursts::counts::delta(
                    &counts.snapshot(),
                    w.before.get(&pid).unwrap_or(&none),
                );
                if d.is_empty() {
                    continue;
                }
                let leaf_now = self.pipe.leaf_weights.get(&pid);
                let leaf_then = w.leaf_before.get(&pid);
                let leaf: HashMap<u64, u64> = leaf_now
                    .into_iter()
                    .flatten()
                    .filter_map(|(pc, n)| {
                        let before = leaf_then.and_then(|m| m.get(pc)).copied().unwrap_or(0);
                        (*n > before).then_some((*pc, n - before))
                    })
                    .collect();
                leaves.push(leaf);
                views.push((src, d));
            }
            let parts: Vec<PathPart> = views
                .into_iter()
                .zip(&leaves)
                .map(|((src, d), leaf)| {
                    let (traced, counts) = source(&self.bursts, &self.released, src);
                    PathPart {
                        traced,
                        execd: matches!(src, Source::Released(i) if self.released.finished[i].execd.is_some()),
                        view: counts.view(d),
                        leaf,
                    }
                })
                .collect();
            let (gz, _) = build_paths(
                &self.opts.event.name,
                self.bursts.tsc_hz(),
                (w.start, std::time::SystemTime::now()),
                &parts,
                &self.pipe.procs,
                &mut self.symbolizer,
            );
            let _ = w.reply.send(gz.map_err(|e| format!("{e:#}")));
        }
    }
}

/// One process's paths in a profile: its facts, the counts to export
/// (all, an interval's, a window's) and the event sampled per PC over
/// the same time.
struct PathPart<'a> {
    traced: &'a crate::bursts::traced::Traced,
    /// A program the process exec'd away from.
    execd: bool,
    view: PathView<'a>,
    leaf: &'a HashMap<u64, u64>,
}

/// Each module's edges per process: `(pid, module name or None for the
/// executable (see [`crate::export::fdata::fdata_module`]), fdata text)`.
type ModuleEdges = Vec<(Pid, Option<String>, Fdata)>;

/// The path profile of `parts` (gzip'd pprof of `span`) and each
/// module's edges per process (the executable's even when empty).
fn build_paths(
    event: &str,
    tsc_hz: Option<f64>,
    span: (std::time::SystemTime, std::time::SystemTime),
    parts: &[PathPart],
    procs: &crate::stacks::table::ProcessTable,
    symbolizer: &mut crate::stacks::symbolize::Symbolizer,
) -> (anyhow::Result<Vec<u8>>, ModuleEdges) {
    let mut paths = crate::export::paths::paths_builder(event, tsc_hz);
    let nanos = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
    };
    paths.set_time(nanos(span.0), nanos(span.1) - nanos(span.0));
    let mut fdatas = Vec::new();
    for part in parts {
        let pid = part.traced.pid;
        crate::export::paths::add_paths(
            &mut paths,
            part.traced,
            &part.view,
            part.leaf,
            |b, addrs| {
                crate::export::context::return_address_locations(b, procs, symbolizer, pid, addrs)
            },
            tsc_hz,
        );
        // One BOLT profile per module: llvm-bolt optimises one binary at
        // a time.
        for m in &part.traced.modules {
            let text = crate::export::fdata::fdata(m, &part.view);
            if m.is_exe || !text.is_empty() {
                fdatas.push((pid, crate::export::fdata::fdata_module(m, part.execd), text));
            }
        }
    }
    let gz = encode_gzip(&paths.finish()).map_err(anyhow::Error::from);
    (gz, fdatas)
}
