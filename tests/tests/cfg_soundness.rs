//! Dynamic soundness of the rewriter's CFGs: real programs (bzip2 and xz
//! built from source by scripts/realprogs.sh, -O2 -g, PIE) run under a ptrace
//! single-stepping tracer ([`burstyd_tests::tracer`]: every instruction in
//! the executable is stepped, libc runs at full speed with the executable's
//! text made non-executable so that every re-entry faults), and every
//! control transfer they take inside an analysed function must be an edge
//! or an exit of that function's CFG, and every block they enter one of its
//! blocks.
//!
//! "Analysed" means what the plan rewrites: an Ok CFG from
//! `userspace_rewriter::analysis::cfg::analyse`, PLT stubs excluded (the plan never
//! touches them; a lazily bound `.plt` stub is re-entered at its `push n` by
//! its own `jmp [GOT]`, which its one-block CFG does not model).
//!
//! Checked for each traced step `prev -> cur` (SVMAs of the executable):
//! - `prev` in a block of an analysed function F, not its last instruction:
//!   `cur` must be the next instruction (or `prev` again for one more
//!   iteration of a `rep` string instruction).
//! - `prev` the last instruction of block b of F:
//!   - direct call: `cur` is the call's target; indirect call: anything;
//!   - `ret`: a Return exit of F; `cur` anything (checked on landing);
//!   - anything else: `cur` starts a block b' with an intra-function edge
//!     b -> b' (not a CallFallThrough edge), or an exit of `prev` allows it
//!     (TailCall/ColdJump to exactly `cur`, IndirectTailCall anywhere).
//! - `cur` in an analysed function G, other than the next instruction of
//!   `prev`'s block: `cur` must start one of G's blocks; after a `ret` (in
//!   the executable, or outside code returning into it) it must be a
//!   *return point*: the start of a block reached by a CallFallThrough edge
//!   from a block ending with a call that ends at `cur` (so a call the CFG
//!   takes for noreturn must not return); when outside code calls or jumps
//!   into the executable, it must be G's entry.
//!
//! The traced program's output must equal its untraced output, byte for
//! byte; the report (printed) gives coverage: steps checked, blocks, edges,
//! exits, functions, and the instructions spent in functions not analysed.
//!
//! Single-stepping costs ~13-15 us per instruction on the 2-core test VM, so
//! the inputs are small (bzip2 still needs >= 10000 bytes to sort with
//! mainSort rather than fallbackSort: ~6.5 M instructions, ~100 s; xz ~4 M,
//! ~60 s; the tests run in parallel, each pinned to its own CPU).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use burstyd_tests::tracer::{self, Ended, Event, Observer, Via};
use burstyd_tests::*;
use userspace_rewriter::analysis::cfg::{Analysis, EdgeKind, ExitKind};
use userspace_rewriter::analysis::disasm::Flow;
use userspace_rewriter::analysis::functions::FunctionKind;

/// One instruction of a block of an analysed function.
#[derive(Clone, Copy)]
struct InsnInfo {
    func: u32,
    block: u32,
    /// Index into `analysis.insns[func]`.
    idx: u32,
    last: bool,
    /// A `rep` string instruction: each single step runs one iteration and
    /// may leave `rip` on the instruction itself.
    rep: bool,
    end: u64,
    flow: Flow,
}

/// A map from the SVMAs of the executable's code to `T`, one slot per byte
/// (lookups at every traced step must be cheap, even unoptimized).
struct AddrMap<T> {
    base: u64,
    slots: Vec<Option<T>>,
}

impl<T: Copy> AddrMap<T> {
    fn new(base: u64, end: u64) -> Self {
        AddrMap {
            base,
            slots: vec![None; (end - base) as usize],
        }
    }
    fn get(&self, addr: u64) -> Option<T> {
        let i = usize::try_from(addr.wrapping_sub(self.base)).ok()?;
        self.slots.get(i).copied().flatten()
    }
    fn insert(&mut self, addr: u64, v: T) {
        let i = (addr - self.base) as usize;
        self.slots[i] = Some(v);
    }
}

/// One violation (deduplicated by `(prev, cur)`).
struct Violation {
    what: String,
    count: u64,
}

