//! Kernel side of stack sampling: loads the eBPF object, opens one sampling
//! perf event per online CPU with `on_overflow` attached, and hands the
//! samples it writes into the ring buffer to the caller.
//!
//! Targeting is done in the kernel: in `--pid`/`run` mode the program drops
//! overflows of other processes (the `TARGETS` map), so threads created later
//! are sampled without reopening events.
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        PerfEvent, TracePoint, UProbe,
        perf_event::{PerfEventScope, SamplePolicy},
        uprobe::{UProbeLinkId, UProbeScope},
    },
};
use burstyd_common::addr::Pid;
use burstyd_common::burst::{BurstTarget, ClonePage};
use burstyd_common::{Config, FILTER_ALL, FILTER_TARGETS, Sample, counter};
use tokio::io::unix::AsyncFd;

use crate::sampling::events::{EventSpec, Sampling};

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/burstyd-ebpf"));

#[derive(Debug, thiserror::Error)]
pub(crate) enum SamplerError {
    #[error(
        "loading the eBPF object failed (does the kernel support BPF ring buffers and BTF? root or CAP_BPF+CAP_PERFMON needed): {0}"
    )]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program `{name}` failed: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("eBPF map `{0}` is missing from the object")]
    MissingMap(&'static str),
    #[error("eBPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("listing online CPUs ({0}): {1}")]
    Cpus(&'static str, std::io::Error),
    #[error("opening the {event} sampling event on CPU {cpu}: {source}")]
    Attach {
        event: String,
        cpu: u32,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("ring buffer: {0}")]
    Io(#[from] std::io::Error),
}

/// Counters kept by the eBPF program, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelCounters {
    pub(crate) samples: u64,
    pub(crate) ring_full: u64,
    pub(crate) ustack_failed: u64,
    pub(crate) kernel_thread: u64,
    /// Burst signals sent / overflows while a burst ran / failed sends.
    pub(crate) burst_signals: u64,
    pub(crate) burst_busy: u64,
    pub(crate) burst_signal_failed: u64,
    /// Burst signals not sent, by reason (see `counter::DECLINED_*`).
    pub(crate) declined: Declined,
    /// Link-map changes announced by traced processes' loaders: the
    /// handler was signalled to invalidate the tables / it was not (the
    /// daemon did at its next drain).
    pub(crate) link_signalled: u64,
    pub(crate) link_unsignalled: u64,
}

/// Overflows in traced processes that sent no burst signal because the
/// program could have noticed it (or the handler would have declined).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Declined {
    pub(crate) in_kernel: u64,
    pub(crate) no_clone: u64,
    pub(crate) blocked: u64,
    pub(crate) pending: u64,
    pub(crate) handler: u64,
    pub(crate) altstack: u64,
    pub(crate) unreadable: u64,
}

