//! Per-function control-flow graphs, jump tables, skip reasons and
//! register/flags liveness.
//!
//! You give it a [`Function`], the linear sweep of its bytes
//! (`disasm::decode`) and a [`CfgContext`] (every function start,
//! the bytes of the file's sections, which functions never return);
//! `build_cfg` returns the function's [`Cfg`] — basic blocks, typed edges,
//! exits and recovered jump tables — or the [`SkipReason`] why the function
//! cannot be handled safely. [`liveness`] then gives, for every instruction,
//! the general-purpose registers and flags live before it.
//!
//! This is the analysis Hirzel & Chilimbi's x86 implementation of bursty
//! tracing needs before it can duplicate a procedure into checking and
//! instrumented versions ("Bursty Tracing", section 3): the checks go on
//! procedure entries and loop back-edges (section 4), so a function is only
//! usable when *every* control transfer out of every block is known. A
//! function the analysis cannot prove it handles is skipped, with a reason,
//! never guessed.
//!
//! ## How
//!
//! Control flow is followed recursively from the entry over the linear sweep;
//! only reached instructions form blocks. Blocks end at branches, returns,
//! traps and calls (a call's return point starts a new block, reached by a
//! [`EdgeKind::CallFallThrough`] edge). Calls to functions that never return
//! end their block with an exit instead. Indirect jumps are resolved as GCC
//! switch tables (see [`JumpTable`]) bounded by the `cmp idx, N; ja default`
//! guard; `jmp [rip+GOT]` is an indirect tail call.
//!
//! C++ landing pads (read from the LSDAs, `landing_pads.rs`) are roots of
//! the part that holds them, like the targets of `.cold` jumps: the
//! unwinder enters there. Calls in the clones push original return
//! addresses, so the unwinder finds each frame's original FDE and
//! call-site table and computes the original landing pad; when the
//! unwinder itself is cloned, its final jump ([`ExitKind::ContextJump`])
//! looks that address up and continues in the landing pad's clone.
//!
//! Noreturn functions: a fixed list of names (`abort`, `exit`,
//! `__stack_chk_fail`, ...; see `KNOWN_NORETURN`), matched on symbol and PLT
//! names, plus every function whose exits are all noreturn, found by the
//! fixpoint `CfgContext::infer_noreturn`.
//!
//! ## Non-goals
//!
//! No indirect jumps other than
//! the GCC table shapes, dispatch over the code pointers the binary states
//! (computed gotos), GOT tail calls and jumps to another frame
//! ([`ExitKind::ContextJump`]), no resynchronising a linear sweep that data desynchronised
//! (those are skip reasons), no interprocedural liveness (calls are modelled
//! by the SysV ABI).
//!
//! ## Files
//!
//! - `types.rs`: the CFG's types ([`Cfg`], [`Block`], [`Edge`], [`Exit`],
//!   [`SkipReason`], ...), re-exported here;
//! - `mod.rs`: the whole-file driver ([`analyse`]);
//! - `context.rs`: [`CfgContext`], what the walk needs beyond one function
//!   (section bytes, function ranges, `.eh_frame`);
//! - `known_noreturn.rs`: the names of functions known not to return;
//! - `noreturn.rs`: inferred noreturn functions;
//! - `build.rs`: `build_cfg`, the recursive walk and the cut into blocks;
//! - `jump_tables.rs`: GCC switch tables and their bound-check guards;
//! - `tail_calls.rs`: how control leaves the function other than by `ret`
//!   (tail calls, `.cold` jumps, indirect tail calls, jumps to another
//!   frame);
//! - `landing_pads.rs`: C++ landing pads from the LSDAs;
//! - `liveness.rs`: register and flags liveness ([`liveness`]).

mod build;
mod context;
mod jump_tables;
mod known_noreturn;
mod landing_pads;
mod liveness;
mod noreturn;
mod tail_calls;
mod types;

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::disasm::Insn;
use crate::analysis::functions::{Function, FunctionKind, FunctionSources, FunctionsError};
use crate::progress::Stage;

use build::build_cfg;
pub use context::CfgContext;
pub(crate) use context::{EhFrameInfo, parse_eh_frame};
pub use liveness::{LiveSet, flag, liveness};
pub use types::{
    Block, CallSite, Cfg, Edge, EdgeKind, Exit, ExitKind, JumpTable, JumpTableKind, SkipReason,
};

// ---------------------------------------------------------------------------
// Whole-file driver

/// The analysis of a whole file.
pub struct Analysis {
    /// Every function, as [`crate::analysis::functions::discover`] found them.
    pub functions: Vec<Function>,
    /// The linear sweep of each function.
    pub insns: Vec<Vec<Insn>>,
    /// The CFG of each function, or why it was skipped.
    pub cfgs: Vec<Result<Cfg, SkipReason>>,
    /// Starts of the functions known or inferred not to return.
    pub noreturn: Vec<u64>,
    /// The family of each function: the lowest index among the parts of
    /// the same function (a function and its `.cold` parts); its own
    /// index for most.
    pub families: Vec<usize>,
}

