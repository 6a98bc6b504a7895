//! The plan and code cache: what the first attach to a module analysed and
//! generated, kept on disk, so that the next attach to the same file (a
//! re-attach, another process of the same program, another program using
//! the same library) costs no analysis and no generation. The cached
//! clones are moved to the new process's layout
//! ([`CloneImage::relocate`]: the same bytes a generation there makes,
//! `userspace-rewriter/tests/relocate.rs`), which takes milliseconds.
//!
//! - **Key**: the module's content: its ELF build ID (when it has one),
//!   its size and a 64-bit FNV-1a hash of its bytes, all three; and
//!   burstyd's own build ID (a rebuilt burstyd never reads another
//!   build's entries).
//! - **Where**: one file per module under the cache directory
//!   (`/var/cache/burstyd` as root, the service's `CacheDirectory=`;
//!   `$XDG_CACHE_HOME/burstyd` or `~/.cache/burstyd` otherwise), written
//!   under a temporary name and renamed, so a reader never sees half an
//!   entry.
//! - **Bound**: after each write, the least recently used entries (by
//!   modification time, refreshed on every hit) are removed until the
//!   directory holds at most the bound (`cache_max_mb`, 1024 MB).
//! - **Format**: a magic line, then sections of `u64` length and bytes: a
//!   JSON header; the plan without its CFGs and path numberings
//!   (MessagePack); those, one MessagePack record per function, and
//!   their offsets; the fdata facts (MessagePack); the clone image, its
//!   relocations, tables, functions and map as little-endian words; and
//!   the `.eh_frame`.
//! - **Details on disk**: a load reads the plan but skips the CFGs and
//!   numberings (most of an entry's plan: 45 MB of python3.11's 50). The
//!   daemon keeps the entry open and reads a function's ([`Details`])
//!   when its paths are exported; a module generated now is switched to
//!   its stored entry the same way once written. An entry removed or
//!   replaced meanwhile stays readable through the open file.
//!
//! An entry that cannot be read or moved is ignored (and removed if it is
//! corrupt); the module is then analysed as if there were none. The
//! clones of an entry run inside traced processes, so a directory or an
//! entry that another user owns or may write is not used at all.
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};
use userspace_rewriter::analysis::plan::{PathDetails, Plan};
use userspace_rewriter::codegen::{
    CloneImage, ClonedFunction, GenStats, Layout, Relocs, ReverseMap, Tables,
};

use super::fdata_facts::FdataFacts;
use super::tables::FileTables;

const MAGIC: &[u8] = b"burstyd plan cache 6\n";

/// Default bound on the cache directory.
pub(crate) const DEFAULT_MAX_MB: u64 = 1024;

/// One module's cached clones and what the exporters need besides its
/// plan (returned beside it by [`Cache::load`]).
pub(crate) struct Entry {
    pub(crate) fdata: FdataFacts,
    /// Encoded for the layout of the attach that made it, without its
    /// bytes (`bytes`: read when they are written into a process) and
    /// its lookup tables (`tables`: the same).
    pub(crate) img: CloneImage,
    pub(crate) bytes: CachedBytes,
    pub(crate) tables: FileTables,
    pub(crate) eh: Vec<u8>,
    pub(crate) exceptions: bool,
    /// The plan's CFGs and path numberings, on disk.
    pub(crate) details: Details,
}

/// A cached image's bytes, in its entry (python3.11's are 22 MB: they go
/// from the file into the process a piece at a time).
pub(crate) struct CachedBytes {
    file: std::sync::Arc<std::fs::File>,
    at: u64,
    len: u64,
}

impl CachedBytes {
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bytes `offset..offset + buf.len()` of the image.
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        use std::os::unix::fs::FileExt as _;
        if offset + buf.len() as u64 > self.len {
            bail!("a read past the cached image");
        }
        self.file
            .read_exact_at(buf, self.at + offset)
            .context("reading cached clones")
    }
}

/// The CFGs and path numberings of a module's plan, read from its cache
/// entry one function at a time.
pub(crate) struct Details {
    file: std::sync::Arc<std::fs::File>,
    /// Per function, where its record starts in the file, and one more:
    /// where the last ends (equal neighbours: none).
    offsets: Vec<u64>,
}

