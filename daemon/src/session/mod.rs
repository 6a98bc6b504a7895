//! One profiling session: start the sampler, turn samples into calling
//! context trees as they arrive, write profiles on interval and at the end.
//!
//! The end comes from `--duration`, SIGINT/SIGTERM, or all targets exiting;
//! whichever it is, what the ring buffer still holds is drained and the last
//! profile is written before returning. `burstyd run` is a wrapper: its
//! signals go to the command, the session ends when the command exits (or
//! at `--duration`, and then burstyd still waits for the command), and
//! burstyd exits with the command's status even when it failed itself.
//!
//! [`Session`] holds everything a session owns; [`run`] is its event loop,
//! one `select!` arm per event source, each handled by one method
//! (`on_samples`, `on_drain_tick`, `on_interval`, `on_reload`,
//! `on_http_request`, `on_second`, `on_liveness`, `on_watchdog`,
//! `on_burst_tick`, `on_attached`, `on_signal`, `on_command_exit`), then
//! [`Session::shutdown`]. Nothing in the loop blocks for long: bursty
//! tracing attaches on a thread of its own and detaches on tokio's
//! blocking pool.
//!
//! - `pipeline.rs`: samples → trees (and HTTP profile windows);
//! - `intervals.rs`: interval profiles, and pushing them;
//! - `files.rs`: interval file names and retention; an earlier run's stale outputs;
//! - `reload.rs`: SIGHUP and the rescans of configured targets;
//! - `command.rs`: the signals, and `run`'s command they are passed on to;
//! - `bursts.rs`: finished attaches, detach at the end, path profiles;
//! - `tuple_profiles.rs`: the tuple profiles at the end.
use std::collections::HashMap;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};

use crate::bursts::tracers::Bursts;
use crate::export::context::{build_profile, write_profile};
use crate::export::pprof::encode_gzip;
use crate::sampling::sampler::{Sampler, SamplerError};
use crate::service::http::{ProfileKind, ProfileRequest};
use crate::service::metrics::METRICS;
use crate::service::notify::Notifier;
use crate::service::push::Pusher;
use crate::service::targets::Scanner;
use crate::stacks::cct::Cct;
use crate::stacks::symbolize::Symbolizer;

mod bursts;
mod command;
mod files;
mod intervals;
mod options;
mod path_profiles;
mod path_window;
mod pipeline;
mod reload;
mod report;
mod scan;
mod stream_profiles;
mod stream_window;
mod summary;
mod tuple_profiles;
mod tuple_window;

pub(crate) use command::Command;
use command::Signals;
use intervals::{
    Meta, interval_timer, merge, push_interval, pusher_pending, start_pusher, write_interval,
};
pub(crate) use options::{Reload, Service, SessionOptions, SessionStats};
use pipeline::{Pipeline, Window};

/// How long the last pushes may take at exit before they are left in the
/// spool for the next start.
const PUSH_GRACE: Duration = Duration::from_secs(5);

/// Why the session loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndReason {
    Duration,
    Signal,
    TargetsExited,
}

/// The trees that outlive an interval, and where the session's output
/// stands.
struct Output {
    /// Wall clock and daemon CPU when the session started.
    started: Instant,
    cpu_start: u64,
    session_start: SystemTime,
    /// Start of the current interval.
    interval_start: SystemTime,
    meta: Meta,
    /// With --interval, each interval's trees are written and then merged
    /// into this session total that becomes context.pb.gz.
    total: Cct,
    /// The last interval profile, for `/debug/pprof/context`.
    last_interval: Option<Vec<u8>>,
    /// Per push target, the trees not pushed yet and when they start.
    push_pending: Vec<(Cct, SystemTime)>,
}

/// The service parts: HTTP endpoint, push tasks, configured targets,
/// systemd.
struct ServiceParts {
    http: Option<crate::service::http::Server>,
    /// HTTP handlers ask the loop for profiles through this channel.
    req_tx: mpsc::Sender<ProfileRequest>,
    req_rx: mpsc::Receiver<ProfileRequest>,
    pusher: Option<Pusher>,
    scanner: Option<Scanner>,
    notify: Notifier,
}

