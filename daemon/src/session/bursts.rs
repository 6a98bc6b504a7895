//! Bursty tracing in the session: an attach finishing on the attach
//! thread ([`Session::on_attached`]), the record rings drained on a timer,
//! and at the end the detach (off the runtime, while samples keep being
//! drained) and the path profiles.
use std::collections::HashMap;

use burstyd_common::addr::Pid;
use tracing::{debug, info, warn};

use super::{Session, ticker};
use crate::bursts::libraries::LoadRequest;
use crate::bursts::selection::Report;
use crate::bursts::tracer::{BurstTracer, Finished};
use crate::bursts::tracers::Attach;
use crate::sampling::sampler::Sampler;
use crate::service::metrics::METRICS;
use crate::service::targets::read_exe;

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
    /// Every 100 ms (5 ms in `--full-trace`): the burst records, read off
    /// the rings, counted in batches of several drains (see
    /// `BurstTracer::drain`).
    /// What the sampler's drain timer does (that timer sleeps meanwhile:
    /// one wakeup fewer).
    pub(super) fn on_burst_timer(&mut self) {
        self.drain_bursts(true);
        self.on_drain_tick();
    }

    /// Every burst record so far, counted (what the profiles read).
    pub(super) fn on_burst_tick(&mut self) {
        self.drain_bursts(false);
    }

    fn drain_bursts(&mut self, hold: bool) {
        // The samples first: every START in a burst ring has its stack
        // sample in the sample ring already (see `bursts::contexts`).
        self.sampler.drain_now(|s| self.pipe.handle(s));
        let pipe = &mut self.pipe;
        let busy = self.bursts.drain(
            |pid| pipe.in_clones.remove(&pid).unwrap_or_default(),
            &mut pipe.start_stacks,
            hold,
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
        METRICS.attaching.set(self.bursts.waiting().len() as u64);
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
                    if crate::sys::process_running(pid) {
                        warn!(%pid, "bursty tracing disabled for this process (it is sampled only): {e:#}");
                    } else {
                        // Gone (a command that could not be run): nothing
                        // to say about tracing it.
                        tracing::debug!(%pid, "not traced, it ended: {e:#}");
                    }
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
        if !t.image_present() {
            // It exec'd while being attached: the tracer is the old
            // program's, and the new one is attached to afresh.
            debug!(%pid, "exec'd while being attached");
            self.pipe.procs.set_clone_frames(pid, t.clone_frames());
            self.finish_exec(*t);
            self.exec_attach(pid);
            return;
        }
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
        // The first tracer starts the drain timer (a full trace wants it
        // faster).
        let every = self.bursts.drain_interval();
        if self
            .timers
            .bursts
            .as_ref()
            .is_none_or(|t| t.period() > every)
        {
            self.timers.bursts = Some(ticker(every));
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
            // Its tracer was released meanwhile (it exited or exec'd), or
            // is about to be (the exec not seen yet).
            Err(e)
                if self.bursts.tracer_mut(pid).is_none()
                    || e.downcast_ref::<crate::bursts::rooms::Execd>().is_some() =>
            {
                debug!(%pid, "shared libraries not cloned: {e:#}");
                return;
            }
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
                if crate::sys::process_running(pid)
                    && e.downcast_ref::<crate::bursts::rooms::Execd>().is_none()
                {
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
            Err(e) if crate::sys::process_running(pid) => {
                warn!(%pid, "bursty tracing disabled for this process (it is sampled only): {e:#}")
            }
            Err(e) => tracing::debug!(%pid, "not traced, it ended: {e:#}"),
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
        let stack = self.opts.service.settings.bursts.refs_stack;
        for pid in plan.attach {
            // A target's own `record`: what its clones record.
            let rec = self
                .svc
                .scanner
                .as_ref()
                .and_then(|s| s.record(pid))
                .map(|r| {
                    use crate::bursts::options::{Record, refs_mode};
                    let r: Vec<Record> = r.iter().copied().collect();
                    userspace_rewriter::codegen::Recording {
                        refs: refs_mode(&r, stack),
                        values: r.contains(&Record::Values),
                        targets: r.contains(&Record::Targets),
                    }
                });
            info!(%pid, "tracing {} in bursts: attaching", exe_name(pid));
            self.pipe.leaf_weights.insert(pid, HashMap::new());
            self.bursts.attach(pid, rec);
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

    /// Every drain tick: the targets and traced processes that exec'd
    /// ([`crate::sampling::sampler::Sampler::take_execs`]). A traced one's
    /// old program is finished (its records so far counted; nothing is
    /// done to the process, whose new program owns its pid, memory and
    /// signals), and the new program is attached to as at the start:
    /// under `run` and `--pid` at once (so `sh -c "exec prog"`, `env`, a
    /// wrapper script, and the children a command forks and execs, are
    /// traced), within `max_traced` processes traced at once; in the
    /// service when its targets are next selected.
    pub(super) fn follow_execs(&mut self) {
        for pid in self.sampler.take_execs() {
            // An exec before its tracer's attach (`run`'s command execs
            // from burstyd's fork into the command, a process attached to
            // after it exec'd): the tracer is the current program's.
            if self
                .bursts
                .tracer_mut(pid)
                .is_some_and(|t| t.image_present())
            {
                continue;
            }
            // Its samples so far are the old program's.
            self.sampler.drain_now(|s| self.pipe.handle(s));
            if let Some(t) = self.bursts.release(pid) {
                self.finish_exec(t);
            }
            self.pipe.procs.exec_seen(pid);
            if let Some(sel) = self.selection.as_mut() {
                sel.exec_seen(pid);
                continue;
            }
            // An attach under way: its tracer says which program it
            // attached to when it arrives (`on_attached`).
            if !self.bursts.waiting().contains(&pid) {
                self.exec_attach(pid);
            }
        }
    }

    /// `pid`'s old program's tracer, after an exec: out of the eBPF maps
    /// (`on_exec` disarmed it already), counted with its contexts, and
    /// finished on the blocking pool with the samples of its program.
    fn finish_exec(&mut self, mut t: BurstTracer) {
        let pid = t.pid();
        let _ = self.sampler.set_burst_target(pid, None);
        let activity = self.pipe.in_clones.remove(&pid).unwrap_or_default();
        t.drain(activity, self.pipe.start_stacks.get_mut(&pid), false);
        self.pipe.start_stacks.remove(&pid);
        let execd = crate::bursts::tracer::Execd {
            comm: self
                .released
                .attached
                .get(&pid)
                .map_or_else(String::new, |a| a.comm.clone()),
            leaf: self.pipe.leaf_weights.remove(&pid).unwrap_or_default(),
        };
        self.pipe.interval_leaf_weights.remove(&pid);
        info!(%pid, "exec'd: the bursts of its previous program ({}) end", execd.comm);
        let tx = self.released.tx.clone();
        self.released.pending += 1;
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(t.finish_exec(execd));
        });
    }

    /// Attaches to the program `pid` exec'd (`run`, `--pid`), unless
    /// `max_traced` processes are traced or being attached already.
    fn exec_attach(&mut self, pid: Pid) {
        if self.bursts.options().is_none() || !crate::sys::process_running(pid) {
            return;
        }
        if let Some(sel) = self.selection.as_mut() {
            sel.exec_seen(pid);
            return;
        }
        let max = self.opts.service.settings.bursts.max_traced;
        if self.bursts.tracers().len() + self.bursts.waiting().len() >= max {
            METRICS.execs_not_followed.inc();
            info!(
                %pid,
                "{} exec'd, but max_traced ({max}) processes are traced already: it is sampled only",
                exe_name(pid)
            );
            return;
        }
        METRICS.execs_followed.inc();
        info!(%pid, "{} exec'd: attaching to it", exe_name(pid));
        self.pipe.leaf_weights.insert(pid, HashMap::new());
        self.bursts.attach(pid, None);
    }

    /// Once a second under `run` and `--pid`: the tracers of processes
    /// that exited (the command's children traced since they exec'd)
    /// are released, so that `max_traced` counts the living.
    pub(super) fn release_exited(&mut self) {
        if self.selection.is_some() {
            return;
        }
        let gone: Vec<Pid> = self
            .bursts
            .tracers()
            .iter()
            .map(|t| t.pid())
            .filter(|&p| !crate::sys::process_running(p))
            .collect();
        for pid in gone {
            self.release_bursts(pid);
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
        t.drain(activity, self.pipe.start_stacks.get_mut(&pid), false);
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
}

/// The process's name and executable for messages: `comm (path)` (the
/// path resolved, e.g. redis-server's symlink to redis-check-rdb).
fn exe_name(pid: Pid) -> String {
    match read_exe(pid) {
        Some(p) => format!(
            "{} ({})",
            crate::sys::comm(pid).unwrap_or_else(|| "?".into()),
            p.display()
        ),
        None => format!("pid {pid}"),
    }
}
