//! `burstyd analyze --json` over the machine's own ELF files: a
//! deterministic sample of those under /usr/lib and /usr/bin (the files
//! whose path hashes lowest, and always the largest shared libraries).
//! Each either succeeds with valid JSON naming the file, or fails with one
//! line that names the file: no bare message, no panic, no death by a
//! signal.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use burstyd_tests::*;

/// Files picked by their path's hash.
const SAMPLED: usize = 36;
/// The largest shared libraries, always analysed.
const LARGEST_SO: usize = 3;

/// FNV-1a: a hash that is the same on every run and toolchain.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Every regular ELF file under `roots` (symbolic links not followed,
/// each inode once), with its size.
fn elves(roots: &[&str]) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<PathBuf> = roots.iter().map(PathBuf::from).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            if !meta.is_file() || !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            let mut magic = [0u8; 4];
            let is_elf = std::fs::File::open(&path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && magic == *b"\x7fELF";
            if is_elf {
                out.push((path, meta.len()));
            }
        }
    }
    out
}

/// The sample: the `SAMPLED` files whose paths hash lowest, and the
/// `LARGEST_SO` largest shared libraries.
fn sample() -> Vec<PathBuf> {
    let all = elves(&["/usr/lib", "/usr/bin"]);
    assert!(all.len() > 100, "only {} ELF files found", all.len());
    let mut by_hash: Vec<&(PathBuf, u64)> = all.iter().collect();
    by_hash.sort_by_key(|(p, _)| (fnv1a(&p.to_string_lossy()), p.clone()));
    let mut by_size: Vec<&(PathBuf, u64)> = all
        .iter()
        .filter(|(p, _)| p.file_name().unwrap().to_string_lossy().contains(".so"))
        .collect();
    by_size.sort_by_key(|(p, size)| (std::cmp::Reverse(*size), p.clone()));
    let mut picked: Vec<PathBuf> = by_size
        .iter()
        .take(LARGEST_SO)
        .chain(by_hash.iter().take(SAMPLED))
        .map(|(p, _)| p.clone())
        .collect();
    picked.dedup();
    picked
}

/// What `burstyd analyze --json FILE` did wrong, if anything.
fn check(file: &Path) -> Option<String> {
    let name = file.to_str().unwrap();
    let f = run_timeout(
        Command::new(burstyd_bin()).args(["analyze", "--json", name]),
        Duration::from_secs(300),
    );
    if let Some(sig) = f.status.signal() {
        return Some(format!("{name}: killed by signal {sig}\n{}", f.describe()));
    }
    if f.stderr.contains("panicked") || f.status.code() == Some(101) {
        return Some(format!("{name}: panicked\n{}", f.describe()));
    }
    if f.status.success() {
        let v: serde_json::Value = match serde_json::from_slice(&f.stdout) {
            Ok(v) => v,
            Err(e) => return Some(format!("{name}: invalid JSON ({e})\n{}", f.describe())),
        };
        if v["file"].as_str() != Some(name) || !v["functions_total"].is_u64() {
            return Some(format!(
                "{name}: JSON without its file and functions: {v:.300}"
            ));
        }
        if !v["paths_total"].is_number() {
            return Some(format!("{name}: paths_total is not a number: {v:.300}"));
        }
        return None;
    }
    // A failure: one line, `burstyd: error: ...`, that names the file.
    let lines: Vec<&str> = f.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let ok = f.status.code() == Some(1)
        && lines.len() == 1
        && lines[0].starts_with("burstyd: error: ")
        && lines[0].contains(name);
    (!ok).then(|| {
        format!(
            "{name}: failed without one error line naming the file\n{}",
            f.describe()
        )
    })
}

#[test]
fn analyze_json_succeeds_or_names_the_file_on_the_machines_elves() {
    let files = sample();
    eprintln!("analysing {} ELF files: {files:#?}", files.len());
    let queue = Mutex::new(files.clone());
    let problems = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let Some(file) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    if let Some(p) = check(&file) {
                        problems.lock().unwrap().push(p);
                    }
                }
            });
        }
    });
    let problems = problems.into_inner().unwrap();
    assert!(
        problems.is_empty(),
        "{} of {} files:\n{}",
        problems.len(),
        files.len(),
        problems.join("\n\n")
    );
}
