//! User-space stack unwinding from a register snapshot and a copy of the stack.
//!
//! **You give it** the sampled thread's `rip`, `rsp` and `rbp` ([`UserRegs`]), a
//! copy of user stack memory starting at `rsp`, and the [`ProcessTable`] that
//! knows the process' mappings. **It gives back** the call stack as code
//! addresses (AVMAs), innermost first: the instruction pointer, then each
//! caller's return address exactly as read from the stack (not minus one;
//! the symbolizer does that), plus an [`UnwindEnd`] saying why it stopped.
//!
//! Unwinding uses DWARF CFI (`.eh_frame` via `.eh_frame_hdr`, or
//! `.debug_frame`) through the `framehop` crate, so programs built without
//! frame pointers unwind correctly; where a module has no CFI for an address,
//! framehop falls back to following `rbp`. One framehop unwinder is kept per
//! process and rebuilt when the process' executable mappings change
//! ([`ProcessTable::generation`]); framehop's rule cache is shared by all.
//!
//! ## Address spaces
//!
//! AVMA = address in the process; SVMA = address stated in the ELF file;
//! `bias = avma - svma`. framehop is given each mapping with `base_avma = bias`
//! (for ELF its "base SVMA" is 0), so it looks up unwind rules by SVMA.
//!
//! ## Non-goals
//!
//! No kernel stacks, no 32-bit processes, no recovery of registers other than
//! `rip`/`rsp`/`rbp`, no reading of process memory beyond the given copy
//! (so stacks deeper than the copy end in [`UnwindEnd::StackTruncated`]).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Unwinder as _};
use tracing::debug;

use crate::procs::{Module, ProcessTable, SectionId};

/// Most frames [`Unwinder::unwind`] produces.
pub const MAX_FRAMES: usize = 256;

/// The registers unwinding starts from.
#[derive(Clone, Copy, Debug)]
pub struct UserRegs {
    /// Instruction pointer.
    pub rip: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// Frame pointer (or whatever the code keeps in `rbp`).
    pub rbp: u64,
}

/// Why unwinding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindEnd {
    /// Reached the outermost frame (e.g. `_start`, or a return address of 0).
    Complete,
    /// Needed stack memory beyond the copy.
    StackTruncated,
    /// An address had no module / no unwind information and the frame-pointer
    /// fallback did not get further.
    NoUnwindInfo,
    /// Stopped after [`MAX_FRAMES`] frames.
    MaxDepth,
    /// The unwind information or the stack contents were inconsistent.
    Error,
}

/// Section bytes for framehop: a section of a shared [`Module`].
#[derive(Clone)]
pub struct ModuleSection {
    module: Arc<Module>,
    id: SectionId,
}

impl Deref for ModuleSection {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.module.section_data(self.id).unwrap_or(&[])
    }
}

type FhUnwinder = UnwinderX86_64<ModuleSection>;

struct PidUnwinder {
    generation: u64,
    unwinder: FhUnwinder,
}

/// Unwinds user stacks of many processes. Not thread-safe by itself; keep one per sampling thread.
pub struct Unwinder {
    per_pid: HashMap<u32, PidUnwinder>,
    cache: CacheX86_64,
    /// For processes we know nothing about: frame-pointer unwinding only.
    empty: FhUnwinder,
}

impl Default for Unwinder {
    fn default() -> Self {
        Self::new()
    }
}

fn build_unwinder(procs: &ProcessTable, pid: u32) -> FhUnwinder {
    let mut unwinder = FhUnwinder::new();
    for m in procs.exec_mappings(pid) {
        let module = &m.module;
        let section = |id| {
            module.section_data(id)?;
            Some(ModuleSection {
                module: module.clone(),
                id,
            })
        };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: module.section_svma(SectionId::Text),
            text: None,
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            text_segment_svma: None,
            text_segment: None,
            got_svma: module.section_svma(SectionId::Got),
            eh_frame_svma: module.section_svma(SectionId::EhFrame),
            eh_frame: section(SectionId::EhFrame),
            eh_frame_hdr_svma: module.section_svma(SectionId::EhFrameHdr),
            eh_frame_hdr: section(SectionId::EhFrameHdr),
            debug_frame: section(SectionId::DebugFrame),
        };
        unwinder.add_module(framehop::Module::new(
            m.path.to_string(),
            m.start..m.end,
            m.bias,
            info,
        ));
    }
    unwinder
}

