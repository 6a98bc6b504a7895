//! The deterministic *plan* of a binary: everything the clone generator
//! needs, computed from the ELF file alone (no process is touched).
//!
//! Pipeline: [`functions`](super::functions) → [`disasm`](super::disasm) →
//! [`cfg`](mod@cfg) → [`graph`] (dominators, loops) → [`paths`] (Ball-Larus
//! numbering) and `callgraph` (the entry-check set C of Hirzel & Chilimbi
//! §4.1, k-boring loops of §4.2).
//!
//! Check points (Hirzel & Chilimbi §2, §4): the unreduced framework checks at
//! every procedure entry and every loop back edge (`checks_all`); the
//! reduced placement checks only on entry to procedures in C and on back
//! edges of loops that are not k-boring, keeping every retreating edge of an
//! irreducible region (`checks_reduced`).
//!
//! Same input, same bytes: the plan holds no times, no paths on disk and no
//! hash-map order. The analysis time is reported beside it
//! ([`AnalysisReport::analysis_ms`]).
use std::collections::BTreeMap;
use std::time::Instant;

use iced_x86::{Mnemonic, OpKind};
use object::Object;
use serde::Serialize;

use crate::analysis::callgraph::{self, CallGraph, LoopSummary};
use crate::analysis::cfg::{self, Cfg, SkipReason};
use crate::analysis::disasm::{Flow, Insn};
use crate::analysis::functions::{Function, FunctionKind, FunctionSources};
use crate::analysis::graph::Loops;
use crate::analysis::paths::{self, PathNumbering, PathsError};
use crate::progress::Stage;

/// Default `k` for k-boring loops: the paper's experiments skip 4-boring
/// loops (§4.2).
pub const DEFAULT_K: u64 = 4;

#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Loops with no calls and at most `k` memory references get neither
    /// instrumentation nor a back-edge check.
    pub k: u64,
    /// Keep the full CFGs and path numberings in the plan (the clone
    /// generator needs them; summaries do not).
    pub keep_details: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            k: DEFAULT_K,
            keep_details: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The reason is the source's (shown by `{:#}`, once).
    #[error("not an ELF file we can read")]
    Object(#[from] object::Error),
    #[error("{0}")]
    Functions(#[from] crate::analysis::functions::FunctionsError),
    #[error("not an x86-64 ELF file (found {0:?})")]
    Architecture(object::Architecture),
}

/// Totals over the analysable functions (the JSON summary's keys).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Functions found (PLT stubs excluded: they are the dynamic linker's
    /// code, never cloned).
    pub functions_total: usize,
    pub functions_analyzable: usize,
    /// Skip reason (variant name) → functions.
    pub skipped: BTreeMap<String, usize>,
    /// Where the functions were found (a function may count in several).
    pub found_in: BTreeMap<String, usize>,
    pub plt_stubs: usize,
    pub blocks: usize,
    pub edges: usize,
    pub loops: usize,
    pub irreducible_functions: usize,
    /// Sum of Ball-Larus path counts over functions that have a numbering.
    pub paths_total: u128,
    /// Functions whose paths could not be numbered at all (none since
    /// paths are cut into regions): still rewritten for edges, calls and
    /// checks, without path numbers.
    pub functions_too_many_paths: usize,
    /// Functions with more than [`MAX_PATHS`] paths, cut into regions.
    pub functions_cut_into_regions: usize,
    pub checks_all: usize,
    pub checks_reduced: usize,
    pub entry_checks_all: usize,
    pub entry_checks_reduced: usize,
    pub back_edge_checks_all: usize,
    pub back_edge_checks_reduced: usize,
    pub k_boring_loops: usize,
}

/// One loop of a function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LoopPlan {
    pub header: u64,
    pub blocks: usize,
    pub back_edges: usize,
    pub has_call: bool,
    /// Memory references in the body (the "profiling events of interest").
    pub events: u64,
    pub k_boring: bool,
}

/// What the plan says about one analysable function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FunctionAnalysis {
    pub blocks: usize,
    pub edges: usize,
    pub loops: Vec<LoopPlan>,
    pub irreducible: bool,
    /// Ball-Larus paths, `None` when they cannot be numbered.
    pub paths: Option<u64>,
    /// Edges cut to keep the paths under [`MAX_PATHS`] (0 for almost
    /// every function): the function's paths also end there.
    #[serde(skip_serializing_if = "is_zero", default)]
    pub cut_edges: usize,
    /// In the entry-check set C.
    pub entry_check: bool,
    /// Back edges (and irreducible retreating edges) that keep a check.
    pub back_edge_checks: usize,
    /// All back and retreating edges (unreduced checks).
    pub back_edges: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cfg: Option<Cfg>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numbering: Option<PathNumbering>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionStatus {
    Analyzed(Box<FunctionAnalysis>),
    Skipped { reason: SkipReason },
    Plt,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FunctionPlan {
    pub name: String,
    pub start: u64,
    pub size: u64,
    #[serde(deserialize_with = "source_names_back")]
    pub sources: Vec<&'static str>,
    pub(crate) cold_part: bool,
    /// Index of the first part of the function this one belongs to (a
    /// `.cold` part's parent family; its own index for most): a part
    /// returns from the frame its family's entry made.
    pub family: usize,
    pub status: FunctionStatus,
}

/// The plan of one binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Plan {
    pub build_id: Option<String>,
    pub pie: bool,
    pub k: u64,
    pub summary: Summary,
    pub functions: Vec<FunctionPlan>,
}

