//! Address-space planning in a target: gaps near each module for its
//! clones ([`generate`]), rooms mapped in the first stop for the libraries'
//! second step ([`Rooms`]), the seccomp pre-checks of the mappings, and
//! mapping and writing clones and tables (under ptrace, [`place`], or
//! through `/proc/PID/mem` while the program runs, [`write_unused`]).

use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use tracing::{debug, warn};
use userspace_rewriter::PAGE_SIZE;
use userspace_rewriter::inject::{self, Tracee};

use super::modules::{self};
use super::tables::Merged;

use super::prepare::{Analysed, Generated, code_room, generate_at};

/// Generates `a`'s clones against the control block at `control`: at
/// `fixed` (a re-arm regenerates what an earlier attach wrote there), or
/// in a gap near the module that avoids `reserved` (and is added to it).
/// The gap is sized for a generous bound on the code (clones plus unwind
/// info run at 6-10x the original bytes); in the rare case the code
/// outgrows it, a second generation at a gap of the exact size follows.
pub(super) fn generate(
    pid: Pid,
    a: Analysed,
    control: u64,
    fixed: Option<u64>,
    reserved: &mut Vec<(u64, u64)>,
) -> anyhow::Result<Generated> {
    let (lo, hi) = a.module.range;
    let mut code_len = a.room();
    let mut a = a;
    loop {
        let code = match fixed {
            Some(c) => c,
            None => inject::find_gap_near(pid, lo, hi, code_len, reserved)?,
        };
        match generate_at(a, control, code, fixed.is_none().then_some(code_len))? {
            Ok(g) => {
                if fixed.is_none() {
                    reserved.push((code, code + g.code_len));
                }
                return Ok(g);
            }
            Err(back) => {
                a = *back;
                code_len = a.outgrew;
                if code_len > 1 << 31 {
                    bail!(
                        "the clones of {} would take {code_len} bytes: too large to map near it",
                        a.module.path
                    );
                }
            }
        }
    }
}

/// Address space mapped in the first stop for the second step: per
/// library `(path, lowest mapped address, at, len)` near it, and one
/// `(at, len)` for the tables.
#[derive(Default)]
pub(crate) struct Rooms {
    pub(super) libraries: Vec<(String, u64, u64, u64)>,
    pub(super) tables: (u64, u64),
}

/// Rooms near each library mapped in `pid` (but the executable) and for the tables of all modules: at most one entry
/// per instruction byte, function byte, and two bytes of calls, 16 bytes
/// each. Gaps are found without analysing anything; a library without
/// room is left out (logged).
pub(super) fn library_rooms(
    pid: Pid,
    maps: &[inject::MapEntry],
    exe_path: &str,
    exe_tables_len: u64,
    reserved: &mut Vec<(u64, u64)>,
) -> Rooms {
    let mut rooms = Rooms::default();
    let mut exec_total = 0;
    for p in modules::library_paths(maps, exe_path) {
        let own = maps.iter().filter(|x| x.is_path(p));
        let (lo, hi) = own.clone().fold((u64::MAX, 0), |(lo, hi), x| {
            (lo.min(x.start), hi.max(x.end))
        });
        let exec: u64 = own.filter(|x| x.is_exec()).map(|x| x.end - x.start).sum();
        let len = code_room(exec);
        match inject::find_gap_near(pid, lo, hi, len, reserved) {
            Ok(at) => {
                reserved.push((at, at + len));
                rooms.libraries.push((p.to_owned(), lo, at, len));
                exec_total += exec;
            }
            Err(e) if crate::sys::process_running(pid) => warn!(%pid, "{p} is not cloned: {e}"),
            Err(_) => return Rooms::default(),
        }
    }
    if !rooms.libraries.is_empty() {
        let len = (exe_tables_len + 40 * exec_total + 4096).next_multiple_of(PAGE_SIZE);
        rooms.tables = (0, len);
    }
    rooms
}

impl Rooms {
    /// Asks the target's seccomp filters about [`Self::map`]'s calls.
    pub(super) fn checks(&self, t: &mut Tracee) -> anyhow::Result<()> {
        for &(_, _, at, len) in &self.libraries {
            t.check_syscall(
                libc::SYS_mmap,
                &[at, len, RX as u64, CODE_FLAGS as u64, u64::MAX, 0],
            )?;
        }
        if self.tables.1 > 0 {
            t.check_syscall(
                libc::SYS_mmap,
                &[
                    0,
                    self.tables.1,
                    libc::PROT_READ as u64,
                    TABLE_FLAGS as u64,
                    u64::MAX,
                    0,
                ],
            )?;
        }
        Ok(())
    }

    /// Maps the libraries' rooms (under ptrace; before any mapping the
    /// kernel places, which could take their gaps); a library whose room
    /// cannot be mapped is left out.
    pub(super) fn map_fixed(&mut self, t: &mut Tracee, pid: Pid) {
        self.libraries.retain(|(path, _, at, len)| {
            match t.mmap(*at, *len, RX, CODE_FLAGS, -1, 0) {
                Ok(_) => true,
                Err(e) => {
                    warn!(%pid, "{path} is not cloned: mapping room for its clones at {at:#x}..{:#x}: {e}", at + len);
                    false
                }
            }
        });
    }

    /// Maps the tables' room, where the kernel puts it (after every fixed
    /// mapping).
    pub(super) fn map_tables(mut self, t: &mut Tracee) -> anyhow::Result<Rooms> {
        if self.tables.1 > 0 && !self.libraries.is_empty() {
            self.tables.0 = t
                .mmap(0, self.tables.1, libc::PROT_READ, TABLE_FLAGS, -1, 0)
                .context("mapping room for the lookup tables")?;
        } else {
            self.libraries.clear();
        }
        Ok(self)
    }
}

