//! `/proc` queries about the target: its mappings, a gap within ±2 GiB of
//! the binary for the clones (rel32 reach), a real-time signal it does not
//! use for the bursts, whether CET shadow stacks are on, its live threads,
//! and why ptrace said EPERM.

use burstyd_common::addr::Pid;

use super::error::{InjectError, Result};
use super::signals::bit;
use crate::PAGE_SIZE;

const TWO_GIB: u64 = 1 << 31;
/// User address space top on x86-64 with 4-level paging (and the default
/// for mmap with 5-level paging).
const USER_TOP: u64 = 0x7fff_ffff_f000;

/// Thread ids in /proc/PID/task whose state is not zombie/dead.
pub(super) fn live_tasks(pid: Pid) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            InjectError::NoSuchProcess(pid)
        } else {
            InjectError::Io {
                what: format!("reading /proc/{pid}/task"),
                source: e,
            }
        }
    })?;
    let mut tids = Vec::new();
    for entry in dir.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else {
            continue; // exited meanwhile
        };
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, Some('Z' | 'X' | 'x') | None) {
            continue;
        }
        tids.push(tid);
    }
    tids.sort_unstable();
    Ok(tids)
}

pub(super) fn read_proc(pid: Pid, file: &str) -> Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) {
            InjectError::NoSuchProcess(pid)
        } else {
            InjectError::Io {
                what: format!("reading /proc/{pid}/{file}"),
                source: e,
            }
        }
    })
}

/// The value of `Key:` in a /proc status file.
pub(super) fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim())
    })
}

pub(super) fn diagnose_eperm(pid: Pid, tid: i32) -> InjectError {
    let Ok(status) = read_proc(pid, "status") else {
        return InjectError::NoSuchProcess(pid);
    };
    let tstatus = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .unwrap_or_else(|_| status.clone());
    if let Some(tracer) = status_field(&tstatus, "TracerPid").and_then(|v| v.parse::<i32>().ok())
        && tracer != 0
    {
        return InjectError::AlreadyTraced { pid, tracer };
    }
    let state = status_field(&status, "State").unwrap_or_default();
    if state.starts_with('Z') || state.starts_with('X') {
        return InjectError::Zombie(pid);
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "absent (no Yama)".into());
    let uid = status_field(&status, "Uid").unwrap_or_default();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    InjectError::NotPermitted {
        pid,
        hint: format!(
            "ptrace needs CAP_SYS_PTRACE, or the same user as the target (we run as euid \
             {euid}; the target's uids are {uid}) and a dumpable target; \
             kernel.yama.ptrace_scope is {scope} (0: same user may attach, 1: only \
             descendants unless CAP_SYS_PTRACE, 2: only CAP_SYS_PTRACE, 3: nobody)"
        ),
    }
}

/// One line of `/proc/PID/maps`: the one parser of it, for the injector
/// (gaps, the `syscall` gadget, libraries) and the daemon (its process
/// table, the executable and libgcc_s of a burst target).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// First address (AVMA) of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset the mapping starts at.
    pub offset: u64,
    /// Device major number of the file (hex in maps).
    pub dev_major: u32,
    /// Device minor number.
    pub dev_minor: u32,
    /// Inode of the file, 0 for anonymous mappings.
    pub inode: u64,
    /// `rwxp`/`rwxs` characters as printed, e.g. `*b"r-xp"`.
    pub perms: [u8; 4],
    /// The path or pseudo-path (`[heap]`, `[stack]`, `[vdso]`, ...), without a
    /// ` (deleted)` suffix; `None` for anonymous mappings. A file replaced or
    /// removed on disk is still the mapped file: compare paths on this.
    pub path: Option<String>,
    /// Whether the kernel marked the file ` (deleted)` (removed or replaced
    /// on disk since it was mapped; memfds always are).
    pub deleted: bool,
}

impl MapEntry {
    /// Whether the mapping is executable.
    pub fn is_exec(&self) -> bool {
        self.perms[2] == b'x'
    }

    /// Whether the path is a kernel pseudo-path like `[heap]` or `[vdso]`.
    pub fn is_pseudo(&self) -> bool {
        self.path.as_deref().is_some_and(|p| p.starts_with('['))
    }

