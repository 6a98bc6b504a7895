//! `burstyd analyze`: the rewriter's plan of a binary, for people (a
//! summary), for programs (`--json`), and as Graphviz (`--dot`).
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use userspace_rewriter::analysis::plan::{self, FunctionPlan, FunctionStatus, Plan, PlanOptions};

use crate::bursts::coverage::{CodeMap, HotCoverage};
use crate::export::leaves::ProfileLeaves;

pub(crate) struct AnalyzeOptions<'a> {
    pub(crate) json: bool,
    pub(crate) function: Option<&'a str>,
    pub(crate) dot: bool,
    pub(crate) plan_out: Option<&'a Path>,
    pub(crate) profile: Option<&'a Path>,
    pub(crate) k: u64,
}

pub(crate) fn run(path: &Path, opts: &AnalyzeOptions) -> anyhow::Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let report = plan::analyze(
        &data,
        &PlanOptions {
            k: opts.k,
            keep_details: opts.dot || opts.plan_out.is_some(),
        },
    )
    .with_context(|| format!("analysing {}", path.display()))?;
    if let Some(out) = opts.plan_out {
        let json = serde_json::to_vec(&report.plan)
            .with_context(|| format!("writing the plan of {} as JSON", path.display()))?;
        std::fs::write(out, json).with_context(|| format!("writing {}", out.display()))?;
    }
    let plan = &report.plan;
    let selected: Option<&FunctionPlan> = match opts.function {
        Some(name) => Some(
            plan.functions
                .iter()
                .find(|f| f.name == name)
                .with_context(|| format!("no function named `{name}` in {}", path.display()))?,
        ),
        None => None,
    };
    if opts.dot {
        let Some(f) = selected else {
            bail!("--dot needs --function NAME");
        };
        let text = dot(&data, f)
            .with_context(|| format!("drawing the CFG of `{}` in {}", f.name, path.display()))?;
        return crate::sys::print_stdout(&text);
    }
    let hot = match opts.profile {
        Some(p) => Some(hot_coverage(&data, path, plan, p)?),
        None => None,
    };
    if opts.json {
        let hot_coverage = hot.as_ref().map(|(hot, samples)| {
            serde_json::json!({
                "samples_in_file": samples,
                "weight_total": hot.total,
                "weight_in_file": hot.in_exe,
                "weight_instrumented": hot.instrumented,
                "uninstrumented": hot.missed.iter().map(|(f, w, why)| serde_json::json!({
                    "function": f, "weight": w, "why": why,
                })).collect::<Vec<_>>(),
            })
        });
        let file = path.display().to_string();
        let analysis_ms = report.analysis_ms;
        let text = match selected {
            Some(f) => json_report(&JsonReport {
                file,
                body: f,
                analysis_ms,
                hot_coverage,
            }),
            None => json_report(&JsonReport {
                file,
                body: &plan.summary,
                analysis_ms,
                hot_coverage,
            }),
        }
        .with_context(|| format!("writing the JSON report of {}", path.display()))?;
        return crate::sys::print_stdout(&format!("{text}\n"));
    }
    let mut text = match selected {
        Some(f) => human_function(f),
        None => human_summary(path, plan, report.analysis_ms),
    };
    if let (Some((hot, samples)), Some(p)) = (&hot, opts.profile) {
        text.push_str(&human_hot(hot, *samples, p));
    }
    crate::sys::print_stdout(&text)
}

/// `--json`: the summary (or `--function`'s plan), the file's name, the
/// analysis time and the hot coverage, as one object.
#[derive(serde::Serialize)]
struct JsonReport<'a, T> {
    file: String,
    #[serde(flatten)]
    body: &'a T,
    analysis_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    hot_coverage: Option<serde_json::Value>,
}

/// The text of a [`JsonReport`], written straight from the plan's types
/// rather than through `serde_json::Value`, which holds no integer above
/// `u64::MAX` ("number out of range"): the summary's `paths_total`, a sum
/// of up to 2^62 paths per function, exceeds it in large libraries
/// (libz3, Mesa's drivers). It is written as the exact integer it is (JSON
/// numbers have no bound; readers that hold numbers as doubles, as jq
/// and JavaScript do, round it, as they round any count above 2^53).
fn json_report<T: serde::Serialize>(r: &JsonReport<'_, T>) -> serde_json::Result<String> {
    serde_json::to_string_pretty(r)
}

