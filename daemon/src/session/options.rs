//! What a session is asked to do ([`SessionOptions`], with its service
//! side) and what it counts ([`SessionStats`]).
use std::path::PathBuf;
use std::time::Duration;

use burstyd_common::addr::Pid;

use crate::sampling::events::{EventSpec, Sampling};
use crate::service::config::Source;
use crate::service::settings::{Overrides, Settings};
use crate::service::targets::Scanner;

pub(crate) struct SessionOptions {
    pub(crate) event: EventSpec,
    pub(crate) requested_event: Option<String>,
    pub(crate) sampling: Sampling,
    /// `None`: system-wide.
    pub(crate) targets: Option<Vec<Pid>>,
    pub(crate) duration: Option<Duration>,
    pub(crate) interval: Option<Duration>,
    pub(crate) output: PathBuf,
    /// Bursty tracing of the targets (`--pid`/`run`), unless `--no-bursts`.
    pub(crate) bursts: Option<crate::bursts::options::BurstOptions>,
    /// `run`'s gate, to be closed once the attach thread is ready to hold
    /// the command at its entry point (see [`Bursts::start`]); closing it
    /// releases the command.
    pub(crate) gate: Option<std::os::fd::OwnedFd>,
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