impl Unwinder {
    /// A new unwinder with no per-process state.
    pub fn new() -> Self {
        Unwinder {
            per_pid: HashMap::new(),
            cache: CacheX86_64::new(),
            empty: FhUnwinder::new(),
        }
    }

    /// Unwind one sample.
    ///
    /// `stack` is a copy of user memory starting at `regs.rsp`. Clears `out`,
    /// then pushes addresses innermost first: `out[0] = regs.rip`, then each
    /// caller's return address exactly as read from the stack (not minus one).
    /// At most [`MAX_FRAMES`] frames. Never panics on garbage input.
    pub fn unwind(
        &mut self,
        procs: &mut ProcessTable,
        pid: u32,
        regs: &UserRegs,
        stack: &[u8],
        out: &mut Vec<u64>,
    ) -> UnwindEnd {
        procs.ensure(pid, regs.rip);
        let end = self.unwind_once(procs, pid, regs, stack, out);
        if matches!(end, UnwindEnd::Complete | UnwindEnd::MaxDepth) {
            return end;
        }
        // The last address may be in a library mapped since our snapshot (dlopen):
        // refresh (rate-limited by the table) and retry once if anything changed.
        let Some(&last) = out.last() else { return end };
        if procs.exec_mapping(pid, last).is_some() {
            return end;
        }
        let before = procs.generation(pid);
        procs.ensure(pid, last);
        if procs.generation(pid) == before {
            return end;
        }
        debug!(pid, "maps changed during unwinding; retrying");
        self.unwind_once(procs, pid, regs, stack, out)
    }

    fn unwind_once(
        &mut self,
        procs: &ProcessTable,
        pid: u32,
        regs: &UserRegs,
        stack: &[u8],
        out: &mut Vec<u64>,
    ) -> UnwindEnd {
        out.clear();
        let unwinder = match procs.generation(pid) {
            Some(generation) => {
                let state = self.per_pid.entry(pid).or_insert_with(|| PidUnwinder {
                    generation: 0,
                    unwinder: FhUnwinder::new(),
                });
                if state.generation != generation {
                    state.unwinder = build_unwinder(procs, pid);
                    state.generation = generation;
                }
                &state.unwinder
            }
            None => &self.empty,
        };

        let stack_start = regs.rsp;
        let stack_end = regs.rsp.saturating_add(stack.len() as u64);
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(stack_start).ok_or(())?;
            let off = usize::try_from(off).map_err(|_| ())?;
            let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut frames = unwinder.iter_frames(
            regs.rip,
            UnwindRegsX86_64::new(regs.rip, regs.rsp, regs.rbp),
            &mut self.cache,
            &mut read_stack,
        );
        loop {
            if out.len() >= MAX_FRAMES {
                return UnwindEnd::MaxDepth;
            }
            match frames.next() {
                Ok(Some(frame)) => out.push(frame.address()),
                Ok(None) => return UnwindEnd::Complete,
                Err(framehop::Error::ReturnAddressIsNull) => return UnwindEnd::Complete,
                Err(e) => {
                    let last = out.last().copied().unwrap_or(regs.rip);
                    let lookup = if out.len() > 1 {
                        last.wrapping_sub(1)
                    } else {
                        last
                    };
                    let described = procs
                        .exec_mapping(pid, lookup)
                        .is_some_and(|m| m.module.has_unwind_info());
                    return match e {
                        framehop::Error::CouldNotReadStack(addr) if addr >= stack_end => {
                            UnwindEnd::StackTruncated
                        }
                        _ if !described => UnwindEnd::NoUnwindInfo,
                        _ => UnwindEnd::Error,
                    };
                }
            }
        }
    }

    /// Drop per-process unwinder state (call when the process exited and its
    /// samples are done).
    pub fn forget(&mut self, pid: u32) {
        self.per_pid.remove(&pid);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};

