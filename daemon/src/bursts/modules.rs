//! The modules of a traced process that get clones: the executable and
//! every shared library mapped when it is attached (libc, libm,
//! libstdc++, a vendor's `.so`, ...), each read from the mapping itself
//! (`/proc/PID/map_files`: a library replaced on disk since is still the
//! one mapped) and analysed on its own.
//!
//! The dynamic loader is one of them: the unwinder asks it for every
//! frame of a C++ throw (`_dl_find_object`), `__tls_get_addr` and the
//! lazy-binding resolver run inside hot code, and a burst that called
//! into it used to pause there. It is analysed like any other library
//! (the resolver's final jump is an indirect tail call); only its
//! debugger hook `_dl_debug_state` keeps no clone (see [`super::prepare`]).
//!
//! A module's bytes stay in its file until it is analysed afresh: what a
//! plan cache lookup needs (the length, a hash, the build ID, the load
//! bias) is read from the file as a stream. xerces-c's `DOMPrint` is a
//! 42 MB file, held whole at every attach before.
//!
//! Left out, with the reason logged: the vdso (no file), anything that
//! is not an ELF file or whose analysis fails, and burstyd's own regions.
use burstyd_common::addr::Pid;
use tracing::debug;
use userspace_rewriter::analysis::elf::ElfInfo;
use userspace_rewriter::codegen::Recording;
use userspace_rewriter::inject::MapEntry;

/// One mapped ELF file of the target.
pub(crate) struct Module {
    /// Its path as `/proc/PID/maps` shows it (without " (deleted)").
    pub(crate) path: String,
    /// The file, as mapped.
    pub(crate) file: std::fs::File,
    /// Its length, FNV-1a hash (the module's id) and build ID (hex): what
    /// its plan cache key is made of.
    pub(crate) len: u64,
    pub(crate) hash: u64,
    pub(crate) build_id: Option<String>,
    /// `[lo, hi)` of all its mappings (AVMAs).
    pub(crate) range: (u64, u64),
    /// AVMA − SVMA.
    pub(crate) bias: u64,
    /// The main executable (`/proc/PID/exe`).
    pub(crate) is_exe: bool,
    /// The inode of its file (its mapping at the lowest offset).
    pub(crate) ino: u64,
    /// What its clones record besides paths (memory mode's references,
    /// tuples; part of its plan cache key; set by whoever asks for
    /// clones).
    pub(crate) rec: Recording,
}

/// The executable (first) and, with `libraries`, the shared libraries
/// (the dynamic loader among them) mapped in `pid`, in address order
/// after it. `exe_path` is the executable's maps path, `exe_data` its
/// file (`/proc/PID/exe`).
pub(crate) fn mapped_modules(
    pid: Pid,
    maps: &[MapEntry],
    exe_path: &str,
    exe_file: std::fs::File,
    libraries: bool,
) -> anyhow::Result<Vec<Module>> {
    let exe = module_at(maps, exe_path, Some(exe_file), pid, true)?
        .ok_or_else(|| anyhow::anyhow!("pid {pid}: {exe_path} is not in /proc/{pid}/maps"))?;
    let mut out = vec![exe];
    if libraries {
        out.extend(mapped_libraries(pid, maps, exe_path));
    }
    Ok(out)
}

/// The shared libraries mapped in `pid` (every executable file mapping
/// but the executable's, `exe_path`), in address order.
pub(crate) fn mapped_libraries(pid: Pid, maps: &[MapEntry], exe_path: &str) -> Vec<Module> {
    let mut out = Vec::new();
    for p in library_paths(maps, exe_path) {
        match module_at(maps, p, None, pid, false) {
            Ok(Some(m)) => out.push(m),
            Ok(None) => {}
            Err(e) => debug!(%pid, "not cloning {p}: {e:#}"),
        }
    }
    out
}

/// The paths of [`mapped_libraries`], in address order, without reading
/// anything.
pub(crate) fn library_paths<'a>(maps: &'a [MapEntry], exe_path: &str) -> Vec<&'a str> {
    let mut paths: Vec<&str> = Vec::new();
    for m in maps {
        let Some(p) = m.path.as_deref() else { continue };
        if !m.is_exec() || !p.starts_with('/') || p == exe_path || paths.contains(&p) {
            continue;
        }
        paths.push(p);
    }
    paths
}

