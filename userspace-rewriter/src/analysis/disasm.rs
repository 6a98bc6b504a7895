//! x86-64 decoding of one function's bytes.
//!
//! You give it the bytes of a function and the SVMA of the first byte
//! (`decode`); it returns every instruction of a *linear sweep* over the
//! bytes, each with its address, length and control-flow class ([`Flow`]),
//! plus the decoded [`iced_x86::Instruction`] for later stages (jump-table
//! matching and liveness in [`crate::analysis::cfg`]).
//!
//! A linear sweep is what a post-link rewriter such as the Vulcan-based
//! implementation of Hirzel & Chilimbi ("Bursty Tracing", section 3) starts
//! from: it decodes every byte of the function's symbol/FDE range in order.
//! Bytes that do not decode become [`Flow::Invalid`] instructions of length 1
//! so the sweep always covers the whole range; deciding whether invalid or
//! overlapping code is actually reached is the job of [`cfg`](super::cfg),
//! which walks control flow recursively over this sweep.
//!
//! ## Non-goals
//!
//! No 16/32-bit code, no formatting (use [`Insn::display`] when debugging),
//! no recursive-descent decoding here and no interpretation of jump tables.

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, Register};
use serde::Serialize;

/// What an instruction does to control flow.
///
/// Targets are SVMAs (the decoder runs with `ip` = the function's SVMA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// Direct unconditional jump (`jmp rel`).
    Jump(u64),
    /// Direct conditional jump (`jcc`, `jrcxz`, `loop*`): taken target; the
    /// not-taken successor is the next instruction.
    CondJump(u64),
    /// Indirect jump through a register or memory (`jmp rax`, `jmp [..]`),
    /// with or without the CET `notrack` prefix.
    IndirectJump,
    /// Direct near call.
    Call(u64),
    /// Indirect near call.
    IndirectCall,
    /// Near return (`ret`, `ret imm16`).
    Ret,
    /// An instruction after which execution never continues in this function
    /// normally: `ud0`/`ud1`/`ud2`, `hlt`, `int3`, `int1`.
    Trap,
    /// `syscall`/`sysenter`: control comes back to the next instruction.
    Syscall,
    /// `int n`, `into` and other interrupts that return to the next instruction.
    Interrupt,
    /// Control flow this crate does not model: far jumps/calls/returns,
    /// `iret`, `sysret`, transactional `xbegin`/`xabort`/`xend`...
    Unsupported,
    /// The bytes do not decode to a valid 64-bit instruction (length 1).
    Invalid,
}

impl Flow {
    /// Whether the instruction may fall through to the next one.
    pub(crate) fn falls_through(self) -> bool {
        matches!(
            self,
            Flow::Next
                | Flow::CondJump(_)
                | Flow::Call(_)
                | Flow::IndirectCall
                | Flow::Syscall
                | Flow::Interrupt
        )
    }

    /// The direct branch/call target, if any.
    pub(crate) fn target(self) -> Option<u64> {
        match self {
            Flow::Jump(t) | Flow::CondJump(t) | Flow::Call(t) => Some(t),
            _ => None,
        }
    }
}

/// One decoded instruction.
#[derive(Clone, Copy, Debug)]
pub struct Insn {
    /// SVMA of the first byte.
    pub addr: u64,
    /// Length in bytes (1 for [`Flow::Invalid`]).
    len: u32,
    /// Control-flow class.
    pub flow: Flow,
    /// Whether the instruction carries the CET `notrack` (`3E`) prefix
    /// (only meaningful on indirect jumps/calls).
    pub notrack: bool,
    /// The decoded instruction (its `ip()` is `addr`).
    pub instr: Instruction,
}

impl Insn {
    /// SVMA just past the instruction.
    pub fn end(&self) -> u64 {
        self.addr.wrapping_add(u64::from(self.len))
    }

    /// Whether this is `endbr64` (the CET landing pad that
    /// `-fcf-protection` puts at function entries and indirect targets).
    pub fn is_endbr64(&self) -> bool {
        self.instr.code() == Code::Endbr64
    }

    /// Intel-syntax text of the instruction, for debugging and test messages.
    pub fn display(&self) -> String {
        use iced_x86::Formatter;
        if self.flow == Flow::Invalid {
            return "(bad)".to_string();
        }
        let mut out = String::new();
        let mut f = iced_x86::IntelFormatter::new();
        f.format(&self.instr, &mut out);
        out
    }
}