#[derive(Default)]
struct Coverage {
    steps: u64,
    steps_checked: u64,
    blocks: HashSet<(u32, u32)>,
    edges: HashSet<(u32, u32, u32)>,
    exits: HashSet<(u32, u64)>,
    /// Instructions executed in each analysed function (0: never entered),
    /// by function index.
    functions: Vec<u64>,
    /// Instructions executed in functions that are not analysed (skipped,
    /// PLT stubs), by function index.
    unanalysed: Vec<u64>,
    returns_checked: u64,
    enters: BTreeMap<String, u64>,
}

struct Checker {
    a: Analysis,
    /// Every instruction in a block of an analysed function, by SVMA.
    insns: AddrMap<InsnInfo>,
    /// Block starts of analysed functions: SVMA -> (function, block).
    block_starts: AddrMap<(u32, u32)>,
    /// The analysed function (Ok CFG, not a PLT stub) whose range holds
    /// each byte.
    owner: AddrMap<u32>,
    /// Any function whose range holds each byte.
    any_owner: AddrMap<u32>,
    /// Intra-function edges other than CallFallThrough: (function, from, to).
    edges: HashSet<(u32, u32, u32)>,
    /// Exits by instruction SVMA.
    exits: HashMap<u64, Vec<ExitKind>>,
    /// Return points: SVMA -> (function, call block, return block).
    return_points: AddrMap<(u32, u32, u32)>,
    /// Function ranges `(start, end, index)` sorted by start (all kinds).
    ranges: Vec<(u64, u64, u32)>,
    /// Violations by `(prev, cur)` (`u64::MAX` for outside).
    violations: BTreeMap<(u64, u64), Violation>,
    /// How long `analyse` took.
    analysis_time: std::time::Duration,
    total_violations: u64,
    cov: Coverage,
}

