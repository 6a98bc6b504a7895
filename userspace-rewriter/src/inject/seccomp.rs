//! The target's seccomp filters, and what they would do to the system
//! calls we inject.
//!
//! A seccomp filter applies to every system call the thread makes,
//! injected ones included: a filter that kills on `memfd_create` would kill
//! the program in the middle of an attach. So before injecting anything we
//! read the thread's filters (`PTRACE_SECCOMP_GET_FILTER`, root only) and
//! run them ourselves on the exact call (number, arguments, instruction
//! pointer) with a small classic-BPF interpreter: the same program the
//! kernel would run, on the same `struct seccomp_data`. A call whose
//! verdict is anything but `SECCOMP_RET_ALLOW` (or `_LOG`) is not made.
//! Strict mode (`SECCOMP_MODE_STRICT`) allows nothing we need.
use burstyd_common::addr::Pid;

use super::error::{InjectError, Result};

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `PTRACE_SECCOMP_GET_FILTER`.
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

// Actions (`SECCOMP_RET_*`), high 16 bits of a filter's return value.
const RET_ACTION_FULL: u32 = 0xffff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
const RET_TRACE: u32 = 0x7ff0_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

/// The seccomp state of a thread: its filters, most recent first.
#[derive(Debug, Default)]
pub(super) struct Filters(Vec<Vec<Insn>>);

impl Filters {
    /// Reads the filters of thread `tid` (stopped under our ptrace). `mode`
    /// is the `Seccomp:` field of its `/proc` status.
    pub(super) fn read(pid: Pid, tid: i32, mode: u32) -> Result<Filters> {
        match mode {
            0 => return Ok(Filters::default()),
            2 => {}
            _ => return Err(InjectError::SeccompStrict(pid)),
        }
        let mut all = Vec::new();
        for index in 0.. {
            // SAFETY: a null buffer asks for the length only.
            let n = unsafe {
                libc::ptrace(
                    PTRACE_SECCOMP_GET_FILTER,
                    tid,
                    index as *mut libc::c_void,
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOENT) {
                    break;
                }
                return Err(InjectError::Ptrace {
                    call: "PTRACE_SECCOMP_GET_FILTER",
                    tid,
                    source: e,
                });
            }
            let mut raw = vec![0u64; n as usize];
            // SAFETY: `raw` holds `n` 8-byte `struct sock_filter`s.
            let got = unsafe {
                libc::ptrace(
                    PTRACE_SECCOMP_GET_FILTER,
                    tid,
                    index as *mut libc::c_void,
                    raw.as_mut_ptr() as *mut libc::c_void,
                )
            };
            if got != n {
                return Err(InjectError::Ptrace {
                    call: "PTRACE_SECCOMP_GET_FILTER",
                    tid,
                    source: std::io::Error::last_os_error(),
                });
            }
            all.push(raw.into_iter().map(Insn::from_raw).collect());
        }
        Ok(Filters(all))
    }

    /// The verdict of every filter on the call, combined as the kernel
    /// does (the most restrictive action wins).
    pub(super) fn verdict(&self, nr: i64, args: &[u64], ip: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as i32).to_le_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH_X86_64.to_le_bytes());
        data[8..16].copy_from_slice(&ip.to_le_bytes());
        for (i, a) in args.iter().take(6).enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        self.0
            .iter()
            .map(|f| run(f, &data))
            .min_by_key(|&v| (v & RET_ACTION_FULL) as i32)
            .unwrap_or(RET_ALLOW)
    }

    /// `Err` naming the call and the action unless the filters let the
    /// call through.
    pub(super) fn check(&self, pid: Pid, nr: i64, args: &[u64], ip: u64) -> Result<()> {
        let v = self.verdict(nr, args, ip);
        match v & RET_ACTION_FULL {
            RET_ALLOW | RET_LOG => Ok(()),
            _ => Err(InjectError::SeccompRefuses {
                pid,
                syscall: syscall_name(nr),
                action: action_name(v),
            }),
        }
    }
}

impl Insn {
    fn from_raw(w: u64) -> Insn {
        Insn {
            code: w as u16,
            jt: (w >> 16) as u8,
            jf: (w >> 24) as u8,
            k: (w >> 32) as u32,
        }
    }
}