/// The loop's clocks.
struct Timers {
    /// `--duration`.
    deadline: Option<tokio::time::Instant>,
    /// `--interval`.
    interval: Option<Interval>,
    /// Drains the sample ring when the eBPF side did not wake us.
    drain: Interval,
    /// Rescans configured targets, refreshes metrics.
    second: Interval,
    /// Checks whether `--pid` targets still run.
    liveness: Interval,
    /// systemd watchdog pings (only when systemd asks for them).
    watchdog: Interval,
    watchdog_on: bool,
    /// Drains the burst record rings, from the first attach on.
    bursts: Option<Interval>,
}

/// Everything a session owns.
pub(crate) struct Session {
    opts: SessionOptions,
    sampler: Sampler,
    /// `burstyd run`'s command, awaited as an end condition; it gets the
    /// session's signals.
    command: Option<Command>,
    /// Samples → trees.
    pipe: Pipeline,
    symbolizer: Symbolizer,
    out: Output,
    svc: ServiceParts,
    bursts: Bursts,
    /// The service's targets traced in bursts (`None` with `--pid`, `run`
    /// or without bursts).
    selection: Option<crate::bursts::selection::Selection>,
    /// Tracers released before the end (their process exited or is no
    /// longer selected), detached on the blocking pool.
    released: Released,
    /// Open `/debug/pprof/paths?seconds=N` requests.
    path_windows: Vec<path_window::PathWindow>,
    /// Open `/debug/pprof/streams?seconds=N` requests, and each memory-mode
    /// process's recent-reference position at the last interval.
    stream_windows: Vec<stream_window::StreamWindow>,
    stream_marks: HashMap<Pid, u64>,
    /// Open `/debug/pprof/values?seconds=N` and `targets` requests, and
    /// each process's tuple profiles at the last interval.
    tuple_windows: Vec<tuple_window::TupleWindow>,
    tuple_marks: HashMap<Pid, tuple_window::TupleMark>,
    timers: Timers,
    signals: Signals,
}

/// Tracers taken out of the set during the session: their detach under
/// way on tokio's blocking pool, and what they recorded.
struct Released {
    tx: mpsc::UnboundedSender<crate::bursts::tracer::Finished>,
    rx: mpsc::UnboundedReceiver<crate::bursts::tracer::Finished>,
    /// Detaches under way.
    pending: usize,
    /// Detached: their paths go into the path profiles.
    finished: Vec<crate::bursts::tracer::Finished>,
    /// Their burst counts (and at the end everyone's), for `/metrics`.
    totals: crate::bursts::stats::BurstStats,
    /// Every traced process's name and attach time, for `summary.json`.
    attached: HashMap<Pid, summary::Attached>,
}

/// How a session went, and how `run`'s command exited.
pub(crate) struct Ended {
    /// The session: its counts, or why it failed (no profile then, or no
    /// final one).
    pub(crate) result: anyhow::Result<SessionStats>,
    /// `run`'s command, always waited for, however the session went.
    pub(crate) command: Option<anyhow::Result<ExitStatus>>,
}

/// Runs a session until it ends; `command` (for `burstyd run`) is one of
/// the end conditions, gets the session's signals, and is waited for
/// whatever happens to the session.
pub(crate) async fn run(opts: SessionOptions, sampler: Sampler, command: Option<Command>) -> Ended {
    let (result, command) = match Session::start(opts, sampler) {
        Err(e) => (Err(e), command),
        Ok(mut s) => {
            s.command = command;
            match s.run_loop().await {
                // A command that never ran (its exec failed, as a shell
                // would say in one line): no profile of it.
                Ok(_)
                    if s.command
                        .as_ref()
                        .is_some_and(|c| c.exited() && c.exec_failed()) =>
                {
                    let command = s.command.take();
                    s.abort().await;
                    (Ok(SessionStats::default()), command)
                }
                Ok(reason) => {
                    let command = s.command.take();
                    if let Some(c) = command.as_ref().filter(|c| !c.exited()) {
                        tracing::info!(
                            "the command (pid {}) is still running: it runs on untraced, and burstyd waits for it to exit",
                            c.pid()
                        );
                    }
                    (s.shutdown(reason).await, command)
                }
                Err(e) => {
                    let command = s.command.take();
                    s.abort().await;
                    (Err(e), command)
                }
            }
        }
    };
    if let (Err(e), Some(c)) = (&result, &command)
        && !c.exited()
    {
        tracing::error!(
            "{e:#}; profiling stopped, waiting for the command (pid {}) to exit",
            c.pid()
        );
    }
    let command = match command {
        Some(c) => Some(c.finish().await),
        None => None,
    };
    Ended { result, command }
}

