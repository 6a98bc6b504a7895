//! One profiling session: start the sampler, turn samples into calling
//! context trees as they arrive, write profiles on interval and at the end.
//!
//! The end comes from `--duration`, SIGINT/SIGTERM, or all targets exiting;
//! whichever it is, what the ring buffer still holds is drained and the last
//! profile is written before returning.
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use burstyd_common::{SAMPLE_USER_REGS, SAMPLE_USTACK_SHORT, Sample};
use tokio::signal::unix::{SignalKind, signal};

use crate::cct::Cct;
use crate::events::{EventSpec, Sampling};
use crate::export::{ProfileMeta, build_profile, write_profile};
use crate::procs::ProcessTable;
use crate::sampler::Sampler;
use crate::symbolize::Symbolizer;
use crate::unwind::{UnwindEnd, Unwinder, UserRegs};

pub struct SessionOptions {
    pub event: EventSpec,
    pub requested_event: Option<String>,
    pub sampling: Sampling,
    /// `None`: system-wide.
    pub targets: Option<Vec<u32>>,
    pub kernel_stacks: bool,
    pub duration: Option<Duration>,
    pub interval: Option<Duration>,
    pub output: PathBuf,
}

/// Counts reported at the end of a session.
#[derive(Debug, Default, Clone)]
pub struct SessionStats {
    pub samples: u64,
    pub truncated_stacks: u64,
    pub no_unwind_info: u64,
    pub unwind_errors: u64,
    pub kernel_only: u64,
    pub ring_full: u64,
    pub profiles_written: u64,
    /// Daemon CPU before sampling began (loading eBPF, attaching), ns.
    pub startup_cpu_ns: u64,
    /// Daemon CPU while sampling (unwinding, trees, interval profiles), ns.
    pub sampling_cpu_ns: u64,
    /// Wall time of the sampling phase.
    pub sampling_secs: f64,
    /// Daemon CPU for the final drain and profile (symbolization), ns.
    pub final_cpu_ns: u64,
    pub peak_rss_bytes: u64,
}

/// Why the session loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
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
}

impl Pipeline {
    fn handle(&mut self, s: &Sample) {
        self.stats.samples += 1;
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
    }
}

fn comm_str(comm: &[u8; 16]) -> &str {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    std::str::from_utf8(&comm[..end]).unwrap_or("?")
}

/// Runs a session until it ends; `child` (for `burstyd run`) is awaited as
/// one of the end conditions and its exit status returned.
pub async fn run(
    opts: SessionOptions,
    mut sampler: Sampler,
    mut child: Option<tokio::process::Child>,
) -> anyhow::Result<(SessionStats, Option<std::process::ExitStatus>)> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut pipe = Pipeline {
        procs: ProcessTable::new(),
        unwinder: Unwinder::new(),
        cct: Cct::new(),
        stats: SessionStats::default(),
        frames: Vec::with_capacity(256),
    };
    let mut symbolizer = Symbolizer::new();
    let started = Instant::now();
    let cpu_start = crate::sys::self_cpu_ns();
    let mut interval_start = SystemTime::now();
    let session_start = interval_start;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut interval = opts.interval.map(|d| {
        let mut i = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let mut liveness = tokio::time::interval(Duration::from_millis(250));
    // The eBPF side wakes us only when the ring buffer fills up; otherwise
    // we drain on this timer (see burstyd_common::WAKEUP_BYTES).
    let mut drain_tick =
        tokio::time::interval(Duration::from_millis(burstyd_common::DRAIN_INTERVAL_MS));
    drain_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut exit_status = None;
    // With --interval, each interval's trees are written and then merged
    // into the session total that becomes context.pb.gz.
    let mut total = Cct::new();
    let meta = |start, end| ProfileMeta {
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
        start,
        end,
    };

    // systemd: ready once the programs are loaded and attached (they are:
    // the sampler exists), then status lines and watchdog pings.
    let notify = crate::notify::Notifier::from_env();
    notify.ready(&format!(
        "sampling {} on {}",
        match &opts.targets {
            None => "every process".to_string(),
            Some(t) => format!("pid {t:?}"),
        },
        opts.event.name
    ));
    let watchdog_every = notify.watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(Duration::from_secs(3600)));

    let reason = loop {
        tokio::select! {
            r = sampler.drain(|s| pipe.handle(s)) => { r.context("reading the sample ring buffer")?; }
            _ = drain_tick.tick() => { sampler.drain_now(|s| pipe.handle(s)); }
            _ = sigint.recv() => break EndReason::Signal,
            _ = sigterm.recv() => break EndReason::Signal,
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() => break EndReason::Duration,
            status = async { child.as_mut().unwrap().wait().await }, if child.is_some() && exit_status.is_none() => {
                exit_status = Some(status.context("waiting for the command")?);
                break EndReason::TargetsExited;
            }
            _ = async { interval.as_mut().unwrap().tick().await }, if interval.is_some() => {
                sampler.drain_now(|s| pipe.handle(s));
                let now = SystemTime::now();
                let cct = std::mem::take(&mut pipe.cct);
                let name = format!("context-{}.pb.gz", timestamp(now));
                let profile = build_profile(&cct, &pipe.procs, &mut symbolizer, &meta(interval_start, now));
                let path = write_profile(&opts.output, &name, &profile)
                    .with_context(|| format!("writing {}", opts.output.join(&name).display()))?;
                tracing::info!("wrote {} ({} samples)", path.display(), cct.samples);
                notify.status(&format!("wrote {} ({} samples)", path.display(), cct.samples));
                pipe.stats.profiles_written += 1;
                merge(&mut total, cct);
                interval_start = now;
            }
            _ = watchdog.tick(), if watchdog_every.is_some() => notify.watchdog(),
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
    drop(sampler);
    pipe.stats.ring_full = counters.ring_full;
    match reason {
        EndReason::Signal => tracing::info!("signal received; writing the profile"),
        EndReason::TargetsExited => tracing::info!("target exited; writing the profile"),
        EndReason::Duration => {}
    }
    let now = SystemTime::now();
    let last = std::mem::take(&mut pipe.cct);
    if opts.interval.is_some() && !last.is_empty() {
        let name = format!("context-{}.pb.gz", timestamp(now));
        let profile = build_profile(
            &last,
            &pipe.procs,
            &mut symbolizer,
            &meta(interval_start, now),
        );
        write_profile(&opts.output, &name, &profile)?;
        pipe.stats.profiles_written += 1;
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
pub fn check_targets(pids: &[u32]) -> anyhow::Result<()> {
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