impl Analysis {
    /// `(analysable, total)` over the non-PLT functions.
    pub fn coverage(&self) -> (usize, usize) {
        let mut ok = 0;
        let mut total = 0;
        for (f, c) in self.functions.iter().zip(&self.cfgs) {
            if f.kind == FunctionKind::Plt {
                continue;
            }
            total += 1;
            ok += usize::from(c.is_ok());
        }
        (ok, total)
    }

    /// How many functions were skipped for each kind of reason (the variant
    /// name), sorted by name.
    pub fn skip_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for c in self.cfgs.iter().filter_map(|c| c.as_ref().err()) {
            let name = format!("{c:?}");
            let name = name
                .split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_string();
            *h.entry(name).or_insert(0) += 1;
        }
        h
    }

    /// The index of the function named `name` (or with that alias).
    pub fn function(&self, name: &str) -> Option<usize> {
        self.functions
            .iter()
            .position(|f| f.name == name || f.aliases.iter().any(|a| a == name))
    }
}

/// Discover, decode and build the CFG of every function of the ELF file
/// `data`, with noreturn inference.
pub fn analyse(file: &object::File, data: &[u8]) -> Result<Analysis, FunctionsError> {
    let mut functions = crate::analysis::functions::discover(file, data)?;
    let mut ctx = CfgContext::new(file, &functions);
    let n = functions.len();
    let mut insns: Vec<Vec<Insn>> = functions
        .iter()
        .enumerate()
        .map(|(k, f)| {
            crate::progress::report(Stage::Instructions, k, n);
            ctx.decode(f)
        })
        .collect();
    ctx.infer_noreturn(&functions, &insns);
    let none = BTreeSet::new();
    // Landing pads are entered from outside (by the unwinder): roots of
    // the part that holds them. A part whose CFG fails with them keeps the
    // CFG it has without (exceptions landing there then leave the clones).
    let pads = landing_pads::landing_pads(&ctx);
    let mut roots: Vec<BTreeSet<u64>> = functions
        .iter()
        .map(|f| {
            if f.kind == FunctionKind::Plt {
                return BTreeSet::new();
            }
            let lo = pads.partition_point(|&p| p <= f.start);
            let hi = pads.partition_point(|&p| p < f.end());
            pads[lo..hi.max(lo)].iter().copied().collect()
        })
        .collect();
    let mut cfgs: Vec<Result<Cfg, SkipReason>> = functions
        .iter()
        .zip(&insns)
        .zip(&mut roots)
        .enumerate()
        .map(|(k, ((f, i), r))| {
            crate::progress::report(Stage::Cfgs, k, n);
            if r.is_empty() {
                return build_cfg(f, i, &ctx, &none);
            }
            build_cfg(f, i, &ctx, r).or_else(|_| {
                r.clear();
                build_cfg(f, i, &ctx, &none)
            })
        })
        .collect();
    crate::progress::report(Stage::Cfgs, n, n);
    // Code the tables do not name but the analysed code calls or
    // tail-jumps to: a function of its own, appended (the others keep
    // their indices and CFGs: a transfer there was a call or tail call
    // already). One round: what those call in turn stays unnamed.
    let extra = unnamed_targets(&functions, &cfgs, &ctx);
    if !extra.is_empty() {
        let noreturn = std::mem::take(&mut ctx.noreturn);
        functions.extend(extra);
        ctx = CfgContext::new(file, &functions);
        ctx.noreturn = noreturn;
        let none = BTreeSet::new();
        for f in &functions[n..] {
            let i = ctx.decode(f);
            cfgs.push(build_cfg(f, &i, &ctx, &none));
            insns.push(i);
            roots.push(BTreeSet::new());
        }
    }
    let families = connect_parts(&functions, &insns, &ctx, &mut cfgs, roots);
    let noreturn = ctx.noreturn_functions().collect();
    Ok(Analysis {
        functions,
        insns,
        cfgs,
        noreturn,
        families,
    })
}