    /// Whether the path (without ` (deleted)`) is `path`.
    pub fn is_path(&self, path: &str) -> bool {
        self.path.as_deref() == Some(path)
    }

    /// Parse one line of `/proc/PID/maps`. `None` for malformed lines.
    pub fn parse(line: &str) -> Option<MapEntry> {
        // start-end perms offset major:minor inode [path]
        let mut rest = line;
        let mut field = || {
            let s = rest.trim_start_matches(' ');
            let end = s.find(' ').unwrap_or(s.len());
            let (f, r) = s.split_at(end);
            rest = r;
            if f.is_empty() { None } else { Some(f) }
        };
        let range = field()?;
        let perms = field()?;
        let offset = field()?;
        let dev = field()?;
        let inode = field()?;
        let (start, end) = range.split_once('-')?;
        let (major, minor) = dev.split_once(':')?;
        let perms: [u8; 4] = perms.as_bytes().try_into().ok()?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        if end < start {
            return None;
        }
        let path = rest.trim_start_matches(' ');
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (path, false),
        };
        Some(MapEntry {
            start,
            end,
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev_major: u32::from_str_radix(major, 16).ok()?,
            dev_minor: u32::from_str_radix(minor, 16).ok()?,
            inode: inode.parse().ok()?,
            perms,
            path: (!path.is_empty()).then(|| path.to_owned()),
            deleted,
        })
    }
}

/// The mappings of process `pid`, in address order (malformed lines are
/// skipped).
pub fn maps(pid: Pid) -> Result<Vec<MapEntry>> {
    Ok(parse_maps(&read_proc(pid, "maps")?))
}

/// Parse the text of a `/proc/PID/maps` file, skipping malformed lines.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(MapEntry::parse).collect()
}

/// A page-aligned address where `len` bytes (rounded up to pages) fit in
/// a free gap of process `pid`'s address space such that every byte of the
/// gap is within ±2 GiB (rel32 reach) of every byte of `[lo, hi)` (e.g. the
/// target binary's mapped range), from `/proc/PID/maps`.
///
/// Preference: the closest gap *below* `lo`, then the closest gap above
/// `hi` that leaves the brk heap room to grow. The area right after a
/// binary is where its brk heap lives (`start_brk`, from /proc/PID/stat,
/// randomised up to 32 MiB after the bss): a mapping there would make
/// `brk` fail and malloc fall back to mmap. So above, the gap must start
/// 1 GiB past the heap's current end (then 64 MiB, then right after it, if
/// nothing else fits); below the binary nothing grows. 256 MiB below
/// `[stack]` are kept free for stack growth too. `reserved`: ranges the
/// caller is about to map (not yet in the maps), to be avoided as well.
pub fn find_gap_near(pid: Pid, lo: u64, hi: u64, len: u64, reserved: &[(u64, u64)]) -> Result<u64> {
    let (maps, start_brk, min_addr) = layout_facts(pid)?;
    gap_near(&maps, start_brk, min_addr, lo, hi, len, reserved).ok_or(InjectError::NoGap {
        pid,
        lo,
        hi,
        len,
    })
}

/// A page-aligned address in the low 2 GiB of process `pid` where `len`
/// bytes fit: below every mapping (nothing grows there) if there is room,
/// else above the brk heap's 1 GiB of growth; the highest such address
/// under 1 GiB first (the 1-2 GiB range is where `MAP_32BIT` allocations
/// of JITs go), then under 2 GiB. Code anywhere reaches state mapped here
/// with absolute 32-bit operands. `None` when nothing fits.
pub fn find_low_gap(
    pid: Pid,
    len: u64,
    limit: u64,
    reserved: &[(u64, u64)],
) -> Result<Option<u64>> {
    let (maps, start_brk, min_addr) = layout_facts(pid)?;
    Ok(low_gap(&maps, start_brk, min_addr, len, limit, reserved))
}

