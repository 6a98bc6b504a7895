//! Instrumented clones: the *apply* side's code generator.
//!
//! For every function the plan could analyse, this module emits a copy of
//! its instructions, relocated to a region near the binary (iced-x86's
//! block encoder re-encodes branches and RIP-relative operands for the new
//! addresses), with the instrumentation of Hirzel & Chilimbi's *instrumented
//! code* woven in:
//!
//! - **Ball-Larus path register** updates on DAG edges (edge stubs out of
//!   line, so a taken branch and a fall-through each get their own
//!   increment), path records at exits and truncated (back) edges, the
//!   register restarted after a back edge (PEP §3.1-3.3);
//! - **calls and returns**: an `ENTER` record and a shadow-stack push at
//!   every clone entry, the caller's path register restored at the return;
//! - **checks** (the burst budget) at entries of the set C, at back edges
//!   of loops that are not k-boring, and at every return site. A check
//!   that fails jumps to the *same* instruction in the original code: the
//!   burst ends there and the thread runs on at full speed.
//!
//! Direct calls and jumps between cloned functions stay in the clones;
//! calls to anything else (PLT, libraries, indirect) go to the original and
//! come back to the clone's return site. A `ret` (or tail call) whose return
//! address is in original code is an activation older than the burst: the
//! runtime looks the address up and, when it was rewritten, sends the return
//! to the caller's clone, so the burst climbs up the stack instead of
//! escaping into original code; when not, the burst ends.
//!
//! Every snippet preserves all registers and, unless liveness proves them
//! dead, the flags, and skips the 128-byte red zone before pushing. The
//! shared state lives in [`burstyd_common::burst::BurstControl`], reached
//! RIP-relatively; only the thread that owns the burst gets past a check,
//! so the single set of registers there is never shared.
//!
//! The runtime (signal handler, restorer, record writer, table lookup) is
//! emitted at the start of the region. The handler maps the interrupted PC
//! through a sorted `(original, clone)` table of every rewritten
//! instruction, so a burst can start at any instruction of a cloned
//! function; the path register starts as [`PATH_INVALID`] (the path's prefix
//! was not seen) and becomes valid at the next path start.
use std::collections::{BTreeMap, HashMap};

use burstyd_common::burst::*;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, IcedError, Instruction, InstructionBlock,
    MemoryOperand, OpKind, Register,
};
use serde::Serialize;

use crate::analysis::cfg::{self, Cfg, EdgeKind, ExitKind, LiveSet};
use crate::analysis::disasm::{Flow, Insn};
use crate::analysis::paths::PathNumbering;
use crate::analysis::plan::{FunctionStatus, Plan};

/// Where the image goes in the target.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// `AVMA - SVMA` of the executable.
    pub bias: u64,
    /// AVMA of the [`BurstControl`].
    pub control: u64,
    /// AVMA where [`CloneImage::bytes`] is written.
    pub code: u64,
}

/// One cloned function.
#[derive(Clone, Debug, Serialize)]
pub struct ClonedFunction {
    /// Index into the plan's `functions` (the `fid` in records).
    pub fid: u32,
    /// AVMA of the original.
    pub orig: u64,
    /// AVMA of the clone's entry.
    pub clone: u64,
    /// Whether its path records are valid Ball-Larus numbers.
    pub paths: bool,
}

/// The generated code and tables.
#[derive(Debug)]
pub struct CloneImage {
    /// Code, then (8-aligned) the translation table.
    pub bytes: Vec<u8>,
    /// AVMA of the signal handler (`SA_SIGINFO`).
    pub handler: u64,
    /// AVMA of the `rt_sigreturn` restorer (`SA_RESTORER`).
    pub restorer: u64,
    /// `[clone_lo, clone_hi)`: the code.
    pub code_range: (u64, u64),
    /// AVMA and length (pairs) of the sorted `(original, clone)` table.
    pub table_addr: u64,
    pub table_len: u64,
    /// AVMA and length (pairs) of the sorted `(original start, clone
    /// entry)` table of cloned functions.
    pub fn_table_addr: u64,
    pub fn_table_len: u64,
    pub functions: Vec<ClonedFunction>,
    /// Functions the plan analysed but the generator left out, by reason.
    pub skipped: BTreeMap<String, usize>,
    /// Instrumentation points emitted.
    pub stats: GenStats,
    /// `(clone address, original address, original end)` of every copied
    /// instruction, sorted by clone address (clone frames → original).
    pub reverse: Vec<(u64, u64, u64)>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct GenStats {
    pub instructions: usize,
    pub edge_increments: usize,
    pub checks: usize,
    pub path_records: usize,
}

impl CloneImage {
    /// The clone address of an original instruction (AVMA), if rewritten.
    pub fn translate(&self, orig: u64) -> Option<u64> {
        let table = self.table();
        table
            .binary_search_by_key(&orig, |&(o, _)| o)
            .ok()
            .map(|i| table[i].1)
    }