/// A function's CFG and path numbering: what turns its path numbers back
/// into blocks and edges. A long-lived holder of plans (the daemon) keeps
/// them apart from the plan, on disk, and reads a function's when its
/// paths are exported ([`Plan::take_details`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PathDetails {
    pub cfg: Cfg,
    pub numbering: PathNumbering,
}

impl Plan {
    /// Takes every function's CFG and path numbering out of the plan, in
    /// function order (`Some` where it had both). The rest of the plan,
    /// [`FunctionAnalysis::paths`] included, stays as it was.
    pub fn take_details(&mut self) -> Vec<Option<PathDetails>> {
        self.functions
            .iter_mut()
            .map(|f| match &mut f.status {
                FunctionStatus::Analyzed(fa) => match (fa.cfg.take(), fa.numbering.take()) {
                    (Some(cfg), Some(numbering)) => Some(PathDetails { cfg, numbering }),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// A copy of the plan without the CFGs and path numberings (see
    /// [`Plan::take_details`]).
    pub fn without_details(&self) -> Plan {
        let functions = self
            .functions
            .iter()
            .map(|f| FunctionPlan {
                name: f.name.clone(),
                start: f.start,
                size: f.size,
                sources: f.sources.clone(),
                cold_part: f.cold_part,
                family: f.family,
                status: match &f.status {
                    FunctionStatus::Analyzed(fa) => {
                        FunctionStatus::Analyzed(Box::new(FunctionAnalysis {
                            loops: fa.loops.clone(),
                            cfg: None,
                            numbering: None,
                            ..**fa
                        }))
                    }
                    other => other.clone(),
                },
            })
            .collect();
        Plan {
            build_id: self.build_id.clone(),
            pie: self.pie,
            k: self.k,
            summary: self.summary.clone(),
            functions,
        }
    }

    /// The CFG and path numbering of function `i`, if the plan holds them.
    pub fn details_of(&self, i: usize) -> Option<(&Cfg, &PathNumbering)> {
        match &self.functions.get(i)?.status {
            FunctionStatus::Analyzed(fa) => Some((fa.cfg.as_ref()?, fa.numbering.as_ref()?)),
            _ => None,
        }
    }
}

/// A plan and how long it took.
pub struct AnalysisReport {
    pub plan: Plan,
    pub analysis_ms: u64,
}

fn source_names(s: FunctionSources) -> Vec<&'static str> {
    FunctionSources::NAMES
        .into_iter()
        .filter(|(bit, _)| s.contains(*bit))
        .map(|(_, n)| n)
        .collect()
}

/// [`source_names`] read back (a cached plan).
fn source_names_back<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<&'static str>, D::Error> {
    let names: Vec<String> = serde::Deserialize::deserialize(d)?;
    names
        .iter()
        .map(|n| {
            FunctionSources::NAMES
                .into_iter()
                .map(|(_, k)| k)
                .find(|k| k == n)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown function source {n}")))
        })
        .collect()
}

/// Variant name of a skip reason (`UnresolvedIndirectJump`, ...).
fn reason_name(r: &SkipReason) -> String {
    let s = format!("{r:?}");
    s.split([' ', '{', '('])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// An instruction that reads or writes memory through an explicit memory
/// operand (`lea` and `nop` do not).
fn is_memory_event(i: &Insn) -> bool {
    let ins = &i.instr;
    if matches!(ins.mnemonic(), Mnemonic::Lea | Mnemonic::Nop) {
        return false;
    }
    (0..ins.op_count()).any(|k| ins.op_kind(k) == OpKind::Memory)
}

/// Function starts whose address is taken: referenced by an instruction
/// other than as a direct branch target (RIP-relative `lea`, immediates), or
/// stored in data (8-byte words of non-code sections, dynamic relocations).
fn address_taken(file: &object::File, functions: &[Function], insns: &[Vec<Insn>]) -> Vec<bool> {
    let index: BTreeMap<u64, usize> = functions
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind != FunctionKind::Plt)
        .map(|(i, f)| (f.start, i))
        .collect();
    let mut taken = vec![false; functions.len()];
    let mut mark = |addr: u64| {
        if let Some(&i) = index.get(&addr) {
            taken[i] = true;
        }
    };
    for list in insns {
        for i in list {
            let ins = &i.instr;
            if ins.is_ip_rel_memory_operand() && ins.mnemonic() == Mnemonic::Lea {
                mark(ins.ip_rel_memory_address());
            }
            for k in 0..ins.op_count() {
                match ins.op_kind(k) {
                    OpKind::Immediate32to64 | OpKind::Immediate32 | OpKind::Immediate64 => {
                        mark(ins.immediate(k))
                    }
                    OpKind::Memory if !ins.is_ip_rel_memory_operand() => {
                        mark(ins.memory_displacement64())
                    }
                    _ => {}
                }
            }
        }
    }
    for w in crate::analysis::elf::stored_words(file) {
        mark(w);
    }
    taken
}

/// Builds the plan of the ELF image `data`.
pub fn analyze(data: &[u8], opts: &PlanOptions) -> Result<AnalysisReport, PlanError> {
    analyze_with_insns(data, opts).map(|(report, _)| report)
}

/// [`analyze`], also returning the decoded instructions and CFGs the plan
/// was computed from (the clone generator relocates those instructions).
pub fn analyze_with_insns(
    data: &[u8],
    opts: &PlanOptions,
) -> Result<(AnalysisReport, cfg::Analysis), PlanError> {
    let t0 = Instant::now();
    let file = object::File::parse(data)?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err(PlanError::Architecture(file.architecture()));
    }
    let analysis = cfg::analyse(&file, data)?;
    let functions = &analysis.functions;
    let n = functions.len();
    let by_start: BTreeMap<u64, usize> = functions
        .iter()
        .enumerate()
        .map(|(i, f)| (f.start, i))
        .collect();

    // Call graph over all functions.
    let mut cg = CallGraph::new(n);
    for (i, (f, c)) in functions.iter().zip(&analysis.cfgs).enumerate() {
        if f.sources.contains(FunctionSources::DYNSYM) || f.start == file.entry() {
            cg.set_root(i);
        }
        let Ok(c) = c else {
            // We cannot see its calls: it may call anything.
            cg.set_unknown_calls(i);
            continue;
        };
        for call in &c.calls {
            match call.target.and_then(|t| by_start.get(&t)) {
                Some(&callee) if functions[callee].kind != FunctionKind::Plt => {
                    cg.add_call(i, callee)
                }
                _ => cg.set_unknown_calls(i),
            }
        }
        for e in &c.exits {
            if let cfg::ExitKind::TailCall { target } = e.kind {
                match by_start.get(&target) {
                    Some(&callee) if functions[callee].kind != FunctionKind::Plt => {
                        cg.add_call(i, callee)
                    }
                    _ => cg.set_unknown_calls(i),
                }
            }
        }
    }
    // main is called from libc's __libc_start_main, i.e. from outside.
    for (i, f) in functions.iter().enumerate() {
        if f.name == "main" {
            cg.set_root(i);
        }
    }
    for (i, t) in address_taken(&file, functions, &analysis.insns)
        .into_iter()
        .enumerate()
    {
        if t {
            cg.set_address_taken(i);
        }
    }
    let in_c = callgraph::entry_check_set(&cg);

    let mut summary = Summary::default();
    let mut plans = Vec::with_capacity(n);
    for (i, f) in functions.iter().enumerate() {
        crate::progress::report(Stage::Paths, i, n);
        for s in source_names(f.sources) {
            *summary.found_in.entry(s.to_string()).or_insert(0) += 1;
        }
        let status = if f.kind == FunctionKind::Plt {
            summary.plt_stubs += 1;
            FunctionStatus::Plt
        } else {
            summary.functions_total += 1;
            match &analysis.cfgs[i] {
                Err(reason) => {
                    *summary.skipped.entry(reason_name(reason)).or_insert(0) += 1;
                    FunctionStatus::Skipped {
                        reason: reason.clone(),
                    }
                }
                Ok(c) => {
                    let fa = analyze_function(c, &analysis.insns[i], in_c[i], opts);
                    summary.functions_analyzable += 1;
                    summary.blocks += fa.blocks;
                    summary.edges += fa.edges;
                    summary.loops += fa.loops.len();
                    summary.k_boring_loops += fa.loops.iter().filter(|l| l.k_boring).count();
                    summary.irreducible_functions += usize::from(fa.irreducible);
                    match fa.paths {
                        Some(p) => summary.paths_total += u128::from(p),
                        None => summary.functions_too_many_paths += 1,
                    }
                    summary.functions_cut_into_regions += usize::from(fa.cut_edges > 0);
                    summary.entry_checks_all += 1;
                    summary.entry_checks_reduced += usize::from(fa.entry_check);
                    summary.back_edge_checks_all += fa.back_edges;
                    summary.back_edge_checks_reduced += fa.back_edge_checks;
                    FunctionStatus::Analyzed(Box::new(fa))
                }
            }
        };
        plans.push(FunctionPlan {
            name: f.name.clone(),
            start: f.start,
            size: f.size,
            sources: source_names(f.sources),
            cold_part: matches!(f.kind, FunctionKind::ColdPart { .. }),
            family: analysis.families[i],
            status,
        });
    }
    crate::progress::report(Stage::Paths, n, n);
    summary.checks_all = summary.entry_checks_all + summary.back_edge_checks_all;
    summary.checks_reduced = summary.entry_checks_reduced + summary.back_edge_checks_reduced;

    let build_id = crate::analysis::elf::ElfInfo::parse(data)
        .ok()
        .and_then(|e| e.build_id_hex());
    let plan = Plan {
        build_id,
        pie: file.kind() == object::ObjectKind::Dynamic,
        k: opts.k,
        summary,
        functions: plans,
    };
    Ok((
        AnalysisReport {
            plan,
            analysis_ms: t0.elapsed().as_millis() as u64,
        },
        analysis,
    ))
}

/// Path numbers at most this many per function (bit 63 of the path
/// register is `PATH_INVALID`; the margin leaves room for increments).
pub const MAX_PATHS: u64 = 1 << 62;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn analyze_function(
    c: &Cfg,
    insns: &[Insn],
    entry_check: bool,
    opts: &PlanOptions,
) -> FunctionAnalysis {
    let g = c.to_graph();
    let loops: Loops = c.loops();
    let block_has_call: Vec<bool> = c
        .blocks
        .iter()
        .map(|b| {
            insns[b.insns.clone()]
                .iter()
                .any(|i| matches!(i.flow, Flow::Call(_) | Flow::IndirectCall))
        })
        .collect();
    let block_events: Vec<u64> = c
        .blocks
        .iter()
        .map(|b| {
            insns[b.insns.clone()]
                .iter()
                .filter(|i| is_memory_event(i))
                .count() as u64
        })
        .collect();
    let summaries: Vec<LoopSummary> =
        callgraph::loop_summaries(&loops, &|b| block_has_call[b], &|b| block_events[b]);
    let boring = callgraph::k_boring_loops(&summaries, opts.k);
    let loop_plans: Vec<LoopPlan> = loops
        .loops
        .iter()
        .zip(&summaries)
        .zip(&boring)
        .map(|((l, s), &k_boring)| LoopPlan {
            header: c.blocks[l.header].start,
            blocks: l.body.len(),
            back_edges: l.back_edges.len(),
            has_call: s.has_call,
            events: s.events,
            k_boring,
        })
        .collect();
    let back_edges = loops.back_edges.len() + loops.retreating_non_back.len();
    let back_edge_checks = loops
        .loops
        .iter()
        .zip(&boring)
        .filter(|(_, b)| !**b)
        .map(|(l, _)| l.back_edges.len())
        .sum::<usize>()
        + loops.retreating_non_back.len();
    // Paths beyond MAX_PATHS are cut into regions (their path register
    // keeps bit 63 for PATH_INVALID and a margin below it).
    let (numbering, cut_edges) = match paths::number_paths_cutting(&g, &loops, MAX_PATHS) {
        Ok((p, cut)) => (Some(p), cut.len()),
        Err(PathsError::TooManyPaths { .. }) => (None, 0),
        // The CFG builder and the loop finder disagree: a bug, not an input
        // property. Keep the function without paths rather than guess.
        Err(_) => (None, 0),
    };
    FunctionAnalysis {
        blocks: c.blocks.len(),
        edges: c.edges.len(),
        irreducible: loops.irreducible,
        loops: loop_plans,
        paths: numbering.as_ref().map(|p| p.total_paths()),
        cut_edges,
        entry_check,
        back_edge_checks,
        back_edges,
        cfg: opts.keep_details.then(|| c.clone()),
        numbering: if opts.keep_details { numbering } else { None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not ELF says why once, however its error chain is
    /// printed.
    #[test]
    fn not_elf_says_why_once() {
        let e = analyze(b"#!/bin/sh\necho hi\n", &PlanOptions::default())
            .err()
            .unwrap();
        // What anyhow's `{:#}` prints: each error of the chain once.
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain += &format!(": {s}");
            source = s.source();
        }
        assert_eq!(chain.matches("magic").count(), 1, "{chain}");
        assert!(
            chain.starts_with("not an ELF file we can read: "),
            "{chain}"
        );
    }
}