fn low_gap(
    maps: &[MapEntry],
    start_brk: Option<u64>,
    min_addr: u64,
    len: u64,
    limit: u64,
    reserved: &[(u64, u64)],
) -> Option<u64> {
    let len = len.checked_add(PAGE_SIZE - 1)? & !(PAGE_SIZE - 1);
    let mut busy: Vec<(u64, u64)> = maps.iter().map(|m| (m.start, m.end)).collect();
    busy.extend_from_slice(reserved);
    let heap_end = heap_end(maps, start_brk);
    if let Some(h) = heap_end {
        busy.push((h, h.saturating_add(1 << 30)));
    }
    busy.sort_unstable();
    let lowest = busy.first().map_or(u64::MAX, |b| b.0);
    let mut free = Vec::new();
    let mut cur = min_addr;
    for &(s, e) in &busy {
        if s > cur {
            free.push((cur, s));
        }
        cur = cur.max(e);
    }
    free.push((cur, u64::MAX));
    let fit = |top: u64, below_all: bool| {
        free.iter()
            .filter_map(|&(a, b)| {
                let b = b.min(top);
                let b = if below_all { b.min(lowest) } else { b };
                let g = b.checked_sub(len)? & !(PAGE_SIZE - 1);
                (g >= a).then_some(g)
            })
            .max()
    };
    let one_gib = (1u64 << 30).min(limit);
    fit(one_gib, true)
        .or_else(|| fit(limit, true))
        .or_else(|| fit(one_gib, false))
        .or_else(|| fit(limit, false))
}

/// Where the brk heap ends now (or starts, before its first `brk`).
fn heap_end(maps: &[MapEntry], start_brk: Option<u64>) -> Option<u64> {
    maps.iter()
        .filter(|m| m.is_path("[heap]"))
        .map(|m| m.end)
        .max()
        .into_iter()
        .chain(start_brk)
        .max()
}

/// `/proc/PID/maps`, the brk heap's start and `vm.mmap_min_addr`.
fn layout_facts(pid: Pid) -> Result<(Vec<MapEntry>, Option<u64>, u64)> {
    let maps = maps(pid)?;
    let stat = read_proc(pid, "stat").unwrap_or_default();
    // Fields after "(comm)": state is field 3; start_brk is field 47.
    let start_brk = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(47 - 3))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&b| b != 0);
    let min_addr = std::fs::read_to_string("/proc/sys/vm/mmap_min_addr")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65536)
        .max(PAGE_SIZE);
    Ok((maps, start_brk, min_addr))
}

fn gap_near(
    maps: &[MapEntry],
    start_brk: Option<u64>,
    min_addr: u64,
    lo: u64,
    hi: u64,
    len: u64,
    reserved: &[(u64, u64)],
) -> Option<u64> {
    if len == 0 || hi <= lo {
        return None;
    }
    let len = len.checked_add(PAGE_SIZE - 1)? & !(PAGE_SIZE - 1);
    // Every start g must satisfy max(hi, g+len) - min(lo, g) <= 2 GiB.
    let g_min = hi.saturating_sub(TWO_GIB);
    let g_max = lo.checked_add(TWO_GIB)?.checked_sub(len)?;
    let heap_end = heap_end(maps, start_brk);
    let mut busy: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.start < USER_TOP)
        .map(|m| {
            if m.is_path("[stack]") {
                (m.start.saturating_sub(256 << 20), m.end)
            } else {
                (m.start, m.end)
            }
        })
        .chain(reserved.iter().copied())
        .collect();
    let free = |busy: &[(u64, u64)]| -> Vec<(u64, u64)> {
        let mut b = busy.to_vec();
        b.sort_unstable();
        let mut out = Vec::new();
        let mut cur = min_addr;
        for (s, e) in b {
            if s > cur {
                out.push((cur, s));
            }
            cur = cur.max(e);
        }
        if cur < USER_TOP {
            out.push((cur, USER_TOP));
        }
        out
    };
    // Below the binary: the highest fit.
    let below = free(&busy)
        .into_iter()
        .filter_map(|(a, b)| {
            let b = b.min(lo);
            let g = b.checked_sub(len)? & !(PAGE_SIZE - 1);
            (g >= a.max(g_min) && g <= g_max && g + len <= lo).then_some(g)
        })
        .max();
    if below.is_some() {
        return below;
    }
    for reserve in [1u64 << 30, 64 << 20, 0] {
        if let Some(h) = heap_end {
            busy.push((h, h.saturating_add(reserve)));
        }
        let above = free(&busy)
            .into_iter()
            .filter_map(|(a, b)| {
                let g = (a.max(hi).max(g_min) + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
                (g + len <= b && g <= g_max).then_some(g)
            })
            .min();
        if heap_end.is_some() {
            busy.pop();
        }
        if above.is_some() {
            return above;
        }
    }
    None
}

