//! The injected runtime: the small routines the instrumented clones call,
//! and the burst signal handler, assembled with iced-x86's
//! [`CodeAssembler`] for one placement (`at`) and one control block
//! (`control`).
//!
//! Every routine reaches the [`BurstControl`] RIP-relatively, so the code
//! must lie within ±2 GiB of it ([`assemble`] fails otherwise). All state
//! is in the control block: the code itself is position-dependent only
//! through those displacements.
//!
//! # Calling convention
//!
//! A clone calls a routine with `call` from its *standard frame*:
//!
//! ```text
//! lea rsp, [rsp - 128]      ; skip the red zone
//! pushfq
//! push rax
//! push rcx
//! push rdx
//! mov eax, arg              ; mov ecx, arg2 (rt_exit)
//! call routine
//! pop rdx / pop rcx / pop rax / popfq / lea rsp, [rsp + 128]
//! ```
//!
//! so a routine may clobber rax, rcx, rdx and the flags and must preserve
//! every other register. [`FRAME`](asm::FRAME) is the distance from `rsp` at a
//! routine's entry to the program's `rsp` at the snippet; `rt_enter` and
//! `rt_exit` read the program's `rsp` (the activation's return address)
//! there. The contract, routine by routine (and its file):
//!
//! - `rt_emit(rax = w0, rdx = w1)` (`ring.rs`): writes the two-word record at
//!   `head & ring_mask` and advances `head` by 2; clobbers rcx (and the
//!   flags; rax and rdx are preserved). A full ring truncates the burst (its
//!   budget drops to 1, `truncated` counts it once) and counts the record
//!   in `lost_records`, unless `wait_when_full` (full trace), which yields
//!   (`sched_yield`, at most 2^22 times) for the daemon to consume.
//! - `rt_ref(rax = w0, rdx = address)` (`refs.rs`): memory mode's
//!   reference: nothing for an address in the thread's own stack (its red
//!   zone up to 8 MiB above its `rsp`), else `rt_emit`. Clobbers rcx.
//! - `rt_lookup(rax = original address) -> rax = clone address or 0`
//!   (`lookup.rs`): binary search over every rewritten instruction (the
//!   sorted `insns` table of the `TablesHeader` at `tables`). Clobbers rcx, rdx.
//! - `rt_lookup_fn(rax)` (`lookup.rs`): the same over function entries
//!   (`functions`, original start → clone entry), then over instructions
//!   (an entry point inside a function: entered with the burst's path made
//!   invalid), returning rax unchanged when neither has it (an indirect
//!   call to code that was not cloned). Clobbers rcx, rdx.
//! - `rt_end(eax = reason)` (`end.rs`): END record, the burst is over
//!   (`owner` = 0, `ended` + 1, `active` = 0). Clobbers rax, rcx, rdx.
//! - `rt_enter(eax = fid | flags)` (`enter.rs`): push (rsp, caller's path) on
//!   the shadow stack, path = 0, ENTER record. Shadow entries at or below
//!   the new frame are dead (frames left by longjmp or unwinding) and are
//!   dropped first; a full shadow stack counts `shadow_overflow`. With
//!   `measure`: the entry's `elapsed = rdtsc - path_start`, and after the
//!   record `path_start = rdtsc` (also on overflow). Clobbers rax, rcx, rdx.
//! - `rt_back(eax = fid)` (`back.rs`): PATH record (back edge) with the path
//!   register; with `measure`, then the COST record and `path_start =
//!   rdtsc`. The caller then sets the restart value. Clobbers rax, rcx,
//!   rdx.
//! - `rt_back_at([rsp + 8] = fid, [rsp + 16] = increment)` (`back.rs`):
//!   not from the standard frame but its own (the clone pushes the two
//!   arguments after skipping the red zone, and drops them after): `path +=
//!   increment`, then `rt_back`'s records (and `path_start`). Preserves
//!   every register and the flags.
//! - `rt_lookup_ret(rax)` (`lookup.rs`): the same over the calls' return
//!   sites (`returns`, original return address →
//!   the clone's return site), 0 when not found.
//! - `rt_exit(eax = fid | NO_PATH, ecx = kind)` (`exit.rs`): PATH record
//!   (none with [`NO_PATH`]); for returns and tail calls, pop the shadow
//!   entry of this frame (restoring the caller's path register; dead
//!   deeper entries are dropped, no match leaves the path
//!   `PATH_INVALID`); for returns, write where the return goes into the
//!   slot below the return address (`[program rsp - 8]`, which the clone's
//!   `lea rsp, [rsp + 8]; jmp [rsp - 16]` reads): the clone return site of
//!   the original return address (`rt_lookup_ret`), or the original itself
//!   and the burst ends (`END_LEFT_CLONES`). With `measure`: the PATH
//!   record is followed by the COST record; a pop that matches sets
//!   `path_start = rdtsc - elapsed` (the caller's path excludes the
//!   callee); `PATH_END_NORETURN` sets `path_start = rdtsc` (what follows
//!   is a new path: a `.cold` part's, or a call that does not return).
//!   Clobbers rax, rcx, rdx.
//! - `rt_unwind(rax = target) -> rax` (`unwind.rs`): an indirect jump
//!   after `rsp` was loaded from a computed value (the unwinder's
//!   `__builtin_eh_return` into a landing pad, `longjmp`), not from the
//!   standard frame's `call` but through `transfer_through` (the same
//!   frame): drop the shadow entries of the frames left, path =
//!   `PATH_INVALID`, UNWIND record (the depth left), and the target's
//!   clone (`rt_lookup`), or the target itself and the burst ends. With
//!   `measure`, a target with a clone gets `path_start = rdtsc` (the
//!   landing pad's path, which its clone starts inline, is timed from
//!   here). Clobbers rax, rcx, rdx.
//! - `handler(sig, info, ucontext)` (`handler.rs`): the `SA_SIGINFO` handler.
//!   Starts a burst when armed, `burst_len` is not 0, no burst is active
//!   (`lock cmpxchg` on `active`), `fs:[0]` is the thread's TCB, and the
//!   interrupted PC was rewritten: the PC in the ucontext becomes the
//!   clone's, `owner` = `fs:[0]`, `budget` = `burst_len`, path =
//!   `PATH_INVALID`, `depth` = 0, `bursts` + 1, `owner_tid` = `gettid()`,
//!   START record (`gettid()`, interrupted PC), and with `measure`
//!   `path_start = rdtsc`. A running burst of the
//!   same thread whose PC is back in original code is ended first. Otherwise it counts why it declined. Everything it
//!   clobbers is restored by `rt_sigreturn` from the ucontext.
//! - `restorer` (`handler.rs`): `rt_sigreturn` (`SA_RESTORER`), then `int3`.
//!
//! The handler clobbers rax, rcx, rdx, rsi, rdi, r9, r10 and r11; the
//! kernel's signal frame restores them.
//!
//! # Path costs
//!
//! With `measure` set in the control block (by the daemon),
//! the routines time each path with the time-stamp counter (`rdtsc`),
//! exclusive of the functions it calls: `path_start` (private state) is
//! when the innermost activation's current path started, a call saves the
//! caller's ticks so far in its shadow entry (`elapsed`) and the return
//! sets `path_start = rdtsc - elapsed`, and every PATH record is followed
//! by a COST record (`w0 = tag`, `w1` = ticks), the counter read before the
//! records and read again after them for the next path. With `measure` 0
//! no `rdtsc` runs and no COST record is written; each routine that would
//! measure costs one compare-and-branch more (`rt_enter`, `rt_back` and
//! `rt_exit` are then assembled twice, plain and measuring, behind it).
//!
//! The clones start paths inline (`set_path`) only right after a routine
//! that set `path_start`: the restart after a truncated edge follows
//! `rt_back`/`rt_back_at`, a landing pad's entry stub follows `rt_unwind`
//! (or the handler, which may start a burst there), and a jump into a
//! `.cold` part's clone follows `rt_exit(PATH_END_NORETURN)`.
//!
//! # Tests
//!
//! Every routine runs in the test process, as a normal user: `testing.rs`
//! maps a control block, a 16-word ring, the tables, a stack and the code;
//! `regs.rs` calls a routine with every general register set and reads them
//! all back (the contract above is checked, not assumed); `signal.rs`
//! installs the handler and restorer for a real signal. (When this runtime
//! replaced the hand-emitted one, a test ran both from 4000 random states
//! and found every effect identical; it went with the old code.)
use burstyd_common::burst::BurstControl;
use iced_x86::code_asm::{CodeAssembler, CodeLabel};
use iced_x86::{BlockEncoderOptions, IcedError};

