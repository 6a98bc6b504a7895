//! Bursty tracing in the session: an attach finishing on the attach
//! thread ([`Session::on_attached`]), the record rings drained on a timer,
//! and at the end the detach (off the runtime, while samples keep being
//! drained) and the path profiles.
use std::collections::HashMap;

use tracing::{debug, info, warn};

use super::path_window::PathWindow;
use super::summary::finished_summary;
use super::{Session, ticker};
use crate::bursts::counts::PathView;
use crate::bursts::libraries::LoadRequest;
use crate::bursts::selection::Report;
use crate::bursts::tracer::{BurstTracer, Finished};
use crate::bursts::tracers::Attach;
use crate::export::fdata::Fdata;
use crate::export::pprof::encode_gzip;
use crate::export::summary::{ProcessSummary, hot_weights};
use crate::sampling::sampler::{KernelCounters, Sampler};
use crate::service::metrics::METRICS;
use crate::service::targets::read_exe;
use burstyd_common::addr::Pid;

/// Before `t`'s tables are put in use: once its loader has clones, the
/// uprobe that reports the loader's link-map changes, then the tables
/// checked against the maps (see `bursts::linkmap`).
/// Returns a request to clone libraries loaded since (for
/// [`crate::bursts::tracers::Bursts::request`]).
fn link(sampler: &mut Sampler, t: &mut BurstTracer) -> Option<LoadRequest> {
    let pid = t.pid();
    if let Some(loader) = t.link_hook()
        && let Err(e) = sampler.watch_link_map(pid, &loader)
    {
        warn!(%pid, "cannot watch the dynamic loader for dlopen/dlclose ({}; a uprobe perf event, which needs CAP_SYS_ADMIN): {e}", loader.display());
    }
    let (gone, request) = t.relink(sampler.link_changes(pid));
    sampler.remove_pages(pid, &gone);
    request
}

/// The functions an extension rewrote and skipped, into the metrics.
fn count_functions(ext: &crate::bursts::prepare::Extension) {
    METRICS
        .functions_rewritten
        .add(ext.functions_rewritten as u64);
    METRICS.functions_skipped.add(ext.functions_skipped as u64);
}

impl Session {
    /// Every 50 ms (5 ms in `--full-trace`): the burst records.
    pub(super) fn on_burst_tick(&mut self) {
        // The samples first: every START in a burst ring has its stack
        // sample in the sample ring already (see `bursts::contexts`).
        self.sampler.drain_now(|s| self.pipe.handle(s));
        let pipe = &mut self.pipe;
        let busy = self.bursts.drain(
            |pid| pipe.in_clones.remove(&pid).unwrap_or_default(),
            &mut pipe.start_stacks,
        );
        if busy && let Some(t) = self.timers.bursts.as_mut() {
            t.reset_after(crate::bursts::options::BUSY_DRAIN_AGAIN);
        }
        let sampler = &mut self.sampler;
        for (pid, gone) in self.bursts.relink(|pid| sampler.link_changes(pid)) {
            sampler.remove_pages(pid, &gone);
        }
    }

    /// An attach finished: arm the eBPF side for the process, let the
    /// unwinder see through its clones, count the events it samples per
    /// PC, drain its ring from now on.
    pub(super) fn on_attached(&mut self, a: Attach) {
        let (pid, tracer, armed) = match a {
            Attach::Tracer { pid, tracer, armed } => (pid, tracer, armed),
            Attach::Libraries { pid, libraries } => return self.on_libraries(pid, libraries, true),
            Attach::Loaded { request, libraries } => return self.on_loaded(request, libraries),
        };
        let mut t = match tracer {
            Ok(t) => t,
            Err(e) => {
                self.pipe.leaf_weights.remove(&pid);
                let Some(sel) = self.selection.as_mut() else {
                    warn!(%pid, "bursty tracing disabled for this process (it is sampled only): {e:#}");
                    return;
                };
                // The service: once per executable, then retried with
                // backoff (its processes are sampled meanwhile).
                let reason = format!("{e:#}");
                match sel.failed(pid, &reason, std::time::Instant::now()) {
                    Report::Warn { retry_in } => warn!(
                        %pid,
                        "cannot trace {} in bursts (it is sampled only; its processes are tried again in {} s): {reason}",
                        exe_name(pid),
                        retry_in.as_secs()
                    ),
                    Report::Quiet => {
                        debug!(%pid, "cannot trace in bursts (again): {reason}")
                    }
                }
                return;
            }
        };
        if let Some(sel) = self.selection.as_mut()
            && !sel.attached(pid)
        {
            // Released while it was being attached (it exited, or a
            // reload dropped it): never armed, detached at once.
            debug!(%pid, "attached after it was released: detaching");
            self.pipe.procs.set_clone_frames(pid, t.clone_frames());
            self.spawn_detach(*t);
            return;
        }
        let request = link(&mut self.sampler, &mut t);
        // Also with --burst 0: every overflow still reaches the handler,
        // which returns to the original code at once (what being attached
        // costs without bursts).
        if let Err(e) = self
            .sampler
            .set_burst_target(pid, Some((t.target(), t.pages())))
        {
            warn!(%pid, "cannot arm bursts: {e}");
        }
        self.joined(*t);
        if let Some(r) = request {
            self.bursts.request(r);
        }
        if self.timers.bursts.is_none() {
            self.timers.bursts = Some(ticker(self.bursts.drain_interval()));
        }
        // A command held at its entry point may go now.
        let _ = armed.send(());
    }