/// A signal process `pid` does not use: not caught, not ignored, not
/// pending, and not blocked by any thread (`SigCgt`, `SigIgn`, `ShdPnd` of
/// /proc/PID/status; `SigBlk`, `SigPnd` of each /proc/PID/task/*/status),
/// chosen from SIGRTMAX (64) down to SIGRTMIN+2 (34): glibc reserves 32 and
/// 33 for itself. A thread that blocks every one of them (34..=64) says
/// nothing about any: it blocks all signals, as worker threads of servers
/// do (jemalloc's background thread in Debian's redis-server), and never
/// gets a burst signal (the eBPF program checks each thread's mask). A
/// signal the program waits for (`sigwait`) is blocked in every thread,
/// or the threads that do not block it would die of it: it stays used.
pub fn free_signal(pid: Pid) -> Result<i32> {
    let status = read_proc(pid, "status")?;
    let mut threads = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            if let Ok(s) = std::fs::read_to_string(e.path().join("status")) {
                threads.push(s);
            }
        }
    }
    pick_free_signal(&status, &threads)?.ok_or(InjectError::NoFreeSignal(pid))
}

fn pick_free_signal(process: &str, threads: &[String]) -> Result<Option<i32>> {
    let mask = |s: &str, key: &str| -> Result<u64> {
        match status_field(s, key) {
            Some(v) => u64::from_str_radix(v, 16).map_err(|_| InjectError::Parse {
                what: format!("{key} in a /proc status file"),
                text: v.into(),
            }),
            None => Ok(0),
        }
    };
    let mut used = mask(process, "SigCgt")? | mask(process, "SigIgn")? | mask(process, "ShdPnd")?;
    let range = (34..=64).fold(0u64, |m, s| m | bit(s));
    let mut blocked_all = 0;
    for t in threads {
        let blk = mask(t, "SigBlk")?;
        used |= mask(t, "SigPnd")?;
        if blk & range == range {
            blocked_all += 1;
        } else {
            used |= blk;
        }
    }
    // Every thread blocks them all: none can take the signal.
    if !threads.is_empty() && blocked_all == threads.len() {
        return Ok(None);
    }
    Ok((34..=64).rev().find(|&s| used & bit(s) == 0))
}

/// Whether user-space CET shadow stacks are enabled in any thread of `pid`
/// (`x86_Thread_features:` of /proc/PID/status and the threads' status
/// lists `shstk`). A call or signal frame we set up would not match the
/// shadow stack, so the caller must refuse to inject. False when the kernel
/// has no shadow stack support or the process is gone.
pub fn shadow_stack_enabled(pid: Pid) -> bool {
    let mut texts = vec![read_proc(pid, "status").unwrap_or_default()];
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            texts.extend(std::fs::read_to_string(e.path().join("status")));
        }
    }
    texts.iter().any(|t| status_has_shstk(t))
}

