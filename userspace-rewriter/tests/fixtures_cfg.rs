//! Function discovery, decoding and CFGs of the C fixture
//! `tests/fixtures/flow.c`, compiled here with gcc in several ways.
//!
//! The exact block/edge counts were checked by hand against `objdump -d -M
//! intel` of the gcc 12 (Debian 12.2.0) builds; the listings are quoted next
//! to each assertion.

mod common;

use std::path::PathBuf;

use userspace_rewriter::analysis::cfg::{self, EdgeKind, ExitKind, JumpTableKind, flag};
use userspace_rewriter::analysis::disasm::Flow;
use userspace_rewriter::analysis::functions::{FunctionKind, FunctionSources};

/// The builds every test can use: (name, gcc flags, stripped).
const VARIANTS: &[(&str, &[&str], bool)] = &[
    ("O0-pie", &["-O0", "-fpie", "-pie"], false),
    ("O2-pie", &["-O2", "-fpie", "-pie"], false),
    ("O3-pie", &["-O3", "-fpie", "-pie"], false),
    ("O0-nopie", &["-O0", "-fno-pie", "-no-pie"], false),
    ("O2-nopie", &["-O2", "-fno-pie", "-no-pie"], false),
    (
        "O2-cet",
        &[
            "-O2",
            "-fpie",
            "-pie",
            "-fcf-protection=full",
            "-Wl,-z,ibtplt",
        ],
        false,
    ),
    (
        "O2-lib.so",
        &["-O2", "-fPIC", "-shared", "-DNO_MAIN"],
        false,
    ),
    ("O2-pie-stripped", &["-O2", "-fpie", "-pie"], true),
    ("O2-nopie-stripped", &["-O2", "-fno-pie", "-no-pie"], true),
];

const FIXTURE_FUNCTIONS: &[&str] = &[
    "small_branch",
    "dense_switch",
    "offset_switch",
    "nested_loops",
    "fib",
    "leaf_add",
    "tail_caller",
    "die",
    "checked_div",
    "must_be_positive",
    "cold_path",
    "cold_case_switch",
];

fn build(name: &str) -> PathBuf {
    let (_, flags, strip) = VARIANTS
        .iter()
        .find(|v| v.0 == name)
        .unwrap_or_else(|| panic!("no variant {name}"));
    common::build("flow.c", name, flags, *strip)
}

/// The CFG of `name` in analysis `a`, with a readable failure.
fn cfg_of<'a>(a: &'a cfg::Analysis, name: &str) -> (usize, &'a cfg::Cfg) {
    let i = a
        .function(name)
        .unwrap_or_else(|| panic!("{name} not found"));
    match &a.cfgs[i] {
        Ok(c) => (i, c),
        Err(e) => panic!("{name} skipped: {e}"),
    }
}