mod asm;
mod back;
mod end;
mod enter;
mod exit;
mod handler;
mod lookup;
mod refs;
mod ring;
mod tuples;
mod unwind;

#[cfg(test)]
mod regs;
#[cfg(test)]
mod signal;
#[cfg(test)]
mod testing;

pub use asm::NO_PATH;
use asm::field;

/// The assembled runtime: its bytes and the absolute address (AVMA) of
/// each routine.
#[derive(Clone, Debug)]
pub struct Runtime {
    /// The code, to be placed at the `at` given to [`assemble`].
    pub bytes: Vec<u8>,
    /// `rt_emit`: called by the other routines, and by the clones in
    /// memory mode (`REC_REF` records). `rt_lookup` is called by the other
    /// routines, not by the clones; the unit tests call it directly.
    pub emit: u64,
    /// `rt_ref`: memory mode's references, the thread's stack left out;
    /// `rt_ref_all`: with the stack's (`--refs-stack`).
    pub reference: u64,
    pub reference_all: u64,
    /// `rt_tuple`: the tuples of the tuple profiles, through the
    /// compressor; `rt_tuple_flush`: the associative table emptied (by
    /// `rt_end`).
    pub tuple: u64,
    pub tuple_flush: u64,
    #[cfg_attr(not(test), allow(dead_code))]
    pub lookup: u64,
    pub lookup_fn: u64,
    /// The function-entry table's search that `rt_lookup_fn` calls first
    /// (0 on a miss).
    pub lookup_function_entry: u64,
    #[cfg_attr(not(test), allow(dead_code))]
    pub lookup_ret: u64,
    pub enter: u64,
    pub exit: u64,
    pub back: u64,
    pub back_at: u64,
    pub end: u64,
    pub unwind: u64,
    /// The signal handler (`SA_SIGINFO`).
    pub handler: u64,
    /// The `rt_sigreturn` restorer (`SA_RESTORER`).
    pub restorer: u64,
}