    /// Kills and reaps the child on drop (also when a test fails).
    pub(crate) struct ChildGuard(pub Child);
    impl Drop for ChildGuard {
        fn drop(&mut self) {
            unsafe {
                libc::kill(self.0.id() as i32, libc::SIGKILL);
            }
            let _ = self.0.wait();
        }
    }

    pub(crate) fn scratch_dir(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "burstyd-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    pub(crate) const SPIN_C: &str = r#"
#include <stdio.h>
volatile unsigned long counter;
volatile unsigned long limit = ~0UL;

__attribute__((noinline)) long leaf(long x) {
    volatile long buf[8];
    for (int i = 0; i < 8; i++) buf[i] = x + i;
    while (counter < limit) counter++;
    return buf[3] + (long)counter;
}

__attribute__((noinline)) long b(long x) {
    volatile long buf[16];
    buf[0] = x;
    long r = leaf(buf[0] + 1);
    buf[1] = r;
    return buf[1] + buf[0];
}

__attribute__((noinline)) long a(long x) {
    volatile long buf[32];
    buf[5] = x;
    long r = b(buf[5] * 3);
    buf[6] = r;
    return buf[6] - buf[5];
}

int main(int argc, char **argv) {
    (void)argv;
    long r = a(argc);
    printf("%ld\n", r);
    return (int)(r & 1);
}
"#;

    /// Builds the spinning fixture with gcc into a fresh directory.
    pub(crate) fn build_spin_fixture(dir: &Path) -> PathBuf {
        let src = dir.join("spin.c");
        std::fs::write(&src, SPIN_C).unwrap();
        let exe = dir.join("spin");
        let out = Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("gcc must be installed to run this test");
        assert!(
            out.status.success(),
            "gcc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }

    /// Stops `pid` with PTRACE_SEIZE + PTRACE_INTERRUPT, returns its registers
    /// and up to `len` bytes of stack from rsp. The tracee stays stopped until detach.
    pub(crate) fn seize_and_sample(pid: i32, len: usize) -> (UserRegs, Vec<u8>) {
        unsafe {
            assert_eq!(
                libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize),
                0,
                "PTRACE_SEIZE: {}",
                std::io::Error::last_os_error()
            );
            assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize), 0);
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, libc::__WALL), pid);
            let mut r: libc::user_regs_struct = std::mem::zeroed();
            assert_eq!(
                libc::ptrace(libc::PTRACE_GETREGS, pid, 0usize, &mut r as *mut _ as usize),
                0,
                "PTRACE_GETREGS: {}",
                std::io::Error::last_os_error()
            );
            let regs = UserRegs {
                rip: r.rip,
                rsp: r.rsp,
                rbp: r.rbp,
            };
            // Do not read past the end of the [stack] mapping.
            let maps = crate::procs::read_maps(pid as u32).unwrap();
            let limit = maps
                .iter()
                .find(|m| m.contains(regs.rsp))
                .map(|m| (m.end - regs.rsp) as usize)
                .unwrap_or(0)
                .min(len);
            let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
            let mut stack = vec![0u8; limit];
            use std::os::unix::fs::FileExt;
            mem.read_exact_at(&mut stack, regs.rsp).unwrap();
            (regs, stack)
        }
    }

    pub(crate) fn detach(pid: i32) {
        unsafe {
            libc::ptrace(libc::PTRACE_DETACH, pid, 0usize, 0usize);
        }
    }

    #[test]
    fn unwind_garbage_never_panics() {
        let mut procs = ProcessTable::new();
        let mut u = Unwinder::new();
        let mut out = Vec::new();
        let pid = std::process::id();
        let own = unwind_garbage_never_panics as fn() as usize as u64;
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..2000 {
            let stack: Vec<u8> = (0..(rnd() % 512)).map(|_| rnd() as u8).collect();
            let regs = UserRegs {
                rip: if i % 2 == 0 {
                    own + rnd() % 4096
                } else {
                    rnd()
                },
                rsp: if i % 3 == 0 {
                    u64::MAX - (rnd() % 64)
                } else {
                    rnd()
                },
                rbp: rnd(),
            };
            let p = if i % 5 == 0 { u32::MAX - 3 } else { pid };
            let end = u.unwind(&mut procs, p, &regs, &stack, &mut out);
            assert!(!out.is_empty() && out.len() <= MAX_FRAMES, "{end:?}");
            assert_eq!(out[0], regs.rip);
        }
        // Empty stack.
        let end = u.unwind(
            &mut procs,
            pid,
            &UserRegs {
                rip: own,
                rsp: 0x1000,
                rbp: 0,
            },
            &[],
            &mut out,
        );
        assert_eq!(out, vec![own]);
        assert_ne!(end, UnwindEnd::MaxDepth);
        u.forget(pid);
    }

    #[test]
    fn unwind_self_is_complete() {
        // Unwind our own thread from a known point: the copy of our own stack.
        #[inline(never)]
        fn sample() -> (UserRegs, Vec<u8>) {
            let (rip, rsp, rbp): (u64, u64, u64);
            unsafe {
                std::arch::asm!(
                    "lea {rip}, [rip]",
                    "mov {rsp}, rsp",
                    "mov {rbp}, rbp",
                    rip = out(reg) rip,
                    rsp = out(reg) rsp,
                    rbp = out(reg) rbp,
                );
            }
            // Copy 256 KiB of our own stack (or up to its end).
            let maps = crate::procs::read_maps(std::process::id()).unwrap();
            let end = maps
                .iter()
                .find(|m| m.contains(rsp))
                .map(|m| m.end)
                .unwrap();
            let len = ((end - rsp) as usize).min(256 << 10);
            let mut stack = vec![0u8; len];
            let mem = std::fs::File::open("/proc/self/mem").unwrap();
            use std::os::unix::fs::FileExt;
            mem.read_exact_at(&mut stack, rsp).unwrap();
            (UserRegs { rip, rsp, rbp }, stack)
        }
        let (regs, stack) = sample();
        let mut procs = ProcessTable::new();
        let mut u = Unwinder::new();
        let mut out = Vec::new();
        let end = u.unwind(&mut procs, std::process::id(), &regs, &stack, &mut out);
        // Test threads start in clone3 → start_thread, which are CFI-described as the end.
        assert!(out.len() >= 4, "{end:?} {out:x?}");
        assert!(
            matches!(end, UnwindEnd::Complete | UnwindEnd::StackTruncated),
            "{end:?} {out:x?}"
        );
    }

    #[test]
    fn unwind_gcc_fixture_without_frame_pointers() {
        let dir = scratch_dir("unwind");
        let exe = build_spin_fixture(&dir);
        let child = ChildGuard(Command::new(&exe).spawn().unwrap());
        let pid = child.0.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (regs, stack) = seize_and_sample(pid, 16 << 10);
        let mut procs = ProcessTable::new();
        let mut u = Unwinder::new();
        let mut out = Vec::new();
        let end = u.unwind(&mut procs, pid as u32, &regs, &stack, &mut out);
        // The same with rbp zeroed: proves we do not depend on frame pointers.
        let mut out_no_fp = Vec::new();
        let regs_no_fp = UserRegs { rbp: 0, ..regs };
        let end_no_fp = u.unwind(&mut procs, pid as u32, &regs_no_fp, &stack, &mut out_no_fp);
        detach(pid);
        drop(child);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(end, UnwindEnd::Complete, "{out:x?}");
        assert_eq!(end_no_fp, UnwindEnd::Complete);
        assert_eq!(out, out_no_fp);
        assert_eq!(out[0], regs.rip);
        // leaf, b, a, main, __libc_start_call_main, __libc_start_main, _start
        assert!(out.len() >= 5, "{out:x?}");
        let exe_maps: Vec<_> = procs
            .exec_mappings(pid as u32)
            .iter()
            .filter(|m| m.module.path().ends_with("/spin"))
            .collect();
        let in_exe = |a: u64| exe_maps.iter().any(|m| m.start <= a && a < m.end);
        assert!(out[..4].iter().all(|&a| in_exe(a)), "{out:x?}");
    }
}
