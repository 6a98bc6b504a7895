//! One profiling session: start the sampler, turn samples into calling
//! context trees as they arrive, write profiles on interval and at the end.
//!
//! The end comes from `--duration`, SIGINT/SIGTERM, or all targets exiting;
//! whichever it is, what the ring buffer still holds is drained and the last
//! profile is written before returning.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use burstyd_common::{SAMPLE_USER_REGS, SAMPLE_USTACK_SHORT, Sample};
use tokio::signal::unix::{SignalKind, signal};

use crate::export::context::{ProfileMeta, build_profile, write_profile};
use crate::export::pprof::encode_gzip;
use crate::sampling::events::{EventSpec, Sampling};
use crate::sampling::sampler::Sampler;
use crate::service::config::{Overrides, PushTarget, Settings, Source};
use crate::service::http::{ProfileKind, ProfileRequest};
use crate::service::metrics::METRICS;
use crate::service::push::{Job, Pusher};
use crate::service::targets::Scanner;
use crate::stacks::cct::Cct;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::table::ProcessTable;
use crate::stacks::unwind::{UnwindEnd, Unwinder, UserRegs};

pub(crate) struct SessionOptions {
    pub(crate) event: EventSpec,
    pub(crate) requested_event: Option<String>,
    pub(crate) sampling: Sampling,
    /// `None`: system-wide.
    pub(crate) targets: Option<Vec<u32>>,
    pub(crate) duration: Option<Duration>,
    pub(crate) interval: Option<Duration>,
    pub(crate) output: PathBuf,
    /// Bursty tracing of the targets (`--pid`/`run`), unless `--no-bursts`.
    pub(crate) bursts: Option<crate::bursts::BurstOptions>,
    pub(crate) service: Service,
}

/// The service side of a session: configuration-file targets, HTTP, push,
/// retention, reload.
pub(crate) struct Service {
    /// The effective settings (HTTP address, push targets, retention).
    pub(crate) settings: Settings,
    /// Configured target selectors, rescanned every second.
    pub(crate) scanner: Option<Scanner>,
    /// Where SIGHUP re-reads the configuration from (`None`: no file).
    pub(crate) reload: Option<Reload>,
}

pub(crate) struct Reload {
    pub(crate) source: Source,
    pub(crate) overrides: Overrides,
    /// `--pid` or `run`: the file's targets do not apply.
    pub(crate) static_targets: bool,
}

/// How long the last pushes may take at exit before they are left in the
/// spool for the next start.
const PUSH_GRACE: Duration = Duration::from_secs(5);

/// A `/debug/pprof/profile?seconds=N` request being collected.
struct Window {
    cct: Cct,
    start: SystemTime,
    end: tokio::time::Instant,
    reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}

/// Counts reported at the end of a session.
#[derive(Debug, Default, Clone)]
pub(crate) struct SessionStats {
    pub(crate) samples: u64,
    pub(crate) truncated_stacks: u64,
    pub(crate) no_unwind_info: u64,
    pub(crate) unwind_errors: u64,
    pub(crate) kernel_only: u64,
    pub(crate) ring_full: u64,
    pub(crate) profiles_written: u64,
    /// Daemon CPU before sampling began (loading eBPF, attaching), ns.
    pub(crate) startup_cpu_ns: u64,
    /// Daemon CPU while sampling (unwinding, trees, interval profiles), ns.
    pub(crate) sampling_cpu_ns: u64,
    /// Wall time of the sampling phase.
    pub(crate) sampling_secs: f64,
    /// Daemon CPU for the final drain and profile (symbolization), ns.
    pub(crate) final_cpu_ns: u64,
    pub(crate) peak_rss_bytes: u64,
}

/// Why the session loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndReason {
    Duration,
    Signal,
    TargetsExited,
}

/// Turns raw samples into CCT entries.
struct Pipeline {
    procs: ProcessTable,
    unwinder: Unwinder,
    cct: Cct,
    stats: SessionStats,
    frames: Vec<u64>,
    /// Open HTTP profile windows: every sample also goes into each.
    windows: Vec<Window>,
    /// For processes traced in bursts: event weight per sampled PC (the
    /// original address), to attribute the event to paths.
    leaf_weights: HashMap<u32, HashMap<u64, u64>>,
}

