//! Which hardware or software event drives sampling, and how often.
//!
//! Hardware events need a PMU. Many VMs (ours included) have none; then we
//! fall back to the `cpu-clock` software event, say so once, and record the
//! event actually used in the profile.
use aya::programs::perf_event::{HardwareEvent, PerfEventConfig, SoftwareEvent};

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_RAW: u32 = 4;

/// Default sampling frequency per CPU (Hz), used when neither `--freq` nor
/// `--period` is given. Chosen from bench/overhead.sh: see README.md
/// ("Overhead") for the measured slowdown at this setting.
pub(crate) const DEFAULT_FREQ: u64 = 199;

#[derive(Clone, Debug)]
pub(crate) struct EventSpec {
    /// The name recorded in the profile (`<name>/<unit>`, see [`unit`]).
    pub(crate) name: String,
    pub(crate) config: PerfEventConfig,
    /// perf `type`/`config` pair, for probing support.
    pub(crate) type_: u32,
    pub(crate) raw_config: u64,
}

impl EventSpec {
    fn is_hardware(&self) -> bool {
        self.type_ == PERF_TYPE_HARDWARE || self.type_ == PERF_TYPE_RAW
    }

    fn cpu_clock() -> Self {
        Self::software("cpu-clock", SoftwareEvent::CpuClock)
    }

    fn software(name: &str, ev: SoftwareEvent) -> Self {
        EventSpec {
            name: name.into(),
            config: PerfEventConfig::Software(ev),
            type_: PERF_TYPE_SOFTWARE,
            raw_config: ev as u32 as u64,
        }
    }

    fn hardware(name: &str, ev: HardwareEvent) -> Self {
        EventSpec {
            name: name.into(),
            config: PerfEventConfig::Hardware(ev),
            type_: PERF_TYPE_HARDWARE,
            raw_config: ev as u32 as u64,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "unknown event `{0}`; known events: cycles, instructions, cache-misses, cache-references, branch-misses, branch-instructions, cpu-clock, task-clock, page-faults, rNNNN (raw hex)"
)]
pub(crate) struct UnknownEvent(String);

pub(crate) fn parse_event(name: &str) -> Result<EventSpec, UnknownEvent> {
    use HardwareEvent as H;
    use SoftwareEvent as S;
    Ok(match name {
        "cycles" | "cpu-cycles" => EventSpec::hardware("cycles", H::CpuCycles),
        "instructions" => EventSpec::hardware("instructions", H::Instructions),
        "cache-misses" => EventSpec::hardware("cache-misses", H::CacheMisses),
        "cache-references" => EventSpec::hardware("cache-references", H::CacheReferences),
        "branch-misses" => EventSpec::hardware("branch-misses", H::BranchMisses),
        "branch-instructions" | "branches" => {
            EventSpec::hardware("branch-instructions", H::BranchInstructions)
        }
        "cpu-clock" => EventSpec::software("cpu-clock", S::CpuClock),
        "task-clock" => EventSpec::software("task-clock", S::TaskClock),
        "page-faults" | "faults" => EventSpec::software("page-faults", S::PageFaults),
        raw if raw.len() > 1 && raw.starts_with('r') => {
            let id = u64::from_str_radix(&raw[1..], 16).map_err(|_| UnknownEvent(name.into()))?;
            EventSpec {
                name: raw.into(),
                config: PerfEventConfig::Raw { event_id: id },
                type_: PERF_TYPE_RAW,
                raw_config: id,
            }
        }
        _ => return Err(UnknownEvent(name.into())),
    })
}

/// The unit of event `name`'s values in a profile (its pprof sample type
/// and period type): the software clocks count nanoseconds (their period
/// is a time: each sample weighs the nanoseconds since the last one), so
/// `go tool pprof` shows their profiles as time; every other event
/// (hardware, raw, page-faults) counts occurrences.
pub(crate) fn unit(name: &str) -> &'static str {
    match name {
        "cpu-clock" | "task-clock" => "nanoseconds",
        _ => "count",
    }
}

/// How often to sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sampling {
    /// One sample every N events.
    Period(u64),
    /// N samples per second per CPU (the kernel adapts the period).
    Frequency(u64),
}

impl std::fmt::Display for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sampling::Frequency(hz) => write!(f, "{hz} Hz"),
            Sampling::Period(1) => write!(f, "every event"),
            Sampling::Period(n) => write!(f, "one sample every {n} events"),
        }
    }
}