impl Runtime {
    /// The routines the clones and the other routines call, each entered
    /// by a `call` with the return address on top (not the signal
    /// handler and its restorer, which the kernel enters).
    pub(crate) fn routines(&self) -> [u64; 15] {
        [
            self.emit,
            self.reference,
            self.reference_all,
            self.tuple,
            self.tuple_flush,
            self.lookup,
            self.lookup_fn,
            self.lookup_function_entry,
            self.lookup_ret,
            self.enter,
            self.exit,
            self.back,
            self.back_at,
            self.end,
            self.unwind,
        ]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The block encoder failed, e.g. the code is not within ±2 GiB of the
    /// control block.
    #[error("assembling the runtime failed: {0}")]
    Encode(String),
    /// Not a possible address of a [`BurstControl`] (below 64 KiB, or not
    /// aligned to its 64 bytes).
    #[error("bad control block address {0:#x}")]
    Control(u64),
}

impl From<IcedError> for RuntimeError {
    fn from(e: IcedError) -> Self {
        RuntimeError::Encode(e.to_string())
    }
}

/// The routines' entry labels.
struct Entries {
    emit: CodeLabel,
    reference: CodeLabel,
    reference_all: CodeLabel,
    tuple: CodeLabel,
    tuple_flush: CodeLabel,
    lookup: CodeLabel,
    lookup_fn: CodeLabel,
    lookup_ret: CodeLabel,
    end: CodeLabel,
    enter: CodeLabel,
    back: CodeLabel,
    back_at: CodeLabel,
    exit: CodeLabel,
    unwind: CodeLabel,
    handler: CodeLabel,
    restorer: CodeLabel,
}

/// Assembles the runtime for the [`BurstControl`] at `control`, to be
/// placed at `at` (both AVMAs in the target).
pub fn assemble(control: u64, at: u64) -> Result<Runtime, RuntimeError> {
    // Labels are small integers inside the assembler; a RIP-relative
    // target equal to one would be taken for it. Real control blocks are
    // page-aligned mappings far above that.
    if control < 0x1_0000 || !control.is_multiple_of(align_of::<BurstControl>() as u64) {
        return Err(RuntimeError::Control(control));
    }
    let mut a = CodeAssembler::new(64)?;
    let mut e = Entries {
        emit: a.create_label(),
        reference: a.create_label(),
        reference_all: a.create_label(),
        tuple: a.create_label(),
        tuple_flush: a.create_label(),
        lookup: a.create_label(),
        lookup_fn: a.create_label(),
        lookup_ret: a.create_label(),
        end: a.create_label(),
        enter: a.create_label(),
        back: a.create_label(),
        back_at: a.create_label(),
        exit: a.create_label(),
        unwind: a.create_label(),
        handler: a.create_label(),
        restorer: a.create_label(),
    };
    ring::emit(&mut a, control, &mut e.emit)?;
    refs::reference(
        &mut a,
        control,
        &mut e.reference,
        &mut e.reference_all,
        e.emit,
    )?;
    tuples::tuple(&mut a, control, &mut e.tuple, e.emit)?;
    tuples::flush(&mut a, control, &mut e.tuple_flush, e.emit)?;
    use burstyd_common::burst::TablesHeader;
    use core::mem::offset_of;
    let tables = field!(control, tables);
    lookup::lookup(
        &mut a,
        &mut e.lookup,
        tables,
        (
            offset_of!(TablesHeader, insns),
            offset_of!(TablesHeader, insns_len),
        ),
    )?;
    let mut function_entry = a.create_label();
    lookup::lookup(
        &mut a,
        &mut function_entry,
        tables,
        (
            offset_of!(TablesHeader, functions),
            offset_of!(TablesHeader, functions_len),
        ),
    )?;
    lookup::lookup_fn(&mut a, control, &mut e.lookup_fn, function_entry, e.lookup)?;
    lookup::lookup(
        &mut a,
        &mut e.lookup_ret,
        tables,
        (
            offset_of!(TablesHeader, returns),
            offset_of!(TablesHeader, returns_len),
        ),
    )?;
    end::end(&mut a, control, &mut e.end, e.emit, e.tuple_flush)?;
    enter::enter(&mut a, control, &mut e.enter, e.emit)?;
    back::back(&mut a, control, &mut e.back, e.emit)?;
    back::back_at(&mut a, control, &mut e.back_at, e.back)?;
    exit::exit(&mut a, control, &mut e.exit, e.emit, e.lookup_ret, e.end)?;
    unwind::unwind(&mut a, control, &mut e.unwind, e.emit, e.lookup, e.end)?;
    handler::handler(&mut a, control, &mut e.handler, e.emit, e.lookup, e.end)?;
    handler::restorer(&mut a, &mut e.restorer)?;

    let r = a.assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    Ok(Runtime {
        emit: r.label_ip(&e.emit)?,
        reference: r.label_ip(&e.reference)?,
        reference_all: r.label_ip(&e.reference_all)?,
        tuple: r.label_ip(&e.tuple)?,
        tuple_flush: r.label_ip(&e.tuple_flush)?,
        lookup: r.label_ip(&e.lookup)?,
        lookup_fn: r.label_ip(&e.lookup_fn)?,
        lookup_function_entry: r.label_ip(&function_entry)?,
        lookup_ret: r.label_ip(&e.lookup_ret)?,
        enter: r.label_ip(&e.enter)?,
        exit: r.label_ip(&e.exit)?,
        back: r.label_ip(&e.back)?,
        back_at: r.label_ip(&e.back_at)?,
        end: r.label_ip(&e.end)?,
        unwind: r.label_ip(&e.unwind)?,
        handler: r.label_ip(&e.handler)?,
        restorer: r.label_ip(&e.restorer)?,
        bytes: r.inner.code_buffer,
    })
}

#[cfg(test)]
mod tests {
    use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Mnemonic, Register};

