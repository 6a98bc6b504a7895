//! Profiles out: profile.proto and its interning builder ([`pprof`]),
//! calling context trees → symbolized pprof ([`context`]), bursty
//! tracing's path counts → `paths.pb.gz` ([`paths`]) and BOLT's
//! `edges.fdata` ([`fdata`]), and the atomic file write every output goes
//! through.
use std::path::{Path, PathBuf};

pub(crate) mod context;
pub(crate) mod fdata;
pub(crate) mod paths;
pub(crate) mod pprof;

/// Writes `bytes` to `dir/name` atomically (a hidden temp file in `dir`,
/// then rename), creating `dir` if needed. Returns the path written.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
