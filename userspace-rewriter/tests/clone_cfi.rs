//! The clones' unwind info restates the original's: at every copied
//! instruction of a clone, the CFI row (CFA rule and every register rule)
//! is the one in effect at the original instruction — also when the
//! rules are DWARF expressions that read registers and memory (OpenSSL's
//! realigned stacks, tests/fixtures/realigned.S, and libcrypto itself if
//! installed). A function whose CFA is computed from `rip` is left out.
//! And every copy lies in the clones: a `loop` (no near form) is spelled
//! out as a short branch to a near jump, not left to the encoder.
mod common;

use gimli::{
    BaseAddresses, CfaRule, EhFrame, LittleEndian, RegisterRule, UnwindContext, UnwindSection,
};
use userspace_rewriter::analysis::plan::{FunctionStatus, PlanOptions, analyze_with_insns};
use userspace_rewriter::codegen::{Layout, Recording, generate_excluding, unwind_info};

type Section<'a> = EhFrame<gimli::EndianSlice<'a, LittleEndian>>;
type Fde<'a> = gimli::FrameDescriptionEntry<gimli::EndianSlice<'a, LittleEndian>>;

/// The FDEs of a section, sorted by start.
fn fdes<'a>(eh: &Section<'a>, bases: &BaseAddresses) -> Vec<Fde<'a>> {
    let mut out = Vec::new();
    let mut entries = eh.entries(bases);
    while let Some(e) = entries.next().unwrap() {
        if let gimli::CieOrFde::Fde(p) = e {
            out.push(p.parse(EhFrame::cie_from_offset).unwrap());
        }
    }
    out.sort_by_key(|f| f.initial_address());
    out
}

/// The row at `pc` as comparable data: the CFA rule and the register
/// rules, with expressions as their bytes. (`ctx`: gimli's scratch
/// space, reused: a new one per row was most of the test's time.)
fn row_at(
    eh: &Section<'_>,
    bases: &BaseAddresses,
    fdes: &[Fde<'_>],
    pc: u64,
    ctx: &mut UnwindContext<usize>,
) -> Option<(String, Vec<String>)> {
    let i = fdes.partition_point(|f| f.initial_address() <= pc);
    let fde = fdes.get(i.checked_sub(1)?)?;
    if pc >= fde.initial_address() + fde.len() {
        return None;
    }
    let row = fde.unwind_info_for_address(eh, bases, ctx, pc).ok()?;
    let expr =
        |e: &gimli::UnwindExpression<usize>| format!("{:02x?}", e.get(eh).unwrap().0.slice());
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => format!("{}+{offset}", register.0),
        CfaRule::Expression(e) => format!("exp {}", expr(e)),
    };
    let mut regs: Vec<String> = row
        .registers()
        .map(|(r, rule)| {
            let rule = match rule {
                RegisterRule::Expression(e) => format!("exp {}", expr(e)),
                RegisterRule::ValExpression(e) => format!("valexp {}", expr(e)),
                other => format!("{other:?}"),
            };
            format!("{}: {rule}", r.0)
        })
        .collect();
    regs.sort();
    Some((cfa, regs))
}