impl Pipeline {
    fn handle(&mut self, s: &Sample) {
        self.stats.samples += 1;
        METRICS.samples.inc();
        let thread_name = comm_str(&s.comm);
        self.cct.process_names.entry(s.pid).or_insert_with(|| {
            std::fs::read_to_string(format!("/proc/{}/comm", s.pid))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_else(|_| thread_name.to_owned())
        });
        let kernel = &s.kstack[..(s.kstack_len as usize).min(s.kstack.len())];
        self.frames.clear();
        let mut truncated = false;
        if s.flags & SAMPLE_USER_REGS != 0 {
            let regs = UserRegs {
                rip: s.rip,
                rsp: s.rsp,
                rbp: s.rbp,
            };
            let stack = &s.ustack[..(s.ustack_len as usize).min(s.ustack.len())];
            let end = self
                .unwinder
                .unwind(&mut self.procs, s.pid, &regs, stack, &mut self.frames);
            match end {
                UnwindEnd::Complete => {}
                UnwindEnd::StackTruncated | UnwindEnd::MaxDepth => {
                    truncated = true;
                    self.stats.truncated_stacks += 1;
                    METRICS.truncated_stacks.inc();
                }
                UnwindEnd::NoUnwindInfo => {
                    truncated = true;
                    self.stats.no_unwind_info += 1;
                }
                UnwindEnd::Error => {
                    truncated = true;
                    self.stats.unwind_errors += 1;
                }
            }
            if s.flags & SAMPLE_USTACK_SHORT != 0 && s.ustack_len == 0 {
                truncated = true;
            }
        } else {
            self.stats.kernel_only += 1;
        }
        self.cct.add(
            s.pid,
            s.tid,
            thread_name,
            &self.frames,
            kernel,
            truncated,
            s.period.max(1),
        );
        if let Some(m) = self.leaf_weights.get_mut(&s.pid)
            && let Some(&pc) = self.frames.first()
        {
            *m.entry(pc).or_insert(0) += s.period.max(1);
        }
        for w in &mut self.windows {
            if !w.cct.process_names.contains_key(&s.pid)
                && let Some(n) = self.cct.process_names.get(&s.pid)
            {
                w.cct.process_names.insert(s.pid, n.clone());
            }
            w.cct.add(
                s.pid,
                s.tid,
                thread_name,
                &self.frames,
                kernel,
                truncated,
                s.period.max(1),
            );
        }
    }

    /// Answers the windows whose time is up (all of them with `all`).
    fn finish_windows(
        &mut self,
        all: bool,
        symbolizer: &mut Symbolizer,
        meta: &dyn Fn(SystemTime, SystemTime) -> ProfileMeta,
    ) {
        if self.windows.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        let (done, open): (Vec<Window>, Vec<Window>) = std::mem::take(&mut self.windows)
            .into_iter()
            .partition(|w| all || w.end <= now);
        self.windows = open;
        for w in done {
            let p = build_profile(
                &w.cct,
                &self.procs,
                symbolizer,
                &meta(w.start, SystemTime::now()),
            );
            let _ = w.reply.send(encode_gzip(&p).map_err(|e| e.to_string()));
        }
    }
}