    /// The `(original, clone)` pairs.
    pub fn table(&self) -> Vec<(u64, u64)> {
        let off = (self.table_addr - self.code_range.0) as usize;
        self.bytes[off..off + self.table_len as usize * 16]
            .chunks_exact(16)
            .map(|c| {
                (
                    u64::from_le_bytes(c[..8].try_into().unwrap()),
                    u64::from_le_bytes(c[8..].try_into().unwrap()),
                )
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("encoding the clones failed: {0}")]
    Encode(String),
    #[error("the plan has no CFGs (computed without keep_details)")]
    NoDetails,
}

impl From<IcedError> for GenError {
    fn from(e: IcedError) -> Self {
        GenError::Encode(e.to_string())
    }
}

/// Why one function was not cloned.
#[derive(Debug)]
struct Skip(&'static str);

impl From<IcedError> for Skip {
    fn from(_: IcedError) -> Self {
        Skip("instruction cannot be re-encoded")
    }
}

/// Labels are instruction IPs the block encoder links; this range is
/// non-canonical, so no real address collides with one.
const LABEL_BASE: u64 = 0x8000_0000_0000_0000;

/// An instruction list with labels (several labels may name one point).
struct Emitter {
    out: Vec<Instruction>,
    next: u64,
    pending: Vec<u64>,
    alias: HashMap<u64, u64>,
}

impl Emitter {
    fn new() -> Self {
        Emitter {
            out: Vec::new(),
            next: 0,
            pending: Vec::new(),
            alias: HashMap::new(),
        }
    }

    fn label(&mut self) -> u64 {
        self.next += 1;
        LABEL_BASE + self.next
    }

    fn bind(&mut self, l: u64) {
        self.pending.push(l);
    }

    fn emit(&mut self, mut i: Instruction) {
        match self.pending.first() {
            Some(&first) => {
                i.set_ip(first);
                for &o in &self.pending[1..] {
                    self.alias.insert(o, first);
                }
                self.pending.clear();
            }
            None => i.set_ip(0),
        }
        self.out.push(i);
    }

    fn e(&mut self, i: Result<Instruction, IcedError>) -> Result<(), IcedError> {
        self.emit(i?);
        Ok(())
    }

    /// Drops everything emitted since `mark` (a function that failed).
    fn truncate(&mut self, mark: usize) {
        self.out.truncate(mark);
        self.pending.clear();
    }

    fn finish(mut self) -> Vec<Instruction> {
        if !self.pending.is_empty() {
            self.emit(Instruction::with(Code::Zero_bytes));
        }
        let alias = std::mem::take(&mut self.alias);
        let resolve = |t: u64| alias.get(&t).copied().unwrap_or(t);
        for i in &mut self.out {
            if i.op_count() > 0 && matches!(i.op0_kind(), OpKind::NearBranch64) {
                i.set_near_branch64(resolve(i.near_branch64()));
            }
            if i.is_ip_rel_memory_operand() {
                i.set_memory_displacement64(resolve(i.memory_displacement64()));
            }
        }
        self.out
    }

    // --- small instruction helpers ---

    fn lea_rsp(&mut self, d: i64) -> Result<(), IcedError> {
        self.e(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, d),
        ))
    }
    /// `inc qword [abs]` (a control-block counter).
    fn inc(&mut self, addr: u64) -> Result<(), IcedError> {
        self.e(Instruction::with1(Code::Inc_rm64, rip(addr)))
    }
    fn push(&mut self, r: Register) -> Result<(), IcedError> {
        self.e(Instruction::with1(Code::Push_r64, r))
    }
    fn pop(&mut self, r: Register) -> Result<(), IcedError> {
        self.e(Instruction::with1(Code::Pop_r64, r))
    }
    fn pushf(&mut self) {
        self.emit(Instruction::with(Code::Pushfq));
    }
    fn popf(&mut self) {
        self.emit(Instruction::with(Code::Popfq));
    }
    fn ret(&mut self) {
        self.emit(Instruction::with(Code::Retnq));
    }
    fn jmp(&mut self, target: u64) -> Result<(), IcedError> {
        self.e(Instruction::with_branch(Code::Jmp_rel32_64, target))
    }
    fn call(&mut self, target: u64) -> Result<(), IcedError> {
        self.e(Instruction::with_branch(Code::Call_rel32_64, target))
    }
    fn jcc(&mut self, code: Code, target: u64) -> Result<(), IcedError> {
        self.e(Instruction::with_branch(code, target))
    }
    /// `mov r64, imm64` (shortest form chosen by the encoder).
    fn mov_imm(&mut self, r: Register, v: u64) -> Result<(), IcedError> {
        if v <= u32::MAX as u64 {
            self.e(Instruction::with2(Code::Mov_r32_imm32, r32(r), v as u32))
        } else {
            self.e(Instruction::with2(Code::Mov_r64_imm64, r, v))
        }
    }
    /// `op r64, [abs]` RIP-relative.
    fn rm(&mut self, code: Code, r: Register, addr: u64) -> Result<(), IcedError> {
        self.e(Instruction::with2(code, r, rip(addr)))
    }
    /// `op [abs], r64` RIP-relative.
    fn mr(&mut self, code: Code, addr: u64, r: Register) -> Result<(), IcedError> {
        self.e(Instruction::with2(code, rip(addr), r))
    }
}

fn rip(addr: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RIP, addr as i64)
}

fn mem(base: Register, index: Register, scale: u32, displ: i64) -> MemoryOperand {
    MemoryOperand::with_base_index_scale_displ_size(base, index, scale, displ, 1)
}

fn r32(r: Register) -> Register {
    r.full_register32()
}

/// Offsets of [`BurstControl`] fields.
macro_rules! field {
    ($l:expr, $f:ident) => {
        $l.control + core::mem::offset_of!(BurstControl, $f) as u64
    };
}

/// Bytes between `rsp` inside a runtime routine (before it pushes anything)
/// and the program's `rsp` at the snippet: return address, rdx, rcx, rax,
/// flags, red zone.
const FRAME: i64 = 8 + 24 + 8 + 128;

/// `rt_exit` argument flag: the function has no valid path numbering.
const NO_PATH: u32 = 0x8000_0000;

/// The runtime routines' labels.
struct Runtime {
    emit: u64,
    lookup: u64,
    lookup_fn: u64,
    enter: u64,
    exit: u64,
    back: u64,
    end: u64,
    handler: u64,
    restorer: u64,
}

/// Generates the clones of every analysed function in `plan` (computed with
/// `keep_details`), whose instructions are `analysis.insns`.
pub fn generate(
    plan: &Plan,
    analysis: &cfg::Analysis,
    layout: &Layout,
) -> Result<CloneImage, GenError> {
    generate_excluding(plan, analysis, layout, &Default::default())
}

/// [`generate`], leaving out the functions starting at `exclude` (SVMAs),
/// e.g. those whose unwind information cannot be restated
/// ([`crate::codegen::unwind_info::untranslatable`]).
pub fn generate_excluding(
    plan: &Plan,
    analysis: &cfg::Analysis,
    layout: &Layout,
    exclude: &std::collections::BTreeSet<u64>,
) -> Result<CloneImage, GenError> {
    let mut em = Emitter::new();
    let rt = emit_runtime(&mut em, layout)?;

    // Which functions get a clone, and their entry labels.
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut entry_label: HashMap<u64, u64> = HashMap::new(); // SVMA -> label
    let mut chosen = Vec::new();
    let mut have_details = false;
    for (i, f) in plan.functions.iter().enumerate() {
        let FunctionStatus::Analyzed(fa) = &f.status else {
            continue;
        };
        let Some(cfg) = fa.cfg.as_ref() else {
            continue;
        };
        have_details = true;
        if f.cold_part {
            *skipped.entry("cold part".into()).or_default() += 1;
            continue;
        }
        if exclude.contains(&f.start) {
            *skipped
                .entry("unwind info not restatable".into())
                .or_default() += 1;
            continue;
        }
        if let Err(Skip(why)) = precheck(cfg, &analysis.insns[i]) {
            *skipped.entry(why.into()).or_default() += 1;
            continue;
        }
        entry_label.insert(f.start, em.label());
        chosen.push(i);
    }
    if !have_details && plan.summary.functions_analyzable > 0 {
        return Err(GenError::NoDetails);
    }

    let mut stats = GenStats::default();
    // (original AVMA, instruction index of its clone code, original end)
    let mut table_idx: Vec<(u64, usize, u64)> = Vec::new();
    let mut funcs: Vec<(u32, u64, u64, bool)> = Vec::new(); // fid, orig, label, paths
    let mut removed: Vec<(u64, u64)> = Vec::new();
    for &i in &chosen {
        let f = &plan.functions[i];
        let FunctionStatus::Analyzed(fa) = &f.status else {
            unreachable!()
        };
        let cfg = fa.cfg.as_ref().unwrap();
        let numbering = fa
            .numbering
            .as_ref()
            .filter(|n| n.total_paths() < (1 << 62));
        let mark = em.out.len();
        let tmark = table_idx.len();
        let label = entry_label[&f.start];
        let g = cfg.to_graph();
        let dom = crate::analysis::graph::dominators(&g);
        let loops = crate::analysis::graph::loops(&g, &dom);
        let mut fg = FnGen {
            em: &mut em,
            rt: &rt,
            layout,
            fid: i as u32,
            cfg,
            insns: &analysis.insns[i],
            live: cfg::liveness(cfg, &analysis.insns[i]),
            numbering,
            loops: &loops,
            edges_of: {
                let mut v = vec![Vec::new(); cfg.blocks.len()];
                for e in &cfg.edges {
                    v[e.from].push(*e);
                }
                v
            },
            entry_label: &entry_label,
            table: &mut table_idx,
            stats: GenStats::default(),
            out_of_line: Vec::new(),
        };
        let result = fg.function(label);
        let s = fg.stats;
        match result {
            Ok(()) => {
                stats.edge_increments += s.edge_increments;
                stats.checks += s.checks;
                stats.path_records += s.path_records;
                stats.instructions += analysis.insns[i].len();
                funcs.push((i as u32, f.start + layout.bias, label, numbering.is_some()));
            }
            Err(Skip(why)) => {
                em.truncate(mark);
                table_idx.truncate(tmark);
                *skipped.entry(why.into()).or_default() += 1;
                // Calls to it now go to the original.
                if let Some(l) = entry_label.remove(&f.start) {
                    removed.push((f.start, l));
                }
            }
        }
    }
    // Calls to functions skipped after others referenced their labels go
    // to the original.
    for (start, label) in removed {
        em.bind(label);
        em.jmp(start + layout.bias)?;
    }

    let insns = em.finish();
    let block = InstructionBlock::new(&insns, layout.code);
    let enc = BlockEncoder::encode(
        64,
        block,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )?;
    let offsets = enc.new_instruction_offsets;
    let mut bytes = enc.code_buffer;
    let code_len = bytes.len() as u64;
    let addr_of_index = |idx: usize| layout.code + u64::from(offsets[idx]);
    // Label -> address.
    let mut label_addr: HashMap<u64, u64> = HashMap::new();
    for (idx, ins) in insns.iter().enumerate() {
        if ins.ip() >= LABEL_BASE {
            label_addr.insert(ins.ip(), addr_of_index(idx));
        }
    }
    let mut table: Vec<(u64, u64)> = table_idx
        .iter()
        .map(|&(o, idx, _)| (o, addr_of_index(idx)))
        .collect();
    let mut reverse: Vec<(u64, u64, u64)> = table_idx
        .iter()
        .map(|&(o, idx, end)| (addr_of_index(idx), o, end))
        .collect();
    reverse.sort_unstable();
    table.sort_unstable();
    table.dedup_by_key(|e| e.0);
    while bytes.len() % 16 != 0 {
        bytes.push(0xcc);
    }
    let table_addr = layout.code + bytes.len() as u64;
    for &(o, c) in &table {
        bytes.extend_from_slice(&o.to_le_bytes());
        bytes.extend_from_slice(&c.to_le_bytes());
    }
    // Function entries: original start -> clone entry (indirect calls).
    let mut fn_table: Vec<(u64, u64)> = funcs
        .iter()
        .map(|&(_, orig, label, _)| (orig, label_addr[&label]))
        .collect();
    fn_table.sort_unstable();
    fn_table.dedup_by_key(|e| e.0);
    let fn_table_addr = layout.code + bytes.len() as u64;
    for &(o, c) in &fn_table {
        bytes.extend_from_slice(&o.to_le_bytes());
        bytes.extend_from_slice(&c.to_le_bytes());
    }
    let functions = funcs
        .into_iter()
        .map(|(fid, orig, label, paths)| ClonedFunction {
            fid,
            orig,
            clone: label_addr[&label],
            paths,
        })
        .collect();
    Ok(CloneImage {
        bytes,
        handler: label_addr[&rt.handler],
        restorer: label_addr[&rt.restorer],
        code_range: (layout.code, layout.code + code_len),
        table_addr,
        table_len: table.len() as u64,
        fn_table_addr,
        fn_table_len: fn_table.len() as u64,
        functions,
        skipped,
        stats,
        reverse,
    })
}

/// Shapes the generator does not handle (checked before emitting).
fn precheck(cfg: &Cfg, insns: &[Insn]) -> Result<(), Skip> {
    for jt in &cfg.jump_tables {
        let Some(i) = insns.iter().find(|i| i.addr == jt.jump) else {
            return Err(Skip("jump table jump not found"));
        };
        let ins = &i.instr;
        match ins.op0_kind() {
            OpKind::Register if ins.op0_register() != Register::RSP => {}
            OpKind::Memory
                if ins.memory_base() != Register::RSP && ins.memory_index() != Register::RSP => {}
            _ => return Err(Skip("unusual jump-table jump")),
        }
    }
    Ok(())
}

struct FnGen<'a> {
    em: &'a mut Emitter,
    rt: &'a Runtime,
    layout: &'a Layout,
    fid: u32,
    cfg: &'a Cfg,
    insns: &'a [Insn],
    live: Vec<LiveSet>,
    numbering: Option<&'a PathNumbering>,
    loops: &'a crate::analysis::graph::Loops,
    /// Out-edges per block, in edge order (index = `idx`).
    edges_of: Vec<Vec<cfg::Edge>>,
    entry_label: &'a HashMap<u64, u64>,
    table: &'a mut Vec<(u64, usize, u64)>,
    stats: GenStats,
    /// Code emitted after the function body: (label, what).
    out_of_line: Vec<(u64, OutOfLine)>,
}

