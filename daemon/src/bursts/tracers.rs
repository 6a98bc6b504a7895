//! The bursty-tracing side of a session ([`Bursts`]): one tracer per
//! target, and the attach thread (`burstyd-attach`) that attaches to them
//! one after the other and clones their libraries, off the session's loop.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use burstyd_common::addr::Pid;
use std::collections::HashMap;
use tokio::sync::mpsc;
use tracing::warn;

use super::attach::{self};
use super::contexts;
use super::exec_gate;
use super::libraries;
use super::options::{BUSY_DRAIN_RECORDS, BurstOptions};
use super::prepare;
use super::stats::Activity;

use super::tracer::BurstTracer;

/// What the attach thread sends: a finished attach, then (unless
/// `--exe-only`) the shared libraries it added to it.
pub(crate) enum Attach {
    Tracer {
        pid: Pid,
        tracer: anyhow::Result<Box<BurstTracer>>,
        /// Told once bursts are armed for it (a held command waits).
        armed: std::sync::mpsc::Sender<()>,
    },
    Libraries {
        pid: Pid,
        libraries: anyhow::Result<Option<prepare::Extension>>,
    },
    /// Libraries loaded since the attach ([`BurstTracer::relink`]'s
    /// request), cloned.
    Loaded {
        request: libraries::LoadRequest,
        libraries: anyhow::Result<Option<prepare::Extension>>,
    },
}

/// Work for the attach thread.
pub(crate) enum Job {
    /// Attach to a process (the service's targets, as they are selected).
    Attach { pid: Pid, opts: BurstOptions },
    /// Clone the libraries a traced process loaded since its attach
    /// ([`BurstTracer::relink`]'s request).
    Load(libraries::LoadRequest),
}

/// The attach thread's work, in its order: executables first (each
/// target takes bursts within milliseconds), then their libraries, then
/// the libraries loaded since.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) attaches: std::collections::VecDeque<(Pid, BurstOptions)>,
    pub(super) libraries: std::collections::VecDeque<(Pid, libraries::Pending)>,
    pub(super) loads: std::collections::VecDeque<libraries::LoadRequest>,
}

impl Queue {
    pub(super) fn push(&mut self, j: Job) {
        match j {
            Job::Attach { pid, opts } => self.attaches.push_back((pid, opts)),
            Job::Load(r) => self.loads.push_back(r),
        }
    }
}

/// The bursty-tracing side of a session: one tracer per target, and the
/// thread attaching to them.
pub(crate) struct Bursts {
    pub(super) tracers: Vec<BurstTracer>,
    pub(super) full_trace: bool,
    /// Bursts measure their paths' time (some tracer's, ever).
    pub(super) measure: bool,
    /// The options of further attaches (the service's, changed by a
    /// reload).
    pub(super) opts: Option<BurstOptions>,
    /// Finished attaches, until the attach thread is done (the channel
    /// closes when it returns).
    pub(super) attaching: Option<mpsc::UnboundedReceiver<Attach>>,
    /// Set when the session ends: the attach thread starts no further
    /// attach (the one under way runs to its end and is detached).
    pub(super) cancel: Arc<AtomicBool>,
    /// Processes to attach to and libraries loaded since an attach, for
    /// the attach thread (dropped when the session ends: the thread
    /// returns).
    pub(super) jobs: Option<std::sync::mpsc::Sender<Job>>,
    /// The processes sent to the attach thread whose attach has not
    /// finished yet (queued, or under way).
    pub(super) waiting: std::collections::BTreeSet<Pid>,
}