impl Checker {
    fn new(exe: &Path) -> Checker {
        let data = std::fs::read(exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let t0 = Instant::now();
        let a = userspace_rewriter::analysis::cfg::analyse(&file, &data).unwrap();
        let analysis_time = t0.elapsed();
        let lo = a.functions.iter().map(|f| f.start).min().unwrap();
        let hi = a.functions.iter().map(|f| f.end()).max().unwrap();
        let mut insns = AddrMap::new(lo, hi);
        let mut block_starts = AddrMap::new(lo, hi);
        let mut owner = AddrMap::new(lo, hi);
        let mut any_owner = AddrMap::new(lo, hi);
        for (fi, f) in a.functions.iter().enumerate() {
            for addr in f.start..f.end() {
                if any_owner.get(addr).is_none() {
                    any_owner.insert(addr, fi as u32);
                }
            }
        }
        let mut return_points = AddrMap::new(lo, hi);
        let mut edges = HashSet::new();
        let mut exits: HashMap<u64, Vec<ExitKind>> = HashMap::new();
        for (fi, cfg) in a.cfgs.iter().enumerate() {
            let Ok(cfg) = cfg else { continue };
            if a.functions[fi].kind == FunctionKind::Plt {
                // PLT stubs are not part of the plan (never rewritten); and a
                // lazily bound `.plt` stub is re-entered at `push n` by its
                // own `jmp [GOT]`.
                continue;
            }
            let fi = fi as u32;
            let fins = &a.insns[fi as usize];
            let f = &a.functions[fi as usize];
            for addr in f.start..f.end() {
                owner.insert(addr, fi);
            }
            for (bi, b) in cfg.blocks.iter().enumerate() {
                block_starts.insert(b.start, (fi, bi as u32));
                for i in b.insns.clone() {
                    let insn = &fins[i];
                    insns.insert(
                        insn.addr,
                        InsnInfo {
                            func: fi,
                            block: bi as u32,
                            idx: i as u32,
                            last: i + 1 == b.insns.end,
                            rep: insn.instr.is_string_instruction()
                                && (insn.instr.has_rep_prefix() || insn.instr.has_repne_prefix()),
                            end: insn.end(),
                            flow: insn.flow,
                        },
                    );
                }
            }
            for e in &cfg.edges {
                if e.kind == EdgeKind::CallFallThrough {
                    let to = cfg.blocks[e.to].start;
                    let last = &fins[cfg.blocks[e.from].insns.end - 1];
                    assert!(
                        matches!(last.flow, Flow::Call(_) | Flow::IndirectCall) && last.end() == to,
                        "CallFallThrough edge not from a call to its return point in {}",
                        a.functions[fi as usize].name
                    );
                    return_points.insert(to, (fi, e.from as u32, e.to as u32));
                } else {
                    edges.insert((fi, e.from as u32, e.to as u32));
                }
            }
            for x in &cfg.exits {
                exits.entry(x.insn).or_default().push(x.kind);
            }
        }
        let mut ranges: Vec<(u64, u64, u32)> = a
            .functions
            .iter()
            .enumerate()
            .map(|(i, f)| (f.start, f.end(), i as u32))
            .collect();
        ranges.sort();
        let n = a.functions.len();
        Checker {
            a,
            insns,
            block_starts,
            owner,
            any_owner,
            edges,
            exits,
            return_points,
            ranges,
            violations: BTreeMap::new(),
            analysis_time,
            total_violations: 0,
            cov: Coverage {
                functions: vec![0; n],
                unanalysed: vec![0; n],
                ..Coverage::default()
            },
        }
    }

    fn name_at(&self, addr: u64) -> String {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        match self.ranges[..i].iter().rev().take(8).find(|r| addr < r.1) {
            Some(r) => {
                let f = &self.a.functions[r.2 as usize];
                let status = match &self.a.cfgs[r.2 as usize] {
                    Ok(_) => String::new(),
                    Err(e) => format!(" [skipped: {e}]"),
                };
                format!("{}+{:#x}{status}", f.name, addr - f.start)
            }
            None => format!("{addr:#x} (no function)"),
        }
    }

    fn disasm(&self, addr: u64) -> String {
        if let Some(p) = self.insns.get(addr) {
            return self.a.insns[p.func as usize][p.idx as usize].display();
        }
        for (fi, f) in self.a.functions.iter().enumerate() {
            if f.contains(addr)
                && let Ok(i) = self.a.insns[fi].binary_search_by_key(&addr, |i| i.addr)
            {
                return self.a.insns[fi][i].display();
            }
        }
        "?".to_string()
    }

    fn violation(&mut self, prev: Option<u64>, cur: Option<u64>, why: &str) {
        self.total_violations += 1;
        let key = (prev.unwrap_or(u64::MAX), cur.unwrap_or(u64::MAX));
        if let Some(v) = self.violations.get_mut(&key) {
            v.count += 1;
            return;
        }
        if self.violations.len() >= 200 {
            return;
        }
        let side = |a: Option<u64>| match a {
            Some(a) => format!("{a:#x} {} `{}`", self.name_at(a), self.disasm(a)),
            None => "(outside the executable)".to_string(),
        };
        let what = format!("{why}\n    prev {}\n    cur  {}", side(prev), side(cur));
        self.violations.insert(key, Violation { what, count: 1 });
    }

    /// Check the source side of `prev -> cur`. Returns (`prev` was a `ret`,
    /// `cur` is the sequential successor within `prev`'s block).
    fn check_prev(&mut self, prev: u64, cur: Option<u64>) -> (bool, bool) {
        let Some(p) = self.insns.get(prev) else {
            if let Some(f) = self.any_owner.get(prev) {
                self.cov.unanalysed[f as usize] += 1;
            }
            // `prev` in no analysed block: skipped function, outside
            // anything, or an instruction the CFG did not reach (flagged
            // when it was entered).
            return (false, false);
        };
        self.cov.steps_checked += 1;
        self.cov.functions[p.func as usize] += 1;
        if p.rep && cur == Some(prev) {
            // One more iteration of a `rep` string instruction.
            return (false, true);
        }
        if !p.last {
            if cur != Some(p.end) {
                self.violation(Some(prev), cur, "left a block before its last instruction");
            }
            return (false, cur == Some(p.end));
        }
        match p.flow {
            Flow::Call(t) => {
                if cur != Some(t) {
                    self.violation(Some(prev), cur, "direct call did not go to its target");
                }
                (false, false)
            }
            Flow::IndirectCall => (false, false),
            Flow::Ret => {
                self.cov.exits.insert((p.func, prev));
                if !self.exit_allows(prev, |k| matches!(k, ExitKind::Return)) {
                    self.violation(Some(prev), cur, "ret that is not a Return exit");
                }
                (true, false)
            }
            _ => {
                if let Some(c) = cur
                    && let Some((f, b)) = self.block_starts.get(c)
                    && f == p.func
                    && self.edges.contains(&(f, p.block, b))
                {
                    self.cov.edges.insert((f, p.block, b));
                    return (false, false);
                }
                let ok = self.exit_allows(prev, |k| match k {
                    ExitKind::TailCall { target } | ExitKind::ColdJump { target } => {
                        cur == Some(target)
                    }
                    ExitKind::IndirectTailCall => true,
                    _ => false,
                });
                if ok {
                    self.cov.exits.insert((p.func, prev));
                } else {
                    self.violation(
                        Some(prev),
                        cur,
                        "control transfer that is neither an edge nor an exit of the CFG",
                    );
                }
                (false, false)
            }
        }
    }

    fn exit_allows(&self, insn: u64, ok: impl Fn(ExitKind) -> bool) -> bool {
        self.exits
            .get(&insn)
            .is_some_and(|ks| ks.iter().any(|&k| ok(k)))
    }

    /// Check the landing side: `cur` entered other than sequentially.
    fn check_cur(&mut self, prev: Option<u64>, cur: u64, how: Landing) {
        let Some(g) = self.owner.get(cur) else {
            return;
        };
        self.cov.steps_checked += u64::from(prev.is_none_or(|p| self.insns.get(p).is_none()));
        if self.cov.functions[g as usize] == 0 {
            self.cov.functions[g as usize] = 1;
        }
        match self.block_starts.get(cur) {
            Some((f, b)) if f == g => {
                self.cov.blocks.insert((f, b));
            }
            _ => {
                self.violation(
                    prev,
                    Some(cur),
                    "entered an analysed function not at a block start",
                );
                return;
            }
        }
        match how {
            Landing::Transfer => {}
            Landing::Return => {
                self.cov.returns_checked += 1;
                match self.return_points.get(cur) {
                    Some((f, from, to)) => {
                        self.cov.edges.insert((f, from, to));
                    }
                    None => self.violation(
                        prev,
                        Some(cur),
                        "return to an address that is not a call's return point in the CFG",
                    ),
                }
            }
            Landing::CallFromOutside => {
                if self.a.functions[g as usize].start != cur {
                    self.violation(
                        prev,
                        Some(cur),
                        "called or jumped into from outside code not at a function entry",
                    );
                }
            }
        }
    }
}

/// How control arrived at an instruction that is not the sequential
/// successor of the previous one in its block.
#[derive(Clone, Copy)]
enum Landing {
    /// A jump, call, fall-through into the next block, or a signal.
    Transfer,
    /// A `ret` in the executable, or outside code returning into it.
    Return,
    /// Outside code calling or jumping into the executable.
    CallFromOutside,
}

impl Observer for Checker {
    fn event(&mut self, e: Event) {
        self.cov.steps += 1;
        match e {
            Event::Step { prev, cur } => {
                let (returned, sequential) = self.check_prev(prev, Some(cur));
                // Straight-line execution through instructions the CFG does
                // not have: reported once, where it was entered.
                let unreached_straight = self.insns.get(prev).is_none()
                    && self.owner.get(prev).is_some()
                    && self.owner.get(prev) == self.owner.get(cur)
                    && self.next_in_sweep(prev) == Some(cur);
                if !sequential && !unreached_straight {
                    // A `ret` in a skipped function: the landing must still be
                    // a return point.
                    let returned = returned
                        || (self.insns.get(prev).is_none()
                            && matches!(self.flow_anywhere(prev), Some(Flow::Ret)));
                    let how = if returned {
                        Landing::Return
                    } else {
                        Landing::Transfer
                    };
                    self.check_cur(Some(prev), cur, how);
                }
            }
            Event::Leave { prev } => {
                self.check_prev(prev, None);
            }
            Event::Enter { cur, via } => {
                *self.cov.enters.entry(format!("{via:?}")).or_default() += 1;
                let how = match via {
                    Via::Call => Landing::CallFromOutside,
                    Via::Return => Landing::Return,
                    // A signal handler's entry, or the interrupted code
                    // resuming: not a transfer of the code itself.
                    Via::Signal => return,
                };
                self.check_cur(None, cur, how);
            }
        }
    }
}

impl Checker {
    /// The address after the instruction at `addr` in its function's linear
    /// sweep, when that instruction falls through.
    fn next_in_sweep(&self, addr: u64) -> Option<u64> {
        let f = self.owner.get(addr)? as usize;
        let ins = &self.a.insns[f];
        let k = ins.binary_search_by_key(&addr, |i| i.addr).ok()?;
        (ins[k].flow == Flow::Next).then(|| ins[k].end())
    }

