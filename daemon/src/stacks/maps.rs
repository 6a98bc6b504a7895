//! `/proc/PID/maps`: one line per mapping, parsed into [`MapEntry`].

use burstyd_common::addr::Pid;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MapEntry {
    /// First address (AVMA) of the mapping.
    pub(crate) start: u64,
    /// One past the last address.
    pub(crate) end: u64,
    /// File offset the mapping starts at.
    pub(crate) offset: u64,
    /// Device major number of the file (hex in maps).
    pub(crate) dev_major: u32,
    /// Device minor number.
    pub(crate) dev_minor: u32,
    /// Inode of the file, 0 for anonymous mappings.
    pub(crate) inode: u64,
    /// `rwxp`/`rwxs` characters as printed, e.g. `*b"r-xp"`.
    pub(crate) perms: [u8; 4],
    /// The path or pseudo-path (`[heap]`, `[stack]`, `[vdso]`, ...), without a
    /// ` (deleted)` suffix; `None` for anonymous mappings.
    pub(crate) path: Option<String>,
    /// Whether the kernel marked the file ` (deleted)`.
    pub(crate) deleted: bool,
}

impl MapEntry {
    /// Whether the mapping is executable.
    pub(crate) fn is_exec(&self) -> bool {
        self.perms[2] == b'x'
    }

    /// Whether the path is a kernel pseudo-path like `[heap]` or `[vdso]`.
    pub(crate) fn is_pseudo(&self) -> bool {
        self.path.as_deref().is_some_and(|p| p.starts_with('['))
    }

    /// Parse one line of `/proc/PID/maps`. `None` for malformed lines.
    pub(crate) fn parse(line: &str) -> Option<MapEntry> {
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

/// Parse the text of a `/proc/PID/maps` file, skipping malformed lines.
fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(MapEntry::parse).collect()
}

/// Read and parse `/proc/PID/maps`.
pub(crate) fn read_maps(pid: Pid) -> std::io::Result<Vec<MapEntry>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procs_parse_maps_lines() {
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
        assert_eq!(m[1].path.as_deref(), Some("[stack]"));
        assert!(m[1].is_pseudo());
        assert_eq!(m[2].path.as_deref(), Some("/tmp/a b"));
        assert!(m[2].deleted && m[2].is_exec());
        assert_eq!(
            (m[2].dev_major, m[2].dev_minor, m[2].offset),
            (8, 0x11, 0x1000)
        );
        assert_eq!(m[3].path, None);
        assert!(m[4].is_exec());
        assert!(MapEntry::parse("").is_none());
        assert!(MapEntry::parse("1-0 r-xp 0 0:0 0").is_none());
    }

    #[test]
    fn procs_read_maps_self_finds_exe_and_libc() {
        let maps = read_maps(Pid(std::process::id())).unwrap();
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let exe = exe.to_str().unwrap();
        assert!(
            maps.iter()
                .any(|m| m.is_exec() && m.path.as_deref() == Some(exe)),
            "no executable mapping of {exe}"
        );
        assert!(
            maps.iter()
                .any(|m| m.is_exec() && m.path.as_deref().is_some_and(|p| p.contains("libc.so"))),
            "no libc"
        );
    }
}