/// Whether the program whose control block is at `control` is the one
/// `mem` (`/proc/PID/mem`) reads: the block's magic word is there.
pub(super) fn runs_ours(mem: &std::fs::File, control: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut word = [0u8; 8];
    mem.read_exact_at(&mut word, control)
        .is_ok_and(|()| u64::from_le_bytes(word) == burstyd_common::burst::CONTROL_MAGIC)
}

/// `pid`'s memory for the writes of a later step of its attach, opened
/// while it runs the program whose control block is at `control`
/// (checked through it). The file holds the address space it was opened
/// on: were the process to exec meanwhile, the writes would go to the
/// old, dying one, never into the new program.
pub(super) fn open_ours(pid: Pid, control: u64) -> anyhow::Result<std::fs::File> {
    let mem = crate::sys::open_mem(pid, true).context("opening the target's memory")?;
    if !runs_ours(&mem, control) {
        return Err(Execd.into());
    }
    Ok(mem)
}

/// The process runs another program than the one attached to (it exec'd):
/// a step of the attach found its control block gone.
#[derive(Debug)]
pub(crate) struct Execd;

impl std::fmt::Display for Execd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the process exec'd since its attach (its control block is gone)")
    }
}

impl std::error::Error for Execd {}

/// Writes clones and lookup tables through `mem` (`/proc/PID/mem`, see
/// [`open_ours`]) while the program runs: nothing points at these bytes
/// until the session puts the tables in use.
pub(super) fn write_unused(
    pid: Pid,
    mem: &std::fs::File,
    gens: &[Generated],
    tables: &Merged<'_>,
    tables_at: u64,
) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let write = |at: u64, bytes: &[u8]| {
        mem.write_all_at(bytes, at)
            .with_context(|| format!("writing {} bytes at {at:#x} in pid {pid}", bytes.len()))
    };
    for g in gens {
        g.write_code(write)?;
        write(g.eh.0, &g.eh.1)?;
    }
    tables.write(tables_at, write)
}

/// Protections and flags of the clone code and table mappings.
pub(super) const RX: i32 = libc::PROT_READ | libc::PROT_EXEC;
pub(super) const CODE_FLAGS: i32 =
    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
pub(super) const TABLE_FLAGS: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;

/// Asks the target's seccomp filters about the calls [`place`] makes.
pub(super) fn place_checks(
    t: &mut Tracee,
    gens: &[Generated],
    tables_len: u64,
) -> anyhow::Result<()> {
    for g in gens {
        t.check_syscall(
            libc::SYS_mmap,
            &[
                g.code,
                g.code_len,
                RX as u64,
                CODE_FLAGS as u64,
                u64::MAX,
                0,
            ],
        )?;
    }
    t.check_syscall(
        libc::SYS_mmap,
        &[
            0,
            tables_len,
            libc::PROT_READ as u64,
            TABLE_FLAGS as u64,
            u64::MAX,
            0,
        ],
    )?;
    Ok(())
}

/// Under ptrace: maps and writes each module's clones and unwind info at
/// their addresses, registers the unwind info with the target's unwinder
/// (`register_frame`), and maps the lookup `tables` anywhere. Returns the
/// tables' header address and the executable's registered `.eh_frame`
/// (0 if none). Fixed addresses first: the kernel's choice for the tables
/// must not take them.
pub(super) fn place(
    t: &mut Tracee,
    pid: Pid,
    gens: &[Generated],
    tables: &Merged<'_>,
    tables_len: u64,
    register_frame: Option<u64>,
) -> anyhow::Result<(u64, u64)> {
    for g in gens {
        t.mmap(g.code, g.code_len, RX, CODE_FLAGS, -1, 0)
            .with_context(|| format!("mapping the clone code of {}", g.facts.path))?;
    }
    let tables_at = t
        .mmap(0, tables_len, libc::PROT_READ, TABLE_FLAGS, -1, 0)
        .context("mapping the lookup tables")?;
    tables.write(tables_at, |at, b| Ok(t.write_memory(at, b)?))?;
    let mut exe_eh = 0;
    for g in gens {
        g.write_code(|at, b| Ok(t.write_memory(at, b)?))?;
        t.write_memory(g.eh.0, &g.eh.1)?;
        // Register the clones' unwind info with the target's unwinder, so
        // that backtraces from signal frames pass through clone frames.
        let registered = match register_frame {
            Some(f) => match t.call(f, &[g.eh.0]) {
                Ok(_) => true,
                Err(e) => {
                    warn!(%pid, "registering the unwind info of the clones of {} failed: {e}", g.facts.path);
                    false
                }
            },
            None => false,
        };
        // Not fatal: calls in clones push original return addresses, so
        // an exception thrown in a burst unwinds through original frames
        // only (the unwinder starts in its own frame, whose return
        // address is original too). The clones' FDEs matter only to an
        // unwinder starting at a clone pc: from a signal frame
        // (asynchronous cancellation, -fnon-call-exceptions) or a
        // debugger's backtrace.
        if g.exceptions && !registered {
            debug!(
                %pid,
                "{} has landing pads but the clones' unwind info is not registered (no __register_frame)",
                g.facts.path
            );
        }
        if g.facts.is_exe && registered {
            exe_eh = g.eh.0;
        }
    }
    Ok((tables_at, exe_eh))
}