fn interval_timer(d: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

fn start_pusher(targets: &[PushTarget], output: &Path) -> Option<Pusher> {
    (!targets.is_empty()).then(|| {
        for t in targets {
            tracing::info!(
                "pushing profiles to {:?} at {} as {} every {:?}",
                t.kind,
                t.url,
                t.app,
                t.interval
            );
        }
        Pusher::start(targets, &output.join("spool"))
    })
}

/// Per push target, the trees not pushed yet (targets whose interval is
/// longer than the profile interval) and when they start.
fn pusher_pending(p: &Option<Pusher>, start: SystemTime) -> Vec<(Cct, SystemTime)> {
    p.as_ref()
        .map(|p| p.targets().map(|_| (Cct::new(), start)).collect())
        .unwrap_or_default()
}

/// Writes one interval profile (and prunes old ones); returns its bytes.
fn write_interval(
    opts: &SessionOptions,
    cct: &Cct,
    procs: &ProcessTable,
    symbolizer: &mut Symbolizer,
    meta: &ProfileMeta,
    notify: Option<&crate::service::notify::Notifier>,
) -> anyhow::Result<Vec<u8>> {
    let name = format!("context-{}.pb.gz", timestamp(meta.end));
    let profile = build_profile(cct, procs, symbolizer, meta);
    let bytes = encode_gzip(&profile)?;
    let path = crate::export::write_atomic(&opts.output, &name, &bytes)
        .with_context(|| format!("writing {}", opts.output.join(&name).display()))?;
    tracing::info!("wrote {} ({} samples)", path.display(), cct.samples);
    if let Some(n) = notify {
        n.status(&format!(
            "wrote {} ({} samples)",
            path.display(),
            cct.samples
        ));
    }
    METRICS.profiles_written.inc();
    let s = &opts.service.settings;
    if s.keep.is_some() || s.max_age.is_some() {
        prune_output(&opts.output, s.keep, s.max_age);
    }
    Ok(bytes)
}

/// Hands an interval profile to each push target: as is when the target's
/// interval is the profile interval, else merged until its interval is
/// covered. `last`: the session ends, push whatever is pending.
#[allow(clippy::too_many_arguments)]
fn push_interval(
    pusher: &Pusher,
    pending: &mut [(Cct, SystemTime)],
    cct: &Cct,
    bytes: &[u8],
    start: SystemTime,
    end: SystemTime,
    profile_interval: Option<Duration>,
    procs: &ProcessTable,
    symbolizer: &mut Symbolizer,
    meta: &dyn Fn(SystemTime, SystemTime) -> ProfileMeta,
    last: bool,
) {
    let m = meta(start, end);
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let job = |from: SystemTime, profile: Vec<u8>| Job {
        from: unix(from),
        until: unix(end).max(unix(from) + 1),
        rate_hz: m.freq,
        event: m.event.clone(),
        profile,
    };
    let iv = profile_interval.unwrap_or_default();
    for (i, t) in pusher.targets().enumerate() {
        let Some((acc, acc_start)) = pending.get_mut(i) else {
            continue;
        };
        if t.interval.as_secs_f64() <= iv.as_secs_f64() * 1.05 && acc.is_empty() {
            pusher.submit(i, job(start, bytes.to_vec()));
            *acc_start = end;
            continue;
        }
        if acc.is_empty() {
            *acc_start = start;
        }
        acc.merge(cct);
        let covered = end.duration_since(*acc_start).unwrap_or_default();
        if last || covered.as_secs_f64() >= t.interval.as_secs_f64() * 0.95 {
            let p = build_profile(acc, procs, symbolizer, &meta(*acc_start, end));
            match encode_gzip(&p) {
                Ok(b) => pusher.submit(i, job(*acc_start, b)),
                Err(e) => tracing::warn!("encoding a profile to push: {e}"),
            }
            *acc = Cct::new();
            *acc_start = end;
        }
    }
}

/// One rescan of the configured targets: new pids into `TARGETS`, exited
/// or no longer matching ones out.
fn apply_scan(scanner: &mut Scanner, sampler: &mut Sampler, procs: &mut ProcessTable) {
    let change = scanner.scan();
    for pid in change.added {
        match sampler.add_target(pid) {
            Ok(()) => tracing::info!("target pid {pid} ({}) appeared; sampling it", comm_of(pid)),
            Err(e) => tracing::warn!("adding target pid {pid}: {e}"),
        }
    }
    for pid in change.removed {
        if let Err(e) = sampler.remove_target(pid) {
            tracing::warn!("removing target pid {pid}: {e}");
        }
        if !crate::sys::process_running(pid) {
            procs.mark_exited(pid);
            tracing::info!("target pid {pid} exited");
        } else {
            tracing::info!("pid {pid} no longer matches the targets; not sampling it");
        }
    }
    METRICS.targets.set(scanner.current().len() as u64);
}

fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_owned())
        .unwrap_or_else(|_| "?".into())
}