    /// The flow of the instruction at `addr` in any function's linear sweep.
    fn flow_anywhere(&self, addr: u64) -> Option<Flow> {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        self.ranges[..i]
            .iter()
            .rev()
            .take(8)
            .filter(|r| addr < r.1)
            .find_map(|r| {
                let ins = &self.a.insns[r.2 as usize];
                ins.binary_search_by_key(&addr, |i| i.addr)
                    .ok()
                    .map(|k| ins[k].flow)
            })
    }

    fn report(&self, label: &str, stats: &tracer::TraceStats) -> String {
        let (ok, total) = self.a.coverage();
        let entered = || {
            self.cov
                .functions
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .filter_map(|(f, _)| self.a.cfgs[f].as_ref().ok())
        };
        let entered_blocks: usize = entered().map(|c| c.blocks.len()).sum();
        let entered_edges: usize = entered().map(|c| c.edges.len()).sum();
        let entered_functions = entered().count();
        let mut s = format!(
            "{label}: analysed {ok}/{total} functions in {:.2}s; traced {} events ({} instructions in the \
             executable, {} exits to outside code, {} signals) in {:.1}s\n  \
             steps checked: {}; returns checked: {}; analysed functions entered: {}; distinct \
             blocks entered: {} (of {entered_blocks} in those functions); distinct edges taken: \
             {} (of {entered_edges}); distinct exits taken: {}; entries from outside: {:?}\n  \
             violations: {} ({} distinct)",
            self.analysis_time.as_secs_f64(),
            self.cov.steps,
            stats.steps_inside,
            stats.leaves,
            stats.signals,
            stats.elapsed.as_secs_f64(),
            self.cov.steps_checked,
            self.cov.returns_checked,
            entered_functions,
            self.cov.blocks.len(),
            self.cov.edges.len(),
            self.cov.exits.len(),
            self.cov.enters,
            self.total_violations,
            self.violations.len(),
        );
        let mut hot: Vec<(u64, usize)> = self
            .cov
            .functions
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(f, n)| (*n, f))
            .collect();
        hot.sort_by(|a, b| b.cmp(a));
        s += "\n  most executed analysed functions:";
        for &(n, f) in hot.iter().take(10) {
            s += &format!("\n    {n:>9}  {}", self.a.functions[f].name);
        }
        let mut unanalysed: Vec<(u64, usize)> = self
            .cov
            .unanalysed
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(f, n)| (*n, f))
            .collect();
        unanalysed.sort_by(|a, b| b.cmp(a));
        s += &format!(
            "\n  instructions executed in functions not analysed: {} in {} functions{}",
            unanalysed.iter().map(|u| u.0).sum::<u64>(),
            unanalysed.len(),
            if unanalysed.is_empty() { "" } else { "; most:" }
        );
        for &(n, f) in unanalysed.iter().take(6) {
            let func = &self.a.functions[f];
            let why = match &self.a.cfgs[f] {
                _ if func.kind == FunctionKind::Plt => "PLT stub".to_string(),
                Ok(_) => "?".to_string(),
                Err(e) => e.to_string(),
            };
            s += &format!("\n    {n:>9}  {} ({why})", func.name);
        }
        for v in self.violations.values().take(50) {
            s += &format!("\n  [x{}] {}", v.count, v.what);
        }
        if self.violations.len() > 50 {
            s += &format!("\n  ... and {} more", self.violations.len() - 50);
        }
        s
    }
}