#[test]
fn functions_found_in_every_build() {
    for (name, _, stripped) in VARIANTS {
        if *stripped {
            continue;
        }
        let a = common::analyse(&build(name));
        let fs = &a.functions;
        // Sorted by address, one function per address.
        assert!(fs.windows(2).all(|w| w[0].start < w[1].start), "{name}");
        for f in FIXTURE_FUNCTIONS {
            let i = a
                .function(f)
                .unwrap_or_else(|| panic!("{name}: {f} missing"));
            let fun = &fs[i];
            assert_eq!(fun.kind, FunctionKind::Normal, "{name}: {f}");
            assert!(fun.sources.contains(FunctionSources::SYMTAB), "{name}: {f}");
            assert!(
                fun.sources.contains(FunctionSources::EH_FRAME),
                "{name}: {f}"
            );
            assert!(fun.size > 0);
        }
        if name.ends_with(".so") {
            // Exported: in .dynsym as well.
            let i = a.function("dense_switch").unwrap();
            assert!(fs[i].sources.contains(FunctionSources::DYNSYM));
        } else {
            assert!(a.function("main").is_some(), "{name}");
        }
        // PLT stubs, named from .rela.plt.
        for stub in ["puts@plt", "abort@plt", "fprintf@plt", "exit@plt"] {
            let i = a
                .function(stub)
                .unwrap_or_else(|| panic!("{name}: {stub} missing\n{}", common::summary(&a)));
            assert_eq!(fs[i].kind, FunctionKind::Plt);
            assert!(fs[i].sources.contains(FunctionSources::PLT));
        }
        // Cold parts at -O2 and up: `ja default` of the switch and the
        // abort() branch of must_be_positive go to .text.unlikely.
        if name.starts_with("O2") || name.starts_with("O3") {
            for parent in ["dense_switch", "must_be_positive"] {
                let cold = format!("{parent}.cold");
                let i = a
                    .function(&cold)
                    .unwrap_or_else(|| panic!("{name}: {cold}"));
                let p = a.function(parent).unwrap();
                assert_eq!(
                    fs[i].kind,
                    FunctionKind::ColdPart { parent: Some(p) },
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn cet_build_has_plt_sec_stubs_and_endbr64() {
    let path = build("O2-cet");
    let a = common::analyse(&path);
    let puts = &a.functions[a.function("puts@plt").unwrap()];
    let lazy = &a.functions[a.function("puts@plt.lazy").unwrap()];
    // With -z ibtplt, calls go to .plt.sec (after .plt).
    assert!(puts.start > lazy.start, "{puts:?} {lazy:?}");
    let (i, c) = cfg_of(&a, "puts@plt");
    assert!(a.insns[i][0].is_endbr64());
    assert_eq!(c.exits[0].kind, ExitKind::IndirectTailCall);
    for f in FIXTURE_FUNCTIONS {
        let i = a.function(f).unwrap();
        assert!(a.insns[i][0].is_endbr64(), "{f} starts with endbr64");
        assert!(a.cfgs[i].is_ok(), "{f}: {:?}", a.cfgs[i]);
    }
    // The switch's `notrack jmp rax`.
    let (i, c) = cfg_of(&a, "dense_switch");
    let jmp = a.insns[i]
        .iter()
        .find(|x| x.addr == c.jump_tables[0].jump)
        .unwrap();
    assert_eq!(jmp.flow, Flow::IndirectJump);
    assert!(jmp.notrack, "{}", jmp.display());
}

#[test]
fn stripped_binary_finds_the_same_starts_from_eh_frame() {
    for (full, stripped) in [
        ("O2-pie", "O2-pie-stripped"),
        ("O2-nopie", "O2-nopie-stripped"),
    ] {
        let a = common::analyse(&build(full));
        let s = common::analyse(&build(stripped));
        let starts: std::collections::BTreeSet<u64> = s.functions.iter().map(|f| f.start).collect();
        let mut checked = 0;
        for f in &a.functions {
            if f.sources.contains(FunctionSources::EH_FRAME) {
                assert!(
                    starts.contains(&f.start),
                    "{stripped}: {} at {:#x} not found",
                    f.name,
                    f.start
                );
                checked += 1;
            }
        }
        assert!(checked >= FIXTURE_FUNCTIONS.len());
        // Without .symtab, FDE-only functions are named sub_<hex>; PLT names
        // still come from .rela.plt.
        assert!(
            s.functions
                .iter()
                .all(|f| !f.sources.contains(FunctionSources::SYMTAB))
        );
        let ds = a.functions[a.function("dense_switch").unwrap()].start;
        let sf = s.functions.iter().find(|f| f.start == ds).unwrap();
        assert_eq!(sf.name, format!("sub_{ds:x}"));
        assert!(s.function("puts@plt").is_some());
        // Same CFG shape for every fixture function.
        for name in FIXTURE_FUNCTIONS {
            let (_, c) = cfg_of(&a, name);
            let i = s
                .functions
                .iter()
                .position(|f| f.start == c.function)
                .unwrap();
            let sc = s.cfgs[i]
                .as_ref()
                .unwrap_or_else(|e| panic!("{stripped} {name}: {e}"));
            assert_eq!(sc.blocks, c.blocks, "{stripped} {name}");
            assert_eq!(sc.edges, c.edges, "{stripped} {name}");
        }
    }
}

/// small_branch at -O2 (PIE):
/// ```text
/// 1260: test   edi,edi                         B0
/// 1262: jle    126e <small_branch+0xe>         B0 -> B2 (Taken), B1 (NotTaken)
/// 1264: mov    DWORD PTR [rip+0x2dde],0x1      B1 -> B2 (FallThrough)
/// 126e: lea    eax,[rdi+0x1]                   B2
/// 1271: ret                                    B2: exit Return
/// ```
/// With -fcf-protection=full an `endbr64` comes first; same shape.
#[test]
fn small_branch_exact_cfg_and_liveness() {
    for variant in ["O2-pie", "O2-cet", "O2-nopie", "O3-pie"] {
        let a = common::analyse(&build(variant));
        let (i, c) = cfg_of(&a, "small_branch");
        let f = &a.functions[i];
        let listing = common::objdump(&build(variant), f.start, f.end());
        assert_eq!(c.blocks.len(), 3, "{variant}\n{listing}");
        let kinds: Vec<(usize, usize, EdgeKind)> =
            c.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, 2, EdgeKind::Taken),
                (0, 1, EdgeKind::NotTaken),
                (1, 2, EdgeKind::FallThrough)
            ],
            "{variant}\n{listing}"
        );
        assert_eq!(c.exits.len(), 1);
        assert_eq!(c.exits[0].block, 2);
        assert_eq!(c.exits[0].kind, ExitKind::Return);
        let g = c.to_graph();
        assert_eq!(g.succs, vec![vec![2, 1], vec![2], vec![]]);
        assert_eq!((g.entry, g.exits.clone()), (0, vec![2]));

        // Liveness. Registers: bit 0 rax, 7 rdi.
        let live = cfg::liveness(c, &a.insns[i]);
        let insns = &a.insns[i];
        let at = |m: &str| {
            let k = insns
                .iter()
                .position(|x| x.display().starts_with(m))
                .unwrap();
            live[k]
        };
        let test = at("test");
        assert!(test.regs & (1 << 7) != 0, "rdi live at entry");
        assert!(test.regs & 1 == 0, "rax dead at entry");
        assert!(
            !test.status_flags_live(),
            "test writes the flags: dead before it"
        );
        let jle = at("jle");
        assert_eq!(
            jle.flags & (flag::ZF | flag::SF | flag::OF),
            flag::ZF | flag::SF | flag::OF
        );
        let lea = at("lea");
        assert!(lea.regs & (1 << 7) != 0 && lea.regs & 1 == 0 && !lea.status_flags_live());
        let ret = at("ret");
        assert!(ret.regs & 1 != 0, "rax live at ret");
        assert!(ret.regs & (1 << 3) != 0, "rbx (callee-saved) live at ret");
        assert!(!ret.status_flags_live());
    }
}

/// -O2 (PIE):
/// ```text
/// tail_caller:
/// 15a0: mov    esi,0x7
/// 15a5: jmp    1590 <leaf_add>        one block, exit TailCall(leaf_add)
///
/// checked_div:
/// 15e0: test   esi,esi                B0
/// 15e2: je     15ea                   B0 -> B2 (Taken), B1 (NotTaken)
/// 15e4: mov eax,edi; cdq; idiv esi    B1
/// 15e9: ret                           B1: exit Return
/// 15ea: push rax; lea rdi,[rip+..]    B2
/// 15f2: call   15b0 <die>             B2: exit NoReturnCall(die): die is
///                                     inferred noreturn (its exit is
///                                     `call exit@plt`)
///
/// must_be_positive:
/// 1600: test   edi,edi                B0
/// 1602: jle    1098 <must_be_positive.cold>   exit ColdJump; B0 -> B1 (NotTaken)
/// 1608: lea    eax,[rdi+rdi*1]        B1
/// 160b: ret                           B1: exit Return
/// ```
#[test]
fn tail_calls_noreturn_and_cold_jumps() {
    let path = build("O2-pie");
    let a = common::analyse(&path);
    let start = |n: &str| a.functions[a.function(n).unwrap()].start;

    let (_, c) = cfg_of(&a, "tail_caller");
    assert_eq!(c.blocks.len(), 1);
    assert!(c.edges.is_empty());
    assert_eq!(c.exits.len(), 1);
    assert_eq!(
        c.exits[0].kind,
        ExitKind::TailCall {
            target: start("leaf_add")
        }
    );

    assert!(a.noreturn.contains(&start("die")), "die inferred noreturn");
    assert!(a.noreturn.contains(&start("exit@plt")));
    assert!(a.noreturn.contains(&start("abort@plt")));
    assert!(!a.noreturn.contains(&start("checked_div")));

    let (_, c) = cfg_of(&a, "checked_div");
    assert_eq!(c.blocks.len(), 3);
    let kinds: Vec<(usize, usize, EdgeKind)> =
        c.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
    assert_eq!(
        kinds,
        vec![(0, 2, EdgeKind::Taken), (0, 1, EdgeKind::NotTaken)]
    );
    let exits: Vec<(usize, ExitKind)> = c.exits.iter().map(|e| (e.block, e.kind)).collect();
    assert_eq!(
        exits,
        vec![
            (1, ExitKind::Return),
            (
                2,
                ExitKind::NoReturnCall {
                    target: Some(start("die"))
                }
            )
        ]
    );

    let (_, c) = cfg_of(&a, "must_be_positive");
    assert_eq!(c.blocks.len(), 2);
    assert_eq!(c.edges.len(), 1);
    assert_eq!(c.edges[0].kind, EdgeKind::NotTaken);
    let exits: Vec<(usize, ExitKind)> = c.exits.iter().map(|e| (e.block, e.kind)).collect();
    assert_eq!(
        exits,
        vec![
            (
                0,
                ExitKind::ColdJump {
                    target: start("must_be_positive.cold")
                }
            ),
            (1, ExitKind::Return)
        ]
    );
    // The cold part: `call abort@plt`, a noreturn call.
    let (_, c) = cfg_of(&a, "must_be_positive.cold");
    assert_eq!(
        c.exits[0].kind,
        ExitKind::NoReturnCall {
            target: Some(start("abort@plt"))
        }
    );

    // Recursion: fib calls itself.
    let (_, c) = cfg_of(&a, "fib");
    assert!(c.calls.iter().any(|s| s.target == Some(start("fib"))));
}

/// The switches of every build: one jump table each, 10 entries for
/// `dense_switch` (`cmp edi,0x9; ja default`), 12 for `offset_switch`
/// (`sub edi,0x64; cmp dil,0xb; ja default; movzx edi,dil`), and the block
/// ending in the indirect jump has one `JumpTable` edge per distinct target.
/// -O2 PIE:
/// ```text
/// 1284: cmp    edi,0x9
/// 1287: ja     1090 <dense_switch.cold>
/// 128d: lea    rdx,[rip+0xda4]
/// 1294: mov    edi,edi
/// 1296: movsxd rax,DWORD PTR [rdx+rdi*4]
/// 129a: add    rax,rdx
/// 129d: jmp    rax
/// ```
/// -O2 non-PIE: `jmp QWORD PTR [rdi*8+0x402010]`, -O0 non-PIE: `mov rax,
/// QWORD PTR [rax*8+0x402010]; jmp rax` (absolute entries); -O0 PIE:
/// `mov eax,[rbp-0x4]; lea rdx,[rax*4]; lea rax,[rip+T]; mov eax,[rdx+rax];
/// cdqe; lea rdx,[rip+T]; add rax,rdx; jmp rax`, guarded by
/// `cmp DWORD PTR [rbp-0x4],0x9; ja`.
#[test]
fn every_jump_table_is_recovered() {
    for (name, _, stripped) in VARIANTS {
        let path = build(name);
        let a = common::analyse(&path);
        let full = if *stripped {
            common::analyse(&build(&name.replace("-stripped", "")))
        } else {
            common::analyse(&path)
        };
        for (func, entries) in [("dense_switch", 10), ("offset_switch", 12)] {
            let start = full.functions[full.function(func).unwrap()].start;
            let i = a.functions.iter().position(|f| f.start == start).unwrap();
            let c = a.cfgs[i].as_ref().unwrap_or_else(|e| {
                panic!(
                    "{name} {func}: {e}\n{}",
                    common::objdump(&path, start, a.functions[i].end())
                )
            });
            assert_eq!(c.jump_tables.len(), 1, "{name} {func}");
            let t = &c.jump_tables[0];
            assert_eq!(t.targets.len(), entries, "{name} {func}");
            let expected_kind = if name.contains("nopie") {
                JumpTableKind::Absolute64
            } else {
                JumpTableKind::PicRelative32
            };
            assert_eq!(t.kind, expected_kind, "{name} {func}");
            let b = c.block_at(t.jump).unwrap();
            let distinct: std::collections::BTreeSet<u64> = t
                .targets
                .iter()
                .copied()
                .filter(|&x| a.functions[i].contains(x))
                .collect();
            let succs: Vec<usize> = c.succs(b).collect();
            assert_eq!(succs.len(), distinct.len(), "{name} {func}");
            assert!(
                c.edges
                    .iter()
                    .filter(|e| e.from == b)
                    .all(|e| e.kind == EdgeKind::JumpTable)
            );
            // Every case body is a block start.
            for x in &distinct {
                assert!(
                    c.blocks.iter().any(|bl| bl.start == *x),
                    "{name} {func}: {x:#x}"
                );
            }
            // Cases are distinct code here: at least 9 distinct targets.
            assert!(
                distinct.len() >= entries - 1,
                "{name} {func}: {distinct:x?}"
            );
        }
    }
}

#[test]
fn no_fixture_function_is_skipped() {
    for (name, _, _) in VARIANTS {
        let a = common::analyse(&build(name));
        let skipped: Vec<String> = a
            .functions
            .iter()
            .zip(&a.cfgs)
            .filter_map(|(f, c)| c.as_ref().err().map(|e| format!("{}: {e}", f.name)))
            .collect();
        assert!(skipped.is_empty(), "{name}: {skipped:#?}");
        let (ok, total) = a.coverage();
        eprintln!("{name}: {ok}/{total} functions analysable");
    }
}

#[test]
fn loops_have_back_edges() {
    for name in ["O0-pie", "O2-pie", "O3-pie"] {
        let a = common::analyse(&build(name));
        for func in ["nested_loops", "cold_path"] {
            let (_, c) = cfg_of(&a, func);
            // A back edge goes to a block at or before its source.
            let back = c
                .edges
                .iter()
                .filter(|e| c.blocks[e.to].start <= c.blocks[e.from].start)
                .count();
            let want = if func == "nested_loops" { 2 } else { 1 };
            assert!(back >= want, "{name} {func}: {back} back edges\n{c:#?}");
        }
    }
}

#[test]
fn plan_types_serialize_deterministically() {
    let path = build("O2-pie");
    let a = common::analyse(&path);
    let b = common::analyse(&path);
    let ja = serde_json::to_string(&(&a.functions, &a.cfgs)).unwrap();
    let jb = serde_json::to_string(&(&b.functions, &b.cfgs)).unwrap();
    assert_eq!(ja, jb);
    assert!(
        ja.contains("\"sources\":[\"symtab\",\"eh_frame\"]"),
        "{}",
        &ja[..400]
    );
    assert!(ja.contains("\"JumpTable\""));
    assert!(ja.contains("\"ColdPart\":{\"parent\":"));
}

/// A stripped shared library keeps its exported names in `.dynsym` but its
/// `.cold` parts become unnamed FDE ranges that jump back into the middle of
/// their (named) parents: those jumps are `ColdJump` exits, not
/// `JumpOutsideFunction` skips (seen at scale in a stripped python3).
#[test]
fn stripped_library_cold_parts_jump_back_to_named_parents() {
    let path = common::build(
        "flow.c",
        "O2-lib-stripped.so",
        &["-O2", "-fPIC", "-shared", "-DNO_MAIN"],
        true,
    );
    let a = common::analyse(&path);
    let unnamed_cold_jumps = a
        .functions
        .iter()
        .zip(&a.cfgs)
        .filter(|(f, _)| f.name.starts_with("sub_"))
        .filter_map(|(_, c)| c.as_ref().ok())
        .flat_map(|c| &c.exits)
        .filter(|e| matches!(e.kind, cfg::ExitKind::ColdJump { .. }))
        .count();
    assert!(
        unnamed_cold_jumps > 0,
        "expected unnamed .cold parts jumping back to their parents"
    );
    let (ok, total) = a.coverage();
    assert_eq!(ok, total, "skips: {:?}", a.skip_histogram());
}