/// SIGHUP: re-reads the configuration; a bad file is rejected whole (with
/// its line and reason) and the running settings stay.
fn reload(
    opts: &mut SessionOptions,
    sampler: &mut Sampler,
    scanner: &mut Option<Scanner>,
    http: &mut Option<crate::service::http::Server>,
    req_tx: &tokio::sync::mpsc::Sender<ProfileRequest>,
    pusher: &mut Option<Pusher>,
    notify: &crate::service::notify::Notifier,
) {
    let Some(r) = &opts.service.reload else {
        tracing::info!("SIGHUP: no configuration file in use; nothing to reload");
        return;
    };
    let new = crate::service::config::load(&r.source)
        .map_err(anyhow::Error::from)
        .and_then(|f| Settings::resolve(f.as_ref(), Some(&r.source.path), &r.overrides));
    let new = match new {
        Ok(n) => n,
        Err(e) => {
            METRICS.config_reload_failures.inc();
            tracing::error!(
                "configuration reload rejected, the previous configuration stays in force: {e:#}"
            );
            notify.status(&format!(
                "configuration reload rejected (previous one in force): {e:#}"
            ));
            return;
        }
    };
    let old = opts.service.settings.clone();
    if new.event != old.event
        || new.sampling != old.sampling
        || new.kernel_stacks != old.kernel_stacks
    {
        tracing::warn!(
            "event, period/freq and kernel_stacks changes take effect at the next start (systemctl restart burstyd)"
        );
    }
    if !r.static_targets && new.targets != old.targets {
        let was = scanner.is_some();
        let now_targeted = !new.targets.is_empty();
        if now_targeted {
            let s = scanner.get_or_insert_with(|| Scanner::new(Vec::new()));
            s.set_specs(new.targets.clone());
            if !was && let Err(e) = sampler.set_targeted(true) {
                tracing::error!("switching to targeted sampling: {e}");
            }
            apply_scan(s, sampler, &mut ProcessTable::new());
            tracing::info!("targets now {:?}: pids {:?}", new.targets, s.current());
        } else if let Some(mut s) = scanner.take() {
            s.set_specs(Vec::new());
            for pid in s.scan().removed {
                let _ = sampler.remove_target(pid);
            }
            if let Err(e) = sampler.set_targeted(false) {
                tracing::error!("switching to system-wide sampling: {e}");
            }
            METRICS.targets.set(0);
            tracing::info!("no targets configured: sampling every process");
        }
    }
    if new.output != old.output {
        opts.output = new.output.clone();
        if let Some(h) = http.as_ref() {
            h.set_output(new.output.clone());
        }
    }
    opts.interval = new.interval;
    if new.http != old.http {
        match new.http {
            None => {
                *http = None;
                tracing::info!("HTTP endpoint off");
            }
            Some(addr) => {
                match crate::service::http::Server::start(addr, req_tx.clone(), opts.output.clone())
                {
                    Ok(s) => {
                        tracing::info!("HTTP endpoint now on http://{}/", s.addr());
                        *http = Some(s);
                    }
                    Err(e) => {
                        tracing::error!("serving HTTP on {addr}: {e}; the endpoint stays as it was")
                    }
                }
            }
        }
    }
    if new.push != old.push || new.output != old.output {
        // Dropping the old tasks leaves their spooled profiles on disk; the
        // new task of the same destination sends them.
        *pusher = None;
        *pusher = start_pusher(&new.push, &opts.output);
    }
    let path = r.source.path.display().to_string();
    opts.service.settings = new;
    METRICS.config_reloads.inc();
    tracing::info!("configuration reloaded from {path}");
    notify.status(&format!("configuration reloaded from {path}"));
}

