//! `paths.pb.gz`: the Ball-Larus paths bursty tracing counted, as pprof:
//! the calling context tree of paths. Leaf pseudo-frame `f path N:
//! L12→L14→L20` (the blocks' source lines; a block without one by its
//! address, `0x16895`), then the function (named by
//! [`function_name`]: `xz!sub_16880` where no symbol names it), then its
//! calling context: the functions entered in the burst, then the stack the
//! burst began on, up to the thread's root (`[caller unknown]` on top where
//! the burst's stack sample was missing or could not be unwound to the
//! root); labels `symbol`, `path`, `pid` and `ci95_ppm` (the path's
//! confidence); values `executions/count` (estimated: see
//! [`crate::bursts::estimate`]), `<event>/<unit>` (the sampled event
//! attributed to paths: an estimate; nanoseconds for the software clocks,
//! else count), when bursts measured them `measured-time/nanoseconds`,
//! and `recorded/count` (the executions recorded).
use std::collections::HashMap;

use userspace_rewriter::analysis::plan::FunctionStatus;

use super::pprof::{LineKey, MappingKey, ProfileBuilder};
use crate::bursts::contexts::FOREIGN;
use crate::bursts::counts::PathView;
use crate::bursts::facts::PathFacts;
use crate::bursts::traced::{Traced, TracedModule};
use crate::stacks::symbolize::function_name;

/// The sample type of the paths' measured time.
pub(crate) const MEASURED: &str = "measured-time";

/// The sample type of the executions recorded, before weighting.
pub(crate) const RECORDED: &str = "recorded";

/// The numeric label of a path's confidence: its share's 95% interval's
/// half-width relative to the share, in parts per million.
pub(crate) const CI95_LABEL: &str = "ci95_ppm";

/// The builder of `paths.pb.gz`, which every traced process adds to.
/// `tsc_hz`: the time-stamp counter's rate, when bursts measured each
/// path's time with it.
pub(crate) fn paths_builder(event: &str, tsc_hz: Option<f64>) -> ProfileBuilder {
    let unit = crate::sampling::events::unit(event);
    let mut types = vec![("executions", "count"), (event, unit)];
    if tsc_hz.is_some() {
        types.push((MEASURED, "nanoseconds"));
    }
    types.push((RECORDED, "count"));
    let mut b = ProfileBuilder::new(&types, (event, unit), 1);
    b.add_comment("Ball-Larus paths from bursty tracing: leaf frame = the path (its blocks' source lines, or where there is none their addresses as nm prints them), then the function, then its calling context (the functions entered in the burst, then the stack sample the burst began with, up to the thread's root; [caller unknown] where that stack was not complete)");
    b.add_comment("executions/count: the executions the bursts' records stand for (each weighted by the inverse of its chance to be recorded whole: a path spanning more of a burst's checks is caught by fewer bursts); recorded/count: the executions recorded");
    b.add_comment(&format!("{event}/{unit}: an estimate, the sampled {event} of each block split among the paths through it by their executions"));
    b.add_comment(&format!("label {CI95_LABEL}: the half-width of the 95% confidence interval of the path's share of all executions (over every context and thread of its process), in parts per million of that share, from the burst-to-burst spread of its counts; absent in a full trace"));
    if let Some(hz) = tsc_hz {
        b.add_comment(&format!("{MEASURED}/nanoseconds: measured in bursts with the time-stamp counter (lfence; rdtsc, {:.0} MHz; no user-readable PMU counter), from each path's start to its end, exclusive of the functions it calls (their paths have their own), minus the cheapest execution measured in the process (the instrumentation's own cost of a path: see each process's comment)", hz / 1e6));
        b.set_default_sample_type(MEASURED);
    } else {
        // Not the last type (`recorded`), which readers take without one.
        b.set_default_sample_type(event);
    }
    b
}