    /// The shared libraries' clones were added to `pid`'s attachment: its
    /// records name their functions, the unwinder sees through them, and
    /// (`arm`) bursts may start in them too.
    fn on_libraries(
        &mut self,
        pid: burstyd_common::addr::Pid,
        libraries: anyhow::Result<Option<crate::bursts::prepare::Extension>>,
        arm: bool,
    ) {
        if let Some(t) = self.bursts.tracer_mut(pid) {
            t.libraries_added();
        }
        let ext = match libraries {
            Ok(Some(ext)) => ext,
            Ok(None) => return,
            Err(e) => {
                warn!(%pid, "shared libraries not cloned (the executable's clones go on): {e:#}");
                return;
            }
        };
        count_functions(&ext);
        let Some(t) = self.bursts.tracer_mut(pid) else {
            return;
        };
        t.extend(ext, arm);
        self.extended(pid, arm);
    }

    /// `pid`'s tracer has more modules: the unwinder sees their clones,
    /// their tables go in use (checked against the maps), bursts may start
    /// in them (`arm`), and libraries loaded meanwhile are asked for.
    fn extended(&mut self, pid: burstyd_common::addr::Pid, arm: bool) {
        let Some(t) = self.bursts.tracer_mut(pid) else {
            return;
        };
        let request = link(&mut self.sampler, t);
        let (target, frames) = (t.target(), t.clone_frames());
        if arm
            && let Err(e) = self
                .sampler
                .set_burst_target(pid, Some((target, t.pages())))
        {
            warn!(%pid, "cannot arm bursts in the libraries: {e}");
        }
        self.pipe.procs.set_clone_frames(pid, frames);
        if let Some(r) = request {
            self.bursts.request(r);
        }
    }

    /// Libraries `pid` loaded since the attach were cloned: added and put
    /// in use like the second step's (unless stale, see
    /// [`BurstTracer::loaded`]).
    fn on_loaded(
        &mut self,
        request: LoadRequest,
        libraries: anyhow::Result<Option<crate::bursts::prepare::Extension>>,
    ) {
        let pid = request.pid;
        let ext = match libraries {
            Ok(ext) => ext,
            Err(e) => {
                if crate::sys::process_running(pid) {
                    warn!(%pid, "libraries loaded since the attach are not cloned yet: {e:#}; trying again");
                }
                if let Some(t) = self.bursts.tracer_mut(pid) {
                    t.load_failed(&request);
                }
                return;
            }
        };
        if let Some(ext) = &ext {
            count_functions(ext);
        }
        let Some(t) = self.bursts.tracer_mut(pid) else {
            return;
        };
        if t.loaded(&request, ext) {
            self.extended(pid, true);
        }
    }

    /// An attach that finished after the session ended: never armed in
    /// the eBPF map (so no burst starts), detached with the others.
    fn on_late_attach(&mut self, a: Attach) {
        // (A held command goes once `armed` is dropped.)
        let (pid, tracer) = match a {
            Attach::Tracer { pid, tracer, .. } => (pid, tracer),
            // The bursts under way may already run in them: their records
            // must be understood, but nothing new is armed.
            Attach::Libraries { pid, libraries } => {
                return self.on_libraries(pid, libraries, false);
            }
            // Never put in use: the session is ending.
            Attach::Loaded { .. } => return,
        };
        match tracer {
            Ok(t) => {
                info!(%pid, "the session ended while attaching; detaching");
                self.joined(*t);
            }
            Err(e) => {
                warn!(%pid, "bursty tracing disabled for this process (it is sampled only): {e:#}")
            }
        }
    }