impl Bursts {
    /// Starts attaching to each target (waiting for `run`'s command to
    /// have exec'd), one after the other, on a thread of its own
    /// (`burstyd-attach`): the analysis, the code generation and the
    /// ptrace stop take seconds for a big binary, and the session keeps
    /// sampling, serving HTTP and pinging the watchdog meanwhile. The
    /// tracers (or why a target cannot be traced) arrive through
    /// [`Self::next_attach`]. The thread then waits for more work
    /// ([`Self::attach`], libraries loaded later) until the session ends.
    ///
    /// With `gate` (`run`'s command, `pids[0]`, waits on it to exec), the
    /// attach thread first becomes the command's tracer, then closes the
    /// gate and holds the command at its entry point until its clones
    /// (and its libraries') are in place: bursts cover it from its first
    /// instruction. Should that fail, it is released and attached to as
    /// it runs.
    pub(crate) fn start(
        opts: Option<&BurstOptions>,
        pids: &[Pid],
        gate: Option<std::os::fd::OwnedFd>,
    ) -> Self {
        let mut bursts = Bursts {
            tracers: Vec::new(),
            full_trace: opts.is_some_and(|o| o.full_trace),
            measure: opts.is_some_and(|o| o.measure),
            opts: opts.cloned(),
            attaching: None,
            cancel: Arc::new(AtomicBool::new(false)),
            jobs: None,
            waiting: Default::default(),
        };
        let Some(opts) = opts else {
            return bursts;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (jobs, queued) = std::sync::mpsc::channel::<Job>();
        bursts.jobs = Some(jobs);
        let mut queue = Queue::default();
        for &pid in pids {
            queue.attaches.push_back((pid, opts.clone()));
        }
        let (first, cancel) = (pids.first().copied(), bursts.cancel.clone());
        let spawned = std::thread::Builder::new()
            .name("burstyd-attach".into())
            .spawn(move || {
                let mut held = first
                    .zip(gate)
                    .map(|(pid, g)| exec_gate::hold_command(pid, g));
                let mut niced = false;
                loop {
                    let mut open = true;
                    loop {
                        match queued.try_recv() {
                            Ok(j) => queue.push(j),
                            Err(std::sync::mpsc::TryRecvError::Empty) => break,
                            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    if cancel.load(Ordering::Relaxed) {
                        if let (Some(true), Some(pid)) = (held.take(), first) {
                            userspace_rewriter::inject::hold::release(pid);
                        }
                        return;
                    }
                    if let Some((pid, opts)) = queue.attaches.pop_front() {
                        // A process attached to again has exec'd: the
                        // libraries of its old program are not its.
                        queue.libraries.retain(|(p, _)| *p != pid);
                        queue.loads.retain(|r| r.pid != pid);
                        // Only the first can be `run`'s held command.
                        let hold = held.take() == Some(true);
                        match attach_one(pid, &opts, hold, &tx) {
                            Some(Some(p)) => queue.libraries.push_back((pid, p)),
                            Some(None) => {}
                            None => return,
                        }
                        continue;
                    }
                    // The libraries are background work: the session
                    // (draining rings, sampling) and the targets come
                    // first. (Not `run`'s or `--pid`'s executables: a
                    // short program must be armed early.)
                    if !niced {
                        // SAFETY: setpriority on this thread (PRIO_PROCESS
                        // with a tid) has no memory effects.
                        unsafe {
                            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10)
                        };
                        niced = true;
                    }
                    if let Some((pid, p)) = queue.libraries.pop_front() {
                        // Sent also when there is nothing to add: the
                        // session then looks for libraries loaded since.
                        let libraries = match libraries::add_libraries(pid, p, &cancel) {
                            Ok(None) if cancel.load(Ordering::Relaxed) => {
                                tracing::info!(%pid, "the session ended before its shared libraries were cloned");
                                continue;
                            }
                            // It exited meanwhile: nothing to say.
                            Err(_) if !crate::sys::process_running(pid) => continue,
                            r => r,
                        };
                        if tx.send(Attach::Libraries { pid, libraries }).is_err() {
                            return;
                        }
                        crate::sys::return_free_memory();
                        continue;
                    }
                    if let Some(request) = queue.loads.pop_front() {
                        let libraries = libraries::add_loaded(&request);
                        if tx.send(Attach::Loaded { request, libraries }).is_err() {
                            return;
                        }
                        crate::sys::return_free_memory();
                        continue;
                    }
                    if !open {
                        return;
                    }
                    match queued.recv() {
                        Ok(j) => queue.push(j),
                        Err(_) => return,
                    }
                }
            });
        match spawned {
            Ok(_) => {
                bursts.attaching = Some(rx);
                bursts.waiting.extend(pids);
            }
            Err(e) => warn!("bursty tracing disabled: cannot start the attach thread: {e}"),
        }
        bursts
    }

    /// Attaches to `pid` on the attach thread ([`Self::next_attach`]
    /// reports it), with the options in force; `rec`: what its clones
    /// record (a service target's own `record`), or `None` for the
    /// options'.
    pub(crate) fn attach(&mut self, pid: Pid, rec: Option<userspace_rewriter::codegen::Recording>) {
        if let (Some(tx), Some(opts)) = (&self.jobs, &self.opts) {
            let mut opts = opts.clone();
            if let Some(r) = rec {
                opts.refs = r.refs;
                opts.values = r.values;
                opts.targets = r.targets;
            }
            if tx.send(Job::Attach { pid, opts }).is_ok() {
                self.waiting.insert(pid);
            }
        }
    }

    /// The processes whose attach is queued or under way (not traced
    /// yet).
    pub(crate) fn waiting(&self) -> &std::collections::BTreeSet<Pid> {
        &self.waiting
    }

    /// What is being attached, for a person, while nothing is traced
    /// yet: the attach under way and how far it is, or the processes
    /// waiting for one; `None` when none is waiting.
    pub(crate) fn attaching_now(&self) -> Option<String> {
        if self.waiting.is_empty() {
            return None;
        }
        match super::progress::now() {
            Some(s) if s.step == super::progress::Step::Attach && self.waiting.contains(&s.pid) => {
                Some(s.describe())
            }
            _ => {
                let pids: Vec<String> = self.waiting.iter().map(|p| p.to_string()).collect();
                Some(format!("waiting to attach to pid {}", pids.join(", ")))
            }
        }
    }

    /// The options of further attaches (`None` without bursts).
    pub(crate) fn options(&self) -> Option<&BurstOptions> {
        self.opts.as_ref()
    }

    /// New options (a reload): for further attaches, and the burst length
    /// and path timing of every traced process from its next burst on.
    pub(crate) fn set_options(&mut self, opts: BurstOptions) {
        self.measure |= opts.measure;
        for t in &mut self.tracers {
            t.set_options(&opts);
        }
        self.opts = Some(opts);
    }

    /// Takes `pid`'s tracer out of the set (to be disarmed and detached);
    /// `None` when it is not traced (yet).
    pub(crate) fn release(&mut self, pid: Pid) -> Option<BurstTracer> {
        let i = self.tracers.iter().position(|t| t.pid() == pid)?;
        Some(self.tracers.swap_remove(i))
    }

    /// The next finished attach; `None` when the attach thread is done
    /// (then [`Self::attaching`] turns false) or was never started.
    /// Cancel safe.
    pub(crate) async fn next_attach(&mut self) -> Option<Attach> {
        let a = self.attaching.as_mut()?.recv().await;
        match &a {
            None => {
                self.attaching = None;
                self.waiting.clear();
            }
            Some(Attach::Tracer { pid, .. }) => {
                self.waiting.remove(pid);
            }
            Some(_) => {}
        }
        a
    }

    /// Whether attaches are still under way.
    pub(crate) fn attaching(&self) -> bool {
        self.attaching.is_some()
    }

    /// No further attaches (the one under way still finishes).
    pub(crate) fn cancel_pending(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.jobs = None;
    }

    /// The tracer of `pid`, if it is traced.
    pub(crate) fn tracer_mut(&mut self, pid: Pid) -> Option<&mut BurstTracer> {
        self.tracers.iter_mut().find(|t| t.pid() == pid)
    }

    /// The processes traced now.
    pub(crate) fn tracers(&self) -> &[BurstTracer] {
        &self.tracers
    }

    pub(crate) fn tracers_mut(&mut self) -> &mut [BurstTracer] {
        &mut self.tracers
    }

    /// A tracer attached (by [`Self::next_attach`]) joins the set.
    pub(crate) fn add(&mut self, t: BurstTracer) {
        self.tracers.push(t);
    }

    /// Whether any process is traced.
    pub(crate) fn active(&self) -> bool {
        !self.tracers.is_empty()
    }

    /// Disarms every tracer (no new bursts; running ones end at their next
    /// check) after `untarget(pid)` took it out of the eBPF map.
    pub(crate) fn disarm(&mut self, mut untarget: impl FnMut(Pid)) {
        for t in &mut self.tracers {
            untarget(t.pid());
            t.disarm();
        }
    }

    /// The time-stamp counter's rate when bursts measure their paths'
    /// time with it (calibrated against the monotonic clock over 20 ms).
    pub(crate) fn tsc_hz(&self) -> Option<f64> {
        self.measure.then(crate::sys::tsc_hz)
    }

    /// How often to drain the record rings: a full trace fills them fast
    /// (every 5 ms); bursts every 100 ms, memory mode's included. One burst
    /// in `refs_every` records references, at most half a sub-ring
    /// ([`super::options::DEFAULT_REFS_BURST`]), and a drain that finds
    /// many records brings the next one forward
    /// ([`super::options::BUSY_DRAIN_AGAIN`]). Each drain starts with the
    /// daemon's tables out of cache (the target ran meanwhile), so fewer,
    /// larger drains cost less: memory mode's steady CPU on sqlite3 went
    /// from 3.2-3.5% of a core at 5 ms to 2.25-2.3% at 50 ms (2026-11-29;
    /// 2 bursts of 5,146 declined as "behind"; at 200 ms, 182 of 6,236).
    /// Since a drain only reads the records off the rings (they are
    /// counted in batches, see [`BurstTracer::drain`]), what it costs is
    /// mostly its wakeup: 100 ms.
    pub(crate) fn drain_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(if self.full_trace { 5 } else { 100 })
    }

    /// `activity(pid)`: the samples of `pid` since the last drain;
    /// `stacks`: its burst signals' stack samples. Returns whether the
    /// rings held many records ([`BUSY_DRAIN_RECORDS`] in one process):
    /// then they should be drained again soon ([`BUSY_DRAIN_AGAIN`]), not
    /// at the next [`Self::drain_interval`], since the handler declines
    /// bursts while a sub-ring is more than half full.
    /// With `hold`, the records may be counted at a later drain
    /// ([`BurstTracer::drain`]); without, everything read so far is
    /// counted.
    pub(crate) fn drain(
        &mut self,
        mut activity: impl FnMut(Pid) -> Activity,
        stacks: &mut HashMap<Pid, contexts::StartStacks>,
        hold: bool,
    ) -> bool {
        let mut busy = false;
        for t in &mut self.tracers {
            let a = activity(t.pid());
            busy |= t.drain(a, stacks.get_mut(&t.pid()), hold) >= BUSY_DRAIN_RECORDS;
        }
        busy
    }

    /// Relinks each tracer that needs it ([`BurstTracer::relink`]);
    /// `changes(pid)` is its loader's count of link-map changes. Returns
    /// the ranges of the libraries found unloaded, per process.
    pub(crate) fn relink(
        &mut self,
        mut changes: impl FnMut(Pid) -> Option<u64>,
    ) -> Vec<(Pid, Vec<(u64, u64)>)> {
        let mut out = Vec::new();
        let jobs = self.jobs.as_ref();
        for t in &mut self.tracers {
            let (gone, request) = t.relink(changes(t.pid()));
            if let (Some(r), Some(tx)) = (request, jobs) {
                let _ = tx.send(Job::Load(r));
            }
            if !gone.is_empty() {
                out.push((t.pid(), gone));
            }
        }
        out
    }

    /// Asks the attach thread to clone libraries loaded since.
    pub(crate) fn request(&self, r: libraries::LoadRequest) {
        if let Some(tx) = &self.jobs {
            let _ = tx.send(Job::Load(r));
        }
    }

    /// The tracers, for detaching (the set is empty afterwards).
    pub(crate) fn take(&mut self) -> Vec<BurstTracer> {
        std::mem::take(&mut self.tracers)
    }
}

/// On the attach thread: attaches to `pid` (held at its entry point with
/// `hold`) and sends the tracer, or why it cannot be traced. Returns the
/// libraries to clone next (`Some(Some(..))`), or `None` when the session
/// is gone (the thread returns).
pub(super) fn attach_one(
    pid: Pid,
    opts: &BurstOptions,
    hold: bool,
    tx: &mpsc::UnboundedSender<Attach>,
) -> Option<Option<libraries::Pending>> {
    if !hold {
        exec_gate::wait_for_exec(pid);
    }
    let (tracer, then) = match BurstTracer::attach(pid, opts, hold) {
        Ok((t, then)) => (Ok(Box::new(t)), then),
        Err(e) => {
            if hold {
                // Still held by this thread: let it run.
                userspace_rewriter::inject::hold::release(pid);
            }
            (Err(e), None)
        }
    };
    let (armed, armed_rx) = std::sync::mpsc::channel();
    let sent = tx.send(Attach::Tracer { pid, tracer, armed });
    crate::sys::return_free_memory();
    let mut libraries = None;
    match then {
        Some(attach::Then::Libraries(p)) => libraries = Some(p),
        Some(attach::Then::Release { held, start_burst }) => {
            // Bursts armed (or the session gone): it runs.
            let armed = armed_rx.recv_timeout(std::time::Duration::from_secs(5));
            if let (Ok(_), Some(signal)) = (armed, start_burst) {
                // Pending while it is stopped: taken at its first
                // instruction once it runs, untraced.
                // SAFETY: tgkill has no memory arguments.
                let r = unsafe { libc::syscall(libc::SYS_tgkill, pid.0, pid.0, signal) };
                if r != 0 {
                    warn!(%pid, "starting the full trace at the entry point: {}", std::io::Error::last_os_error());
                }
            }
            if let Err(e) = held.detach() {
                warn!(%pid, "releasing the held command: {e}");
            }
        }
        None => {}
    }
    if let Err(mpsc::error::SendError(a)) = sent {
        // Nobody will drain it: leave the target as it was.
        if let Attach::Tracer { tracer: Ok(t), .. } = a {
            let _ = (*t).detach();
        }
        return None;
    }
    Some(libraries)
}
