//! Inputs the fuzzer (userspace-rewriter/fuzz) found to crash the analyser,
//! kept as regression tests: each must give a plan or an error, never a
//! panic. Named after the line that panicked:
//! - functions.rs:222 — `.text` with `sh_addr + sh_size` past 2^64;
//! - functions.rs:279 — a symbol with `st_value + st_size` past 2^64;
//! - functions.rs:306 — a `.plt` section without SHF_EXECINSTR;
//! - crash-442a8b50… — the fuzzer's own first input (same as :222).
use std::path::Path;

use userspace_rewriter::analysis::plan::{self, PlanOptions};

#[test]
fn fuzzer_crashes_stay_fixed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let r = std::panic::catch_unwind(|| {
            plan::analyze(&data, &PlanOptions::default()).map(|r| r.plan)
        });
        assert!(r.is_ok(), "{name}: the analyser panicked");
        n += 1;
    }
    assert!(n >= 4, "only {n} regression inputs in {}", dir.display());
}