/// The hot coverage of `plan` (its analysed functions counting as
/// instrumented) by the samples of the pprof profile at `profile`, and how
/// many samples were in the file.
fn hot_coverage(
    data: &[u8],
    path: &Path,
    plan: &Plan,
    profile: &Path,
) -> anyhow::Result<(HotCoverage, u64)> {
    let prof = crate::export::pprof::read_file(profile)?;
    let elf = userspace_rewriter::analysis::elf::ElfInfo::parse(data)
        .with_context(|| format!("reading the ELF headers of {}", path.display()))?;
    let leaves = ProfileLeaves::read(&prof, path, &elf);
    if leaves.samples == 0 {
        bail!(
            "no sample of {} has its leaf in {} (neither its build ID nor its path matches a mapping of the profile)",
            profile.display(),
            path.display()
        );
    }
    let code = CodeMap::new(
        leaves.exe,
        plan.functions
            .iter()
            .filter(|f| matches!(f.status, FunctionStatus::Analyzed(_)))
            .map(|f| (f.start, f.start + f.size)),
    );
    Ok((
        HotCoverage::measure(&code, plan, 0, &leaves.weights),
        leaves.samples,
    ))
}

fn human_hot(hot: &HotCoverage, samples: u64, profile: &Path) -> String {
    let mut o = String::new();
    let pct = |w: u64| 100.0 * w as f64 / hot.in_exe.max(1) as f64;
    let _ = writeln!(o, "hot coverage by the samples of {}", profile.display());
    let _ = writeln!(
        o,
        "  {samples} samples with their leaf in this file ({:.1}% of its processes' user-mode event weight)",
        100.0 * hot.in_exe as f64 / hot.total.max(1) as f64
    );
    let _ = writeln!(
        o,
        "  {:.1}% of their weight lands in functions the rewriter instruments",
        pct(hot.instrumented)
    );
    if !hot.missed.is_empty() {
        let _ = writeln!(o, "  most sampled uninstrumented functions:");
        for (f, w, why) in hot.missed.iter().take(15) {
            let _ = writeln!(o, "    {:>5.1}%  {f}  ({why})", pct(*w));
        }
    }
    o
}