    fn joined(&mut self, t: BurstTracer) {
        let s = t.stats();
        METRICS
            .functions_rewritten
            .add(s.functions_rewritten as u64);
        METRICS.functions_skipped.add(s.functions_skipped as u64);
        self.pipe.procs.set_clone_frames(t.pid(), t.clone_frames());
        let facts = super::summary::Attached {
            comm: crate::sys::comm(t.pid()).unwrap_or_else(|| "?".into()),
            secs: t.attach_secs(),
        };
        self.released.attached.insert(t.pid(), facts);
        self.bursts.add(t);
    }

    /// The service, once a second and after a reload: attaches to the
    /// targets newly selected for bursts (within `max_traced`), releases
    /// those that exited or are no longer selected.
    pub(super) fn select_bursts(&mut self) {
        let Some(sel) = self.selection.as_mut() else {
            return;
        };
        let empty = std::collections::BTreeSet::new();
        let wanted = self.svc.scanner.as_ref().map_or(&empty, |s| s.bursty());
        let mut full = Vec::new();
        let plan = sel.plan(wanted, read_exe, std::time::Instant::now(), &mut full);
        for pid in full {
            info!(
                %pid,
                "selected for bursts, but max_traced processes are traced already: {} is sampled only until one of them goes",
                exe_name(pid)
            );
        }
        for pid in plan.release {
            self.release_bursts(pid);
        }
        for pid in plan.attach {
            info!(%pid, "tracing {} in bursts: attaching", exe_name(pid));
            self.pipe.leaf_weights.insert(pid, HashMap::new());
            self.bursts.attach(pid);
        }
    }

    /// Once a second, for the processes whose libraries are cloned when
    /// hot ([`crate::bursts::options::Libraries::Hot`]): each one's user-mode event
    /// weight per mapped file since it was selected; a library past the
    /// share is cloned at the next relink.
    pub(super) fn select_hot_libraries(&mut self) {
        let (procs, weights) = (&self.pipe.procs, &self.pipe.leaf_weights);
        for t in self.bursts.tracers_mut() {
            if !t.hot_libraries() {
                continue;
            }
            let pid = t.pid();
            let Some(leaf) = weights.get(&pid) else {
                continue;
            };
            let mut shares: HashMap<&str, u64> = HashMap::new();
            let mut total = 0;
            for (&pc, &w) in leaf {
                total += w;
                if let Some(m) = procs.exec_mapping(pid, pc) {
                    *shares.entry(&m.path).or_insert(0) += w;
                }
            }
            for path in t.note_hot(&shares, total) {
                info!(
                    %pid,
                    "{path} holds {:.1}% of the process's samples: cloning it",
                    100.0 * shares[path.as_str()] as f64 / total as f64
                );
            }
        }
    }

    /// Stops tracing `pid` in bursts (it exited, or is no longer
    /// selected): out of the eBPF maps, its records so far counted with
    /// their contexts, then disarmed and detached on the blocking pool.
    /// A process still running runs on untouched, sampled if still a
    /// target.
    fn release_bursts(&mut self, pid: burstyd_common::addr::Pid) {
        let Some(mut t) = self.bursts.release(pid) else {
            return;
        };
        let _ = self.sampler.set_burst_target(pid, None);
        self.sampler.drain_now(|s| self.pipe.handle(s));
        let activity = self.pipe.in_clones.remove(&pid).unwrap_or_default();
        t.drain(activity, self.pipe.start_stacks.get_mut(&pid));
        self.pipe.start_stacks.remove(&pid);
        t.disarm();
        if crate::sys::process_running(pid) {
            info!(%pid, "no longer selected for bursts: detaching (the process runs on)");
        } else {
            info!(%pid, "exited: its bursts are released");
        }
        self.spawn_detach(t);
    }

