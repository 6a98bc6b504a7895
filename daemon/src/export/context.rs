//! Calling context trees → symbolized pprof profiles on disk.
//!
//! Every node of every thread's tree that holds samples becomes one pprof
//! sample: its context (leaf first) as locations, values
//! `[samples, samples × period]` (`samples/count` and `<event>/<unit>`:
//! nanoseconds for the software clocks, else count), and labels `pid`,
//! `comm`, `thread` (string) and `tid` (number). Addresses are symbolized here, once per
//! distinct (process, address), through [`Symbolizer`].
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use burstyd_common::addr::{FrameAddress, Pid};

use crate::export::pprof::{LineKey, MappingKey, Profile, ProfileBuilder, encode_gzip};
use crate::stacks::cct::{Cct, FrameAddr};
use crate::stacks::symbolize::{Resolved, Symbolizer};
use crate::stacks::table::{MappingInfo, ProcessTable};

/// What the profile says about how it was taken.
#[derive(Clone, Debug)]
pub(crate) struct ProfileMeta {
    /// Event actually sampled (after any fallback), e.g. `cpu-clock`.
    pub(crate) event: String,
    /// The event asked for, when it differs (fallback).
    pub(crate) requested_event: Option<String>,
    /// Sampling period (events per sample) or 0 in frequency mode.
    pub(crate) period: u64,
    pub(crate) freq: u64,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
}

const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Builds the pprof profile of `cct`.
pub(crate) fn build_profile(
    cct: &Cct,
    procs: &ProcessTable,
    symbolizer: &mut Symbolizer,
    meta: &ProfileMeta,
) -> Profile {
    let event = meta.event.as_str();
    let unit = crate::sampling::events::unit(event);
    let mut b = ProfileBuilder::new(
        &[("samples", "count"), (event, unit)],
        (event, unit),
        meta.period as i64,
    );
    b.set_default_sample_type(event);
    let start_ns = meta
        .start
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let dur_ns = meta
        .end
        .duration_since(meta.start)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    b.set_time(start_ns, dur_ns);
    b.add_comment(&format!("burstyd {}", env!("CARGO_PKG_VERSION")));
    if let Some(req) = &meta.requested_event {
        b.add_comment(&format!(
            "event {req} requested; host has no PMU for it, sampled {event} instead"
        ));
    }
    if meta.freq > 0 {
        b.add_comment(&format!("sampling frequency {} Hz per CPU", meta.freq));
    }

    // pprof readers treat the first mapping as the main binary: register
    // the main executable of the process with the most samples first.
    if let Some(pid) = cct
        .threads
        .values()
        .map(|t| (t.nodes.iter().map(|n| n.samples).sum::<u64>(), t.pid))
        .max()
        .map(|(_, pid)| pid)
        && let Some(first) = procs.exec_mappings(pid).first()
        && let Some(m) = procs.mapping_for(pid, first.start)
    {
        b.mapping(&mapping_key(&m), true);
    }

    // (pid, frame) -> location id
    let mut loc_ids: HashMap<(Pid, FrameAddr), u64> = HashMap::new();
    let mut trees: Vec<_> = cct.threads.values().collect();
    trees.sort_by_key(|t| (t.pid, t.tid));
    let mut ctx = Vec::new();
    // Every user frame (each node holds one; node 0 is the root), resolved
    // first, a module at a time.
    let users: std::collections::HashSet<(Pid, FrameAddress)> = trees
        .iter()
        .flat_map(|t| {
            t.nodes.iter().skip(1).filter_map(|n| match n.frame {
                FrameAddr::User(frame) => Some((t.pid, frame)),
                _ => None,
            })
        })
        .collect();
    let mut resolved = symbolizer.resolve_users(procs, users);
    for tree in trees {
        let pid_s = tree.pid.to_string();
        let comm = cct
            .process_names
            .get(&tree.pid)
            .cloned()
            .unwrap_or_else(|| tree.thread_name.clone());
        for (i, node) in tree.nodes.iter().enumerate() {
            if node.samples == 0 {
                continue;
            }
            tree.context(i as u32, &mut ctx);
            let mut locs = Vec::with_capacity(ctx.len());
            for &f in &ctx {
                let id = *loc_ids
                    .entry((tree.pid, f))
                    .or_insert_with(|| location(&mut b, &mut resolved, symbolizer, tree.pid, f));
                locs.push(id);
            }
            b.sample(
                locs,
                vec![node.samples as i64, node.weight as i64],
                &[
                    ("pid", &pid_s),
                    ("comm", &comm),
                    ("thread", &tree.thread_name),
                ],
                &[("tid", tree.tid as i64)],
            );
        }
    }
    b.finish()
}