/// Direct call and tail-call targets of the analysed functions that lie
/// in an executable section but in no known function, as functions
/// ([`FunctionSources::CALL_TARGET`], `sub_<hex>`, up to the next known
/// start or the end of the section).
fn unnamed_targets(
    functions: &[Function],
    cfgs: &[Result<Cfg, SkipReason>],
    ctx: &CfgContext,
) -> Vec<Function> {
    let mut targets = BTreeSet::new();
    for c in cfgs.iter().flatten() {
        let calls = c.calls.iter().filter_map(|s| s.target);
        let tails = c.exits.iter().filter_map(|e| match e.kind {
            ExitKind::TailCall { target } => Some(target),
            _ => None,
        });
        for t in calls.chain(tails) {
            if !ctx.is_function_start(t) && ctx.containing(t).is_none() && ctx.is_code(t) {
                targets.insert(t);
            }
        }
    }
    let starts: BTreeSet<u64> = functions
        .iter()
        .map(|f| f.start)
        .chain(targets.iter().copied())
        .collect();
    targets
        .into_iter()
        .filter_map(|t| {
            let next = starts.range(t + 1..).next().copied().unwrap_or(u64::MAX);
            let size = next.min(ctx.code_end(t)?).saturating_sub(t);
            (size > 0).then(|| Function {
                name: format!("sub_{t:x}"),
                aliases: Vec::new(),
                start: t,
                size,
                sources: FunctionSources::CALL_TARGET,
                kind: FunctionKind::Normal,
                has_lsda: false,
            })
        })
        .collect()
}

/// The parts of one function in the compiler's sense (a function and its
/// `.cold` part, named or not) jump into each other's middle
/// ([`ExitKind::ColdJump`]). Rebuilds the CFG of every part that is
/// entered that way with those targets as roots (so the clones can
/// continue there: see `build_cfg`), until no new target appears, and
/// returns each function's family: the lowest index of the parts
/// connected by such jumps (or by a `.cold` name). A part whose CFG fails
/// with its roots keeps the CFG it had without them (its entries from
/// outside then leave the clones, as before). `roots` are each part's
/// roots so far (its landing pads).
fn connect_parts(
    functions: &[Function],
    insns: &[Vec<Insn>],
    ctx: &CfgContext,
    cfgs: &mut [Result<Cfg, SkipReason>],
    mut roots: Vec<BTreeSet<u64>>,
) -> Vec<usize> {
    let n = functions.len();
    let mut ranges: Vec<(u64, u64, usize)> = functions
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind != FunctionKind::Plt)
        .map(|(i, f)| (f.start, f.end(), i))
        .collect();
    ranges.sort_unstable();
    let containing = |a: u64| -> Option<usize> {
        let k = ranges.partition_point(|r| r.0 <= a);
        ranges[..k]
            .iter()
            .rev()
            .take(8)
            .find(|r| a < r.1)
            .map(|r| r.2)
    };
    let mut family: Vec<usize> = (0..n).collect();
    fn find(f: &mut [usize], mut i: usize) -> usize {
        while f[i] != i {
            f[i] = f[f[i]];
            i = f[i];
        }
        i
    }
    fn union(f: &mut [usize], a: usize, b: usize) {
        let (ra, rb) = (find(f, a), find(f, b));
        f[ra.max(rb)] = ra.min(rb);
    }
    for (i, f) in functions.iter().enumerate() {
        if let FunctionKind::ColdPart { parent: Some(p) } = f.kind {
            union(&mut family, i, p);
        }
    }
    // Parts whose roots all lie in code their CFG already reaches (a
    // parent's join points, mostly) gain no new exits from them: they are
    // rebuilt once, at the end, with all their roots; parts with a root in
    // code not reached yet (a cold part's later fragments) at once, since
    // what they reach may jump elsewhere. Bounded all the same.
    let mut stale: BTreeSet<usize> = BTreeSet::new();
    let rebuild = |cfgs: &mut [Result<Cfg, SkipReason>], j: usize, roots: &BTreeSet<u64>| {
        let with = build_cfg(&functions[j], &insns[j], ctx, roots);
        if with.is_ok() || cfgs[j].is_err() {
            cfgs[j] = with;
        }
    };
    for _ in 0..16 {
        let mut wanted: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
        for (i, c) in cfgs.iter().enumerate() {
            let Ok(c) = c else { continue };
            for e in &c.exits {
                let ExitKind::ColdJump { target } = e.kind else {
                    continue;
                };
                let Some(j) = containing(target).filter(|&j| j != i) else {
                    continue;
                };
                union(&mut family, i, j);
                if target != functions[j].start && !roots[j].contains(&target) {
                    wanted.entry(j).or_default().insert(target);
                }
            }
        }
        if wanted.is_empty() {
            break;
        }
        for (j, new) in wanted {
            let reached = cfgs[j]
                .as_ref()
                .is_ok_and(|c| new.iter().all(|&t| c.block_at(t).is_some()));
            roots[j].extend(new);
            if reached {
                stale.insert(j);
            } else {
                rebuild(cfgs, j, &roots[j]);
                stale.remove(&j);
            }
        }
    }
    for j in stale {
        rebuild(cfgs, j, &roots[j]);
    }
    (0..n).map(|i| find(&mut family, i)).collect()
}