fn ticker(every: Duration) -> Interval {
    let mut i = tokio::time::interval(every);
    i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    i
}

/// The next tick of an optional timer; never without one.
async fn tick(timer: &mut Option<Interval>) {
    match timer {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

impl Session {
    /// Everything up to the loop: signal handlers, timers, the HTTP
    /// endpoint (bound before READY=1, so a port in use fails the start),
    /// push tasks, READY=1, and the attach thread for bursty tracing.
    fn start(mut opts: SessionOptions, sampler: Sampler) -> anyhow::Result<Self> {
        let signals = Signals::new().context("reading signals (signalfd)")?;
        let started = Instant::now();
        let cpu_start = crate::sys::self_cpu_ns();
        let session_start = SystemTime::now();
        let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
        let interval = opts.interval.map(|d| interval_timer(d, Duration::ZERO));
        let meta = Meta::new(&opts, session_start);

        // Service parts: HTTP endpoint (bound before READY=1, so a port in
        // use fails the start), push tasks, the last interval profile.
        let (req_tx, req_rx) = mpsc::channel::<ProfileRequest>(16);
        let http = match &opts.service.settings.http {
            Some(listen) => {
                let s = crate::service::http::Server::start(
                    listen,
                    req_tx.clone(),
                    opts.output.clone(),
                )
                .with_context(|| format!("serving HTTP on {listen}"))?;
                tracing::info!(
                    "HTTP endpoint on {} (/debug/pprof/profile, /metrics)",
                    s.listen()
                );
                Some(s)
            }
            None => None,
        };
        let pusher = start_pusher(&opts.service.settings.push, &opts.output);
        let push_pending = pusher_pending(&pusher, session_start);
        let scanner = opts.service.scanner.take();

        // systemd: ready once the programs are loaded and attached (they
        // are: the sampler exists), then status lines and watchdog pings.
        let notify = Notifier::from_env();
        notify.ready(&format!(
            "sampling {} on {}",
            match (&opts.targets, &scanner) {
                (None, None) => "every process".to_string(),
                (None, Some(s)) =>
                    format!("targets {:?} ({} running)", s.specs(), s.current().len()),
                (Some(t), _) => format!("pid {t:?}"),
            },
            opts.event.name
        ));
        let watchdog_every = notify.watchdog_interval();
        let timers = Timers {
            deadline,
            interval,
            liveness: tokio::time::interval(Duration::from_millis(250)),
            // The eBPF side wakes us only when the ring buffer fills up;
            // otherwise we drain on this timer (see
            // burstyd_common::Config::wakeup_bytes).
            drain: ticker(Duration::from_millis(burstyd_common::DRAIN_INTERVAL_MS)),
            second: ticker(Duration::from_secs(1)),
            watchdog: tokio::time::interval(watchdog_every.unwrap_or(Duration::from_secs(3600))),
            watchdog_on: watchdog_every.is_some(),
            bursts: None,
        };

        let gate = opts.gate.take();
        let targets = opts.targets.as_deref().unwrap_or_default();
        let bursts = Bursts::start(opts.bursts.as_ref(), targets, gate);
        let mut pipe = Pipeline::new();
        // The event sampled at each PC of a process traced in bursts, from
        // the start (the samples taken while it attaches included);
        // dropped again for a process that cannot be traced.
        if bursts.attaching() {
            pipe.leaf_weights = targets.iter().map(|&p| (p, HashMap::new())).collect();
        }
        let selection = (opts.targets.is_none() && bursts.attaching()).then(|| {
            crate::bursts::selection::Selection::new(opts.service.settings.bursts.max_traced)
        });
        let (released_tx, released_rx) = mpsc::unbounded_channel();
        Ok(Session {
            opts,
            sampler,
            command: None,
            pipe,
            symbolizer: Symbolizer::with_dwarf_workers(),
            out: Output {
                started,
                cpu_start,
                session_start,
                interval_start: session_start,
                meta,
                total: Cct::new(),
                last_interval: None,
                push_pending,
            },
            svc: ServiceParts {
                http,
                req_tx,
                req_rx,
                pusher,
                scanner,
                notify,
            },
            bursts,
            selection,
            released: Released {
                tx: released_tx,
                rx: released_rx,
                pending: 0,
                finished: Vec::new(),
                totals: Default::default(),
                attached: HashMap::new(),
            },
            path_windows: Vec::new(),
            stream_windows: Vec::new(),
            stream_marks: HashMap::new(),
            tuple_windows: Vec::new(),
            tuple_marks: HashMap::new(),
            timers,
            signals,
        })
    }

    /// The event loop, until the session ends.
    async fn run_loop(&mut self) -> anyhow::Result<EndReason> {
        loop {
            tokio::select! {
                _ = tick(&mut self.timers.bursts), if self.bursts.active() => self.on_burst_timer(),
                Some(a) = self.bursts.next_attach(), if self.bursts.attaching() => self.on_attached(a),
                Some(f) = self.released.rx.recv(), if self.released.pending > 0 => self.on_detached(f),
                r = self.sampler.drain(|s| self.pipe.handle(s)) => self.on_samples(r)?,
                // (The burst timer does the same while it runs.)
                _ = self.timers.drain.tick(), if !self.bursts.active() => self.on_drain_tick(),
                sig = self.signals.recv() => {
                    if let Some(end) = self.on_signal(sig.context("reading signals")?) {
                        return Ok(end);
                    }
                }
                Some(req) = self.svc.req_rx.recv() => self.on_http_request(req),
                _ = until(self.timers.deadline), if self.timers.deadline.is_some() => {
                    return Ok(EndReason::Duration);
                }
                status = wait(&mut self.command), if self.command.is_some() => {
                    return self.on_command_exit(status);
                }
                _ = tick(&mut self.timers.interval), if self.timers.interval.is_some() => self.on_interval()?,
                _ = self.timers.watchdog.tick(), if self.timers.watchdog_on => self.on_watchdog(),
                _ = self.timers.second.tick() => self.on_second(),
                _ = self.timers.liveness.tick(), if self.command.is_none() => {
                    if self.on_liveness() {
                        return Ok(EndReason::TargetsExited);
                    }
                }
            }
        }
    }

    /// SIGINT/SIGTERM end the session, SIGHUP reloads; under `run` all
    /// three go to the command instead.
    fn on_signal(&mut self, sig: crate::sys::SigInfo) -> Option<EndReason> {
        if let Some(c) = &self.command {
            c.forward(&sig);
            return None;
        }
        if sig.signo == libc::SIGHUP {
            self.on_reload();
            return None;
        }
        Some(EndReason::Signal)
    }

    /// `run`'s command exited: the session ends.
    fn on_command_exit(
        &mut self,
        status: std::io::Result<ExitStatus>,
    ) -> anyhow::Result<EndReason> {
        let status = status.context("waiting for the command")?;
        tracing::debug!("the command exited: {status}");
        Ok(EndReason::TargetsExited)
    }

    /// Samples arrived (the eBPF side woke us): `sampler.drain` handed each
    /// to the pipeline already.
    fn on_samples(&mut self, r: Result<usize, SamplerError>) -> anyhow::Result<()> {
        r.context("reading the sample ring buffer")?;
        Ok(())
    }

    /// The HTTP windows of `open` whose time is up, taken out (the rest
    /// stay), the bursts' records so far drained for them.
    fn take_due<W>(
        &mut self,
        open: fn(&mut Session) -> &mut Vec<W>,
        end: fn(&W) -> tokio::time::Instant,
    ) -> Vec<W> {
        let now = tokio::time::Instant::now();
        let (done, rest) = std::mem::take(open(self))
            .into_iter()
            .partition(|w| end(w) <= now);
        *open(self) = rest;
        if !done.is_empty() && self.bursts.active() {
            self.on_burst_tick();
        }
        done
    }

    /// Every 100 ms: what the ring holds, and the HTTP windows whose time
    /// is up.
    pub(super) fn on_drain_tick(&mut self) {
        self.sampler.drain_now(|s| self.pipe.handle(s));
        self.follow_execs();
        self.pipe
            .finish_windows(false, &mut self.symbolizer, &self.out.meta);
        self.finish_path_windows();
        self.finish_stream_windows();
        self.finish_tuple_windows();
    }

    /// `--interval`: write the interval's profile, hand it to the push
    /// tasks, merge it into the session total.
    fn on_interval(&mut self) -> anyhow::Result<()> {
        self.sampler.drain_now(|s| self.pipe.handle(s));
        let now = SystemTime::now();
        let out = &mut self.out;
        let cct = std::mem::take(&mut self.pipe.cct);
        let interval = write_interval(
            &self.opts,
            &cct,
            &self.pipe.procs,
            &mut self.symbolizer,
            &out.meta.span(out.interval_start, now),
            Some(&self.svc.notify),
        )?;
        self.pipe.stats.profiles_written += u64::from(interval.written);
        let bytes = interval.bytes;
        if let Some(p) = &self.svc.pusher {
            push_interval(
                p,
                &mut out.push_pending,
                &cct,
                &bytes,
                out.interval_start,
                now,
                self.opts.interval,
                &self.pipe.procs,
                &mut self.symbolizer,
                &out.meta,
                false,
            );
        }
        out.last_interval = Some(bytes);
        merge(&mut out.total, cct);
        let start = std::mem::replace(&mut out.interval_start, now);
        self.write_interval_paths(start, now);
        self.write_interval_streams(start, now);
        self.write_interval_tuples(start, now);
        self.write_interval_summary();
        // What building the profiles parsed (DWARF lines, symbols) goes
        // back to the kernel, not kept by the allocator between intervals.
        crate::sys::return_free_memory();
        Ok(())
    }

    /// A profile request from an HTTP handler.
    fn on_http_request(&mut self, req: ProfileRequest) {
        self.sampler.drain_now(|s| self.pipe.handle(s));
        match req.kind {
            ProfileKind::Paths(d) => self.open_path_window(d, req.reply),
            ProfileKind::Streams(d) => self.open_stream_window(d, req.reply),
            ProfileKind::Tuples(kind, d) => self.open_tuple_window(kind, d, req.reply),
            ProfileKind::Window(d) => self.pipe.windows.push(Window {
                cct: Cct::new(),
                start: SystemTime::now(),
                end: tokio::time::Instant::now() + d,
                reply: req.reply,
            }),
            ProfileKind::Context => {
                let bytes = match &self.out.last_interval {
                    Some(b) => Ok(b.clone()),
                    None => {
                        let mut so_far = Cct::new();
                        so_far.merge(&self.out.total);
                        so_far.merge(&self.pipe.cct);
                        let p = build_profile(
                            &so_far,
                            &self.pipe.procs,
                            &mut self.symbolizer,
                            &self
                                .out
                                .meta
                                .span(self.out.session_start, SystemTime::now()),
                        );
                        encode_gzip(&p).map_err(|e| e.to_string())
                    }
                };
                let _ = req.reply.send(bytes);
            }
        }
    }

    fn on_watchdog(&self) {
        self.svc.notify.watchdog();
    }

    /// Once a second: rescan /proc for configured targets, refresh metrics.
    fn on_second(&mut self) {
        METRICS.set_kernel_counters(&self.sampler.counters());
        if let Some(s) = self.svc.scanner.as_mut() {
            scan::apply_scan(s, &mut self.sampler, &mut self.pipe.procs);
        }
        self.select_bursts();
        self.release_exited();
        self.select_hot_libraries();
        if self.bursts.active() || self.selection.is_some() {
            self.publish_traced_metrics();
        }
        METRICS.attaching.set(self.bursts.waiting().len() as u64);
        crate::bursts::progress::log_if_due();
    }

    /// Every 250 ms with `--pid`: marks exited targets; true once all have
    /// exited.
    fn on_liveness(&mut self) -> bool {
        let Some(targets) = &self.opts.targets else {
            return false;
        };
        // A zombie has exited: its parent may reap it only after the
        // session ends (a test or a script waiting on both).
        for &pid in targets {
            if !crate::sys::process_running(pid) {
                self.pipe.procs.mark_exited(pid);
            }
        }
        targets.iter().all(|&p| !crate::sys::process_running(p))
    }

    /// The end: the last samples, bursty tracing's detach and path
    /// profiles, the last interval, the pushes, `context.pb.gz`, the
    /// summary.
    async fn shutdown(mut self, reason: EndReason) -> anyhow::Result<SessionStats> {
        let cpu_loop_end = crate::sys::self_cpu_ns();
        self.svc.notify.stopping("writing the last profile");
        self.svc.http = None;
        self.pipe.stats.sampling_secs = self.out.started.elapsed().as_secs_f64();
        // Whatever is still in the ring buffer belongs to this session.
        self.sampler.drain_now(|s| self.pipe.handle(s));
        let mut finished = self.stop_bursts().await;
        // The end of the last partial interval: its path and edge profiles
        // and its context profile carry the same time, so that retention
        // counts them as one interval.
        let now = SystemTime::now();
        if self.opts.interval.is_some() && !finished.is_empty() {
            // The last partial interval's paths, like its context profile.
            self.released.finished = finished;
            self.write_interval_paths(self.out.interval_start, now);
            self.write_interval_streams(self.out.interval_start, now);
            self.write_interval_tuples(self.out.interval_start, now);
            finished = std::mem::take(&mut self.released.finished);
        }
        let counters = self.sampler.counters();
        self.write_stream_profiles(&finished);
        self.write_tuple_profiles(&finished);
        let traced = self.write_path_profiles(finished, &counters);
        drop(self.sampler);
        // The traced processes' state is gone: its free pages go back
        // before the symbolizer reads the modules' DWARF for the profile.
        crate::sys::return_free_memory();
        let mut pipe = self.pipe;
        let mut symbolizer = self.symbolizer;
        let mut out = self.out;
        let opts = self.opts;
        pipe.stats.ring_full = counters.ring_full;
        METRICS.set_kernel_counters(&counters);
        pipe.finish_windows(true, &mut symbolizer, &out.meta);
        match reason {
            EndReason::Signal => tracing::info!("signal received; writing the profile"),
            EndReason::TargetsExited => tracing::info!("target exited; writing the profile"),
            EndReason::Duration => {}
        }
        let last = std::mem::take(&mut pipe.cct);
        if opts.interval.is_some() && !last.is_empty() {
            let interval = write_interval(
                &opts,
                &last,
                &pipe.procs,
                &mut symbolizer,
                &out.meta.span(out.interval_start, now),
                None,
            )?;
            pipe.stats.profiles_written += u64::from(interval.written);
            let bytes = interval.bytes;
            if let Some(p) = &self.svc.pusher {
                push_interval(
                    p,
                    &mut out.push_pending,
                    &last,
                    &bytes,
                    out.interval_start,
                    now,
                    opts.interval,
                    &pipe.procs,
                    &mut symbolizer,
                    &out.meta,
                    true,
                );
            }
        }
        if let Some(p) = self.svc.pusher.take() {
            p.shutdown(PUSH_GRACE).await;
        }
        let mut total = out.total;
        merge(&mut total, last);
        let profile = build_profile(
            &total,
            &pipe.procs,
            &mut symbolizer,
            &out.meta.span(out.session_start, now),
        );
        let path = write_profile(&opts.output, "context.pb.gz", &profile)
            .with_context(|| format!("writing {}", opts.output.join("context.pb.gz").display()))?;
        pipe.stats.profiles_written += 1;
        METRICS.profiles_written.inc();
        pipe.stats.startup_cpu_ns = out.cpu_start;
        pipe.stats.sampling_cpu_ns = cpu_loop_end - out.cpu_start;
        pipe.stats.final_cpu_ns = crate::sys::self_cpu_ns() - cpu_loop_end;
        pipe.stats.peak_rss_bytes = crate::sys::self_peak_rss();
        let st = &pipe.stats;
        eprintln!(
            "burstyd: wrote {} — {} in {:.1}s of sampling ({}, {}); stacks truncated {}, without unwind info {}, unwind errors {}, kernel-only {}; lost to full ring buffer: {}",
            path.display(),
            crate::words::count(st.samples, "sample", "samples"),
            st.sampling_secs,
            crate::words::count(total.process_names.len() as u64, "process", "processes"),
            crate::words::count(total.threads.len() as u64, "thread", "threads"),
            st.truncated_stacks,
            st.no_unwind_info,
            st.unwind_errors,
            st.kernel_only,
            st.ring_full,
        );
        eprintln!(
            "burstyd: daemon CPU: start-up {} ms, sampling {} ms over {:.1}s ({:.2}% of one core), final profile {} ms; peak RSS {:.1} MB",
            st.startup_cpu_ns / 1_000_000,
            st.sampling_cpu_ns / 1_000_000,
            st.sampling_secs,
            100.0 * st.sampling_cpu_ns as f64 / 1e9 / st.sampling_secs.max(1e-9),
            st.final_cpu_ns / 1_000_000,
            st.peak_rss_bytes as f64 / 1e6,
        );
        let session = crate::export::summary::SessionFigures {
            sampling_seconds: st.sampling_secs,
            processes: total.process_names.len() as u64,
            threads: total.threads.len() as u64,
            startup_cpu_ms: st.startup_cpu_ns / 1_000_000,
            sampling_cpu_ms: st.sampling_cpu_ns / 1_000_000,
            final_cpu_ms: st.final_cpu_ns / 1_000_000,
            peak_rss_bytes: st.peak_rss_bytes,
        };
        summary::write(&opts, &traced, Some(&session));
        let stale = files::remove_stale_outputs(&opts.output, out.session_start);
        if !stale.is_empty() {
            tracing::info!(
                "removed {} an earlier run left in {} and this run did not write again: {}",
                crate::words::count(stale.len() as u64, "file", "files"),
                opts.output.display(),
                stale.join(", ")
            );
        }
        if st.ring_full > 0 {
            tracing::warn!(
                "{} samples were dropped because the ring buffer was full; lower --freq or raise the period",
                st.ring_full
            );
        }
        if st.samples == 0 {
            tracing::warn!(
                "no samples were recorded: was the target idle, or did it exit at once?"
            );
        }
        Ok(pipe.stats)
    }

    /// The loop failed: no profiles, but no target is left armed either
    /// (an attach under way is waited for and detached like the others).
    async fn abort(&mut self) {
        let _ = self.stop_bursts().await;
    }
}

/// `--duration`'s end; never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The exit of `run`'s command; never without one.
async fn wait(command: &mut Option<Command>) -> std::io::Result<ExitStatus> {
    match command {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// Checks `--pid` targets before anything is loaded: each must be a
/// running user-space process other than burstyd itself.
pub(crate) fn check_targets(pids: &[Pid]) -> anyhow::Result<()> {
    let me = std::process::id();
    for &pid in pids {
        if pid.0 == me {
            bail!("--pid {pid} is burstyd itself");
        }
        if !crate::sys::process_exists(pid) {
            bail!("no such process: {pid}");
        }
        // Gone between the two checks: as good as never there.
        let Some(st) = crate::sys::proc_stat(pid) else {
            bail!("no such process: {pid}");
        };
        if st.exited() {
            bail!("process {pid} has exited (zombie), nothing to profile");
        }
        // A kernel thread has no executable (and no user-space stack).
        let no_exe = matches!(crate::sys::exe_link(pid),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        if st.kernel_thread() || no_exe {
            bail!(
                "{pid} is a kernel thread ({}): burstyd profiles user-space programs; use system-wide mode to see kernel stacks",
                st.comm
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_targets_refuses_burstyd_itself() {
        let me = Pid(std::process::id());
        let e = check_targets(&[me]).unwrap_err().to_string();
        assert_eq!(e, format!("--pid {me} is burstyd itself"));
    }

    #[test]
    fn check_targets_refuses_kernel_threads_and_takes_a_process() {
        let e = check_targets(&[Pid(2)]).unwrap_err().to_string();
        assert!(e.starts_with("2 is a kernel thread (kthreadd)"), "{e}");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let r = check_targets(&[Pid(child.id())]);
        let _ = child.kill();
        let _ = child.wait();
        r.unwrap();
    }
}