/// Where the kernel keeps its limit on sampling frequencies.
const MAX_SAMPLE_RATE: &str = "/proc/sys/kernel/perf_event_max_sample_rate";

/// Checks `sampling` against the kernel's limits before anything starts:
/// a frequency above `kernel.perf_event_max_sample_rate` (which the kernel
/// also lowers by itself when sampling interrupts take too long) makes
/// `perf_event_open` fail with a bare EINVAL.
pub(crate) fn check_sampling(sampling: Sampling) -> anyhow::Result<()> {
    match sampling {
        Sampling::Frequency(hz) => {
            let max = std::fs::read_to_string(MAX_SAMPLE_RATE)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            check_frequency(hz, max)
        }
        // The kernel refuses periods with the top bit set.
        Sampling::Period(p) if p > i64::MAX as u64 => {
            anyhow::bail!(
                "--period {p} is too large: the kernel takes at most {}",
                i64::MAX
            )
        }
        Sampling::Period(_) => Ok(()),
    }
}

fn check_frequency(hz: u64, max: Option<u64>) -> anyhow::Result<()> {
    match max {
        Some(max) if hz > max => anyhow::bail!(
            "--freq {hz} is above kernel.perf_event_max_sample_rate ({max}): lower it, or raise the limit with sysctl kernel.perf_event_max_sample_rate={hz}"
        ),
        _ => Ok(()),
    }
}

/// Checks that the host can count `spec`; for an unsupported hardware
/// event returns `cpu-clock` instead and logs why. Other errors (e.g.
/// permissions) are returned as they are.
pub(crate) fn resolve_supported(spec: EventSpec) -> std::io::Result<EventSpec> {
    match crate::sys::probe_perf_event(spec.type_, spec.raw_config, 0) {
        Ok(()) => Ok(spec),
        Err(e)
            if spec.is_hardware()
                && matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV | libc::EINVAL)
                ) =>
        {
            tracing::warn!(
                "event `{}` is not supported on this host (no hardware PMU: {e}); falling back to cpu-clock",
                spec.name
            );
            Ok(EventSpec::cpu_clock())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_raw() {
        assert_eq!(parse_event("cycles").unwrap().name, "cycles");
        assert_eq!(parse_event("cpu-clock").unwrap().type_, PERF_TYPE_SOFTWARE);
        let raw = parse_event("r01c2").unwrap();
        assert_eq!((raw.type_, raw.raw_config), (PERF_TYPE_RAW, 0x01c2));
        assert!(parse_event("bogus").is_err());
        assert!(parse_event("rzz").is_err());
    }

    #[test]
    fn frequency_above_the_kernel_limit_is_refused_by_name() {
        assert!(check_frequency(1000, Some(1000)).is_ok());
        assert!(check_frequency(1000, None).is_ok());
        let e = check_frequency(200000, Some(100000))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--freq 200000"), "{e}");
        assert!(
            e.contains("kernel.perf_event_max_sample_rate (100000)"),
            "{e}"
        );
        assert!(check_sampling(Sampling::Period(u64::MAX)).is_err());
        assert!(check_sampling(Sampling::Period(1_000_000)).is_ok());
    }

    #[test]
    fn software_clock_is_always_supported() {
        // Needs CAP_PERFMON or root (we run tests as root).
        let spec = resolve_supported(parse_event("cpu-clock").unwrap()).unwrap();
        assert_eq!(spec.name, "cpu-clock");
    }

    #[test]
    fn hardware_event_resolves_to_itself_or_cpu_clock() {
        let spec = resolve_supported(parse_event("cycles").unwrap()).unwrap();
        let has_pmu = crate::sys::probe_perf_event(PERF_TYPE_HARDWARE, 0, 0).is_ok();
        assert_eq!(spec.name, if has_pmu { "cycles" } else { "cpu-clock" });
    }

    /// Bursts that start where the misses are (`--event cache-misses`,
    /// memory mode) sample the cache-miss counter where there is one, and
    /// the software clock where there is none.
    #[test]
    fn cache_misses_resolve_to_themselves_or_cpu_clock() {
        let want = parse_event("cache-misses").unwrap();
        let has = crate::sys::probe_perf_event(want.type_, want.raw_config, 0).is_ok();
        let spec = resolve_supported(want).unwrap();
        assert_eq!(spec.name, if has { "cache-misses" } else { "cpu-clock" });
        assert_eq!(spec.is_hardware(), has);
    }
}