/// The module mapped from `path`: its range, its bias from the mapping
/// at the lowest file offset, its bytes (read through that mapping unless
/// given). `None` for a file that is not ELF.
fn module_at(
    maps: &[MapEntry],
    path: &str,
    file: Option<std::fs::File>,
    pid: Pid,
    is_exe: bool,
) -> anyhow::Result<Option<Module>> {
    use anyhow::Context as _;
    let own: Vec<&MapEntry> = maps.iter().filter(|m| m.is_path(path)).collect();
    let (Some(lo), Some(hi), Some(first)) = (
        own.iter().map(|m| m.start).min(),
        own.iter().map(|m| m.end).max(),
        own.iter().min_by_key(|m| m.offset),
    ) else {
        return Ok(None);
    };
    let file = match file {
        Some(f) => f,
        None => open_mapped(pid, path, first)?,
    };
    let elf = match ElfInfo::parse(&object::ReadCache::new(&file)) {
        Ok(e) => e,
        Err(userspace_rewriter::analysis::elf::ElfError::NotElf) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("parsing {path}")),
    };
    let bias = elf
        .load_bias_for(first.start, first.offset, first.is_exec())
        .with_context(|| format!("no PT_LOAD segment for the first mapping of {path}"))?;
    Module::from_file(path, file, (lo, hi), bias, is_exe, first.inode).map(Some)
}

/// The file mapped at `m`: through `/proc/PID/map_files` (the mapped file
/// itself, even replaced or deleted since), which needs CAP_SYS_ADMIN or
/// CAP_CHECKPOINT_RESTORE; without them, through `/proc/PID/root/PATH`
/// when that is still the very file mapped (same device and inode).
///
/// `map_files` opens what is mapped at `m`'s range *now*: a program that
/// unloaded the library read in the maps and loaded another at its place
/// since (`dlclose`, `dlopen`: `tests/fixtures/dlswap.c`) would have the
/// other one analysed and cloned under the first one's name and inode,
/// and its clones entered whenever the first one is mapped there again
/// (wrong results: seen once in four runs of the dlswap test on a loaded
/// machine). So the file opened must be `m`'s: the same inode where the
/// device is the same, else (a stacked file system, whose maps may show
/// the file underneath) a mapping still there when the maps are read
/// again.
fn open_mapped(pid: Pid, path: &str, m: &MapEntry) -> anyhow::Result<std::fs::File> {
    use anyhow::Context as _;
    use std::os::unix::fs::MetadataExt as _;
    let direct = std::fs::File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    let e = match direct {
        Ok(f) => {
            let md = f.metadata()?;
            let dev = (libc::major(md.dev()), libc::minor(md.dev()));
            let same = if dev == (m.dev_major, m.dev_minor) {
                md.ino() == m.inode
            } else {
                userspace_rewriter::inject::maps(pid)?.iter().any(|x| {
                    (x.start, x.end, x.inode, x.dev_major, x.dev_minor)
                        == (m.start, m.end, m.inode, m.dev_major, m.dev_minor)
                })
            };
            if !same {
                anyhow::bail!(
                    "{path} is no longer what is mapped at {:#x} (the program unloaded it and mapped another file there)",
                    m.start
                );
            }
            return Ok(f);
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => e,
        Err(e) => return Err(e).with_context(|| format!("opening {path} through its mapping")),
    };
    let f = std::fs::File::open(format!("/proc/{pid}/root{path}"))
        .with_context(|| format!("opening {path} (its mapping: {e})"))?;
    let md = f.metadata()?;
    let dev = md.dev();
    if (libc::major(dev), libc::minor(dev), md.ino()) != (m.dev_major, m.dev_minor, m.inode) {
        anyhow::bail!(
            "{path} is no longer the file mapped, and its mapping cannot be opened ({e}; give burstyd CAP_CHECKPOINT_RESTORE)"
        );
    }
    Ok(f)
}

/// The length and FNV-1a hash of a file's bytes, read as a stream.
pub(crate) fn hash_file(file: &std::fs::File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let mut h = super::cache::Fnv::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            return Ok((at, h.finish()));
        }
        h.write(&buf[..n]);
        at += n as u64;
    }
}