enum OutOfLine {
    /// Edge `(from, idx)` code, then a jump to its target block.
    Edge(usize, usize),
    /// A check's exit: restore and jump to the original address.
    CheckExit { flags: bool, orig: u64 },
    /// A check's expiry: end the burst, then `CheckExit`.
    CheckExpire { exit: u64 },
    /// A conditional tail call / jump out of the function.
    Exit { insn: usize, kind: ExitKind },
    /// A jump-table case: restore, then the edge.
    Case { flags: bool, edge: u64 },
    /// Data: one u64.
    Slot(u64),
}

impl FnGen<'_> {
    fn avma(&self, svma: u64) -> u64 {
        svma.wrapping_add(self.layout.bias)
    }

    fn record(&mut self, insn: usize) {
        let a = self.avma(self.insns[insn].addr);
        let end = self.avma(self.insns[insn].end());
        self.table.push((a, self.em.out.len(), end));
    }

    /// Flags live before instruction `idx`.
    fn flags_live(&self, idx: usize) -> bool {
        self.live.get(idx).is_none_or(|l| l.status_flags_live())
    }

    fn block_first(&self, b: usize) -> usize {
        self.cfg.blocks[b].insns.start
    }

    /// Out-edges of `b` as `(idx, edge)`.
    fn out_edges(&self, b: usize) -> impl Iterator<Item = (usize, cfg::Edge)> + '_ {
        self.edges_of[b].iter().copied().enumerate()
    }

    fn edge_to(&self, b: usize, to: usize) -> Option<usize> {
        self.out_edges(b).find(|(_, e)| e.to == to).map(|(i, _)| i)
    }

    fn edge_kind(&self, b: usize, kinds: &[EdgeKind]) -> Option<(usize, cfg::Edge)> {
        self.out_edges(b).find(|(_, e)| kinds.contains(&e.kind))
    }

    /// Whether edge `(b, idx)` needs code (an increment or a truncation).
    fn edge_needs_code(&self, b: usize, idx: usize) -> bool {
        if self.is_checked_back_edge(b, idx) {
            return true;
        }
        let Some(n) = self.numbering else {
            return false;
        };
        n.back_edge(b, idx).is_some() || n.increment(b, idx).is_some_and(|v| v != 0)
    }

    /// A truncated edge: a back edge, or a retreating edge of an
    /// irreducible region. Every one has a check in the clones.
    ///
    /// The paper's reductions (no checks on back edges of k-boring loops,
    /// entry checks only on the set C) lower the cost of its *checking
    /// code*, which runs all the time. Here the checking code is the
    /// original code and has no checks at all; checks exist only in the
    /// clones, which run only during bursts, so every back edge and entry
    /// gets one and a burst is bounded by `--burst` checks even inside a
    /// long loop without calls.
    fn is_checked_back_edge(&self, b: usize, idx: usize) -> bool {
        self.loops.retreating_non_back.contains(&(b, idx))
            || self.loops.back_edges.contains(&(b, idx))
    }

    fn edge_stub(
        &mut self,
        labels: &mut HashMap<(usize, usize), u64>,
        blk: &[u64],
        b: usize,
        idx: usize,
    ) -> u64 {
        if let Some(&l) = labels.get(&(b, idx)) {
            return l;
        }
        let to = self.out_edges(b).nth(idx).unwrap().1.to;
        let l = if self.edge_needs_code(b, idx) {
            let l = self.em.label();
            self.out_of_line.push((l, OutOfLine::Edge(b, idx)));
            l
        } else {
            blk[to]
        };
        labels.insert((b, idx), l);
        l
    }

    fn function(&mut self, entry: u64) -> Result<(), Skip> {
        let nb = self.cfg.blocks.len();
        let blk: Vec<u64> = (0..nb).map(|_| self.em.label()).collect();
        let mut stubs: HashMap<(usize, usize), u64> = HashMap::new();

        // Prologue: entry check, then the activation record.
        self.em.bind(entry);
        {
            let first = self.block_first(0);
            let flags = self.flags_live(first);
            let orig = self.avma(self.insns[first].addr);
            self.check(flags, orig)?;
        }
        self.rt_call(self.rt.enter, self.fid | self.no_path_flag(), None, |_| {
            Ok(())
        })?;

        for b in 0..nb {
            self.em.bind(blk[b]);
            let range = self.cfg.blocks[b].insns.clone();
            let last = range.end - 1;
            for k in range.start..last {
                self.copy(k)?;
            }
            self.terminator(b, last, &blk, &mut stubs)?;
        }
        // Out-of-line code.
        let mut k = 0;
        while k < self.out_of_line.len() {
            let (label, _) = self.out_of_line[k];
            let what = std::mem::replace(&mut self.out_of_line[k].1, OutOfLine::Slot(0));
            self.em.bind(label);
            match what {
                OutOfLine::Edge(b, idx) => {
                    let to = self.out_edges(b).nth(idx).unwrap().1.to;
                    self.edge_code(b, idx)?;
                    self.em.jmp(blk[to])?;
                }
                OutOfLine::CheckExit { flags, orig } => {
                    self.em.pop(Register::RAX)?;
                    if flags {
                        self.em.popf();
                    }
                    self.em.lea_rsp(128)?;
                    self.em.jmp(orig)?;
                }
                OutOfLine::CheckExpire { exit } => {
                    self.em.push(Register::RCX)?;
                    self.em.push(Register::RDX)?;
                    self.em.mov_imm(Register::EAX, END_BUDGET)?;
                    self.em.call(self.rt.end)?;
                    self.em.pop(Register::RDX)?;
                    self.em.pop(Register::RCX)?;
                    self.em.jmp(exit)?;
                }
                OutOfLine::Exit { insn, kind } => {
                    let b = self.cfg.block_at(self.insns[insn].addr).unwrap_or(0);
                    self.exit_code(b, insn, kind, &blk)?;
                }
                OutOfLine::Case { flags, edge } => {
                    if flags {
                        self.em.popf();
                    }
                    self.em.pop(Register::RAX)?;
                    self.em.lea_rsp(128)?;
                    self.em.jmp(edge)?;
                }
                OutOfLine::Slot(v) => {
                    self.em.e(Instruction::with_declare_qword(&[v]))?;
                }
            }
            k += 1;
        }
        Ok(())
    }

    fn no_path_flag(&self) -> u32 {
        if self.numbering.is_some() { 0 } else { NO_PATH }
    }

    /// Copies instruction `k` unchanged (RIP-relative operands keep their
    /// absolute targets; the encoder recomputes the displacement).
    fn copy(&mut self, k: usize) -> Result<(), Skip> {
        self.record(k);
        let ins = self.reloc(k);
        self.em.emit(ins);
        Ok(())
    }

    /// Instruction `k` with its addresses moved by the bias.
    fn reloc(&self, k: usize) -> Instruction {
        let mut ins = self.insns[k].instr;
        if ins.is_ip_rel_memory_operand() {
            ins.set_memory_displacement64(self.avma(ins.memory_displacement64()));
        }
        if ins.op_count() > 0 && matches!(ins.op0_kind(), OpKind::NearBranch64) {
            ins.set_near_branch64(self.avma(ins.near_branch64()));
        }
        ins
    }

    /// Where a direct call/jump to SVMA `t` goes: the clone's entry when
    /// `t` starts a cloned function, else the original.
    fn call_target(&self, t: u64) -> u64 {
        self.entry_label
            .get(&t)
            .copied()
            .unwrap_or_else(|| self.avma(t))
    }

    fn exit_at(&self, k: usize) -> Option<ExitKind> {
        let a = self.insns[k].addr;
        self.cfg.exits.iter().find(|e| e.insn == a).map(|e| e.kind)
    }

    fn terminator(
        &mut self,
        b: usize,
        last: usize,
        blk: &[u64],
        stubs: &mut HashMap<(usize, usize), u64>,
    ) -> Result<(), Skip> {
        let insn = &self.insns[last];
        let exit = self.exit_at(last);
        match insn.flow {
            Flow::CondJump(t) => {
                self.record(last);
                let internal = self
                    .cfg
                    .block_at(t)
                    .filter(|&tb| self.cfg.blocks[tb].start == t)
                    .and_then(|tb| self.edge_to(b, tb));
                let target = match internal {
                    Some(idx) => self.edge_stub(stubs, blk, b, idx),
                    None => {
                        let kind = exit.ok_or(Skip("branch out of the function without exit"))?;
                        let l = self.em.label();
                        self.out_of_line
                            .push((l, OutOfLine::Exit { insn: last, kind }));
                        l
                    }
                };
                let mut j = insn.instr;
                j.set_near_branch64(target);
                let code = j.code().as_near_branch();
                j.set_code(code);
                self.em.emit(j);
                self.continuation(b, last, blk, stubs)
            }
            Flow::Jump(t) => {
                let internal = self
                    .cfg
                    .block_at(t)
                    .filter(|&tb| self.cfg.blocks[tb].start == t)
                    .and_then(|tb| self.edge_to(b, tb));
                match (internal, exit) {
                    (Some(idx), _) => {
                        self.record(last);
                        let l = self.edge_stub(stubs, blk, b, idx);
                        self.em.jmp(l)?;
                        Ok(())
                    }
                    (None, Some(kind)) => {
                        self.record(last);
                        self.exit_code(b, last, kind, blk)
                    }
                    (None, None) => Err(Skip("jump without edge or exit")),
                }
            }
            Flow::IndirectJump => {
                if let Some(jt) = self.cfg.jump_tables.iter().find(|j| j.jump == insn.addr) {
                    self.record(last);
                    let targets = jt.targets.clone();
                    self.dispatch(b, last, &targets, blk, stubs)
                } else if let Some(kind) = exit {
                    self.record(last);
                    self.exit_code(b, last, kind, blk)
                } else {
                    Err(Skip("indirect jump without table or exit"))
                }
            }
            Flow::Ret => {
                self.record(last);
                self.exit_code(b, last, exit.unwrap_or(ExitKind::Return), blk)
            }
            Flow::Trap => self.copy(last),
            Flow::Call(_) | Flow::IndirectCall => {
                if let Some(kind @ ExitKind::NoReturnCall { .. }) = exit {
                    self.record(last);
                    self.exit_code(b, last, kind, blk)?;
                    // Should the callee return after all, do what the
                    // original would: run the next original instruction.
                    self.em.jmp(self.avma(insn.end()))?;
                    return Ok(());
                }
                self.record(last);
                self.emit_call(last)?;
                // Return site: the burst may have ended in the callee.
                let next = last + 1;
                let flags = self.flags_live(next.min(self.insns.len() - 1));
                let orig = self.avma(insn.end());
                self.check(flags, orig)?;
                self.continuation(b, last, blk, stubs)
            }
            Flow::Next | Flow::Syscall | Flow::Interrupt => {
                self.copy(last)?;
                self.continuation(b, last, blk, stubs)
            }
            Flow::Unsupported | Flow::Invalid => Err(Skip("unsupported instruction in a block")),
        }
    }

    /// After a block that may fall through: its fall-through edge, or a
    /// tail call by falling off the end.
    fn continuation(
        &mut self,
        b: usize,
        last: usize,
        blk: &[u64],
        stubs: &mut HashMap<(usize, usize), u64>,
    ) -> Result<(), Skip> {
        if let Some((idx, _)) = self.edge_kind(
            b,
            &[
                EdgeKind::FallThrough,
                EdgeKind::NotTaken,
                EdgeKind::CallFallThrough,
            ],
        ) {
            let l = self.edge_stub(stubs, blk, b, idx);
            // Fall into the next block when that is where it goes.
            if b + 1 < blk.len() && l == blk[b + 1] {
                return Ok(());
            }
            self.em.jmp(l)?;
            return Ok(());
        }
        // A conditional jump whose taken and not-taken sides are one edge.
        if let Flow::CondJump(t) = self.insns[last].flow
            && t == self.insns[last].end()
            && let Some(tb) = self.cfg.block_at(t)
            && let Some(idx) = self.edge_to(b, tb)
        {
            let l = self.edge_stub(stubs, blk, b, idx);
            self.em.jmp(l)?;
            return Ok(());
        }
        match self.exit_at(last) {
            Some(kind @ ExitKind::TailCall { .. }) if self.insns[last].flow.falls_through() => {
                self.exit_code(b, last, kind, blk)
            }
            _ => {
                // Nothing modelled follows (e.g. a trap or noreturn call
                // before): behave like the original.
                self.em.jmp(self.avma(self.insns[last].end()))?;
                Ok(())
            }
        }
    }

    fn emit_call(&mut self, k: usize) -> Result<(), Skip> {
        match self.insns[k].flow {
            Flow::Call(t) => {
                let target = self.call_target(t);
                self.em.call(target)?;
            }
            _ => self.indirect_call(k)?,
        }
        Ok(())
    }

    /// `call reg` / `call [mem]`: the target is looked up among the cloned
    /// functions at run time, so a burst follows calls through function
    /// pointers (and vtables) into clones; anything else is called in the
    /// original. The target goes through a control-block slot: only the
    /// burst's thread runs here, between two checks. The stack pointer is
    /// back in place at the call (stack-passed arguments stay where the
    /// callee expects them).
    fn indirect_call(&mut self, k: usize) -> Result<(), Skip> {
        let ins = self.reloc(k);
        // Bytes pushed below the program's rsp before the operand is read.
        const DEPTH: i64 = 128 + 8 * 4;
        let l = *self.layout;
        let em = &mut *self.em;
        let operand = match ins.op0_kind() {
            OpKind::Register => {
                let r = ins.op0_register();
                if r == Register::RSP {
                    return Err(Skip("call through rsp"));
                }
                Instruction::with2(Code::Mov_r64_rm64, Register::RAX, r)?
            }
            OpKind::Memory => {
                if ins.memory_index() == Register::RSP {
                    return Err(Skip("unusual indirect call"));
                }
                let mut d = ins.memory_displacement64() as i64;
                if ins.memory_base() == Register::RSP {
                    d += DEPTH;
                }
                let op = MemoryOperand::new(
                    ins.memory_base(),
                    ins.memory_index(),
                    ins.memory_index_scale(),
                    d,
                    // 1: the encoder picks disp8 or disp32 as needed.
                    if ins.memory_base() == Register::RIP {
                        8
                    } else if d == 0 {
                        0
                    } else {
                        1
                    },
                    false,
                    ins.segment_prefix(),
                );
                Instruction::with2(Code::Mov_r64_rm64, Register::RAX, op)?
            }
            _ => return Err(Skip("unusual indirect call")),
        };
        em.lea_rsp(-128)?;
        em.pushf();
        em.push(Register::RAX)?;
        em.push(Register::RCX)?;
        em.push(Register::RDX)?;
        em.emit(operand);
        em.call(self.rt.lookup_fn)?;
        em.mr(Code::Mov_rm64_r64, field!(l, call_target), Register::RAX)?;
        em.pop(Register::RDX)?;
        em.pop(Register::RCX)?;
        em.pop(Register::RAX)?;
        em.popf();
        em.lea_rsp(128)?;
        em.e(Instruction::with1(
            Code::Call_rm64,
            rip(field!(l, call_target)),
        ))?;
        Ok(())
    }

    /// Leaving the function at instruction `k` (already recorded).
    fn exit_code(&mut self, b: usize, k: usize, kind: ExitKind, _blk: &[u64]) -> Result<(), Skip> {
        let exit_inc = self
            .numbering
            .and_then(|n| n.exit_increment(b))
            .unwrap_or(0);
        let path_kind = match kind {
            ExitKind::Return => PATH_END_RETURN,
            ExitKind::TailCall { .. } | ExitKind::IndirectTailCall => PATH_END_TAIL,
            ExitKind::NoReturnCall { .. } | ExitKind::ColdJump { .. } => PATH_END_NORETURN,
            ExitKind::Trap => {
                return self.copy_unrecorded(k);
            }
        };
        let arg = self.fid | self.no_path_flag();
        self.stats.path_records += 1;
        let l = *self.layout;
        self.rt_call(self.rt.exit, arg, Some(path_kind as u32), |em| {
            if exit_inc != 0 {
                add_path(em, &l, exit_inc)?;
            }
            Ok(())
        })?;
        match kind {
            ExitKind::Return | ExitKind::IndirectTailCall => {
                let ins = self.reloc(k);
                self.em.emit(ins);
            }
            ExitKind::TailCall { target } => {
                let t = self.call_target(target);
                self.em.jmp(t)?;
            }
            ExitKind::NoReturnCall { .. } => self.emit_call(k)?,
            ExitKind::ColdJump { target } => {
                // Leaving the clones: end the burst, continue in the original.
                self.rt_call(self.rt.end, END_LEFT_CLONES as u32, None, |_| Ok(()))?;
                self.em.jmp(self.avma(target))?;
            }
            ExitKind::Trap => unreachable!(),
        }
        Ok(())
    }

    fn copy_unrecorded(&mut self, k: usize) -> Result<(), Skip> {
        let ins = self.reloc(k);
        self.em.emit(ins);
        Ok(())
    }

    /// The code on edge `(b, idx)`: increment, or path end + restart + check
    /// for a truncated edge.
    fn edge_code(&mut self, b: usize, idx: usize) -> Result<(), Skip> {
        let e = self.out_edges(b).nth(idx).unwrap().1;
        let first = self.block_first(e.to);
        let flags = self.flags_live(first);
        let orig = self.avma(self.cfg.blocks[e.to].start);
        if let Some(n) = self.numbering {
            if let Some(a) = n.back_edge(b, idx) {
                let (end_inc, restart) = (a.end_increment, a.restart);
                self.stats.path_records += 1;
                let l = *self.layout;
                self.rt_call(self.rt.back, self.fid, None, |em| add_path(em, &l, end_inc))?;
                self.set_path(restart, flags)?;
            } else if let Some(inc) = n.increment(b, idx).filter(|&v| v != 0) {
                self.stats.edge_increments += 1;
                self.increment(inc, flags)?;
            }
        }
        if self.is_checked_back_edge(b, idx) {
            self.check(flags, orig)?;
        }
        Ok(())
    }

    /// `path += inc`, preserving flags when live.
    fn increment(&mut self, inc: u64, flags: bool) -> Result<(), Skip> {
        let em = &mut *self.em;
        if !flags && inc <= i32::MAX as u64 {
            em.e(Instruction::with2(
                Code::Add_rm64_imm32,
                rip(field!(self.layout, path)),
                inc as u32 as i32,
            ))?;
            return Ok(());
        }
        em.lea_rsp(-128)?;
        if flags {
            em.pushf();
        }
        add_path(em, self.layout, inc)?;
        if flags {
            em.popf();
        }
        em.lea_rsp(128)?;
        Ok(())
    }

    /// `path = v` (a `mov`, flags untouched).
    fn set_path(&mut self, v: u64, _flags: bool) -> Result<(), Skip> {
        let em = &mut *self.em;
        if v <= i32::MAX as u64 {
            em.e(Instruction::with2(
                Code::Mov_rm64_imm32,
                rip(field!(self.layout, path)),
                v as u32 as i32,
            ))?;
        } else {
            em.lea_rsp(-128)?;
            em.push(Register::RAX)?;
            em.mov_imm(Register::RAX, v)?;
            em.mr(Code::Mov_rm64_r64, field!(self.layout, path), Register::RAX)?;
            em.pop(Register::RAX)?;
            em.lea_rsp(128)?;
        }
        Ok(())
    }

    /// A budget check; failing it continues at `orig` in the original code.
    fn check(&mut self, flags: bool, orig: u64) -> Result<(), Skip> {
        self.stats.checks += 1;
        let exit = self.em.label();
        let expire = self.em.label();
        let l = self.layout;
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        if flags {
            em.pushf();
        }
        em.push(Register::RAX)?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RAX,
            MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS),
        ))?;
        em.rm(Code::Cmp_r64_rm64, Register::RAX, field!(l, owner))?;
        em.jcc(Code::Jne_rel32_64, exit)?;
        em.e(Instruction::with2(
            Code::Sub_rm64_imm8,
            rip(field!(l, budget)),
            1,
        ))?;
        em.jcc(Code::Je_rel32_64, expire)?;
        em.pop(Register::RAX)?;
        if flags {
            em.popf();
        }
        em.lea_rsp(128)?;
        self.out_of_line
            .push((exit, OutOfLine::CheckExit { flags, orig }));
        self.out_of_line
            .push((expire, OutOfLine::CheckExpire { exit }));
        Ok(())
    }

    /// A runtime call in the standard frame: `eax = arg`, `ecx = arg2`;
    /// `pre` runs inside the frame (flags and rax, rcx, rdx saved).
    fn rt_call(
        &mut self,
        routine: u64,
        arg: u32,
        arg2: Option<u32>,
        pre: impl FnOnce(&mut Emitter) -> Result<(), IcedError>,
    ) -> Result<(), Skip> {
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        em.pushf();
        em.push(Register::RAX)?;
        em.push(Register::RCX)?;
        em.push(Register::RDX)?;
        pre(em)?;
        em.mov_imm(Register::RAX, u64::from(arg))?;
        if let Some(a2) = arg2 {
            em.mov_imm(Register::RCX, u64::from(a2))?;
        }
        em.call(routine)?;
        em.pop(Register::RDX)?;
        em.pop(Register::RCX)?;
        em.pop(Register::RAX)?;
        em.popf();
        em.lea_rsp(128)?;
        Ok(())
    }

    /// A switch jump: compare the target against each known case (one
    /// comparison per distinct target), take that case's edge; an unknown
    /// target ends the burst and jumps there in the original code.
    fn dispatch(
        &mut self,
        b: usize,
        k: usize,
        targets: &[u64],
        blk: &[u64],
        stubs: &mut HashMap<(usize, usize), u64>,
    ) -> Result<(), Skip> {
        let mut distinct: Vec<u64> = targets.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let flags = self.flags_live(k);
        let ins = self.insns[k].instr;
        let mut cases = Vec::new();
        for &t in &distinct {
            let tb = self
                .cfg
                .block_at(t)
                .filter(|&tb| self.cfg.blocks[tb].start == t)
                .ok_or(Skip("jump-table target is not a block"))?;
            let idx = self
                .edge_to(b, tb)
                .ok_or(Skip("jump-table target without edge"))?;
            let edge = self.edge_stub(stubs, blk, b, idx);
            let slot = self.em.label();
            let case = self.em.label();
            self.out_of_line.push((slot, OutOfLine::Slot(self.avma(t))));
            self.out_of_line
                .push((case, OutOfLine::Case { flags, edge }));
            cases.push((slot, case));
        }
        let em = &mut *self.em;
        em.lea_rsp(-128)?;
        em.push(Register::RAX)?;
        if flags {
            em.pushf();
        }
        match ins.op0_kind() {
            OpKind::Register => {
                let r = ins.op0_register();
                if r != Register::RAX {
                    em.e(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, r))?;
                }
            }
            OpKind::Memory => {
                let mut m = ins;
                if m.is_ip_rel_memory_operand() {
                    m.set_memory_displacement64(
                        m.memory_displacement64().wrapping_add(self.layout.bias),
                    );
                }
                let op = MemoryOperand::new(
                    m.memory_base(),
                    m.memory_index(),
                    m.memory_index_scale(),
                    m.memory_displacement64() as i64,
                    if m.memory_displacement64() == 0 { 0 } else { 1 },
                    false,
                    m.segment_prefix(),
                );
                em.e(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, op))?;
            }
            _ => return Err(Skip("unusual jump-table jump")),
        }
        for (slot, case) in cases {
            em.e(Instruction::with2(
                Code::Cmp_r64_rm64,
                Register::RAX,
                rip(slot),
            ))?;
            em.jcc(Code::Je_rel32_64, case)?;
        }
        // Unknown target: leave the clones.
        if flags {
            em.popf();
        }
        em.pop(Register::RAX)?;
        em.lea_rsp(128)?;
        self.rt_call(self.rt.end, END_LEFT_CLONES as u32, None, |_| Ok(()))?;
        let ins = self.reloc(k);
        self.em.emit(ins);
        Ok(())
    }
}