impl Details {
    /// Function `i`'s CFG and path numbering, if it has them.
    pub(crate) fn get(&self, i: usize) -> anyhow::Result<Option<PathDetails>> {
        use std::os::unix::fs::FileExt as _;
        let (Some(&start), Some(&end)) = (self.offsets.get(i), self.offsets.get(i + 1)) else {
            return Ok(None);
        };
        if start == end {
            return Ok(None);
        }
        let mut buf = vec![0; (end - start) as usize];
        self.file
            .read_exact_at(&mut buf, start)
            .context("reading a function's CFG from the plan cache")?;
        Ok(Some(rmp_serde::from_slice(&buf).context(
            "decoding a function's CFG from the plan cache",
        )?))
    }
}

/// The cache directory and its bound.
pub(crate) struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    /// burstyd's own build ID.
    ours: String,
    /// The directory was found untrusted (said once).
    warned: std::sync::atomic::AtomicBool,
}

static CACHE: OnceLock<Option<Cache>> = OnceLock::new();

/// Sets the process's cache (once; `None`: no cache).
pub(crate) fn init(dir: Option<PathBuf>, max_mb: u64) {
    let cache = dir.map(|dir| Cache {
        dir,
        max_bytes: max_mb.saturating_mul(1 << 20),
        ours: own_build_id(),
        warned: Default::default(),
    });
    let _ = CACHE.set(cache);
}

/// The process's cache, if any.
pub(crate) fn get() -> Option<&'static Cache> {
    CACHE.get().and_then(Option::as_ref)
}

/// The default directory: `/var/cache/burstyd` as root, else the user's
/// cache directory.
pub(crate) fn default_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/var/cache/burstyd"));
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .map(|d| d.join("burstyd"))
}

/// burstyd's build ID, or its size and FNV-1a hash without one. Read
/// as far as needed: the binary with its debug info is 70 MB, which the
/// daemon would otherwise hold, once, at its start.
fn own_build_id() -> String {
    use object::Object as _;
    let Ok(f) = std::fs::File::open("/proc/self/exe") else {
        return "unknown".into();
    };
    let read = object::ReadCache::new(&f);
    if let Some(id) = object::File::parse(&read)
        .ok()
        .and_then(|o| o.build_id().ok().flatten())
    {
        return id.iter().map(|b| format!("{b:02x}")).collect();
    }
    drop(read);
    let (mut h, mut len, mut buf) = (Fnv::default(), 0u64, vec![0; 1 << 16]);
    let mut r = &f;
    while let Ok(n) = std::io::Read::read(&mut r, &mut buf) {
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
        len += n as u64;
    }
    format!("{len:x}-{:016x}", h.0)
}