impl Module {
    /// The module of `file`, mapped at `range` with `bias`: its build ID,
    /// length and hash read from the file.
    pub(crate) fn from_file(
        path: &str,
        file: std::fs::File,
        range: (u64, u64),
        bias: u64,
        is_exe: bool,
        ino: u64,
    ) -> anyhow::Result<Module> {
        use anyhow::Context as _;
        let build_id = ElfInfo::parse(&object::ReadCache::new(&file))
            .with_context(|| format!("parsing {path}"))?
            .build_id_hex();
        let (len, hash) = hash_file(&file).with_context(|| format!("reading {path}"))?;
        Ok(Module {
            path: path.to_owned(),
            file,
            len,
            hash,
            build_id,
            range,
            bias,
            is_exe,
            ino,
            rec: Recording::default(),
        })
    }

    /// The file's bytes (to analyse it afresh).
    pub(crate) fn bytes(&self) -> anyhow::Result<Vec<u8>> {
        use anyhow::Context as _;
        use std::os::unix::fs::FileExt;
        let mut data = vec![0u8; self.len as usize];
        self.file
            .read_exact_at(&mut data, 0)
            .with_context(|| format!("reading {}", self.path))?;
        if super::cache::fnv(&data) != self.hash {
            anyhow::bail!("{} changed while it was read", self.path);
        }
        Ok(data)
    }

    /// Its key in the plan cache.
    pub(crate) fn key(&self) -> String {
        super::cache::key(self.build_id.as_deref(), self.len, self.hash) + &self.rec.key_suffix()
    }
}

/// The separate debug file of an ELF file, if one is installed
/// (`/usr/lib/debug/.build-id/xx/rest.debug`, as Debian's `-dbg` and
/// `-dbgsym` packages install them).
pub(crate) fn debug_file(build_id: Option<&str>) -> Option<std::path::PathBuf> {
    let hex = build_id?;
    if hex.len() <= 2 {
        return None;
    }
    let p = std::path::PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    p.is_file().then_some(p)
}

/// Names for the functions the file's own symbols do not name (`sub_X`:
/// a stripped library's local functions, such as libc's
/// `msort_with_tmp`), from the `.symtab` of its separate debug file.
pub(crate) fn name_from_debug_file(
    plan: &mut userspace_rewriter::analysis::plan::Plan,
    build_id: Option<&str>,
) {
    use object::{Object, ObjectSymbol, SymbolKind};
    if !plan.functions.iter().any(|f| f.name.starts_with("sub_")) {
        return;
    }
    let Some(path) = debug_file(build_id) else {
        return;
    };
    let Ok(bytes) = std::fs::read(&path) else {
        return;
    };
    let Ok(file) = object::File::parse(&*bytes) else {
        return;
    };
    let names: std::collections::HashMap<u64, &str> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.name().ok().filter(|n| !n.is_empty())?)))
        .collect();
    for f in &mut plan.functions {
        if f.name.starts_with("sub_")
            && let Some(n) = names.get(&f.start)
        {
            f.name = (*n).to_owned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's own process: its executable first, then libc (which
    /// every test binary links) and the dynamic loader.
    #[test]
    fn modules_of_self_are_the_executable_then_its_libraries() {
        let pid = Pid(std::process::id());
        let maps = userspace_rewriter::inject::maps(pid).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        let open = || std::fs::File::open(&exe).unwrap();
        let mods = mapped_modules(pid, &maps, &exe, open(), true).unwrap();
        assert!(mods[0].is_exe && mods[0].path == exe);
        assert!(mods[1..].iter().all(|m| !m.is_exe));
        let names: Vec<&str> = mods
            .iter()
            .map(|m| m.path.rsplit('/').next().unwrap())
            .collect();
        assert!(names.iter().any(|n| n.starts_with("libc.so")), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("ld-linux")), "{names:?}");
        let only = mapped_modules(pid, &maps, &exe, open(), false).unwrap();
        assert_eq!(only.len(), 1);
        // What was read as a stream is what the bytes say.
        for m in &mods {
            let bytes = m.bytes().unwrap();
            assert!(m.range.0 < m.range.1 && bytes.starts_with(b"\x7fELF"));
            assert_eq!(m.len, bytes.len() as u64);
            assert_eq!(m.hash, crate::bursts::cache::fnv(&bytes));
            let id = ElfInfo::parse(&bytes[..]).unwrap().build_id_hex();
            assert_eq!(m.build_id, id);
            assert!(m.key().starts_with(id.as_deref().unwrap_or("none")));
        }
    }
}
