//! Shared helpers of the integration tests: build the C fixtures with gcc
//! into `CARGO_TARGET_TMPDIR`, analyse them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use userspace_rewriter::analysis::cfg::{self, Analysis};

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// The fixture source `name` (in tests/fixtures).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Compile `tests/fixtures/<src>` with gcc and `flags` into `<tmp>/<out>`
/// (once per test process; tests share outputs). With `strip`, also run
/// `strip` on the result.
pub fn build(src: &str, out: &str, flags: &[&str], strip: bool) -> PathBuf {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(out);
    if path.exists() {
        return path;
    }
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&path)
        .arg(fixture(src))
        .status()
        .expect("gcc (the tests need gcc)");
    assert!(status.success(), "gcc {flags:?} {src} failed");
    if strip {
        let status = Command::new("strip").arg(&path).status().expect("strip");
        assert!(status.success());
    }
    path
}

/// Read and analyse an ELF file.
pub fn analyse(path: &Path) -> Analysis {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    cfg::analyse(&file, &data).unwrap()
}

/// `objdump -d` of one function, for failure messages.
pub fn objdump(path: &Path, start: u64, end: u64) -> String {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-M", "intel"])
        .arg(format!("--start-address={start:#x}"))
        .arg(format!("--stop-address={end:#x}"))
        .arg(path)
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(_) => String::new(),
    }
}

/// One line per function: name, start, kind, CFG summary or skip reason.
pub fn summary(a: &Analysis) -> String {
    let mut s = String::new();
    for (f, c) in a.functions.iter().zip(&a.cfgs) {
        let what = match c {
            Ok(c) => format!(
                "{} blocks, {} edges, {} exits, {} tables",
                c.blocks.len(),
                c.edges.len(),
                c.exits.len(),
                c.jump_tables.len()
            ),
            Err(e) => format!("SKIP {e}"),
        };
        s += &format!("{:#8x} {:24} {:?}: {what}\n", f.start, f.name, f.kind);
    }
    s
}
