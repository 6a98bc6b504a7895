//! Profiles out: profile.proto and its interning builder ([`pprof`]),
//! calling context trees → symbolized pprof ([`context`]), bursty
//! tracing's path counts → `paths.pb.gz` ([`paths`]) and BOLT's
//! `edges.fdata` ([`fdata`]), hot data streams for the push destinations
//! ([`streams`]), the tuple profiles → `values.pb.gz` and `targets.pb.gz`
//! ([`tuples`]), and the atomic file write every output goes through.
use std::path::{Path, PathBuf};

pub(crate) mod context;
pub(crate) mod fdata;
pub(crate) mod leaves;
pub(crate) mod paths;
pub(crate) mod pprof;
pub(crate) mod streams;
pub(crate) mod summary;
pub(crate) mod tuples;

/// Writes `bytes` to `dir/name` atomically (a hidden temp file in `dir`,
/// then rename), creating `dir` if needed, with mode
/// [`crate::sys::OUTPUT_MODE`] (less the umask). Returns the path written. On
/// failure (a full disk, EIO, a read-only file system) the temp file is
/// removed: nothing but whole profiles is ever left in `dir`.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = crate::sys::create_output_file(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// Checks, before anything runs, that profiles can be written to `dir`:
/// creates it if needed, then creates and removes a file in it.
pub(crate) fn check_output_dir(dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    if dir.is_file() {
        anyhow::bail!("the output directory {} is a file", dir.display());
    }
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!("the output directory {} is not a directory", dir.display());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    let probe = dir.join(format!(".burstyd-write-test.{}", std::process::id()));
    std::fs::File::create(&probe)
        .with_context(|| format!("cannot write to the output directory {}", dir.display()))?;
    std::fs::remove_file(&probe)
        .with_context(|| format!("cannot write to the output directory {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let dir = std::env::temp_dir().join(format!("burstyd-write-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The rename fails: the target is a non-empty directory.
        std::fs::create_dir_all(dir.join("p.pb.gz/x")).unwrap();
        assert!(super::write_atomic(&dir, "p.pb.gz", b"abc").is_err());
        assert!(!dir.join(".p.pb.gz.tmp").exists());
        let ok = super::write_atomic(&dir, "q.pb.gz", b"abc").unwrap();
        assert_eq!(std::fs::read(&ok).unwrap(), b"abc");
        // Not readable by every user: the owner and, where the umask
        // leaves it, the group (the tests' umask is 022, the service's
        // 077). A file replaced takes the mode too.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ok) & 0o137, 0, "{:o}", mode(&ok));
        assert_eq!(mode(&ok) & 0o600, 0o600, "{:o}", mode(&ok));
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o644)).unwrap();
        let again = super::write_atomic(&dir, "q.pb.gz", b"de").unwrap();
        assert_eq!(mode(&again) & 0o137, 0, "{:o}", mode(&again));
        assert!(super::check_output_dir(&dir.join("q.pb.gz")).is_err());
        assert!(super::check_output_dir(&dir.join("new/sub")).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