/// `add [path], v` inside a frame where flags may be clobbered and rax is
/// saved (for values that do not fit an imm32, rax is used).
fn add_path(em: &mut Emitter, l: &Layout, v: u64) -> Result<(), IcedError> {
    if v <= i32::MAX as u64 {
        em.e(Instruction::with2(
            Code::Add_rm64_imm32,
            rip(field!(l, path)),
            v as u32 as i32,
        ))
    } else {
        em.push(Register::RAX)?;
        em.mov_imm(Register::RAX, v)?;
        em.mr(Code::Add_rm64_r64, field!(l, path), Register::RAX)?;
        em.pop(Register::RAX)
    }
}

/// A binary search over a sorted `(original, clone)` table whose address
/// and length are the control-block words at `addr_field`/`len_field`:
/// `rax` = original → `rax` = clone, or 0 (or the original when
/// `keep_if_missing`). Clobbers rcx, rdx.
fn emit_lookup(
    em: &mut Emitter,
    entry: u64,
    addr_field: u64,
    len_field: u64,
    keep_if_missing: bool,
) -> Result<(), IcedError> {
    use Register::*;
    let (lp, right, found, none, out) =
        (em.label(), em.label(), em.label(), em.label(), em.label());
    em.bind(entry);
    em.push(RSI)?;
    em.push(RDI)?;
    em.push(R8)?;
    em.e(Instruction::with2(Code::Mov_r64_rm64, R8, RAX))?;
    em.rm(Code::Mov_r64_rm64, RSI, addr_field)?;
    em.e(Instruction::with2(Code::Xor_r32_rm32, ECX, ECX))?; // lo
    em.rm(Code::Mov_r64_rm64, RDX, len_field)?; // hi
    em.bind(lp);
    em.e(Instruction::with2(Code::Cmp_r64_rm64, RCX, RDX))?;
    em.jcc(Code::Jae_rel32_64, none)?;
    em.e(Instruction::with2(
        Code::Lea_r64_m,
        RAX,
        mem(RCX, RDX, 1, 0),
    ))?;
    em.e(Instruction::with2(Code::Shr_rm64_1, RAX, 1))?;
    em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RAX))?;
    em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
    em.e(Instruction::with2(
        Code::Cmp_rm64_r64,
        mem(RSI, RDI, 1, 0),
        R8,
    ))?;
    em.jcc(Code::Je_rel32_64, found)?;
    em.jcc(Code::Jb_rel32_64, right)?;
    em.e(Instruction::with2(Code::Mov_r64_rm64, RDX, RAX))?;
    em.jmp(lp)?;
    em.bind(right);
    em.e(Instruction::with2(
        Code::Lea_r64_m,
        RCX,
        mem(RAX, Register::None, 1, 1),
    ))?;
    em.jmp(lp)?;
    em.bind(found);
    em.e(Instruction::with2(
        Code::Mov_r64_rm64,
        RAX,
        mem(RSI, RDI, 1, 8),
    ))?;
    em.jmp(out)?;
    em.bind(none);
    if keep_if_missing {
        em.e(Instruction::with2(Code::Mov_r64_rm64, RAX, R8))?;
    } else {
        em.e(Instruction::with2(Code::Xor_r32_rm32, EAX, EAX))?;
    }
    em.bind(out);
    em.pop(R8)?;
    em.pop(RDI)?;
    em.pop(RSI)?;
    em.ret();
    Ok(())
}