/// Classify one decoded instruction.
fn classify(instr: &Instruction) -> Flow {
    if instr.is_invalid() {
        return Flow::Invalid;
    }
    // iced classifies `syscall` like a call; in user space it returns to
    // the next instruction (or, for exit, never: a noreturn syscall needs no
    // fall-through edge, and having one is harmless).
    if matches!(instr.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter) {
        return Flow::Syscall;
    }
    match instr.flow_control() {
        FlowControl::Next => Flow::Next,
        FlowControl::UnconditionalBranch => {
            if instr.code().is_jmp_short_or_near() {
                Flow::Jump(instr.near_branch_target())
            } else {
                Flow::Unsupported // far jmp ptr16:32
            }
        }
        FlowControl::ConditionalBranch => {
            if instr.code().is_jcc_short_or_near()
                || instr.code().is_jcx_short()
                || instr.code().is_loop()
                || instr.code().is_loopcc()
            {
                Flow::CondJump(instr.near_branch_target())
            } else {
                Flow::Unsupported
            }
        }
        FlowControl::IndirectBranch => {
            if instr.code().is_jmp_near_indirect() {
                Flow::IndirectJump
            } else {
                Flow::Unsupported // far indirect jmp
            }
        }
        FlowControl::Call => {
            if instr.code().is_call_near() {
                Flow::Call(instr.near_branch_target())
            } else {
                Flow::Unsupported
            }
        }
        FlowControl::IndirectCall => {
            if instr.code().is_call_near_indirect() {
                Flow::IndirectCall
            } else {
                Flow::Unsupported
            }
        }
        FlowControl::Return => match instr.mnemonic() {
            Mnemonic::Ret => Flow::Ret,
            _ => Flow::Unsupported, // retf, iret, sysret, uiret...
        },
        FlowControl::Interrupt => match instr.mnemonic() {
            Mnemonic::Syscall | Mnemonic::Sysenter => Flow::Syscall,
            Mnemonic::Int3 | Mnemonic::Int1 => Flow::Trap,
            _ => Flow::Interrupt,
        },
        FlowControl::Exception => Flow::Trap, // ud0/ud1/ud2
        FlowControl::XbeginXabortXend => Flow::Unsupported,
    }
    .refine(instr)
}

impl Flow {
    /// `hlt` is `FlowControl::Next` to iced (execution resumes after an
    /// interrupt) but in user space it faults: treat it as a trap.
    fn refine(self, instr: &Instruction) -> Flow {
        if self == Flow::Next && instr.mnemonic() == Mnemonic::Hlt {
            Flow::Trap
        } else {
            self
        }
    }
}

/// Decode `bytes` as 64-bit code starting at SVMA `ip`, linearly, until the
/// end of `bytes`.
///
/// Returns one [`Insn`] per decoded instruction, in address order, covering
/// every byte exactly once. An instruction that would extend past the end of
/// `bytes`, or bytes that are not a valid instruction, produce a
/// [`Flow::Invalid`] entry of length 1 and the sweep resumes at the next byte.
pub(crate) fn decode(bytes: &[u8], ip: u64) -> Vec<Insn> {
    let mut out = Vec::with_capacity(bytes.len() / 3 + 1);
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        let pos = decoder.position();
        decoder.decode_out(&mut instr);
        let addr = ip.wrapping_add(pos as u64);
        if instr.is_invalid() {
            // Resynchronise one byte further.
            out.push(Insn {
                addr,
                len: 1,
                flow: Flow::Invalid,
                notrack: false,
                instr,
            });
            let next = pos + 1;
            if next >= bytes.len() {
                break;
            }
            decoder
                .set_position(next)
                .expect("position within the decoder's data");
            decoder.set_ip(ip.wrapping_add(next as u64));
            continue;
        }
        let flow = classify(&instr);
        let notrack = matches!(flow, Flow::IndirectJump | Flow::IndirectCall)
            && instr.segment_prefix() == Register::DS;
        out.push(Insn {
            addr,
            len: instr.len() as u32,
            flow,
            notrack,
            instr,
        });
    }
    redirect_lock_skips(&mut out, bytes, ip);
    out
}