impl Declined {
    /// `(reason, count)` pairs, in a fixed order (summary and metrics).
    pub(crate) fn reasons(&self) -> [(&'static str, u64); 7] {
        [
            ("in_kernel", self.in_kernel),
            ("no_clone_on_page", self.no_clone),
            ("signal_blocked", self.blocked),
            ("signal_pending", self.pending),
            ("handler_replaced", self.handler),
            ("on_altstack", self.altstack),
            ("task_unreadable", self.unreadable),
        ]
    }
}

pub(crate) struct SamplerOptions {
    pub(crate) event: EventSpec,
    pub(crate) sampling: Sampling,
    /// `None`: every process; `Some`: only these pids (more can be added).
    pub(crate) targets: Option<Vec<Pid>>,
    pub(crate) kernel_stacks: bool,
    /// Processes forked by targets become targets (`burstyd run`).
    pub(crate) follow_children: bool,
    /// Notice targets and traced processes that exec (bursty tracing:
    /// the new program is attached to afresh; [`Sampler::take_execs`]).
    pub(crate) follow_exec: bool,
}

pub(crate) struct Sampler {
    ebpf: Ebpf,
    ring: AsyncFd<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    _logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    cpus: usize,
    /// The `CLONE_PAGES` keys of each armed process, to take them out.
    clone_pages: std::collections::HashMap<Pid, Vec<u64>>,
    /// `on_exec` is attached.
    follows_exec: bool,
    /// The uprobe on each watched process's `_dl_debug_state`.
    link_probes: std::collections::HashMap<Pid, UProbeLinkId>,
}

/// The sample ring's size for `sampling` on `cpus` CPUs: about a second of
/// samples (the daemon drains every `DRAIN_INTERVAL_MS`, and is woken at
/// an eighth), a power of two between `MIN_RING_BYTES` and `RING_BYTES`.
/// The largest ring when the rate is unknown (a period). Every byte of
/// the ring is kernel memory for as long as the daemon runs, and mapped
/// twice into the daemon (its RSS counts it twice), so a fixed 32 MiB
/// ring cost 64 MB of RSS at the default 199 Hz, where 8 MiB hold 1.2 s.
pub(crate) fn ring_bytes(sampling: Sampling, cpus: usize) -> u32 {
    use burstyd_common::{MIN_RING_BYTES, RING_BYTES};
    let Sampling::Frequency(hz) = sampling else {
        return RING_BYTES;
    };
    let per_second = (hz as u128)
        .saturating_mul(cpus.max(1) as u128)
        .saturating_mul(std::mem::size_of::<Sample>() as u128 + 16);
    let bytes = per_second.min(RING_BYTES as u128) as u32;
    bytes.next_power_of_two().clamp(MIN_RING_BYTES, RING_BYTES)
}

impl Sampler {
    pub(crate) fn start(opts: &SamplerOptions) -> Result<Self, SamplerError> {
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| SamplerError::Cpus(what, e))?
            .len();
        let ring_bytes = ring_bytes(opts.sampling, cpus);
        tracing::debug!("sample ring: {} MiB", ring_bytes >> 20);
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("SAMPLES", ring_bytes)
            .load(EBPF_OBJECT)?;
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!("eBPF logger not initialised: {e}");
                None
            }
        };
        {
            let map = ebpf
                .map_mut("CONFIG")
                .ok_or(SamplerError::MissingMap("CONFIG"))?;
            let mut config: Array<_, Config> =
                Array::try_from(map).map_err(|source| SamplerError::Map {
                    name: "CONFIG",
                    source,
                })?;
            let task = match crate::sampling::btf::kernel_task_layout() {
                Ok(t) => t,
                Err(e) => {
                    // `action_size` 0 makes the program decline every
                    // burst signal (it cannot tell whether one is safe).
                    tracing::warn!("{e:#}: bursty tracing will not start bursts");
                    Default::default()
                }
            };
            let cfg = Config {
                task,
                filter: if opts.targets.is_some() {
                    FILTER_TARGETS
                } else {
                    FILTER_ALL
                },
                self_pid: std::process::id(),
                kernel_stacks: opts.kernel_stacks as u32,
                follow_children: opts.follow_children as u32,
                wakeup_bytes: ring_bytes as u64 / 8,
            };
            config.set(0, cfg, 0).map_err(|source| SamplerError::Map {
                name: "CONFIG",
                source,
            })?;
        }
        let ring = RingBuf::try_from(
            ebpf.take_map("SAMPLES")
                .ok_or(SamplerError::MissingMap("SAMPLES"))?,
        )
        .map_err(|source| SamplerError::Map {
            name: "SAMPLES",
            source,
        })?;
        let counters = PerCpuArray::try_from(
            ebpf.take_map("COUNTERS")
                .ok_or(SamplerError::MissingMap("COUNTERS"))?,
        )
        .map_err(|source| SamplerError::Map {
            name: "COUNTERS",
            source,
        })?;
        let mut sampler = Sampler {
            ebpf,
            // SAFETY: the ring buffer owns its fd and keeps it open for as
            // long as the AsyncFd (which owns the ring buffer) lives.
            ring: unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .map_err(|e| SamplerError::Io(e.into()))?,
            counters,
            _logger: logger,
            cpus: 0,
            clone_pages: Default::default(),
            follows_exec: false,
            link_probes: Default::default(),
        };
        if let Some(pids) = &opts.targets {
            for &pid in pids {
                sampler.add_target(pid)?;
            }
        }
        sampler.attach(opts)?;
        if opts.follow_children {
            sampler.follow_children();
        }
        if opts.follow_exec {
            sampler.follow_exec();
        }
        Ok(sampler)
    }

    fn attach(&mut self, opts: &SamplerOptions) -> Result<(), SamplerError> {
        let prog: &mut PerfEvent = self
            .ebpf
            .program_mut("on_overflow")
            .ok_or(SamplerError::MissingMap("on_overflow"))?
            .try_into()
            .map_err(|source| SamplerError::Program {
                name: "on_overflow",
                source,
            })?;
        prog.load().map_err(|source| SamplerError::Program {
            name: "on_overflow",
            source,
        })?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| SamplerError::Cpus(what, e))?;
        let policy = match opts.sampling {
            Sampling::Period(p) => SamplePolicy::Period(p),
            Sampling::Frequency(f) => SamplePolicy::Frequency(f),
        };
        for &cpu in &cpus {
            prog.attach(
                opts.event.config,
                PerfEventScope::AllProcessesOneCpu { cpu },
                policy,
                false,
            )
            .map_err(|source| SamplerError::Attach {
                event: opts.event.name.clone(),
                cpu,
                source,
            })?;
        }
        self.cpus = cpus.len();
        Ok(())
    }

    /// Attaches `on_newtask` so that children of targets are sampled. Needs
    /// tracefs; without it we warn and go on with the targets we have.
    fn follow_children(&mut self) {
        if let Err(e) = self.attach_tracepoint("on_newtask", "task", "task_newtask") {
            tracing::warn!(
                "cannot follow child processes (is tracefs mounted at /sys/kernel/tracing?): {e}; only the command itself is sampled"
            );
        }
    }

    /// Attaches `on_exec`: targets and traced processes that exec are
    /// disarmed at once and listed for [`Self::take_execs`]. Needs
    /// tracefs; without it bursts stop at an exec, as they did before.
    fn follow_exec(&mut self) {
        match self.attach_tracepoint("on_exec", "sched", "sched_process_exec") {
            Ok(()) => self.follows_exec = true,
            Err(e) => tracing::warn!(
                "cannot see execs (is tracefs mounted at /sys/kernel/tracing?): {e}; bursts stop where a traced process execs"
            ),
        }
    }

    /// Loads tracepoint program `name` and attaches it to `category:event`
    /// (mounting tracefs first if need be).
    fn attach_tracepoint(
        &mut self,
        name: &str,
        category: &str,
        event: &str,
    ) -> Result<(), aya::programs::ProgramError> {
        if let Err(e) = crate::sys::ensure_tracefs() {
            tracing::debug!("mounting tracefs: {e}");
        }
        let prog: &mut TracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or(aya::programs::ProgramError::NotLoaded)?
            .try_into()?;
        prog.load()?;
        prog.attach(category, event)?;
        Ok(())
    }

    /// The targets and traced processes that exec'd since the last call
    /// (each once, however many times it did), taken out of `EXECS`.
    pub(crate) fn take_execs(&mut self) -> Vec<Pid> {
        if !self.follows_exec {
            return Vec::new();
        }
        let Ok(mut map) = self.pid_map::<u64>("EXECS") else {
            return Vec::new();
        };
        let pids: Vec<u32> = map.keys().filter_map(Result::ok).collect();
        for p in &pids {
            let _ = map.remove(p);
        }
        pids.into_iter().map(Pid).collect()
    }

    pub(crate) fn cpus(&self) -> usize {
        self.cpus
    }

    /// A pid-keyed hash map of the loaded programs (keyed by the kernel's
    /// `u32` tgid: the conversion from [`Pid`] happens in the callers).
    fn pid_map<V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<HashMap<&mut aya::maps::MapData, u32, V>, SamplerError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(SamplerError::MissingMap(name))?;
        HashMap::try_from(map).map_err(|source| SamplerError::Map { name, source })
    }

    /// Removes `pid` from a pid-keyed map; a pid not in it is fine.
    fn remove_pid<V: aya::Pod>(
        &mut self,
        name: &'static str,
        pid: Pid,
    ) -> Result<(), SamplerError> {
        match self.pid_map::<V>(name)?.remove(&pid.0) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(SamplerError::Map { name, source }),
        }
    }

    /// Starts recording `pid` (targeted mode only).
    pub(crate) fn add_target(&mut self, pid: Pid) -> Result<(), SamplerError> {
        self.pid_map::<u8>("TARGETS")?
            .insert(pid.0, 1, 0)
            .map_err(|source| SamplerError::Map {
                name: "TARGETS",
                source,
            })
    }

    /// Stops recording `pid` (it exited, or no longer matches the
    /// configured targets). A pid not in the map is fine.
    pub(crate) fn remove_target(&mut self, pid: Pid) -> Result<(), SamplerError> {
        self.remove_pid::<u8>("TARGETS", pid)
    }

    /// Switches between sampling only `TARGETS` (`true`) and every process
    /// (a configuration reload that adds or removes all targets).
    pub(crate) fn set_targeted(&mut self, targeted: bool) -> Result<(), SamplerError> {
        let map = self
            .ebpf
            .map_mut("CONFIG")
            .ok_or(SamplerError::MissingMap("CONFIG"))?;
        let mut config: Array<_, Config> =
            Array::try_from(map).map_err(|source| SamplerError::Map {
                name: "CONFIG",
                source,
            })?;
        let mut cfg = config.get(&0, 0).map_err(|source| SamplerError::Map {
            name: "CONFIG",
            source,
        })?;
        cfg.filter = if targeted { FILTER_TARGETS } else { FILTER_ALL };
        config.set(0, cfg, 0).map_err(|source| SamplerError::Map {
            name: "CONFIG",
            source,
        })
    }

    /// Waits until samples are available, then calls `f` on each one in the
    /// ring buffer. Returns the number handled.
    pub(crate) async fn drain(
        &mut self,
        mut f: impl FnMut(&Sample),
    ) -> Result<usize, SamplerError> {
        let mut guard = self.ring.readable_mut().await?;
        let ring = guard.get_inner_mut();
        let mut n = 0;
        while let Some(item) = ring.next() {
            if item.len() < size_of::<Sample>() {
                continue;
            }
            // SAFETY: the program writes whole `Sample`s; the length is
            // checked above and `Sample` is plain data valid for any bits.
            // The ring buffer gives 8-byte aligned records.
            let sample = unsafe { &*(item.as_ptr() as *const Sample) };
            f(sample);
            n += 1;
        }
        guard.clear_ready();
        Ok(n)
    }

    /// Handles whatever is in the ring buffer now, without waiting.
    pub(crate) fn drain_now(&mut self, mut f: impl FnMut(&Sample)) -> usize {
        let ring = self.ring.get_mut();
        let mut n = 0;
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<Sample>() {
                // SAFETY: as in `drain`.
                f(unsafe { &*(item.as_ptr() as *const Sample) });
                n += 1;
            }
        }
        n
    }

    pub(crate) fn counters(&self) -> KernelCounters {
        let get = |i: u32| -> u64 {
            self.counters
                .get(&i, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        KernelCounters {
            samples: get(counter::SAMPLES),
            ring_full: get(counter::RING_FULL),
            ustack_failed: get(counter::USTACK_FAILED),
            kernel_thread: get(counter::KERNEL_THREAD),
            burst_signals: get(counter::BURST_SIGNALS),
            burst_busy: get(counter::BURST_BUSY),
            burst_signal_failed: get(counter::BURST_SIGNAL_FAILED),
            link_signalled: get(counter::LINK_SIGNALLED),
            link_unsignalled: get(counter::LINK_UNSIGNALLED),
            declined: Declined {
                in_kernel: get(counter::DECLINED_IN_KERNEL),
                no_clone: get(counter::DECLINED_NO_CLONE),
                blocked: get(counter::DECLINED_BLOCKED),
                pending: get(counter::DECLINED_PENDING),
                handler: get(counter::DECLINED_HANDLER),
                altstack: get(counter::DECLINED_ALTSTACK),
                unreadable: get(counter::DECLINED_UNREADABLE),
            },
        }
    }

    /// Arms (`Some`: the `BURSTS` entry, and the pages of original code
    /// where a burst can start) or disarms (`None`) the burst signal for
    /// `pid`.
    pub(crate) fn set_burst_target(
        &mut self,
        pid: Pid,
        target: Option<(BurstTarget, &[u64])>,
    ) -> Result<(), SamplerError> {
        let map_err = |name| move |source| SamplerError::Map { name, source };
        let Some((t, pages)) = target else {
            let r = self.remove_pid::<BurstTarget>("BURSTS", pid);
            self.unwatch_link_map(pid);
            for page in self.clone_pages.remove(&pid).unwrap_or_default() {
                let _ = self.clone_page_map()?.remove(&ClonePage {
                    pid: pid.0,
                    _pad: 0,
                    page,
                });
            }
            return r;
        };
        let mut map = self.clone_page_map()?;
        let mut added = Vec::with_capacity(pages.len());
        let mut full = 0usize;
        for &page in pages {
            let key = ClonePage {
                pid: pid.0,
                _pad: 0,
                page,
            };
            match map.insert(key, 1, 0) {
                Ok(()) => added.push(page),
                Err(_) => full += 1,
            }
        }
        if full > 0 {
            tracing::warn!(
                %pid,
                "{full} of {} code pages with clones do not fit the eBPF page set: no bursts start there",
                pages.len()
            );
        }
        self.clone_pages.entry(pid).or_default().extend(added);
        self.pid_map::<BurstTarget>("BURSTS")?
            .insert(pid.0, t, 0)
            .map_err(map_err("BURSTS"))
    }

    /// Watches `pid`'s dynamic loader (`loader`, its path in the maps)
    /// for changes of its link map: a uprobe on its `_dl_debug_state`
    /// (`on_link_change`), for this process only, counting into
    /// `LINK_CHANGES`. Idempotent.
    pub(crate) fn watch_link_map(
        &mut self,
        pid: Pid,
        loader: &std::path::Path,
    ) -> Result<(), SamplerError> {
        if self.link_probes.contains_key(&pid) {
            return Ok(());
        }
        let Some(scope) = std::num::NonZeroU32::new(pid.0).map(UProbeScope::OneProcess) else {
            return Ok(());
        };
        self.pid_map::<u64>("LINK_CHANGES")?
            .insert(pid.0, 0, 0)
            .map_err(|source| SamplerError::Map {
                name: "LINK_CHANGES",
                source,
            })?;
        let name = "on_link_change";
        let program = |source| SamplerError::Program { name, source };
        let prog: &mut UProbe = self
            .ebpf
            .program_mut(name)
            .ok_or(SamplerError::MissingMap(name))?
            .try_into()
            .map_err(program)?;
        if prog.fd().is_err() {
            prog.load().map_err(program)?;
        }
        // Through the process's root: the file it mapped, also in another
        // mount namespace.
        let path = std::path::PathBuf::from(format!("/proc/{pid}/root{}", loader.display()));
        let link = prog
            .attach("_dl_debug_state", &path, scope)
            .map_err(program)?;
        self.link_probes.insert(pid, link);
        Ok(())
    }

    /// How many link-map changes `pid`'s loader announced since it was
    /// watched (`None`: not watched).
    pub(crate) fn link_changes(&mut self, pid: Pid) -> Option<u64> {
        if !self.link_probes.contains_key(&pid) {
            return None;
        }
        self.pid_map::<u64>("LINK_CHANGES")
            .ok()?
            .get(&pid.0, 0)
            .ok()
    }

    fn unwatch_link_map(&mut self, pid: Pid) {
        let Some(link) = self.link_probes.remove(&pid) else {
            return;
        };
        if let Some(prog) = self
            .ebpf
            .program_mut("on_link_change")
            .and_then(|p| <&mut UProbe>::try_from(p).ok())
        {
            let _ = prog.detach(link);
        }
        let _ = self.remove_pid::<u64>("LINK_CHANGES", pid);
    }

    /// Takes the pages in `ranges` out of `pid`'s `CLONE_PAGES` (an
    /// unloaded library's).
    pub(crate) fn remove_pages(&mut self, pid: Pid, ranges: &[(u64, u64)]) {
        let Some(mut pages) = self.clone_pages.remove(&pid) else {
            return;
        };
        let inside = |p: u64| {
            let a = p << burstyd_common::burst::CLONE_PAGE_SHIFT;
            ranges.iter().any(|&(lo, hi)| a >= (lo & !0xfff) && a < hi)
        };
        let gone: Vec<u64> = pages.iter().copied().filter(|&p| inside(p)).collect();
        pages.retain(|&p| !inside(p));
        if let Ok(mut map) = self.clone_page_map() {
            for page in gone {
                let _ = map.remove(&ClonePage {
                    pid: pid.0,
                    _pad: 0,
                    page,
                });
            }
        }
        self.clone_pages.insert(pid, pages);
    }

    fn clone_page_map(
        &mut self,
    ) -> Result<HashMap<&mut aya::maps::MapData, ClonePage, u8>, SamplerError> {
        let name = "CLONE_PAGES";
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(SamplerError::MissingMap(name))?;
        HashMap::try_from(map).map_err(|source| SamplerError::Map { name, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burstyd_common::{MIN_RING_BYTES, RING_BYTES};

    #[test]
    fn the_ring_holds_about_a_second_of_samples() {
        let sample = std::mem::size_of::<Sample>() as u64 + 16;
        // The default rate on 2 CPUs: 8 MiB, more than a second.
        let b = ring_bytes(Sampling::Frequency(199), 2);
        assert_eq!(b, 8 << 20);
        assert!(b as u64 >= 199 * 2 * sample);
        // Never below the floor, never above the compiled size.
        assert_eq!(ring_bytes(Sampling::Frequency(1), 1), MIN_RING_BYTES);
        assert_eq!(ring_bytes(Sampling::Frequency(997), 64), RING_BYTES);
        assert_eq!(
            ring_bytes(Sampling::Frequency(u64::MAX), usize::MAX),
            RING_BYTES
        );
        // A period: the rate is unknown.
        assert_eq!(ring_bytes(Sampling::Period(1_000_000), 2), RING_BYTES);
        for hz in [10, 99, 199, 499, 997, 4000] {
            for cpus in [1, 2, 4, 16] {
                let b = ring_bytes(Sampling::Frequency(hz), cpus);
                assert!(b.is_power_of_two(), "{hz} Hz {cpus} CPUs: {b}");
                assert!(b as u64 >= (hz * cpus as u64 * sample).min(RING_BYTES as u64));
            }
        }
    }
}
