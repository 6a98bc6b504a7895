//! A clone image generated for one layout and moved to another
//! (`CloneImage::relocate`, what a cached attach does) is the image a
//! generation for the other layout makes: the same bytes, tables, maps and
//! `.eh_frame`. On the system's libc (a shared library: the module, the
//! clones, the control block and the `fid`s all move), with the control
//! block mapped high (RIP-relative operands) and low (absolute ones), and
//! on a non-PIE fixture (the module stays where it is).
mod common;

use std::collections::BTreeMap;
use std::path::Path;

use userspace_rewriter::analysis::cfg::Analysis;
use userspace_rewriter::analysis::plan::{FunctionStatus, Plan, PlanOptions, analyze_with_insns};
use userspace_rewriter::codegen::{
    CloneImage, Layout, Recording, Refs, generate_excluding, unwind_info,
};

struct Module {
    data: Vec<u8>,
    plan: Plan,
    analysis: Analysis,
    exclude: BTreeMap<u64, &'static str>,
    /// What its clones record besides paths.
    rec: Recording,
}

fn module(path: &Path) -> Module {
    let data = std::fs::read(path).unwrap();
    let (report, analysis) = analyze_with_insns(&data, &PlanOptions::default()).unwrap();
    let starts = report.plan.functions.iter().filter_map(|f| match f.status {
        FunctionStatus::Analyzed(_) => Some(f.start),
        _ => None,
    });
    let exclude = unwind_info::untranslatable(&data, starts)
        .into_iter()
        .map(|s| (s, "unwind info not restatable"))
        .collect();
    Module {
        data,
        plan: report.plan,
        analysis,
        exclude,
        rec: Recording::default(),
    }
}

fn generate(m: &Module, l: &Layout) -> (CloneImage, Vec<u8>) {
    let img = generate_excluding(&m.plan, &m.analysis, l, &m.exclude, m.rec).unwrap();
    let eh = unwind_info::eh_frame(&m.data, &img, l.bias).unwrap().bytes;
    (img, eh)
}

/// Generates at `from` and at `to`, moves the first to `to`, and compares.
fn moved_equals_generated(m: &Module, from: Layout, to: Layout) {
    let (a, mut eh) = generate(m, &from);
    let (b, want_eh) = generate(m, &to);
    let r = &a.relocs;
    assert!(r.unrelocatable.is_none(), "{:?}", r.unrelocatable);
    assert!(!r.rel_orig.is_empty() && !r.fids.is_empty() && !r.orig_qwords.is_empty());
    // The clones reach their thread's burst state through `fs:` (its TCB)
    // and the slot it points to, never the control block itself: nothing
    // to move there (the runtime at the region's start is assembled anew).
    assert!(r.abs_control.is_empty() && r.rel_control.is_empty());
    let code_delta = to.code.wrapping_sub(from.code);
    // Moved piece by piece (what a daemon writing from its cache does),
    // in odd-sized pieces that would cut fields if their ends were not
    // moved: the same bytes as moved whole.
    let (whole, lazily) = (a.clone(), {
        let mut a = a.clone();
        let bytes = std::mem::take(&mut a.bytes);
        (a, bytes)
    });
    let (_, mv) = lazily
        .0
        .relocate_lazily(&to, lazily.1.len() as u64)
        .unwrap();
    let a = whole.relocate(&to).unwrap();
    // Several odd piece sizes, so that some piece end falls inside a field
    // whatever the code's layout.
    let mut cut = 0;
    for size in [509, 251, 127, 61] {
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < mv.len() {
            let end = mv.piece_end(start, start + size);
            cut += usize::from(end != (start + size).min(mv.len()));
            let mut piece = lazily.1[start as usize..end as usize].to_vec();
            mv.patch(&mut piece, start).unwrap();
            pieces.extend_from_slice(&piece);
            start = end;
        }
        assert!(
            pieces == a.bytes,
            "the bytes moved in pieces of {size} differ"
        );
    }
    assert!(cut > 0, "no piece end moved: the test cuts no field");
    unwind_info::relocate_eh_frame(&mut eh, code_delta).unwrap();
    assert_eq!(a.bytes.len(), b.bytes.len());
    if let Some(i) = (0..a.bytes.len()).find(|&i| a.bytes[i] != b.bytes[i]) {
        panic!(
            "byte {i:#x} of {} differs: moved {:02x?}, generated {:02x?}",
            a.bytes.len(),
            &a.bytes[i.saturating_sub(8)..(i + 8).min(a.bytes.len())],
            &b.bytes[i.saturating_sub(8)..(i + 8).min(b.bytes.len())],
        );
    }
    assert!(eh == want_eh, "the moved .eh_frame differs");
    assert_eq!(a.tables.insns, b.tables.insns);
    assert_eq!(a.tables.functions, b.tables.functions);
    assert_eq!(a.tables.returns, b.tables.returns);
    assert_eq!(a.reverse, b.reverse);
    let f =
        |i: &CloneImage| -> Vec<String> { i.functions.iter().map(|f| format!("{f:?}")).collect() };
    assert!(f(&a) == f(&b), "the cloned functions differ");
    assert_eq!(
        (a.handler, a.restorer, a.code_range, a.layout),
        (b.handler, b.restorer, b.code_range, b.layout)
    );
}