/// Run `exe args` with stdin from `input` (if any), stdout to `out`.
fn command(exe: &Path, args: &[&str], input: &Path, out: &Path) -> Command {
    let mut c = Command::new(exe);
    c.args(args)
        .stdin(File::open(input).unwrap())
        .stdout(File::create(out).unwrap())
        .stderr(Stdio::null())
        .env("LC_ALL", "C");
    c
}

struct Run<'a> {
    args: &'a [&'a str],
    input: PathBuf,
}

/// Trace every run with `checker`, check outputs equal the untraced ones;
/// returns the checker with all runs' observations and the report.
fn soundness(
    label: &str,
    exe: &Path,
    runs: &[Run],
    scratch: &Scratch,
    mut checker: Checker,
) -> (Checker, String) {
    let mut stats = tracer::TraceStats::default();
    for (i, run) in runs.iter().enumerate() {
        let plain = scratch.join(&format!("{label}-{i}.plain"));
        let traced = scratch.join(&format!("{label}-{i}.traced"));
        let st = command(exe, run.args, &run.input, &plain).status().unwrap();
        assert!(st.success(), "{label} {:?} failed untraced: {st}", run.args);
        let t = tracer::trace(
            &mut command(exe, run.args, &run.input, &traced),
            exe,
            &mut checker,
        )
        .unwrap_or_else(|e| panic!("tracing {label} {:?}: {e:#}", run.args));
        assert_eq!(
            t.ended,
            Ended::Exited(0),
            "{label} {:?} failed traced",
            run.args
        );
        let (a, b) = (
            std::fs::read(&plain).unwrap(),
            std::fs::read(&traced).unwrap(),
        );
        assert!(!a.is_empty(), "{label} {:?}: empty output", run.args);
        assert!(
            a == b,
            "{label} {:?}: traced output ({} bytes) differs from untraced output ({} bytes)",
            run.args,
            b.len(),
            a.len()
        );
        eprintln!(
            "{label} {:?}: {} instructions traced, {} exits to outside code, {:.1}s",
            run.args,
            t.stats.steps_inside,
            t.stats.leaves,
            t.stats.elapsed.as_secs_f64()
        );
        stats.steps_inside += t.stats.steps_inside;
        stats.leaves += t.stats.leaves;
        stats.signals += t.stats.signals;
        stats.elapsed += t.stats.elapsed;
    }
    let report = checker.report(label, &stats);
    println!("{report}");
    (checker, report)
}