/// Runs one filter over `data` (`struct seccomp_data`). Anything the
/// kernel's checker would have refused to load reads as `KILL_PROCESS`.
fn run(prog: &[Insn], data: &[u8; 64]) -> u32 {
    let (mut a, mut x) = (0u32, 0u32);
    let mut mem = [0u32; 16];
    let mut pc = 0usize;
    // Classic BPF only jumps forward: at most one pass.
    while let Some(i) = prog.get(pc) {
        pc += 1;
        let k = i.k;
        let src = if i.code & 0x08 != 0 { x } else { k };
        match i.code & 0x07 {
            // BPF_LD / BPF_LDX
            0x00 | 0x01 => {
                let v = match i.code & 0xe0 {
                    0x00 => k, // BPF_IMM
                    0x20 if i.code & 0x18 == 0 => {
                        // BPF_ABS | BPF_W
                        let o = k as usize;
                        match data.get(o..o + 4) {
                            Some(b) if o.is_multiple_of(4) => {
                                u32::from_le_bytes(b.try_into().unwrap())
                            }
                            _ => return RET_KILL_PROCESS,
                        }
                    }
                    0x60 => mem[(k & 15) as usize], // BPF_MEM
                    0x80 => 64,                     // BPF_LEN
                    _ => return RET_KILL_PROCESS,
                };
                if i.code & 0x07 == 0 { a = v } else { x = v }
            }
            0x02 => mem[(k & 15) as usize] = a, // BPF_ST
            0x03 => mem[(k & 15) as usize] = x, // BPF_STX
            // BPF_ALU
            0x04 => {
                a = match i.code & 0xf0 {
                    0x00 => a.wrapping_add(src),
                    0x10 => a.wrapping_sub(src),
                    0x20 => a.wrapping_mul(src),
                    0x30 if src != 0 => a / src,
                    0x40 => a | src,
                    0x50 => a & src,
                    0x60 => a.checked_shl(src).unwrap_or(0),
                    0x70 => a.checked_shr(src).unwrap_or(0),
                    0x80 => a.wrapping_neg(),
                    0x90 if src != 0 => a % src,
                    0xa0 => a ^ src,
                    _ => return RET_KILL_PROCESS,
                }
            }
            // BPF_JMP
            0x05 => {
                let taken = match i.code & 0xf0 {
                    0x00 => {
                        pc += k as usize; // BPF_JA
                        continue;
                    }
                    0x10 => a == src,
                    0x20 => a > src,
                    0x30 => a >= src,
                    0x40 => a & src != 0,
                    _ => return RET_KILL_PROCESS,
                };
                pc += if taken { i.jt } else { i.jf } as usize;
            }
            // BPF_RET
            0x06 => {
                return match i.code & 0x18 {
                    0x00 => k,
                    0x10 => a,
                    _ => RET_KILL_PROCESS,
                };
            }
            // BPF_MISC: TAX / TXA
            _ => {
                if i.code & 0xf8 == 0 {
                    x = a
                } else {
                    a = x
                }
            }
        }
    }
    RET_KILL_PROCESS
}

fn action_name(v: u32) -> String {
    match v & RET_ACTION_FULL {
        RET_KILL_PROCESS => "kills the process".into(),
        RET_KILL_THREAD => "kills the thread".into(),
        RET_TRAP => "sends SIGSYS".into(),
        RET_ERRNO => format!(
            "fails it with {}",
            std::io::Error::from_raw_os_error((v & 0xffff) as i32)
        ),
        RET_USER_NOTIF => "hands it to a supervisor (user notification)".into(),
        RET_TRACE => "hands it to a tracer".into(),
        other => format!("returns action {other:#x}"),
    }
}