fn human_summary(path: &Path, plan: &Plan, ms: u64) -> String {
    let s = &plan.summary;
    let mut o = String::new();
    let pct = |a: usize, b: usize| {
        if b == 0 {
            100.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    let _ = writeln!(o, "{}", path.display());
    let _ = writeln!(
        o,
        "  build id {}, {}",
        plan.build_id.as_deref().unwrap_or("(none)"),
        if plan.pie {
            "position-independent"
        } else {
            "fixed address"
        }
    );
    let _ = writeln!(
        o,
        "  functions: {} found ({}), {} PLT stubs",
        s.functions_total,
        s.found_in
            .iter()
            .map(|(k, v)| match k.as_str() {
                "call_target" => format!("{v} as call targets"),
                "dynamic" => format!("{v} in .dynamic and the init/fini arrays"),
                _ => format!("{v} in .{k}"),
            })
            .collect::<Vec<_>>()
            .join(", "),
        s.plt_stubs
    );
    let _ = writeln!(
        o,
        "  analysable: {} ({:.1}%)",
        s.functions_analyzable,
        pct(s.functions_analyzable, s.functions_total)
    );
    for (reason, n) in &s.skipped {
        let _ = writeln!(o, "    skipped {n:>6}  {reason}");
    }
    let _ = writeln!(
        o,
        "  blocks {}, edges {}, loops {} ({} k-boring, k={}), irreducible functions {}",
        s.blocks, s.edges, s.loops, s.k_boring_loops, plan.k, s.irreducible_functions
    );
    let _ = writeln!(
        o,
        "  Ball-Larus paths: {} in total; {} functions with more than 2^62 cut into regions, {} without path numbers",
        s.paths_total, s.functions_cut_into_regions, s.functions_too_many_paths
    );
    let _ = writeln!(
        o,
        "  checks: {} all ({} entries + {} back edges) -> {} reduced ({} entries in C + {} back edges)",
        s.checks_all,
        s.entry_checks_all,
        s.back_edge_checks_all,
        s.checks_reduced,
        s.entry_checks_reduced,
        s.back_edge_checks_reduced
    );
    let _ = writeln!(o, "  analysis took {ms} ms");
    o
}

fn human_function(f: &FunctionPlan) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} at {:#x}, {} bytes (from {})",
        f.name,
        f.start,
        f.size,
        f.sources.join(", ")
    );
    match &f.status {
        FunctionStatus::Plt => {
            let _ = writeln!(o, "  PLT stub: not analysed");
        }
        FunctionStatus::Skipped { reason } => {
            let _ = writeln!(o, "  skipped: {reason}");
        }
        FunctionStatus::Analyzed(a) => {
            let _ = writeln!(
                o,
                "  blocks {}, edges {}, loops {}{}",
                a.blocks,
                a.edges,
                a.loops.len(),
                if a.irreducible { " (irreducible)" } else { "" }
            );
            match a.paths {
                Some(p) if a.cut_edges > 0 => {
                    let _ = writeln!(
                        o,
                        "  Ball-Larus paths: {p} (more than 2^62 in all: cut into regions at {} edges)",
                        a.cut_edges
                    );
                }
                Some(p) => {
                    let _ = writeln!(o, "  Ball-Larus paths: {p}");
                }
                None => {
                    let _ = writeln!(
                        o,
                        "  Ball-Larus paths: cannot be numbered (no path numbers)"
                    );
                }
            }
            let _ = writeln!(
                o,
                "  entry check: {}; back-edge checks {} of {}",
                if a.entry_check { "yes (in C)" } else { "no" },
                a.back_edge_checks,
                a.back_edges
            );
            for l in &a.loops {
                let _ = writeln!(
                    o,
                    "    loop at {:#x}: {} blocks, {} back edges, {} memory refs{}{}",
                    l.header,
                    l.blocks,
                    l.back_edges,
                    l.events,
                    if l.has_call { ", calls" } else { "" },
                    if l.k_boring { ", k-boring" } else { "" }
                );
            }
        }
    }
    o
}

/// Graphviz of one function's CFG, blocks labelled with their instructions.
fn dot(data: &[u8], f: &FunctionPlan) -> anyhow::Result<String> {
    let FunctionStatus::Analyzed(a) = &f.status else {
        bail!("{} was not analysed, so it has no CFG", f.name);
    };
    let cfg = a.cfg.as_ref().context("plan kept no CFG")?;
    let file = object::File::parse(data)?;
    let functions = userspace_rewriter::analysis::functions::discover(&file, data)?;
    let ctx = userspace_rewriter::analysis::cfg::CfgContext::new(&file, &functions);
    let func = functions
        .iter()
        .find(|x| x.start == f.start)
        .context("function vanished")?;
    let insns = ctx.decode(func);
    let mut o = String::new();
    let _ = writeln!(o, "digraph \"{}\" {{", f.name.replace('"', "\\\""));
    let _ = writeln!(o, "  node [shape=box, fontname=monospace, fontsize=10];");
    for (i, b) in cfg.blocks.iter().enumerate() {
        let mut label = format!("{:#x}:\\l", b.start);
        for ins in &insns[b.insns.clone()] {
            let _ = write!(label, "{}\\l", ins.display().replace('"', "\\\""));
        }
        let exit = cfg.exits.iter().any(|e| e.block == i);
        let _ = writeln!(
            o,
            "  b{i} [label=\"{label}\"{}];",
            if exit { ", peripheries=2" } else { "" }
        );
    }
    for e in &cfg.edges {
        let _ = writeln!(o, "  b{} -> b{} [label=\"{:?}\"];", e.from, e.to, e.kind);
    }
    let _ = writeln!(o, "}}");
    Ok(o)
}