fn assert_sound(c: &Checker, report: &str, min_steps: u64, hot: &[&str]) {
    assert_eq!(c.total_violations, 0, "CFG soundness violations:\n{report}");
    assert!(
        c.cov.steps_checked >= min_steps,
        "only {} steps checked (want >= {min_steps}):\n{report}",
        c.cov.steps_checked
    );
    for name in hot {
        // By name without GCC's clone suffixes (`handle_compress.isra.0`);
        // static functions of different files may share it.
        let same: Vec<usize> = (0..c.a.functions.len())
            .filter(|&f| base_name(&c.a.functions[f].name) == *name)
            .collect();
        assert!(!same.is_empty(), "no function {name}");
        assert!(
            same.iter().any(|&f| c.cov.functions[f] > 0),
            "{name} was never traced as an analysed function ({:?}):\n{report}",
            same.iter().map(|&f| &c.a.cfgs[f]).collect::<Vec<_>>()
        );
    }
}

/// Writes `size` bytes of generated text to `dir/name` and returns its path.
fn text(scratch: &Scratch, name: &str, size: usize, seed: u64) -> PathBuf {
    let p = scratch.join(name);
    generate_text(&p, size, seed);
    p
}

/// `exe args < input > output`, untraced.
fn prepare(exe: &Path, args: &[&str], input: &Path, output: &Path) {
    let st = command(exe, args, input, output).status().unwrap();
    assert!(st.success(), "{} {args:?}: {st}", exe.display());
}

#[test]
fn bzip2_cfgs_are_sound() {
    require_root();
    let exe = realprogs().join("bzip2");
    let scratch = Scratch::new("cfg-soundness-bzip2");
    let big = text(&scratch, "big.txt", 10_300, 7);
    let small = text(&scratch, "small.txt", 1_000, 8);
    let small_bz2 = scratch.join("small.txt.bz2");
    prepare(&exe, &["-9", "-c"], &small, &small_bz2);
    let runs = [
        Run {
            args: &["-9", "-c"],
            input: big,
        },
        Run {
            args: &["-d", "-c"],
            input: small_bz2,
        },
    ];
    let (c, report) = soundness("bzip2", &exe, &runs, &scratch, Checker::new(&exe));
    assert_sound(
        &c,
        &report,
        1_000_000,
        &[
            "mainSort",
            "mainGtU",
            "BZ2_blockSort",
            "BZ2_compressBlock",
            "generateMTFValues",
            "handle_compress",
            "BZ2_hbMakeCodeLengths",
            "BZ2_decompress",
            "BZ2_bzDecompress",
        ],
    );
}