#[test]
fn libc_moved_equals_libc_generated() {
    let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if !path.exists() {
        eprintln!("skipped: no {}", path.display());
        return;
    }
    let m = module(path);
    // High control blocks: near the clones (RIP-relative).
    let b0 = 0x7f00_0000_0000;
    let b1 = 0x7f12_3456_0000;
    moved_equals_generated(
        &m,
        Layout {
            bias: b0,
            code: b0 - 0x1000_0000,
            control: b0 - 0x1010_0000,
            fid_base: 0,
        },
        Layout {
            bias: b1,
            code: b1 + 0x2000_0000,
            control: b1 + 0x4000_0000,
            fid_base: 12_345,
        },
    );
    // Low control blocks (absolute operands).
    moved_equals_generated(
        &m,
        Layout {
            bias: b1,
            code: b1 + 0x300_0000,
            control: 0x2000_0000,
            fid_base: 40_000,
        },
        Layout {
            bias: b0,
            code: b0 - 0x7000_0000,
            control: 0x1_0000,
            fid_base: 7,
        },
    );
}

#[test]
fn non_pie_moved_equals_non_pie_generated() {
    let exe = common::build("paths.c", "paths-nopie", &["-O2", "-no-pie"], false);
    let m = module(&exe);
    moved_equals_generated(
        &m,
        Layout {
            bias: 0,
            code: 0x1000_0000,
            control: 0x2000_0000,
            fid_base: 3,
        },
        Layout {
            bias: 0,
            code: 0x4000_0000,
            control: 0x1_0000,
            fid_base: 90,
        },
    );
}

/// In memory mode, and with tuples, the records' first words (each
/// holding its instruction's original address) move with the module: a
/// library's clones with references and value and target tuples, moved,
/// equal those generated there.
#[test]
fn memory_mode_moved_equals_generated() {
    let path = Path::new("/usr/lib/x86_64-linux-gnu/liblzma.so.5");
    if !path.exists() {
        eprintln!("skipped: no {}", path.display());
        return;
    }
    let m = Module {
        rec: Recording {
            refs: Refs::Data,
            values: true,
            targets: true,
        },
        ..module(path)
    };
    let b0 = 0x7f00_0000_0000;
    let b1 = 0x7f12_3456_0000;
    moved_equals_generated(
        &m,
        Layout {
            bias: b0,
            code: b0 - 0x1000_0000,
            control: 0x2000_0000,
            fid_base: 0,
        },
        Layout {
            bias: b1,
            code: b1 + 0x300_0000,
            control: 0x1_0000,
            fid_base: 77,
        },
    );
}

/// Moving across the 2 GiB line (the operands would change form) is
/// refused, not patched.
#[test]
fn a_control_block_moved_across_2_gib_is_refused() {
    let exe = common::build("paths.c", "paths-nopie", &["-O2", "-no-pie"], false);
    let m = module(&exe);
    let from = Layout {
        bias: 0,
        code: 0x1000_0000,
        control: 0x2000_0000,
        fid_base: 0,
    };
    let (a, _) = generate(&m, &from);
    let to = Layout {
        control: 0x1_2000_0000,
        ..from
    };
    assert!(a.relocate(&to).is_err());
}

/// A plan written as JSON (what the plan cache stores) reads back equal.
#[test]
fn a_plan_reads_back_equal() {
    let exe = common::build("paths.c", "paths-nopie", &["-O2", "-no-pie"], false);
    let m = module(&exe);
    let json = serde_json::to_vec(&m.plan).unwrap();
    let back: Plan = serde_json::from_slice(&json).unwrap();
    assert!(back == m.plan);
}