/// The locations of `pid`'s return addresses `addrs`, symbolized as in
/// `context.pb.gz`, by address.
pub(crate) fn return_address_locations(
    b: &mut ProfileBuilder,
    procs: &ProcessTable,
    symbolizer: &mut Symbolizer,
    pid: Pid,
    addrs: Vec<u64>,
) -> HashMap<u64, u64> {
    let frame = |a: u64| FrameAddress::ReturnAddress(burstyd_common::addr::Avma(a));
    let mut resolved = symbolizer.resolve_users(procs, addrs.iter().map(|&a| (pid, frame(a))));
    addrs
        .into_iter()
        .map(|a| {
            let id = location(b, &mut resolved, symbolizer, pid, FrameAddr::User(frame(a)));
            (a, id)
        })
        .collect()
}

/// The location of `f`: its user frames are in `resolved` (taken out).
fn location(
    b: &mut ProfileBuilder,
    resolved: &mut HashMap<(Pid, FrameAddress), Resolved>,
    symbolizer: &mut Symbolizer,
    pid: Pid,
    f: FrameAddr,
) -> u64 {
    let (addr, resolved) = match f {
        FrameAddr::User(frame) => (
            frame.address().0,
            resolved
                .remove(&(pid, frame))
                .unwrap_or_else(Resolved::unknown),
        ),
        // Kernel frames are named by the address itself, return address or not.
        FrameAddr::Kernel(frame) => {
            let addr = frame.address().0;
            (addr, symbolizer.resolve_kernel(addr))
        }
        FrameAddr::Truncated => {
            let line = LineKey {
                function: "[truncated stack]".into(),
                file: String::new(),
                line: 0,
            };
            return b.location(0, 0, &[line]);
        }
    };
    let Resolved { mapping, frames } = resolved;
    let symbolized = !frames.is_empty();
    let mapping_id = match (&mapping, f) {
        (Some(m), _) => b.mapping(&mapping_key(m), symbolized),
        (None, FrameAddr::Kernel(_)) => b.mapping(
            &MappingKey {
                start: 0xffff_8000_0000_0000,
                limit: u64::MAX,
                file_offset: 0,
                filename: KERNEL_MAPPING.into(),
                build_id: String::new(),
            },
            true,
        ),
        (None, _) => 0,
    };
    let lines: Vec<LineKey> = if symbolized {
        frames
            .into_iter()
            .map(|fr| LineKey {
                function: fr.function,
                file: fr.file.unwrap_or_default(),
                line: fr.line.map(i64::from).unwrap_or(0),
            })
            .collect()
    } else {
        // Code no symbol and no unwind entry places in a function: name
        // it by module and address as `nm` and the path profiles print
        // addresses (the SVMA), so the profile still groups it sensibly.
        let name = match &mapping {
            Some(m) => format!(
                "{}+{:#x}",
                Path::new(&m.path)
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                addr.wrapping_sub(m.bias.0)
            ),
            None => format!("{addr:#x}"),
        };
        vec![LineKey {
            function: name,
            file: String::new(),
            line: 0,
        }]
    };
    b.location(mapping_id, addr, &lines)
}

fn mapping_key(m: &MappingInfo) -> MappingKey {
    MappingKey {
        start: m.start,
        limit: m.limit,
        file_offset: m.file_offset,
        filename: m.path.clone(),
        build_id: m.build_id.clone().unwrap_or_default(),
    }
}

/// Writes `profile` gzip'd to `dir/name` atomically (temp file + rename),
/// creating `dir` if needed.
pub(crate) fn write_profile(dir: &Path, name: &str, profile: &Profile) -> std::io::Result<PathBuf> {
    super::write_atomic(dir, name, &encode_gzip(profile)?)
}