fn status_has_shstk(status: &str) -> bool {
    status_field(status, "x86_Thread_features")
        .is_some_and(|v| v.split_whitespace().any(|f| f == "shstk"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, path: &str) -> MapEntry {
        MapEntry {
            start,
            end,
            offset: 0,
            dev_major: 0,
            dev_minor: 0,
            inode: 0,
            perms: *b"r--p",
            path: Some(path.into()),
            deleted: false,
        }
    }

    /// The control block's low gap: under 1 GiB and below every mapping
    /// for a PIE; below a non-PIE executable at 0x400000 (never in its
    /// brk heap's way); what the caller reserved is avoided.
    #[test]
    fn low_gap_stays_below_everything_and_out_of_the_heap() {
        const LIMIT: u64 = 0x7fff_0000;
        let pie = [
            m(0x5555_0000_0000, 0x5555_0000_8000, "/bin/x"),
            m(0x7f00_0000_0000, 0x7f00_0020_0000, "/lib/libc.so.6"),
        ];
        let g = low_gap(&pie, None, 65536, 0x6000, LIMIT, &[]).unwrap();
        assert_eq!(g, (1 << 30) - 0x6000);
        let r = [(g, g + 0x6000)];
        assert_eq!(
            low_gap(&pie, None, 65536, 0x6000, LIMIT, &r).unwrap(),
            g - 0x6000
        );
        let nonpie = [
            m(0x400000, 0x500000, "/bin/x"),
            m(0x600000, 0x700000, "[heap]"),
            m(0x7f00_0000_0000, 0x7f00_0020_0000, "/lib/libc.so.6"),
        ];
        let g = low_gap(&nonpie, Some(0x600000), 65536, 0x6000, LIMIT, &[]).unwrap();
        assert_eq!(g, 0x400000 - 0x6000);
        // No room below the executable: above the heap's 1 GiB.
        let g = low_gap(&nonpie, Some(0x600000), 65536, 0x400000, LIMIT, &[]).unwrap();
        assert!(g >= 0x700000 + (1 << 30) && g + 0x400000 <= LIMIT, "{g:#x}");
        assert!(low_gap(&nonpie, Some(0x600000), 65536, 1 << 31, LIMIT, &[]).is_none());
    }

    #[test]
    fn gap_prefers_below_then_above_past_the_heap() {
        let bin = [
            m(0x5555_0000_0000, 0x5555_0000_4000, "/bin/x"),
            m(0x5555_0000_4000, 0x5555_0000_8000, "/bin/x"),
        ];
        let g = gap_near(
            &bin,
            None,
            65536,
            0x5555_0000_0000,
            0x5555_0000_8000,
            100,
            &[],
        )
        .unwrap();
        assert_eq!(g, 0x5555_0000_0000 - PAGE_SIZE);
        // Non-PIE at 0x400000 with a mapping filling the space below.
        let maps = [
            m(0x10000, 0x400000, "/low"),
            m(0x400000, 0x500000, "/bin/x"),
            m(0x600000, 0x700000, "[heap]"),
        ];
        // The space between the bss and start_brk is free for us.
        let g = gap_near(
            &maps,
            Some(0x600000),
            65536,
            0x400000,
            0x500000,
            0x3000,
            &[],
        )
        .unwrap();
        assert_eq!(g, 0x500000);
        let mut maps = maps.to_vec();
        maps.insert(2, m(0x500000, 0x600000, "/bin/x"));
        let g = gap_near(
            &maps,
            Some(0x600000),
            65536,
            0x400000,
            0x600000,
            0x3000,
            &[],
        )
        .unwrap();
        assert_eq!(g, 0x700000 + (1 << 30));
        // Too big for the 1 GiB reserve: 64 MiB.
        let g = gap_near(
            &maps,
            Some(0x600000),
            65536,
            0x400000,
            0x600000,
            1 << 30,
            &[],
        )
        .unwrap();
        assert_eq!(g, 0x700000 + (64 << 20));
        // Every byte within 2 GiB: the gap's end bounds it.
        assert!(
            gap_near(
                &maps,
                None,
                65536,
                0x400000,
                0x600000,
                (2 << 30) - 0x200000,
                &[]
            )
            .is_none()
        );
        let g = gap_near(
            &maps,
            None,
            65536,
            0x400000,
            0x600000,
            (2 << 30) - 0x600000,
            &[],
        )
        .unwrap();
        assert!(g + ((2 << 30) - 0x600000) - 0x400000 <= TWO_GIB);
    }

    #[test]
    fn maps_parse() {
        let t = "55d0c0000000-55d0c0001000 r-xp 00001000 fe:00 1234    /usr/bin/x y\n\
                 7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n\
                 7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n";
        let v = parse_maps(t);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].path.as_deref(), Some("/usr/bin/x y"));
        assert_eq!(v[0].offset, 0x1000);
        assert_eq!(v[1].path.as_deref(), Some("[stack]"));
        assert_eq!(v[2].path, None);
    }

    #[test]
    fn maps_parse_lines() {
        let text = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fe:00 247774                     /usr/bin/sleep
7ffd1c1d2000-7ffd1c1f3000 rw-p 00000000 00:00 0                          [stack]
7f0000000000-7f0000001000 r-xp 00001000 08:11 42                         /tmp/a b (deleted)
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";
        let m = parse_maps(text);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].start, 0x55d0c0a00000);
        assert_eq!(m[0].perms, *b"r--p");
        assert_eq!(m[0].dev_major, 0xfe);
        assert_eq!(m[0].inode, 247774);
        assert_eq!(m[0].path.as_deref(), Some("/usr/bin/sleep"));
        assert!(!m[0].deleted);
        assert_eq!(m[1].path.as_deref(), Some("[stack]"));
        assert!(m[1].is_pseudo() && m[1].is_path("[stack]"));
        // A file removed or replaced on disk: the path without the suffix.
        assert_eq!(m[2].path.as_deref(), Some("/tmp/a b"));
        assert!(m[2].deleted && m[2].is_exec() && m[2].is_path("/tmp/a b"));
        assert_eq!(
            (m[2].dev_major, m[2].dev_minor, m[2].offset),
            (8, 0x11, 0x1000)
        );
        assert_eq!(m[3].path, None);
        assert!(m[4].is_exec());
        assert!(MapEntry::parse("").is_none());
        assert!(MapEntry::parse("1-0 r-xp 0 0:0 0").is_none());
        // A memfd is always "deleted".
        let memfd = MapEntry::parse(
            "7f0000004000-7f0000005000 rw-s 00000000 00:01 9 /memfd:burstyd-bursts (deleted)",
        )
        .unwrap();
        assert!(memfd.deleted && memfd.is_path("/memfd:burstyd-bursts"));
    }

    #[test]
    fn maps_of_self_find_exe_and_libc() {
        let maps = maps(Pid(std::process::id())).unwrap();
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let exe = exe.to_str().unwrap();
        assert!(
            maps.iter().any(|m| m.is_exec() && m.is_path(exe)),
            "no executable mapping of {exe}"
        );
        assert!(
            maps.iter()
                .any(|m| m.is_exec() && m.path.as_deref().is_some_and(|p| p.contains("libc.so"))),
            "no libc"
        );
        assert!(maps.windows(2).all(|w| w[0].start < w[1].start));
    }

    #[test]
    fn free_signal_and_shstk_parse() {
        let p = "SigQ:\t0/1\nShdPnd:\t0000000000000000\nSigIgn:\t0000000000001000\n\
                 SigCgt:\t8000000000000000\n";
        let t = vec!["SigPnd:\t0000000000000000\nSigBlk:\t4000000000000000\n".to_string()];
        assert_eq!(pick_free_signal(p, &t).unwrap(), Some(62));
        let all = vec!["SigBlk:\tfffffffe00000000\n".to_string()];
        assert_eq!(pick_free_signal(p, &all).unwrap(), None);
        // A thread that blocks every signal (jemalloc's background thread:
        // `fffffffe7ffbfeff`) beside one that blocks 62: 62 stays used.
        let mut two = t.clone();
        two.push("SigPnd:\t0000000000000000\nSigBlk:\tfffffffe7ffbfeff\n".to_string());
        assert_eq!(pick_free_signal(p, &two).unwrap(), Some(62));
        // ... and one pending in it is still used.
        two.push("SigPnd:\t2000000000000000\nSigBlk:\tffffffffffffffff\n".to_string());
        assert_eq!(pick_free_signal(p, &two).unwrap(), Some(61));
        assert!(status_has_shstk(
            "x86_Thread_features:\tshstk wrss\nx86_Thread_features_locked:\t\n"
        ));
        assert!(!status_has_shstk(
            "x86_Thread_features:\t\nx86_Thread_features_locked:\tshstk\n"
        ));
    }
}