    /// Detaches `t` on tokio's blocking pool; [`Self::on_detached`] gets
    /// the result.
    fn spawn_detach(&mut self, t: BurstTracer) {
        let tx = self.released.tx.clone();
        self.released.pending += 1;
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(t.detach());
        });
    }

    /// A released tracer is detached: its paths wait for the profiles.
    pub(super) fn on_detached(&mut self, f: Finished) {
        self.released.pending -= 1;
        match &f.stats {
            Ok(s) => self.released.totals.add(s),
            Err(e) => warn!(pid = %f.traced.pid, "detaching: {e:#}"),
        }
        self.released.finished.push(f);
    }

    /// Ends bursty tracing. An attach still under way is waited for (its
    /// target is detached like the others: never left armed with nobody
    /// draining it), further ones are not started. Then every target is
    /// disarmed and taken out of the eBPF map, and detached on the
    /// blocking pool (each drains its ring to the end, waits 20 ms for a
    /// signal in flight, restores the signal under ptrace) while the
    /// sample ring keeps being drained here.
    pub(super) async fn stop_bursts(&mut self) -> Vec<Finished> {
        self.bursts.cancel_pending();
        while self.bursts.attaching() {
            tokio::select! {
                a = self.bursts.next_attach() => {
                    if let Some(a) = a {
                        self.on_late_attach(a);
                    }
                }
                _ = self.timers.drain.tick() => {
                    self.sampler.drain_now(|s| self.pipe.handle(s));
                }
            }
        }
        while self.released.pending > 0 {
            tokio::select! {
                f = self.released.rx.recv() => match f {
                    Some(f) => self.on_detached(f),
                    None => break,
                },
                _ = self.timers.drain.tick() => {
                    self.sampler.drain_now(|s| self.pipe.handle(s));
                }
            }
        }
        let mut done = std::mem::take(&mut self.released.finished);
        if !self.bursts.active() {
            return done;
        }
        self.bursts.disarm(|pid| {
            let _ = self.sampler.set_burst_target(pid, None);
        });
        // What was recorded so far, with the bursts' contexts; the
        // detach drains what the last bursts add.
        self.on_burst_tick();
        let tracers = self.bursts.take();
        let mut detach = tokio::task::spawn_blocking(move || {
            tracers
                .into_iter()
                .map(BurstTracer::detach)
                .collect::<Vec<_>>()
        });
        let finished = loop {
            tokio::select! {
                r = &mut detach => break r,
                _ = self.timers.drain.tick() => {
                    self.sampler.drain_now(|s| self.pipe.handle(s));
                }
            }
        };
        // What was sampled while they detached.
        self.sampler.drain_now(|s| self.pipe.handle(s));
        done.extend(finished.unwrap_or_else(|e| {
            warn!("detaching the traced processes: {e}");
            Vec::new()
        }));
        done
    }

    /// `paths.pb.gz`, `edges.fdata` (and `edges-<pid>.fdata` with several
    /// processes) and each process's summary line; returns each one's
    /// summary for `summary.json`.
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
                leaf: self.pipe.leaf_weights.get(&f.traced.pid).unwrap_or(&empty),
            })
            .collect();
        let span = (self.out.session_start, std::time::SystemTime::now());
        let (paths, fdatas) = build_paths(
            &self.opts.event.name,
            tsc_hz,
            span,
            &parts,
            &self.pipe.procs,
            &mut self.symbolizer,
        );
        drop(parts);
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
                "bursts: {} taken, {} truncated, {} declined by the handler (busy {}, PC not rewritten {}, budget 0 {}, daemon behind {}), {} reaped; {} signals sent, {} overflows during a burst, signals not sent: {declined}; link-map changes {} signalled, {} not; functions rewritten {}, skipped {}; {} complete paths recorded (and {} partial ones left out), records lost: {}, bad records: {}",
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
            for name in names {
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

/// The process's name and executable for messages: `comm (path)` (the
/// path resolved, e.g. redis-server's symlink to redis-check-rdb).
fn exe_name(pid: burstyd_common::addr::Pid) -> String {
    match read_exe(pid) {
        Some(p) => format!(
            "{} ({})",
            crate::sys::comm(pid).unwrap_or_else(|| "?".into()),
            p.display()
        ),
        None => format!("pid {pid}"),
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
    /// process), published on `/debug/pprof/paths` and pushed.
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
    /// traced in bursts (404 when none is).
    pub(super) fn open_path_window(
        &mut self,
        d: std::time::Duration,
        reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
    ) {
        if !self.bursts.active() {
            let _ = reply.send(Err(format!(
                "{}no process is traced in bursts now",
                crate::service::http::NOT_FOUND
            )));
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
        let now = tokio::time::Instant::now();
        if !self.path_windows.iter().any(|w| w.end <= now) {
            return;
        }
        if self.bursts.active() {
            self.on_burst_tick();
        }
        let (done, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.path_windows)
            .into_iter()
            .partition(|w| w.end <= now);
        self.path_windows = open;
        for w in done {
            let none = HashMap::new();
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
    view: PathView<'a>,
    leaf: &'a HashMap<u64, u64>,
}

/// Each module's edges per process: `(pid, library name or None for the
/// executable, fdata text)`.
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
                fdatas.push((pid, (!m.is_exe).then(|| m.name().to_owned()), text));
            }
        }
    }
    let gz = encode_gzip(&paths.finish()).map_err(anyhow::Error::from);
    (gz, fdatas)
}