/// A block of a path as its pseudo-frame shows it: `L12`, its first
/// instruction's source line, or where the module has no line for it
/// (no DWARF: a stripped program), `0x16895`, its address as `nm` and
/// `objdump` print it (the SVMA).
fn block_name(start: u64, line: u32) -> String {
    if line == 0 {
        format!("{start:#x}")
    } else {
        format!("L{line}")
    }
}

/// Estimated executions per (fid, path), over all contexts.
fn executions(counts: &PathView<'_>) -> HashMap<(u32, u64), u64> {
    let mut execs: HashMap<(u32, u64), f64> = HashMap::new();
    for ((_, _, fid, path), n) in counts.iter() {
        *execs.entry((*fid, *path)).or_insert(0.0) += n.estimate;
    }
    execs
        .into_iter()
        .map(|(k, v)| (k, v.round() as u64))
        .collect()
}

/// The sampled event attributed to paths: every stack sample's weight
/// at a PC in block `b` of a traced function is split among the paths
/// through `b` in proportion to their executions (the estimator of
/// the event each path incurs, given the block-level samples).
fn path_events(
    traced: &Traced,
    details: &HashMap<u32, PathFacts<'_>>,
    execs: &HashMap<(u32, u64), u64>,
    leaf_weights: &HashMap<u64, u64>,
) -> HashMap<(u32, u64), f64> {
    // The paths through each block.
    let mut through: HashMap<(u32, usize), Vec<(u64, u64)>> = HashMap::new();
    for (&(fid, path), &n) in execs {
        let Some(p) = details
            .get(&fid)
            .and_then(|d| d.numbering.regenerate(path).ok())
        else {
            continue;
        };
        let mut blocks = p.blocks.clone();
        blocks.sort_unstable();
        blocks.dedup();
        for blk in blocks {
            through.entry((fid, blk)).or_default().push((path, n));
        }
    }
    // Every analysed function of every module: (AVMA start, end, fid).
    let starts: Vec<(u64, u64, u32)> = {
        let mut v: Vec<_> = traced
            .modules
            .iter()
            .flat_map(|m| {
                m.plan
                    .functions
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| matches!(f.status, FunctionStatus::Analyzed(_)))
                    .map(|(i, f)| {
                        let a = f.start.wrapping_add(m.bias);
                        (a, a + f.size, m.fid_base + i as u32)
                    })
            })
            .collect();
        v.sort_unstable();
        v
    };
    let mut out: HashMap<(u32, u64), f64> = HashMap::new();
    for (&pc, &w) in leaf_weights {
        let i = starts.partition_point(|s| s.0 <= pc);
        let Some(&(_, end, fid)) = i.checked_sub(1).and_then(|i| starts.get(i)) else {
            continue;
        };
        if pc >= end {
            continue;
        }
        let Some((m, _)) = traced.function(fid) else {
            continue;
        };
        let Some(blk) = details
            .get(&fid)
            .and_then(|d| d.cfg.block_at(pc.wrapping_sub(m.bias)))
        else {
            continue;
        };
        let Some(paths) = through.get(&(fid, blk)) else {
            continue;
        };
        let total: u64 = paths.iter().map(|p| p.1).sum();
        for &(path, n) in paths {
            *out.entry((fid, path)).or_insert(0.0) += w as f64 * n as f64 / total as f64;
        }
    }
    out
}

/// One mapping per module of `traced` (in module order), named as the
/// process maps it. Each spans the whole address space, as the
/// executable's always did: a location's address (a path's: the
/// function's AVMA xor the path number) is a key, not a place in the
/// file.
pub(crate) fn module_mappings(b: &mut ProfileBuilder, traced: &Traced) -> Vec<u64> {
    let exe_name = std::fs::read_link(&traced.exe)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    traced
        .modules
        .iter()
        .map(|m| {
            b.mapping(
                &MappingKey {
                    start: 0,
                    limit: u64::MAX,
                    file_offset: 0,
                    // The executable as `/proc/PID/exe` names it while
                    // the process lives, else as its maps did.
                    filename: if m.is_exe && !exe_name.is_empty() {
                        exe_name.clone()
                    } else {
                        m.path.clone()
                    },
                    build_id: m.plan.build_id.clone().unwrap_or_default(),
                },
                true,
            )
        })
        .collect()
}