/// Deletes interval profiles beyond the newest `keep` and older than
/// `max_age`.
fn prune_output(dir: &Path, keep: Option<usize>, max_age: Option<Duration>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(String, PathBuf)> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().into_string().ok()?;
            (n.starts_with("context-") && n.ends_with(".pb.gz")).then(|| (n, e.path()))
        })
        .collect();
    // The names are UTC timestamps: sorting by name sorts by time.
    files.sort();
    let now = SystemTime::now();
    let n = files.len();
    for (i, (_, path)) in files.iter().enumerate() {
        let too_many = keep.is_some_and(|k| n - i > k);
        let too_old = max_age.is_some_and(|age| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|a| a > age)
        });
        if (too_many || too_old)
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!("removing old profile {}: {e}", path.display());
        }
    }
}

fn comm_str(comm: &[u8; 16]) -> &str {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    std::str::from_utf8(&comm[..end]).unwrap_or("?")
}

/// Runs a session until it ends; `child` (for `burstyd run`) is awaited as
/// one of the end conditions and its exit status returned.
pub(crate) async fn run(
    mut opts: SessionOptions,
    mut sampler: Sampler,
    mut child: Option<tokio::process::Child>,
) -> anyhow::Result<(SessionStats, Option<std::process::ExitStatus>)> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let mut pipe = Pipeline {
        procs: ProcessTable::new(),
        unwinder: Unwinder::new(),
        cct: Cct::new(),
        stats: SessionStats::default(),
        frames: Vec::with_capacity(256),
        windows: Vec::new(),
        leaf_weights: HashMap::new(),
    };
    let mut symbolizer = Symbolizer::new();
    let started = Instant::now();
    let cpu_start = crate::sys::self_cpu_ns();
    let mut interval_start = SystemTime::now();
    let session_start = interval_start;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut interval = opts.interval.map(interval_timer);
    let mut liveness = tokio::time::interval(Duration::from_millis(250));
    // The eBPF side wakes us only when the ring buffer fills up; otherwise
    // we drain on this timer (see burstyd_common::WAKEUP_BYTES).
    let mut drain_tick =
        tokio::time::interval(Duration::from_millis(burstyd_common::DRAIN_INTERVAL_MS));
    drain_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Once a second: rescan /proc for configured targets, refresh metrics.
    let mut second_tick = tokio::time::interval(Duration::from_secs(1));
    second_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut exit_status = None;
    // With --interval, each interval's trees are written and then merged
    // into the session total that becomes context.pb.gz.
    let mut total = Cct::new();
    let base_meta = ProfileMeta {
        event: opts.event.name.clone(),
        requested_event: opts.requested_event.clone(),
        period: match opts.sampling {
            Sampling::Period(p) => p,
            Sampling::Frequency(_) => 0,
        },
        freq: match opts.sampling {
            Sampling::Frequency(f) => f,
            Sampling::Period(_) => 0,
        },
        start: session_start,
        end: session_start,
    };
    let meta = |start, end| ProfileMeta {
        start,
        end,
        ..base_meta.clone()
    };

    // Service parts: HTTP endpoint (bound before READY=1, so a port in use
    // fails the start), push tasks, the last interval profile.
    let (req_tx, mut req_rx) = tokio::sync::mpsc::channel::<ProfileRequest>(16);
    let mut http = match opts.service.settings.http {
        Some(addr) => {
            let s = crate::service::http::Server::start(addr, req_tx.clone(), opts.output.clone())
                .with_context(|| format!("serving HTTP on {addr}"))?;
            tracing::info!(
                "HTTP endpoint on http://{}/ (/debug/pprof/profile, /metrics)",
                s.addr()
            );
            Some(s)
        }
        None => None,
    };
    let mut pusher = start_pusher(&opts.service.settings.push, &opts.output);
    let mut push_pending: Vec<(Cct, SystemTime)> = pusher_pending(&pusher, session_start);
    let mut last_interval: Option<Vec<u8>> = None;
    let mut scanner = opts.service.scanner.take();

    // systemd: ready once the programs are loaded and attached (they are:
    // the sampler exists), then status lines and watchdog pings.
    let notify = crate::service::notify::Notifier::from_env();
    notify.ready(&format!(
        "sampling {} on {}",
        match (&opts.targets, &scanner) {
            (None, None) => "every process".to_string(),
            (None, Some(s)) => format!("targets {:?} ({} running)", s.specs(), s.current().len()),
            (Some(t), _) => format!("pid {t:?}"),
        },
        opts.event.name
    ));
    let watchdog_every = notify.watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(Duration::from_secs(3600)));

    let mut bursts = crate::bursts::Bursts::start(
        opts.bursts.as_ref(),
        opts.targets.as_deref().unwrap_or_default(),
        &mut sampler,
    );
    bursts.register_clone_frames(&mut pipe.procs);
    pipe.leaf_weights = bursts.pids().map(|p| (p, HashMap::new())).collect();
    let mut burst_tick = tokio::time::interval(bursts.drain_interval());
    burst_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let reason = loop {
        tokio::select! {
            _ = burst_tick.tick(), if bursts.active() => bursts.drain(),
            r = sampler.drain(|s| pipe.handle(s)) => { r.context("reading the sample ring buffer")?; }
            _ = drain_tick.tick() => {
                sampler.drain_now(|s| pipe.handle(s));
                pipe.finish_windows(false, &mut symbolizer, &meta);
            }
            _ = sigint.recv() => break EndReason::Signal,
            _ = sigterm.recv() => break EndReason::Signal,
            _ = sighup.recv() => {
                reload(&mut opts, &mut sampler, &mut scanner, &mut http, &req_tx, &mut pusher, &notify);
                interval = opts.interval.map(interval_timer);
                push_pending = pusher_pending(&pusher, SystemTime::now());
            }
            Some(req) = req_rx.recv() => {
                sampler.drain_now(|s| pipe.handle(s));
                match req.kind {
                    ProfileKind::Window(d) => pipe.windows.push(Window {
                        cct: Cct::new(),
                        start: SystemTime::now(),
                        end: tokio::time::Instant::now() + d,
                        reply: req.reply,
                    }),
                    ProfileKind::Context => {
                        let bytes = match &last_interval {
                            Some(b) => Ok(b.clone()),
                            None => {
                                let mut so_far = Cct::new();
                                so_far.merge(&total);
                                so_far.merge(&pipe.cct);
                                let p = build_profile(&so_far, &pipe.procs, &mut symbolizer, &meta(session_start, SystemTime::now()));
                                encode_gzip(&p).map_err(|e| e.to_string())
                            }
                        };
                        let _ = req.reply.send(bytes);
                    }
                }
            }
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() => break EndReason::Duration,
            status = async { child.as_mut().unwrap().wait().await }, if child.is_some() && exit_status.is_none() => {
                exit_status = Some(status.context("waiting for the command")?);
                break EndReason::TargetsExited;
            }
            _ = async { interval.as_mut().unwrap().tick().await }, if interval.is_some() => {
                sampler.drain_now(|s| pipe.handle(s));
                let now = SystemTime::now();
                let cct = std::mem::take(&mut pipe.cct);
                let bytes = write_interval(&opts, &cct, &pipe.procs, &mut symbolizer, &meta(interval_start, now), Some(&notify))?;
                pipe.stats.profiles_written += 1;
                if let Some(p) = &pusher {
                    push_interval(p, &mut push_pending, &cct, &bytes, interval_start, now, opts.interval, &pipe.procs, &mut symbolizer, &meta, false);
                }
                last_interval = Some(bytes);
                merge(&mut total, cct);
                interval_start = now;
            }
            _ = watchdog.tick(), if watchdog_every.is_some() => notify.watchdog(),
            _ = second_tick.tick() => {
                METRICS.ring_drops.set(sampler.counters().ring_full);
                if let Some(s) = scanner.as_mut() {
                    apply_scan(s, &mut sampler, &mut pipe.procs);
                }
            }
            _ = liveness.tick(), if child.is_none() => {
                if let Some(targets) = &opts.targets {
                    for &pid in targets {
                        if !crate::sys::process_exists(pid) {
                            pipe.procs.mark_exited(pid);
                        }
                    }
                    if targets.iter().all(|&p| !crate::sys::process_exists(p)) {
                        break EndReason::TargetsExited;
                    }
                }
            }
        }
    };
    let cpu_loop_end = crate::sys::self_cpu_ns();
    notify.stopping("writing the last profile");
    drop(http);
    pipe.stats.sampling_secs = started.elapsed().as_secs_f64();
    if let (Some(c), None) = (&child, exit_status) {
        tracing::info!(
            "the command (pid {}) is still running; it is left to run untraced",
            c.id().unwrap_or(0)
        );
    }
    // Whatever is still in the ring buffer belongs to this session.
    sampler.drain_now(|s| pipe.handle(s));
    let counters = sampler.counters();
    bursts.finish(
        &mut sampler,
        &opts.output,
        &opts.event.name,
        &counters,
        &pipe.leaf_weights,
    );
    drop(sampler);
    pipe.stats.ring_full = counters.ring_full;
    METRICS.ring_drops.set(counters.ring_full);
    pipe.finish_windows(true, &mut symbolizer, &meta);
    match reason {
        EndReason::Signal => tracing::info!("signal received; writing the profile"),
        EndReason::TargetsExited => tracing::info!("target exited; writing the profile"),
        EndReason::Duration => {}
    }
    let now = SystemTime::now();
    let last = std::mem::take(&mut pipe.cct);
    if opts.interval.is_some() && !last.is_empty() {
        let bytes = write_interval(
            &opts,
            &last,
            &pipe.procs,
            &mut symbolizer,
            &meta(interval_start, now),
            None,
        )?;
        pipe.stats.profiles_written += 1;
        if let Some(p) = &pusher {
            push_interval(
                p,
                &mut push_pending,
                &last,
                &bytes,
                interval_start,
                now,
                opts.interval,
                &pipe.procs,
                &mut symbolizer,
                &meta,
                true,
            );
        }
    }
    if let Some(p) = pusher.take() {
        p.shutdown(PUSH_GRACE).await;
    }
    merge(&mut total, last);
    let profile = build_profile(
        &total,
        &pipe.procs,
        &mut symbolizer,
        &meta(session_start, now),
    );
    let path = write_profile(&opts.output, "context.pb.gz", &profile)
        .with_context(|| format!("writing {}", opts.output.join("context.pb.gz").display()))?;
    pipe.stats.profiles_written += 1;
    METRICS.profiles_written.inc();
    pipe.stats.startup_cpu_ns = cpu_start;
    pipe.stats.sampling_cpu_ns = cpu_loop_end - cpu_start;
    pipe.stats.final_cpu_ns = crate::sys::self_cpu_ns() - cpu_loop_end;
    pipe.stats.peak_rss_bytes = crate::sys::self_peak_rss();
    let st = &pipe.stats;
    eprintln!(
        "burstyd: wrote {} — {} samples in {:.1}s of sampling ({} processes, {} threads); stacks truncated {}, without unwind info {}, unwind errors {}, kernel-only {}; lost to full ring buffer: {}",
        path.display(),
        st.samples,
        st.sampling_secs,
        total.process_names.len(),
        total.threads.len(),
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
    if st.ring_full > 0 {
        tracing::warn!(
            "{} samples were dropped because the ring buffer was full; lower --freq or raise the period",
            st.ring_full
        );
    }
    if st.samples == 0 {
        tracing::warn!("no samples were recorded: was the target idle, or did it exit at once?");
    }
    Ok((pipe.stats, exit_status))
}

/// Adds `from`'s trees into `into`.
fn merge(into: &mut Cct, from: Cct) {
    if into.threads.is_empty() {
        *into = from;
    } else {
        into.merge(&from);
    }
}

/// UTC, `YYYYmmddTHHMMSS.mmmZ` (milliseconds, so that a final partial
/// interval never overwrites the one before it), without a date crate.
fn timestamp(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = secs / 86400;
    let rem = secs % 86400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Checks `--pid` targets before anything is loaded.
pub(crate) fn check_targets(pids: &[u32]) -> anyhow::Result<()> {
    for &pid in pids {
        if !crate::sys::process_exists(pid) {
            bail!("no such process: {pid}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_are_utc_civil() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_042);
        // 2026-11-18 11:06:40 UTC
        assert_eq!(super::timestamp(t), "20261118T110640.042Z");
    }
}