/// Clones every function of `path` it can, and checks each copied
/// instruction's row against the original's. Returns the names of the
/// functions left out for their unwind info, how many rows with
/// expressions were compared, the original addresses (SVMAs) with a
/// copy, and how many instructions of the clones got a row of their own
/// and how many did not ([`unwind_info::CloneUnwind::rows_known`]).
fn check(path: &std::path::Path, rec: Recording) -> (Vec<String>, usize, Vec<u64>, (usize, usize)) {
    let data = std::fs::read(path).unwrap();
    let (report, analysis) = analyze_with_insns(&data, &PlanOptions::default()).unwrap();
    let plan = &report.plan;
    let starts = plan.functions.iter().filter_map(|f| match f.status {
        FunctionStatus::Analyzed(_) => Some(f.start),
        _ => None,
    });
    let exclude: std::collections::BTreeMap<u64, &'static str> =
        unwind_info::untranslatable(&data, starts)
            .into_iter()
            .map(|s| (s, "unwind info not restatable"))
            .collect();
    let excluded = plan
        .functions
        .iter()
        .filter(|f| exclude.contains_key(&f.start))
        .map(|f| f.name.clone())
        .collect();
    let bias = 0x7f00_0000_0000;
    let layout = Layout {
        bias,
        control: 0x2000_0000,
        code: bias - 0x1000_0000,
        fid_base: 0,
    };
    let img = generate_excluding(plan, &analysis, &layout, &exclude, rec).unwrap();
    let ours = unwind_info::eh_frame(&data, &img, bias).unwrap();
    // The snippets between copies get rows of their own too.
    assert!(
        ours.rows_known >= img.table().len(),
        "{} instructions with rows of their own, {} copies",
        ours.rows_known,
        img.table().len()
    );
    let clone_eh = EhFrame::new(&ours.bytes, LittleEndian);
    // Every copy is in the code (a `loop` the encoder rewrote once
    // pointed 4 GiB past it).
    for &(orig, clone) in img.table() {
        assert!(
            (img.code_range.0..img.code_range.1).contains(&clone),
            "the copy of {:#x} at {clone:#x} is outside the clones",
            orig - bias
        );
    }
    let file = object::File::parse(&*data).unwrap();
    use object::{Object, ObjectSection};
    let section = file.section_by_name(".eh_frame").unwrap();
    let orig_eh = EhFrame::new(section.data().unwrap(), LittleEndian);
    let orig_bases = BaseAddresses::default().set_eh_frame(section.address());
    let clone_bases = BaseAddresses::default();
    let orig_fdes = fdes(&orig_eh, &orig_bases);
    let clone_fdes = fdes(&clone_eh, &clone_bases);
    let mut with_expressions = 0;
    let mut starts: Vec<(u64, u64)> = plan
        .functions
        .iter()
        .map(|f| (f.start, f.start + f.size))
        .collect();
    starts.sort_unstable();
    let mut plt_stubs: Vec<(u64, u64)> = plan
        .functions
        .iter()
        .filter(|f| matches!(f.status, FunctionStatus::Plt))
        .map(|f| (f.start, f.start + f.size))
        .collect();
    plt_stubs.sort_unstable();
    let in_plt_stub = |a: u64| {
        let i = plt_stubs.partition_point(|r| r.0 <= a);
        i > 0 && a < plt_stubs[i - 1].1
    };
    let mut ctx = Box::new(UnwindContext::new());
    for &(orig, clone) in img.table() {
        // A PLT stub's trampoline has the CIE's row where a burst can
        // start in it (the return address on top), whatever the stub's
        // FDE says: a lazy `.plt`'s reads `rip`.
        if in_plt_stub(orig - bias) {
            let got = row_at(&clone_eh, &clone_bases, &clone_fdes, clone, &mut ctx);
            assert_eq!(
                got,
                Some(("7+8".to_string(), vec!["16: Offset(-8)".to_string()])),
                "the trampoline of the PLT stub at {:#x}",
                orig - bias
            );
            continue;
        }
        let Some(want) = row_at(&orig_eh, &orig_bases, &orig_fdes, orig - bias, &mut ctx) else {
            continue;
        };
        // A function whose first byte no FDE covers gets none for its
        // clone (rare: an FDE that starts inside it; not restated).
        let i = starts.partition_point(|f| f.0 <= orig - bias);
        if i == 0 || row_at(&orig_eh, &orig_bases, &orig_fdes, starts[i - 1].0, &mut ctx).is_none()
        {
            continue;
        }
        let got = row_at(&clone_eh, &clone_bases, &clone_fdes, clone, &mut ctx).unwrap_or_else(|| {
            let f = &starts[i - 1];
            let c: Vec<u64> = img
                .functions
                .iter()
                .filter(|x| x.orig() >= f.0 + bias && x.orig() < f.1 + bias)
                .map(|x| x.orig() - bias)
                .collect();
            panic!(
                "no row at the clone {clone:#x} of {:#x} (function {:#x}..{:#x}, clones {c:x?})",
                orig - bias,
                f.0,
                f.1
            )
        });
        assert_eq!(got, want, "the row at the clone of {:#x}", orig - bias);
        if want.0.starts_with("exp") || want.1.iter().any(|r| r.contains("exp")) {
            with_expressions += 1;
        }
    }
    let copied = img.table().iter().map(|&(o, _)| o - bias).collect();
    (
        excluded,
        with_expressions,
        copied,
        (ours.rows_known, ours.rows_unknown),
    )
}

#[test]
fn rows_with_expressions_are_restated_at_every_copy() {
    let path = common::build("realigned.S", "librealigned.so", &["-shared"], false);
    let (excluded, with_expressions, copied, _) = check(&path, Recording::default());
    assert_eq!(excluded, vec!["uses_rip".to_string()]);
    // The loop and the epilogue of `realigned` run under the expression.
    assert!(
        with_expressions >= 6,
        "{with_expressions} rows with expressions"
    );
    // Its `loop` has a copy (a burst can start there).
    use object::{Object, ObjectSection, ObjectSymbol};
    let data = std::fs::read(&path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok("realigned"))
        .unwrap();
    let text = file.section_by_name(".text").unwrap();
    let at = (sym.address() - text.address()) as usize;
    let bytes = &text.data().unwrap()[at..at + sym.size() as usize];
    let lp = iced_x86::Decoder::with_ip(64, bytes, sym.address(), 0)
        .iter()
        .find(|i| i.mnemonic() == iced_x86::Mnemonic::Loop)
        .expect("realigned has a loop instruction")
        .ip();
    assert!(copied.contains(&lp), "the loop at {lp:#x} has no copy");
}

#[test]
fn libcrypto_rows_are_restated_at_every_copy() {
    let path = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libcrypto.so.3");
    if !path.exists() {
        eprintln!(
            "skipped: {} is not installed (apt-get install libssl3)",
            path.display()
        );
        return;
    }
    let (excluded, with_expressions, _, (known, unknown)) = check(path, Recording::default());
    // Almost every instruction reached in the clones is at a known stack
    // height, snippets included (3,117,479 here, and 2,600 not: after a
    // realignment of the stack, until the next copy).
    assert!(
        unknown * 100 <= known,
        "{known} instructions with rows of their own, {unknown} without"
    );
    assert!(
        excluded.len() <= 10,
        "left out for their unwind info: {excluded:?}"
    );
    assert!(
        with_expressions >= 1000,
        "{with_expressions} rows with expressions"
    );
}