fn tag(t: u64) -> u64 {
    t << TAG_SHIFT
}

/// The runtime: record writer, table lookup, enter/exit/back-edge/end
/// routines, the signal handler and its restorer.
fn emit_runtime(em: &mut Emitter, l: &Layout) -> Result<Runtime, IcedError> {
    use Register::*;
    let rt = Runtime {
        emit: em.label(),
        lookup: em.label(),
        lookup_fn: em.label(),
        enter: em.label(),
        exit: em.label(),
        back: em.label(),
        end: em.label(),
        handler: em.label(),
        restorer: em.label(),
    };
    let shadow = field!(l, shadow);

    // rt_emit(rax = w0, rdx = w1); clobbers rcx. A full ring truncates the
    // burst (its budget drops to 1) and counts the record as lost, unless
    // `wait_when_full` (full trace), which yields (bounded) for the daemon.
    {
        let (full, retry, wait, lost, done) =
            (em.label(), em.label(), em.label(), em.label(), em.label());
        em.bind(rt.emit);
        em.push(RSI)?;
        em.push(RDI)?;
        em.push(R8)?;
        em.mov_imm(R8, 1 << 22)?; // yields before giving up
        em.bind(retry);
        em.rm(Code::Mov_r64_rm64, RCX, field!(l, head))?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RSI, RCX))?;
        em.rm(Code::Sub_r64_rm64, RSI, field!(l, tail))?;
        em.e(Instruction::with2(Code::Add_rm64_imm8, RSI, 1))?;
        em.rm(Code::Mov_r64_rm64, RDI, field!(l, ring_mask))?;
        em.e(Instruction::with2(Code::Cmp_r64_rm64, RSI, RDI))?;
        em.jcc(Code::Ja_rel32_64, full)?;
        em.e(Instruction::with2(Code::And_r64_rm64, RDI, RCX))?;
        em.rm(Code::Mov_r64_rm64, RSI, field!(l, ring_addr))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RSI, RDI, 8, 0),
            RAX,
        ))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RSI, RDI, 8, 8),
            RDX,
        ))?;
        em.e(Instruction::with2(Code::Add_rm64_imm8, RCX, 2))?;
        em.mr(Code::Mov_rm64_r64, field!(l, head), RCX)?;
        em.bind(done);
        em.pop(R8)?;
        em.pop(RDI)?;
        em.pop(RSI)?;
        em.ret();
        em.bind(full);
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm8,
            rip(field!(l, wait_when_full)),
            0,
        ))?;
        em.jcc(Code::Je_rel32_64, lost)?;
        em.e(Instruction::with2(Code::Sub_rm64_imm8, R8, 1))?;
        em.jcc(Code::Je_rel32_64, lost)?;
        em.bind(wait);
        // sched_yield(); rcx/r11 are clobbered by syscall: save rax, rdx, r11.
        em.push(RAX)?;
        em.push(RDX)?;
        em.push(R11)?;
        em.mov_imm(RAX, 24)?;
        em.emit(Instruction::with(Code::Syscall));
        em.pop(R11)?;
        em.pop(RDX)?;
        em.pop(RAX)?;
        em.jmp(retry)?;
        em.bind(lost);
        em.inc(field!(l, lost_records))?;
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm8,
            rip(field!(l, budget)),
            1,
        ))?;
        em.jcc(Code::Jbe_rel32_64, done)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, budget)),
            1,
        ))?;
        em.inc(field!(l, truncated))?;
        em.jmp(done)?;
    }

    // rt_lookup(rax = original address) -> rax = clone address or 0, over
    // every rewritten instruction; rt_lookup_fn: over function entries
    // (original start -> clone entry), returning rax unchanged when not
    // found (an indirect call to code that was not cloned).
    emit_lookup(
        em,
        rt.lookup,
        field!(l, table_addr),
        field!(l, table_len),
        false,
    )?;
    emit_lookup(
        em,
        rt.lookup_fn,
        field!(l, fn_table_addr),
        field!(l, fn_table_len),
        true,
    )?;

    // rt_end(eax = reason): END record, the burst is over.
    {
        em.bind(rt.end);
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.mov_imm(RDX, tag(REC_END))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.e(Instruction::with2(Code::Xor_r32_rm32, EDX, EDX))?;
        em.call(rt.emit)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, owner)),
            0,
        ))?;
        em.inc(field!(l, ended))?;
        em.e(Instruction::with2(
            Code::Mov_rm32_imm32,
            rip(field!(l, active)),
            0u32,
        ))?;
        em.ret();
    }

    // rt_enter(eax = fid | flags): push (rsp, caller's path), path = 0,
    // ENTER record. Shadow entries at or below the new frame are dead
    // (frames left by longjmp or unwinding) and are dropped first.
    {
        let (lp, push, store, overflow) = (em.label(), em.label(), em.label(), em.label());
        em.bind(rt.enter);
        em.push(RSI)?;
        em.push(RDI)?;
        em.push(R8)?;
        em.e(Instruction::with2(
            Code::Lea_r64_m,
            R8,
            MemoryOperand::with_base_displ(RSP, FRAME + 24),
        ))?;
        em.e(Instruction::with2(Code::Lea_r64_m, RDX, rip(shadow)))?;
        em.rm(Code::Mov_r64_rm64, RSI, field!(l, depth))?;
        em.bind(lp);
        em.e(Instruction::with2(Code::Test_rm64_r64, RSI, RSI))?;
        em.jcc(Code::Je_rel32_64, push)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RSI))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
        em.e(Instruction::with2(
            Code::Cmp_rm64_r64,
            mem(RDX, RDI, 1, -16),
            R8,
        ))?;
        em.jcc(Code::Ja_rel32_64, push)?;
        em.e(Instruction::with1(Code::Dec_rm64, RSI))?;
        em.jmp(lp)?;
        em.bind(push);
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm32,
            RSI,
            SHADOW_DEPTH as i32,
        ))?;
        em.jcc(Code::Jae_rel32_64, overflow)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RSI))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RDX, RDI, 1, 0),
            R8,
        ))?;
        em.rm(Code::Mov_r64_rm64, RCX, field!(l, path))?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            mem(RDX, RDI, 1, 8),
            RCX,
        ))?;
        em.e(Instruction::with1(Code::Inc_rm64, RSI))?;
        em.bind(store);
        em.mr(Code::Mov_rm64_r64, field!(l, depth), RSI)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, path)),
            0,
        ))?;
        em.e(Instruction::with2(Code::And_rm32_imm32, EAX, 0x7fff_ffff))?;
        em.mov_imm(RDX, tag(REC_ENTER))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.e(Instruction::with2(Code::Xor_r32_rm32, EDX, EDX))?;
        em.call(rt.emit)?;
        em.pop(R8)?;
        em.pop(RDI)?;
        em.pop(RSI)?;
        em.ret();
        em.bind(overflow);
        em.inc(field!(l, shadow_overflow))?;
        em.jmp(store)?;
    }

    // rt_back(eax = fid): PATH record (back edge). The caller then sets the
    // restart value.
    {
        em.bind(rt.back);
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.mov_imm(RDX, tag(REC_PATH) | (PATH_END_BACK_EDGE << 32))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.rm(Code::Mov_r64_rm64, RDX, field!(l, path))?;
        em.call(rt.emit)?;
        em.ret();
    }

    // rt_exit(eax = fid | NO_PATH, ecx = kind): PATH record; for returns
    // and tail calls, pop the shadow entry of this frame (restoring the
    // caller's path register) and make sure the return goes to a clone.
    {
        let (nopath, lp, pop_dead, nomatch, fix, lookup, leave, done) = (
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
            em.label(),
        );
        em.bind(rt.exit);
        em.push(RSI)?;
        em.push(RDI)?;
        em.push(R8)?;
        em.e(Instruction::with2(
            Code::Lea_r64_m,
            R8,
            MemoryOperand::with_base_displ(RSP, FRAME + 24),
        ))?;
        em.e(Instruction::with2(Code::Test_rm32_imm32, EAX, NO_PATH))?;
        em.jcc(Code::Jne_rel32_64, nopath)?;
        em.push(RCX)?;
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RCX, 32))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RCX))?;
        em.mov_imm(RDX, tag(REC_PATH))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.rm(Code::Mov_r64_rm64, RDX, field!(l, path))?;
        em.call(rt.emit)?;
        em.pop(RCX)?;
        em.bind(nopath);
        em.e(Instruction::with2(
            Code::Cmp_rm32_imm8,
            ECX,
            PATH_END_NORETURN as i32,
        ))?;
        em.jcc(Code::Je_rel32_64, done)?;
        // Pop: drop entries of dead deeper frames, match this one by rsp.
        em.e(Instruction::with2(Code::Lea_r64_m, RDX, rip(shadow)))?;
        em.rm(Code::Mov_r64_rm64, RSI, field!(l, depth))?;
        em.bind(lp);
        em.e(Instruction::with2(Code::Test_rm64_r64, RSI, RSI))?;
        em.jcc(Code::Je_rel32_64, nomatch)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDI, RSI))?;
        em.e(Instruction::with2(Code::Shl_rm64_imm8, RDI, 4))?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            mem(RDX, RDI, 1, -16),
        ))?;
        em.e(Instruction::with2(Code::Cmp_r64_rm64, RAX, R8))?;
        em.jcc(Code::Jb_rel32_64, pop_dead)?;
        em.jcc(Code::Ja_rel32_64, nomatch)?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            mem(RDX, RDI, 1, -8),
        ))?;
        em.mr(Code::Mov_rm64_r64, field!(l, path), RAX)?;
        em.e(Instruction::with1(Code::Dec_rm64, RSI))?;
        em.mr(Code::Mov_rm64_r64, field!(l, depth), RSI)?;
        em.jmp(fix)?;
        em.bind(pop_dead);
        em.e(Instruction::with1(Code::Dec_rm64, RSI))?;
        em.jmp(lp)?;
        em.bind(nomatch);
        em.mr(Code::Mov_rm64_r64, field!(l, depth), RSI)?;
        em.mov_imm(RAX, PATH_INVALID)?;
        em.mr(Code::Mov_rm64_r64, field!(l, path), RAX)?;
        // The return address: a clone address needs nothing; an original
        // one is translated, or the burst ends.
        em.bind(fix);
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            MemoryOperand::with_base(R8),
        ))?;
        em.rm(Code::Cmp_r64_rm64, RAX, field!(l, clone_lo))?;
        em.jcc(Code::Jb_rel32_64, lookup)?;
        em.rm(Code::Cmp_r64_rm64, RAX, field!(l, clone_hi))?;
        em.jcc(Code::Jb_rel32_64, done)?;
        em.bind(lookup);
        em.call(rt.lookup)?;
        em.e(Instruction::with2(Code::Test_rm64_r64, RAX, RAX))?;
        em.jcc(Code::Je_rel32_64, leave)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            MemoryOperand::with_base(R8),
            RAX,
        ))?;
        em.jmp(done)?;
        em.bind(leave);
        em.mov_imm(RAX, END_LEFT_CLONES)?;
        em.call(rt.end)?;
        em.bind(done);
        em.pop(R8)?;
        em.pop(RDI)?;
        em.pop(RSI)?;
        em.ret();
    }

    // The signal handler: handler(sig, info, ucontext). Starts a burst when
    // armed, idle, and the interrupted PC was rewritten. Everything it
    // clobbers is restored by rt_sigreturn from the ucontext.
    {
        let (busy, disarmed, notfound, zero) = (em.label(), em.label(), em.label(), em.label());
        // uc_mcontext.gregs[REG_RIP]: ucontext (40) + 16 * 8.
        const UC_RIP: i64 = 40 + 16 * 8;
        em.bind(rt.handler);
        em.e(Instruction::with2(
            Code::Cmp_rm32_imm8,
            rip(field!(l, armed)),
            0,
        ))?;
        em.jcc(Code::Je_rel32_64, disarmed)?;
        // Budget zero (`--burst 0`): back to the interrupted original code.
        em.e(Instruction::with2(
            Code::Cmp_rm64_imm8,
            rip(field!(l, burst_len)),
            0,
        ))?;
        em.jcc(Code::Je_rel32_64, zero)?;
        em.e(Instruction::with2(Code::Xor_r32_rm32, EAX, EAX))?;
        em.mov_imm(RCX, 1)?;
        em.e(
            Instruction::with2(Code::Cmpxchg_rm32_r32, rip(field!(l, active)), ECX).map(|mut i| {
                i.set_has_lock_prefix(true);
                i
            }),
        )?;
        em.jcc(Code::Jne_rel32_64, busy)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, R9, RDX))?; // ucontext
        // fs:[0] must be the thread's TCB (the x86-64 TLS ABI): not yet so
        // before libc set up TLS, and then no burst may start.
        em.lea_rsp(-16)?;
        em.mov_imm(RAX, 158)?; // arch_prctl(ARCH_GET_FS, rsp)
        em.mov_imm(RDI, 0x1003)?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RSI, RSP))?;
        em.emit(Instruction::with(Code::Syscall));
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            MemoryOperand::with_base(RSP),
        ))?;
        em.lea_rsp(16)?;
        em.e(Instruction::with2(Code::Test_rm64_r64, RAX, RAX))?;
        em.jcc(Code::Je_rel32_64, notfound)?;
        em.e(Instruction::with2(
            Code::Cmp_r64_rm64,
            RAX,
            MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS),
        ))?;
        em.jcc(Code::Jne_rel32_64, notfound)?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            R10,
            MemoryOperand::with_base_displ(R9, UC_RIP),
        ))?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RAX, R10))?;
        em.call(rt.lookup)?;
        em.e(Instruction::with2(Code::Test_rm64_r64, RAX, RAX))?;
        em.jcc(Code::Je_rel32_64, notfound)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_r64,
            MemoryOperand::with_base_displ(R9, UC_RIP),
            RAX,
        ))?;
        em.e(Instruction::with2(
            Code::Mov_r64_rm64,
            RAX,
            MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS),
        ))?;
        em.mr(Code::Mov_rm64_r64, field!(l, owner), RAX)?;
        em.rm(Code::Mov_r64_rm64, RAX, field!(l, burst_len))?;
        em.mr(Code::Mov_rm64_r64, field!(l, budget), RAX)?;
        em.mov_imm(RAX, PATH_INVALID)?;
        em.mr(Code::Mov_rm64_r64, field!(l, path), RAX)?;
        em.e(Instruction::with2(
            Code::Mov_rm64_imm32,
            rip(field!(l, depth)),
            0,
        ))?;
        em.inc(field!(l, bursts))?;
        // START record: gettid(), interrupted PC.
        em.mov_imm(RAX, 186)?;
        em.emit(Instruction::with(Code::Syscall));
        em.e(Instruction::with2(Code::Mov_r32_rm32, EAX, EAX))?;
        em.mov_imm(RDX, tag(REC_START))?;
        em.e(Instruction::with2(Code::Or_r64_rm64, RAX, RDX))?;
        em.e(Instruction::with2(Code::Mov_r64_rm64, RDX, R10))?;
        em.call(rt.emit)?;
        em.ret();
        em.bind(notfound);
        em.e(Instruction::with2(
            Code::Mov_rm32_imm32,
            rip(field!(l, active)),
            0u32,
        ))?;
        em.inc(field!(l, declined_pc))?;
        em.ret();
        em.bind(busy);
        em.inc(field!(l, declined_busy))?;
        em.ret();
        em.bind(zero);
        em.inc(field!(l, declined_budget))?;
        em.ret();
        em.bind(disarmed);
        em.inc(field!(l, declined_disarmed))?;
        em.ret();

        em.bind(rt.restorer);
        em.mov_imm(RAX, 15)?;
        em.emit(Instruction::with(Code::Syscall));
        em.emit(Instruction::with(Code::Int3));
    }
    Ok(rt)
}