/// Adds a traced process's paths to `paths.pb.gz` (see
/// [`paths_builder`]): one sample per (thread, context, function, path),
/// labelled with the thread's name (`thread`) and id (`tid`).
/// `foreign(b, addrs)`: the locations of the context frames outside
/// traced functions (symbolized as in `context.pb.gz`), by address.
/// `tsc_hz`: as for [`paths_builder`].
pub(crate) fn add_paths(
    b: &mut ProfileBuilder,
    traced: &Traced,
    counts: &PathView<'_>,
    leaf_weights: &HashMap<u64, u64>,
    foreign: impl FnOnce(&mut ProfileBuilder, Vec<u64>) -> HashMap<u64, u64>,
    tsc_hz: Option<f64>,
) {
    let execs = executions(counts);
    if let (Some(hz), Some(floor)) = (tsc_hz, counts.min_cost) {
        b.add_comment(&format!(
            "pid {}: the cheapest path execution took {:.1} ns, subtracted from every execution's measured time",
            traced.pid,
            floor as f64 * 1e9 / hz
        ));
    }
    let floor = counts.min_cost.unwrap_or(0);
    let details = traced.path_details(execs.keys().map(|k| k.0));
    let events = path_events(traced, &details, &execs, leaf_weights);
    let module_index = |m: &TracedModule| {
        traced
            .modules
            .iter()
            .position(|x| std::ptr::eq(x, m))
            .unwrap_or(0)
    };
    // The addresses whose lines name the paths and frames below, per
    // module: the paths' blocks, their functions, the contexts'
    // functions; then each module's lines of those only.
    let mut wanted: Vec<Vec<u64>> = vec![Vec::new(); traced.modules.len()];
    let mut foreign_addrs = Vec::new();
    for ((_, ctx, fid, path), _) in counts.iter() {
        for c in counts.contexts().frames(*ctx).0.iter().chain([fid]) {
            if let Some(a) = counts.contexts().address(*c) {
                foreign_addrs.push(a);
            } else if let Some((m, local)) = traced.function(*c) {
                wanted[module_index(m)].push(m.plan.functions[local].start);
            }
        }
        let (Some((m, _)), Some(d)) = (traced.function(*fid), details.get(fid)) else {
            continue;
        };
        if let Ok(p) = d.numbering.regenerate(*path) {
            let w = &mut wanted[module_index(m)];
            w.extend(p.blocks.iter().map(|&blk| d.cfg.blocks[blk].start));
        }
    }
    let lines = traced.lines_of(&wanted);
    drop(wanted);
    let line_of = |m: &TracedModule, svma: u64| -> (Option<String>, u32) {
        lines[module_index(m)]
            .get(&svma)
            .cloned()
            .unwrap_or((None, 0))
    };
    let mappings = module_mappings(b, traced);
    foreign_addrs.sort_unstable();
    foreign_addrs.dedup();
    let foreign = foreign(b, foreign_addrs);
    let unknown_caller = b.location(
        0,
        0,
        &[LineKey {
            function: "[caller unknown]".into(),
            file: String::new(),
            line: 0,
        }],
    );
    let mut func_loc: HashMap<u32, u64> = HashMap::new();
    let mut entries: Vec<_> = counts.iter().collect();
    entries.sort_by_key(|e| e.0);
    for ((tid, ctx, fid, path), n) in entries {
        let Some((m, local)) = traced.function(*fid) else {
            continue;
        };
        let mapping = mappings[module_index(m)];
        let f = &m.plan.functions[local];
        let Some(PathFacts { cfg, numbering }) = details.get(fid) else {
            continue;
        };
        let Ok(p) = numbering.regenerate(*path) else {
            continue;
        };
        let mut lines = Vec::new();
        let mut file = None;
        for &blk in &p.blocks {
            let start = cfg.blocks[blk].start;
            let (fl, line) = line_of(m, start);
            file = file.or(fl);
            lines.push(block_name(start, line));
        }
        let (ffile, fline) = line_of(m, f.start);
        let fname = function_name(&m.path, &f.name);
        let name = format!("{fname} path {path}: {}", lines.join("→"));
        let leaf = b.location(
            mapping,
            f.start.wrapping_add(m.bias) ^ (*path << 1),
            &[
                LineKey {
                    function: name,
                    file: file.clone().or(ffile.clone()).unwrap_or_default(),
                    line: 0,
                },
                LineKey {
                    function: fname,
                    file: ffile.unwrap_or_default(),
                    line: i64::from(fline),
                },
            ],
        );
        let mut locs = vec![leaf];
        let (frames, rooted) = counts.contexts().frames(*ctx);
        for c in frames.iter().rev() {
            if *c & FOREIGN != 0 {
                if let Some(&id) = counts.contexts().address(*c).and_then(|a| foreign.get(&a)) {
                    locs.push(id);
                }
                continue;
            }
            let Some((cm, clocal)) = traced.function(*c) else {
                continue;
            };
            let id = *func_loc.entry(*c).or_insert_with(|| {
                let cf = &cm.plan.functions[clocal];
                let (cfile, cline) = line_of(cm, cf.start);
                b.location(
                    mappings[module_index(cm)],
                    cf.start.wrapping_add(cm.bias),
                    &[LineKey {
                        function: function_name(&cm.path, &cf.name),
                        file: cfile.unwrap_or_default(),
                        line: i64::from(cline),
                    }],
                )
            });
            locs.push(id);
        }
        if !rooted {
            locs.push(unknown_caller);
        }
        // This context's share of the path's event.
        let ev = events.get(&(*fid, *path)).copied().unwrap_or(0.0) * n.estimate
            / execs[&(*fid, *path)].max(1) as f64;
        let mut values = vec![n.estimate.round() as i64, ev.round() as i64];
        if let Some(hz) = tsc_hz {
            // Executions whose COST record was lost count at the mean.
            let mean = n.cost.saturating_sub(floor * n.measured) as f64 / n.measured.max(1) as f64;
            values.push((mean * n.estimate * 1e9 / hz).round() as i64);
        }
        values.push(n.executions as i64);
        // The thread that ran it (as in context.pb.gz: its name, and its
        // id), so that each thread's paths can be told apart.
        let thread = counts.thread_name(*tid).unwrap_or("");
        let mut nums = vec![
            ("pid", i64::from(traced.pid.0)),
            ("tid", i64::from(*tid)),
            ("path", *path as i64),
        ];
        if let Some(s) = counts.share(*fid, *path) {
            nums.push((CI95_LABEL, (s.relative_ci95 * 1e6).round() as i64));
        }
        b.sample(
            locs,
            values,
            &[("symbol", f.name.as_str()), ("thread", thread)],
            &nums,
        );
    }
}

#[cfg(test)]
mod tests {
    /// The sampled event's sample type and the period type: nanoseconds
    /// for the software clocks, counts for the rest; executions are
    /// counts, the measured time nanoseconds.
    #[test]
    fn the_event_is_in_its_unit() {
        for (event, unit) in [
            ("cpu-clock", "nanoseconds"),
            ("task-clock", "nanoseconds"),
            ("cycles", "count"),
            ("page-faults", "count"),
            ("r01c2", "count"),
        ] {
            let p = super::paths_builder(event, Some(3e9)).finish();
            let s = |i: i64| p.string_table[i as usize].as_str();
            let types: Vec<(&str, &str)> = p
                .sample_type
                .iter()
                .map(|t| (s(t.r#type), s(t.unit)))
                .collect();
            assert_eq!(
                types,
                [
                    ("executions", "count"),
                    (event, unit),
                    (super::MEASURED, "nanoseconds"),
                    (super::RECORDED, "count")
                ]
            );
            let period = p.period_type.as_ref().unwrap();
            assert_eq!((s(period.r#type), s(period.unit)), (event, unit));
        }
    }
}