/// FNV-1a, 64 bits, fed in pieces.
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub(crate) fn write(&mut self, data: &[u8]) {
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a, 64 bits.
pub(crate) fn fnv(data: &[u8]) -> u64 {
    let mut h = Fnv::default();
    h.write(data);
    h.0
}

/// The key of a module's bytes: their build ID (hex), length and
/// [`fnv`] hash.
pub(crate) fn key(build_id: Option<&str>, len: u64, hash: u64) -> String {
    format!("{}-{len:x}-{hash:016x}", build_id.unwrap_or("none"))
}

/// What the header records besides the sections.
#[derive(Serialize, Deserialize)]
struct Header {
    ours: String,
    key: String,
    /// For a human reading the directory.
    path: String,
    layout: [u64; 4],
    code_range: (u64, u64),
    clones_offset: u64,
    handler: u64,
    restorer: u64,
    exceptions: bool,
    stats: GenStats,
    skipped: std::collections::BTreeMap<String, usize>,
}

impl Cache {
    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.bin"))
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bound, in MB.
    pub(crate) fn max_mb(&self) -> u64 {
        self.max_bytes >> 20
    }

    /// Entries can be stored and read: the directory exists (made now if
    /// need be) and no one else may write it (said once if not).
    pub(crate) fn usable(&self) -> bool {
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            self.warn_untrusted(&e);
            return false;
        }
        match self.trusted(&self.dir) {
            Ok(()) => true,
            Err(why) => {
                self.warn_untrusted(&why);
                false
            }
        }
    }

    /// The entry for `key`, if there is a readable one.
    pub(crate) fn load(&self, key: &str) -> Option<(Plan, Entry)> {
        let path = self.path(key);
        let file = std::sync::Arc::new(std::fs::File::open(&path).ok()?);
        if let Err(why) = self
            .trusted(&self.dir)
            .and_then(|()| trusted_meta(&path, &file.metadata()?))
        {
            self.warn_untrusted(&why);
            return None;
        }
        match read(&file, &self.ours, key) {
            Ok(e) => {
                // Recently used: the eviction goes by modification time.
                let _ = file.set_modified(SystemTime::now());
                Some(e)
            }
            Err(e) => {
                // Every entry after an upgrade: expected, not a fault.
                if e.is::<OtherBurstyd>() {
                    debug!("replacing the cached plan {}: {e}", path.display());
                } else {
                    warn!("ignoring the cached plan {}: {e:#}", path.display());
                }
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores an entry for `key`, then keeps the directory within its
    /// bound. Returns the entry's [`Details`], if it was stored.
    pub(crate) fn store(&self, key: &str, e: &Stored<'_>) -> anyhow::Result<Option<Details>> {
        if e.img.relocs.unrelocatable.is_some() {
            return Ok(None);
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating the cache directory {}", self.dir.display()))?;
        if let Err(why) = self.trusted(&self.dir) {
            self.warn_untrusted(&why);
            return Ok(None);
        }
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        let result = write(&tmp, &self.ours, key, e).and_then(|d| {
            std::fs::rename(&tmp, self.path(key)).context("renaming the cache entry")?;
            Ok(d)
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        let details = result?;
        self.evict();
        Ok(Some(details))
    }

    /// The clones of a cache entry run inside traced processes: only a
    /// directory (and files) that no other user can write is used.
    fn trusted(&self, dir: &Path) -> std::io::Result<()> {
        trusted_meta(dir, &std::fs::metadata(dir)?)
    }

    fn warn_untrusted(&self, why: &std::io::Error) {
        if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            warn!("the plan cache is not used: {why}");
        }
    }

    /// Removes the least recently used entries beyond the bound.
    fn evict(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            debug!("cache bound: removing {}", path.display());
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// `path` (with metadata `m`) belongs to us and no one else may write it.
fn trusted_meta(path: &Path, m: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if m.uid() != euid {
        return Err(std::io::Error::other(format!(
            "{} belongs to uid {}, not to burstyd's {euid}",
            path.display(),
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is writable by others (mode {:o})",
            path.display(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// What an entry is written from: a module generated now.
pub(crate) struct Stored<'a> {
    /// Names the module (for a human reading the directory).
    pub(crate) path: &'a str,
    pub(crate) plan: &'a Plan,
    pub(crate) fdata: &'a FdataFacts,
    pub(crate) img: &'a CloneImage,
    pub(crate) eh: &'a [u8],
    pub(crate) exceptions: bool,
}

fn write(tmp: &Path, ours: &str, key: &str, e: &Stored<'_>) -> anyhow::Result<Details> {
    use std::io::Seek as _;
    let Stored {
        path,
        plan,
        fdata,
        img,
        eh,
        exceptions,
    } = *e;
    let l = &img.layout;
    let header = Header {
        ours: ours.into(),
        key: key.into(),
        path: path.into(),
        layout: [l.bias, l.control, l.code, l.fid_base.into()],
        code_range: img.code_range,
        clones_offset: img.clones_offset,
        handler: img.handler,
        restorer: img.restorer,
        exceptions,
        stats: img.stats.clone(),
        skipped: img.skipped.clone(),
    };
    // Read too: the entry's details are read back through this file.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_all(MAGIC)?;
    let section = |w: &mut std::io::BufWriter<std::fs::File>, bytes: &[u8]| {
        w.write_all(&(bytes.len() as u64).to_le_bytes())?;
        w.write_all(bytes)
    };
    section(&mut w, &serde_json::to_vec(&header)?)?;
    section(&mut w, &rmp_serde::to_vec_named(&plan.without_details())?)?;
    // The details, one record per function (its length patched in), then
    // their offsets.
    let at = w.stream_position()?;
    w.write_all(&0u64.to_le_bytes())?;
    let mut offsets = Vec::with_capacity(plan.functions.len() + 1);
    let mut pos = at + 8;
    let mut buf = Vec::new();
    for i in 0..plan.functions.len() {
        offsets.push(pos);
        if let Some((cfg, numbering)) = plan.details_of(i) {
            buf.clear();
            rmp_serde::encode::write_named(&mut buf, &(cfg, numbering))?;
            w.write_all(&buf)?;
            pos += buf.len() as u64;
        }
    }
    offsets.push(pos);
    w.seek(std::io::SeekFrom::Start(at))?;
    w.write_all(&(pos - at - 8).to_le_bytes())?;
    w.seek(std::io::SeekFrom::Start(pos))?;
    section(&mut w, &words(offsets.iter().map(|o| o - at - 8)))?;
    section(&mut w, &rmp_serde::to_vec_named(fdata)?)?;
    section(&mut w, &img.bytes)?;
    let r = &img.relocs;
    for v in [
        &r.rel_orig,
        &r.rel_control,
        &r.abs_control,
        &r.orig_qwords,
        &r.fids,
    ] {
        section(&mut w, &u32s(v))?;
    }
    for t in [
        &img.tables.insns,
        &img.tables.functions,
        &img.tables.returns,
    ] {
        section(&mut w, &words(t.iter().flat_map(|&(a, b)| [a, b])))?;
    }
    section(
        &mut w,
        &words(img.functions.iter().flat_map(|f| {
            [
                f.fid().into(),
                f.orig(),
                f.clone_entry(),
                u64::from(f.paths()),
                f.plt_stub_len().unwrap_or(0),
            ]
        })),
    )?;
    let (clone_base, orig_base, clone, orig, len) = img.reverse.parts();
    section(&mut w, &words([clone_base, orig_base].into_iter()))?;
    section(&mut w, &u32s(clone))?;
    section(&mut w, &u32s(orig))?;
    section(&mut w, len)?;
    section(&mut w, eh)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_data().context("writing the cache entry")?;
    Ok(Details {
        file: std::sync::Arc::new(file),
        offsets,
    })
}

/// An entry made by another build of burstyd (before an upgrade).
#[derive(Debug)]
struct OtherBurstyd;

impl std::fmt::Display for OtherBurstyd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("made by another build of burstyd")
    }
}

impl std::error::Error for OtherBurstyd {}

fn words(v: impl Iterator<Item = u64>) -> Vec<u8> {
    v.flat_map(u64::to_le_bytes).collect()
}

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read(
    file: &std::sync::Arc<std::fs::File>,
    ours: &str,
    key: &str,
) -> anyhow::Result<(Plan, Entry)> {
    // Read as a stream (a mapping would count the whole file in the
    // daemon's resident memory at once).
    let size = file.metadata()?.len();
    let mut r = Sections {
        r: std::io::BufReader::with_capacity(1 << 16, &**file),
        left: size,
    };
    let mut magic = vec![0; MAGIC.len()];
    r.exact(&mut magic)?;
    if magic != MAGIC {
        bail!("not a burstyd plan cache file");
    }
    let n = r.len()?;
    let header: Header = serde_json::from_slice(&r.bytes(n)?)?;
    if header.ours != ours {
        return Err(OtherBurstyd.into());
    }
    if header.key != key {
        bail!("made for another file");
    }
    let t0 = std::time::Instant::now();
    let plan: Plan = r.msgpack().context("the plan")?;
    // The details: skipped now, read a function at a time later.
    let n = r.len()?;
    let at = size - r.left;
    r.skip(n)?;
    let offsets: Vec<u64> = r.words(|[o]: [u64; 1]| o)?;
    if offsets.len() != plan.functions.len() + 1
        || offsets.windows(2).any(|w| w[0] > w[1])
        || offsets.last() != Some(&n)
    {
        bail!("the offsets of the CFGs do not match the plan");
    }
    let details = Details {
        file: file.clone(),
        offsets: offsets.into_iter().map(|o| o + at).collect(),
    };
    let fdata: FdataFacts = r.msgpack().context("the fdata facts")?;
    debug!("plan read in {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    let n = r.len()?;
    let bytes = CachedBytes {
        file: file.clone(),
        at: size - r.left,
        len: n,
    };
    r.skip(n)?;
    let relocs = Relocs {
        rel_orig: r.u32s()?,
        rel_control: r.u32s()?,
        abs_control: r.u32s()?,
        orig_qwords: r.u32s()?,
        fids: r.u32s()?,
        unrelocatable: None,
    };
    // The lookup tables: streamed from here when they are written.
    let mut at = [(0, 0); 3];
    for t in &mut at {
        let n = r.len()?;
        if !n.is_multiple_of(16) {
            bail!("a table of {n} bytes is not of pairs");
        }
        *t = (size - r.left, n / 16);
        r.skip(n)?;
    }
    let tables = FileTables::in_file(file.clone(), at);
    let functions = r
        .words(|w: [u64; 5]| w)?
        .into_iter()
        .map(|[fid, orig, clone, paths, plt_len]| {
            let fid = u32::try_from(fid).context("a fid")?;
            Ok(if plt_len == 0 {
                ClonedFunction::new(fid, orig, clone, paths != 0)
            } else {
                let len = u32::try_from(plt_len).context("a PLT stub's length")?;
                ClonedFunction::plt_stub(fid, orig, clone, len)
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let bases: Vec<u64> = r.words(|[w]: [u64; 1]| w)?;
    let [clone_base, orig_base] = bases[..] else {
        bail!("the map's bases");
    };
    let (clone, orig) = (r.u32s()?, r.u32s()?);
    let n = r.len()?;
    let reverse = ReverseMap::from_parts(clone_base, orig_base, clone, orig, r.bytes(n)?)
        .map_err(anyhow::Error::msg)?;
    let n = r.len()?;
    let eh = r.bytes(n)?;
    let [bias, control, code, fid_base] = header.layout;
    let img = CloneImage {
        bytes: Vec::new(),
        handler: header.handler,
        restorer: header.restorer,
        code_range: header.code_range,
        tables: Tables::default(),
        functions,
        skipped: header.skipped,
        stats: header.stats,
        reverse,
        layout: Layout {
            bias,
            control,
            code,
            fid_base: u32::try_from(fid_base).context("fid base")?,
        },
        relocs,
        clones_offset: header.clones_offset,
    };
    Ok((
        plan,
        Entry {
            fdata,
            img,
            bytes,
            tables,
            eh,
            exceptions: header.exceptions,
            details,
        },
    ))
}

/// The sections of an entry, read in turn.
struct Sections<'f> {
    r: std::io::BufReader<&'f std::fs::File>,
    /// Bytes left in the file: no section may claim more.
    left: u64,
}

impl Sections<'_> {
    /// Skips `n` bytes (a section's, its length read).
    fn skip(&mut self, n: u64) -> anyhow::Result<()> {
        let n = i64::try_from(n).context("a section's length")?;
        self.r.seek_relative(n)?;
        self.left -= n as u64;
        Ok(())
    }

    fn exact(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        self.r.read_exact(buf).context("truncated")?;
        self.left = self.left.saturating_sub(buf.len() as u64);
        Ok(())
    }

    /// The next section's length.
    fn len(&mut self) -> anyhow::Result<u64> {
        let mut b = [0; 8];
        self.exact(&mut b)?;
        let n = u64::from_le_bytes(b);
        if n > self.left {
            bail!("a section of {n} bytes in {} left", self.left);
        }
        Ok(n)
    }

    fn bytes(&mut self, n: u64) -> anyhow::Result<Vec<u8>> {
        let mut v = vec![0; n as usize];
        self.exact(&mut v)?;
        Ok(v)
    }

    /// A MessagePack section.
    fn msgpack<T: serde::de::DeserializeOwned>(&mut self) -> anyhow::Result<T> {
        let n = self.len()?;
        let mut section = std::io::Read::take(&mut self.r, n);
        let v = rmp_serde::from_read(&mut section)?;
        if section.limit() != 0 {
            bail!("{} bytes left in a section", section.limit());
        }
        self.left -= n;
        Ok(v)
    }

    /// A section of `u32` words.
    fn u32s(&mut self) -> anyhow::Result<Vec<u32>> {
        let n = self.len()?;
        if !n.is_multiple_of(4) {
            bail!("a section of {n} bytes is not of 32-bit words");
        }
        let mut v = Vec::with_capacity((n / 4) as usize);
        let mut b = [0; 4];
        for _ in 0..n / 4 {
            self.exact(&mut b)?;
            v.push(u32::from_le_bytes(b));
        }
        Ok(v)
    }

    /// A section of records of `K` little-endian `u64`s, each made into a
    /// `T` by `f`.
    fn words<const K: usize, T>(&mut self, f: impl Fn([u64; K]) -> T) -> anyhow::Result<Vec<T>> {
        let n = self.len()?;
        if !n.is_multiple_of(8 * K as u64) {
            bail!("a section of {n} bytes is not of {K}-word records");
        }
        let mut v = Vec::with_capacity((n / (8 * K as u64)) as usize);
        let mut b = [0; 8];
        for _ in 0..n / (8 * K as u64) {
            let mut w = [0u64; K];
            for x in &mut w {
                self.exact(&mut b)?;
                *x = u64::from_le_bytes(b);
            }
            v.push(f(w));
        }
        Ok(v)
    }
}