    use super::*;

    const CONTROL: u64 = 0x7f12_3456_0000;

    fn decode(rt: &Runtime, at: u64) -> Vec<Instruction> {
        Decoder::with_ip(64, &rt.bytes, at, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    #[test]
    fn rejects_impossible_control_addresses() {
        for control in [0, 0x8000, CONTROL + 8] {
            assert!(matches!(
                assemble(control, CONTROL + 0x10_0000),
                Err(RuntimeError::Control(c)) if c == control
            ));
        }
    }

    /// The code must be within ±2 GiB of every control field.
    #[test]
    fn fails_out_of_rip_relative_range() {
        for at in [CONTROL + (3 << 30), CONTROL - (3 << 30)] {
            assert!(matches!(
                assemble(CONTROL, at),
                Err(RuntimeError::Encode(_))
            ));
        }
        assert!(assemble(CONTROL, CONTROL + (1 << 30)).is_ok());
        assert!(assemble(CONTROL, CONTROL - (1 << 30)).is_ok());
    }

    /// Entries in emission order inside the code; the code ends with the
    /// restorer: `mov eax, 15; syscall; int3`.
    #[test]
    fn entries_and_restorer() {
        let at = CONTROL + 0x1_0000;
        let rt = assemble(CONTROL, at).unwrap();
        let entries = [
            rt.emit,
            rt.reference,
            rt.tuple,
            rt.tuple_flush,
            rt.lookup,
            rt.lookup_fn,
            rt.lookup_ret,
            rt.end,
            rt.enter,
            rt.back,
            rt.exit,
            rt.unwind,
            rt.handler,
            rt.restorer,
        ];
        assert_eq!(rt.emit, at);
        assert!(entries.windows(2).all(|w| w[0] < w[1]), "{entries:x?}");
        let end = at + rt.bytes.len() as u64;
        assert_eq!(rt.restorer + 8, end);
        assert_eq!(
            &rt.bytes[rt.bytes.len() - 8..],
            b"\xb8\x0f\x00\x00\x00\x0f\x05\xcc"
        );
        let starts: Vec<u64> = decode(&rt, at).iter().map(|i| i.ip()).collect();
        assert!(entries.iter().all(|e| starts.contains(e)));
    }

    /// Every instruction before the signal handler is reached from the
    /// routines' entries at a known stack height, so that it gets an
    /// unwind row (`unwind_info::runtime_fdes`): a routine only another
    /// routine calls (the function-entry search inside `rt_lookup_fn`)
    /// must be an entry too, or a sample in it stops unwinding there.
    #[test]
    fn every_routine_instruction_has_a_stack_height() {
        use crate::codegen::stack_heights::{Height, State, analyse};
        let at = CONTROL + 0x1_0000;
        let rt = assemble(CONTROL, at).unwrap();
        let entry = Height {
            anchor: at,
            delta: 0,
        };
        let roots: Vec<(u64, Height)> = rt.routines().iter().map(|&r| (r, entry)).collect();
        let heights = analyse(&rt.bytes, at..at + rt.bytes.len() as u64, &roots);
        let known: std::collections::BTreeSet<u64> = heights
            .iter()
            .filter(|h| matches!(h.2, State::Known(_)))
            .map(|h| h.0)
            .collect();
        let missing: Vec<u64> = decode(&rt, at)
            .iter()
            .map(|i| i.ip())
            .filter(|&ip| ip < rt.handler && !known.contains(&ip))
            .collect();
        // Padding between routines (int3) is reached by nothing.
        let missing: Vec<u64> = missing
            .into_iter()
            .filter(|&ip| rt.bytes[(ip - at) as usize] != 0xcc)
            .collect();
        assert!(missing.is_empty(), "no stack height at {missing:x?}");
    }

    /// What no single-threaded behaviour test sees: every RIP-relative
    /// operand is a control-block or private-state field, the claim of a
    /// slot and the invalidation of `tables` are each one `lock cmpxchg`,
    /// the count of running bursts one `lock xadd`, and every `fs:`
    /// operand is `fs:[0]` or the thread's burst registers, at two
    /// placements.
    #[test]
    fn memory_operands() {
        use burstyd_common::burst::{BurstRegs, TLS_REGS};
        let size = size_of::<BurstControl>() as u64;
        let local = CONTROL + burstyd_common::burst::LOCAL_OFFSET as u64;
        let local_size = size_of::<burstyd_common::burst::BurstLocal>() as u64;
        let regs = TLS_REGS as u64..TLS_REGS as u64 + size_of::<BurstRegs>() as u64;
        for at in [CONTROL + 0x1_0000, CONTROL - 0x7000_0000] {
            let rt = assemble(CONTROL, at).unwrap();
            let insns = decode(&rt, at);
            let rip: Vec<&Instruction> = insns
                .iter()
                .filter(|i| i.is_ip_rel_memory_operand())
                .collect();
            assert!(rip.len() > 40, "{} RIP-relative operands", rip.len());
            for i in rip {
                let t = i.ip_rel_memory_address();
                assert!(
                    (CONTROL..CONTROL + size).contains(&t)
                        || (local..local + local_size).contains(&t),
                    "{i} at {:#x}",
                    i.ip()
                );
            }
            let cmpxchg: Vec<&Instruction> = insns
                .iter()
                .filter(|i| i.mnemonic() == Mnemonic::Cmpxchg)
                .collect();
            // The invalidation of `tables` at the loader's hook, and the
            // handler's claim of a slot's owner.
            assert_eq!(cmpxchg.len(), 2);
            assert!(cmpxchg.iter().all(|i| i.has_lock_prefix()));
            assert_eq!(cmpxchg[0].code(), Code::Cmpxchg_rm64_r64);
            assert_eq!(cmpxchg[0].ip_rel_memory_address(), field!(CONTROL, tables));
            assert_eq!(cmpxchg[1].code(), Code::Cmpxchg_rm64_r64);
            assert_eq!(cmpxchg[1].memory_base(), Register::RSI);
            let xadd: Vec<&Instruction> = insns
                .iter()
                .filter(|i| i.mnemonic() == Mnemonic::Xadd)
                .collect();
            assert_eq!(xadd.len(), 1);
            assert!(xadd[0].has_lock_prefix());
            assert_eq!(xadd[0].ip_rel_memory_address(), field!(CONTROL, active));
            let fs: Vec<&Instruction> = insns
                .iter()
                .filter(|i| i.segment_prefix() == Register::FS)
                .collect();
            assert!(fs.len() > 30, "{} fs operands", fs.len());
            for i in fs {
                assert_eq!(i.memory_base(), Register::None, "{i}");
                assert_eq!(i.memory_index(), Register::None, "{i}");
                let d = i.memory_displacement64();
                assert!(d == 0 || regs.contains(&d), "{i}");
            }
        }
    }
}