/// The names of the calls an injection makes.
pub(super) fn syscall_name(nr: i64) -> String {
    let name = match nr {
        libc::SYS_close => "close",
        libc::SYS_mmap => "mmap",
        libc::SYS_munmap => "munmap",
        libc::SYS_mprotect => "mprotect",
        libc::SYS_madvise => "madvise",
        libc::SYS_rt_sigaction => "rt_sigaction",
        libc::SYS_rt_tgsigqueueinfo => "rt_tgsigqueueinfo",
        libc::SYS_ftruncate => "ftruncate",
        libc::SYS_memfd_create => "memfd_create",
        libc::SYS_getpid => "getpid",
        libc::SYS_sched_yield => "sched_yield",
        libc::SYS_kill => "kill",
        _ => return format!("system call {nr}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stmt(code: u16, k: u32) -> Insn {
        Insn {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }
    fn jump(code: u16, k: u32, jt: u8, jf: u8) -> Insn {
        Insn { code, jt, jf, k }
    }

    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;

    /// What systemd's and Docker's filters look like: check the arch,
    /// then the number; an argument test on mmap's prot.
    #[test]
    fn a_typical_filter() {
        let f = vec![
            stmt(LD_W_ABS, 4),
            jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
            stmt(RET_K, RET_KILL_PROCESS),
            stmt(LD_W_ABS, 0),
            jump(JEQ_K, libc::SYS_memfd_create as u32, 0, 1),
            stmt(RET_K, RET_ERRNO | libc::EPERM as u32),
            jump(JEQ_K, libc::SYS_mmap as u32, 0, 3),
            stmt(LD_W_ABS, 16 + 2 * 8), // prot (low word)
            jump(JSET_K, libc::PROT_EXEC as u32, 0, 1),
            stmt(RET_K, RET_TRAP),
            jump(JGE_K, 1000, 0, 1),
            stmt(RET_K, RET_KILL_THREAD),
            stmt(RET_K, RET_ALLOW),
        ];
        let filters = Filters(vec![f]);
        let v = |nr: i64, args: &[u64]| filters.verdict(nr, args, 0x1000) & RET_ACTION_FULL;
        assert_eq!(v(libc::SYS_memfd_create, &[0, 0]), RET_ERRNO);
        assert_eq!(v(libc::SYS_mmap, &[0, 4096, 3, 0x22]), RET_ALLOW);
        assert_eq!(v(libc::SYS_mmap, &[0, 4096, 5, 0x22]), RET_TRAP);
        assert_eq!(v(libc::SYS_close, &[3]), RET_ALLOW);
        assert_eq!(v(1000, &[]), RET_KILL_THREAD);
        let e = filters
            .check(Pid(7), libc::SYS_memfd_create, &[0, 0], 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("memfd_create") && e.contains("fails it with"),
            "{e}"
        );
        assert!(filters.check(Pid(7), libc::SYS_close, &[3], 0).is_ok());
    }

    /// Several filters: the most restrictive verdict wins, as in the
    /// kernel (`KILL_PROCESS` before everything, `ALLOW` last).
    #[test]
    fn the_most_restrictive_filter_wins() {
        let ret = |v| vec![stmt(RET_K, v)];
        let f = Filters(vec![ret(RET_ALLOW), ret(RET_ERRNO | 1), ret(RET_LOG)]);
        assert_eq!(f.verdict(1, &[], 0) & RET_ACTION_FULL, RET_ERRNO);
        let f = Filters(vec![ret(RET_TRAP), ret(RET_KILL_PROCESS)]);
        assert_eq!(f.verdict(1, &[], 0), RET_KILL_PROCESS);
        assert_eq!(Filters::default().verdict(1, &[], 0), RET_ALLOW);
    }

    /// Out-of-bounds or misaligned loads and falling off the end are what
    /// the kernel's loader refuses: read as the harshest verdict.
    #[test]
    fn malformed_programs_refuse() {
        let f = Filters(vec![vec![stmt(LD_W_ABS, 64), stmt(RET_K, RET_ALLOW)]]);
        assert_eq!(f.verdict(1, &[], 0), RET_KILL_PROCESS);
        let f = Filters(vec![vec![stmt(LD_W_ABS, 2), stmt(RET_K, RET_ALLOW)]]);
        assert_eq!(f.verdict(1, &[], 0), RET_KILL_PROCESS);
        let f = Filters(vec![vec![stmt(LD_W_ABS, 0)]]);
        assert_eq!(f.verdict(1, &[], 0), RET_KILL_PROCESS);
    }
}