/// glibc's `catomic_*` skip a `lock` prefix when the process is
/// single-threaded: `je 1f; lock; 1: cmpxchg` branches one byte into the
/// locked instruction, where the same instruction without the prefix
/// starts. Such a branch (the prefix is the instruction's first byte, and
/// the bytes after it decode to the same instruction, unlocked, ending at
/// the same address) is redirected here to the locked instruction itself: a
/// locked read-modify-write is one valid execution of the unlocked one (it
/// only adds atomicity), with the same result and flags. The address one
/// byte in is thereby no instruction of the analysis (a burst never starts
/// there, and a clone never jumps there).
fn redirect_lock_skips(insns: &mut [Insn], bytes: &[u8], ip: u64) {
    for k in 0..insns.len() {
        let t = match insns[k].flow {
            Flow::Jump(t) | Flow::CondJump(t) => t,
            _ => continue,
        };
        let Err(pos) = insns.binary_search_by_key(&t, |i| i.addr) else {
            continue;
        };
        let Some(c) = pos.checked_sub(1).map(|c| &insns[c]) else {
            continue;
        };
        if t != c.addr.wrapping_add(1) || !c.instr.has_lock_prefix() {
            continue;
        }
        let off = (c.addr - ip) as usize;
        let Some(body) = bytes.get(off..off + c.len as usize) else {
            continue;
        };
        let unlocked = Decoder::with_ip(64, &body[1..], t, DecoderOptions::NONE).decode();
        if body[0] == 0xF0
            && !unlocked.is_invalid()
            && unlocked.len() == body.len() - 1
            && unlocked.code() == c.instr.code()
            && !unlocked.has_lock_prefix()
        {
            let to = c.addr;
            let b = &mut insns[k];
            b.flow = match b.flow {
                Flow::Jump(_) => Flow::Jump(to),
                _ => Flow::CondJump(to),
            };
            b.instr.set_near_branch64(to);
        }
    }
}

/// Decode exactly one instruction at SVMA `ip` from `bytes` (which start at
/// `ip`). Returns `None` if `bytes` is empty.
pub(crate) fn decode_one(bytes: &[u8], ip: u64) -> Option<Insn> {
    if bytes.is_empty() {
        return None;
    }
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let instr = decoder.decode();
    if instr.is_invalid() {
        return Some(Insn {
            addr: ip,
            len: 1,
            flow: Flow::Invalid,
            notrack: false,
            instr,
        });
    }
    let flow = classify(&instr);
    Some(Insn {
        addr: ip,
        len: instr.len() as u32,
        flow,
        notrack: matches!(flow, Flow::IndirectJump | Flow::IndirectCall)
            && instr.segment_prefix() == Register::DS,
        instr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_basic_flows() {
        // endbr64; test edi,edi; je +2; ud2; call rel32(0); notrack jmp rax;
        // ret; hlt; syscall; 0x06 (invalid in 64-bit mode); int3
        let bytes: &[u8] = &[
            0xf3, 0x0f, 0x1e, 0xfa, // endbr64
            0x85, 0xff, // test edi,edi
            0x74, 0x02, // je +2
            0x0f, 0x0b, // ud2
            0xe8, 0x00, 0x00, 0x00, 0x00, // call next
            0x3e, 0xff, 0xe0, // notrack jmp rax
            0xc3, // ret
            0xf4, // hlt
            0x0f, 0x05, // syscall
            0x06, // invalid
            0xcc, // int3
        ];
        let insns = decode(bytes, 0x1000);
        let flows: Vec<Flow> = insns.iter().map(|i| i.flow).collect();
        assert_eq!(
            flows,
            vec![
                Flow::Next,
                Flow::Next,
                Flow::CondJump(0x100a),
                Flow::Trap,
                Flow::Call(0x100f),
                Flow::IndirectJump,
                Flow::Ret,
                Flow::Trap,
                Flow::Syscall,
                Flow::Invalid,
                Flow::Trap,
            ]
        );
        assert!(insns[0].is_endbr64());
        assert!(insns[5].notrack);
        assert_eq!(
            insns.iter().map(|i| i.len as usize).sum::<usize>(),
            bytes.len()
        );
    }

    #[test]
    fn truncated_instruction_is_invalid() {
        // call rel32 cut after two bytes
        let insns = decode(&[0x90, 0xe8, 0x00], 0x10);
        assert_eq!(insns.len(), 3);
        assert_eq!(insns[0].flow, Flow::Next);
        assert_eq!(insns[1].flow, Flow::Invalid);
        assert_eq!(insns[2].addr, 0x12);
    }
}