#[test]
fn xz_cfgs_are_sound() {
    require_root();
    let exe = realprogs().join("xz");
    let scratch = Scratch::new("cfg-soundness-xz");
    let input = text(&scratch, "input.txt", 2_048, 11);
    let xz = scratch.join("input.txt.xz");
    prepare(&exe, &["-6", "-c"], &input, &xz);
    let runs = [
        // LZMA2 "normal" mode: bt4 match finder, optimum parser.
        Run {
            args: &["-6", "-c"],
            input: input.clone(),
        },
        // LZMA2 "fast" mode: hc3 match finder.
        Run {
            args: &["-0", "-c"],
            input,
        },
        Run {
            args: &["-d", "-c"],
            input: xz,
        },
    ];
    let (c, report) = soundness("xz", &exe, &runs, &scratch, Checker::new(&exe));
    assert_sound(
        &c,
        &report,
        1_000_000,
        &[
            "lzma_lzma_encode",
            "lzma_lzma_optimum_normal",
            "lzma_lzma_optimum_fast",
            "lzma_mf_bt4_find",
            "lzma_mf_hc3_find",
            "bt_find_func",
            "get_literal_price",
            "lzma_decode",
            // Its jump table's guard compares the memory the index is
            // loaded from, through a `lea` (analysis/cfg/jump_tables.rs, guard_step).
            "rc_encode",
        ],
    );
}

/// Computed gotos: every transfer of `interp`'s dispatch loop (`goto
/// *ops[*pc++]`) goes to a label its CFG lists as a target (the code
/// pointers stored in `ops`).
#[test]
fn computed_goto_cfgs_are_sound() {
    require_root();
    let exe = fixture("interp");
    let scratch = Scratch::new("cfg-soundness-interp");
    let empty = scratch.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let runs = [Run {
        args: &["3", "500"],
        input: empty,
    }];
    let (c, report) = soundness("interp", &exe, &runs, &scratch, Checker::new(&exe));
    assert_sound(&c, &report, 10_000, &["run"]);
}

/// gawk's byte-code loop `r_interpret`: a 121-case `switch` over a
/// PIC-relative table whose base register is loaded at the function's
/// entry, far from the jump (see `gawk_switch_loop_is_covered`). Every
/// dispatch the program makes must be an edge of the CFG.
#[test]
fn gawk_switch_cfgs_are_sound() {
    require_root();
    let exe = realprogs().join("gawk");
    let scratch = Scratch::new("cfg-soundness-gawk");
    let empty = scratch.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let runs = [Run {
        args: &[
            "BEGIN { for (i = 0; i < 300; i++) { a[i % 7] += i; s = s substr(i, 1, 1) } \
             n = split(s, p, \"3\"); for (k in a) t += a[k]; print t, n, length(s) }",
        ],
        input: empty,
    }];
    let (c, report) = soundness("gawk", &exe, &runs, &scratch, Checker::new(&exe));
    assert_sound(&c, &report, 10_000, &["r_interpret"]);
}

/// The check bites: with the edges and return points of `BZ2_decompress`
/// removed from its CFG, tracing `bzip2 -d` reports both kinds of violation.
#[test]
fn missing_edges_and_return_points_are_reported() {
    require_root();
    let exe = realprogs().join("bzip2");
    let scratch = Scratch::new("cfg-soundness-mutated");
    let small = text(&scratch, "small.txt", 1_000, 8);
    let bz2 = scratch.join("small.txt.bz2");
    prepare(&exe, &["-9", "-c"], &small, &bz2);
    let mut c = Checker::new(&exe);
    let f = c.a.function("BZ2_decompress").expect("BZ2_decompress") as u32;
    c.edges.retain(|e| e.0 != f);
    for slot in &mut c.return_points.slots {
        if matches!(slot, Some((g, _, _)) if *g == f) {
            *slot = None;
        }
    }
    let runs = [Run {
        args: &["-d", "-c"],
        input: bz2,
    }];
    let (c, report) = soundness("bzip2 with a mutilated CFG", &exe, &runs, &scratch, c);
    for want in [
        "control transfer that is neither an edge nor an exit of the CFG",
        "return to an address that is not a call's return point in the CFG",
    ] {
        assert!(
            c.violations
                .values()
                .any(|v| v.what.starts_with(want) && v.what.contains("BZ2_decompress+")),
            "no \"{want}\" violation in BZ2_decompress reported:\n{report}"
        );
    }
}
