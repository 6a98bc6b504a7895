//! Every skip reason on a hand-written function (tests/fixtures/skips.c),
//! and the accepting twin of the unresolvable table.

mod common;

use userspace_rewriter::analysis::cfg::{EdgeKind, ExitKind, SkipReason};

#[test]
fn hand_written_functions_get_their_skip_reason() {
    let path = common::build("skips.c", "skips.so", &["-O2", "-shared", "-fPIC"], false);
    let a = common::analyse(&path);
    let get = |n: &str| {
        let i = a
            .function(n)
            .unwrap_or_else(|| panic!("{n}\n{}", common::summary(&a)));
        (&a.functions[i], &a.cfgs[i])
    };
    let listing = |n: &str| {
        let (f, _) = get(n);
        common::objdump(&path, f.start, f.end())
    };
    let reason = |n: &str| {
        get(n)
            .1
            .clone()
            .err()
            .unwrap_or_else(|| panic!("{n} not skipped\n{}", listing(n)))
    };

    assert!(
        matches!(
            reason("overlap"),
            SkipReason::OverlappingInstructions { .. }
        ),
        "{}",
        listing("overlap")
    );
    assert!(
        matches!(
            reason("into_middle"),
            SkipReason::JumpIntoInstruction { .. }
        ),
        "{}",
        listing("into_middle")
    );
    assert!(matches!(
        reason("data_in_code"),
        SkipReason::DataInCode { .. }
    ));
    assert!(matches!(
        reason("unbounded_table"),
        SkipReason::UnresolvedIndirectJump { .. }
    ));
    // A guard on a copy of the index: accepted only where the copy
    // provably holds the index on every path to the guard.
    let (_, c) = get("copy_guarded_table");
    let c = c
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}\n{}", listing("copy_guarded_table")));
    assert_eq!(c.jump_tables.len(), 1);
    assert_eq!(c.jump_tables[0].targets.len(), 2);
    let (_, c) = get("loop_copy_guarded_table");
    let c = c
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}\n{}", listing("loop_copy_guarded_table")));
    assert_eq!(c.jump_tables[0].targets.len(), 2);
    assert!(matches!(
        reason("stale_copy_table"),
        SkipReason::UnresolvedIndirectJump { .. }
    ));
    assert!(matches!(
        reason("falls_off"),
        SkipReason::FallsOffEnd { .. }
    ));
    assert!(matches!(
        reason("pushed_jump"),
        SkipReason::UnresolvedIndirectJump { .. }
    ));

    // bounded_table: B0 `cmp edi,1; ja 8f` (-> B2 Taken, B1 NotTaken),
    // B1 `lea; mov; movsxd; add; jmp rax` (-> B3, B4: JumpTable), B2 `xor;
    // ret`, B3 `mov eax,1; ret`, B4 `mov eax,2; ret`.
    let (_, c) = get("bounded_table");
    let c = c
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}\n{}", listing("bounded_table")));
    assert_eq!(c.jump_tables.len(), 1);
    assert_eq!(c.jump_tables[0].targets.len(), 2);
    let b = c.block_at(c.jump_tables[0].jump).unwrap();
    let table_edges: Vec<_> = c.edges.iter().filter(|e| e.from == b).collect();
    assert_eq!(table_edges.len(), 2);
    assert!(table_edges.iter().all(|e| e.kind == EdgeKind::JumpTable));
    assert_eq!(c.blocks.len(), 5);
    let edges: Vec<_> = c.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
    assert_eq!(
        edges,
        vec![
            (0, 2, EdgeKind::Taken),
            (0, 1, EdgeKind::NotTaken),
            (1, 3, EdgeKind::JumpTable),
            (1, 4, EdgeKind::JumpTable)
        ]
    );
    assert_eq!(c.exits.len(), 3);

    // lock_skip: B0 `test; je 1f` -> B1 `lock addl; ret` (the taken side
    // one byte into it, redirected to it: one edge for both sides).
    let (_, c) = get("lock_skip");
    let c = c
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}\n{}", listing("lock_skip")));
    let edges: Vec<_> = c.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
    assert_eq!(
        edges,
        vec![(0, 1, EdgeKind::Taken)],
        "{}",
        listing("lock_skip")
    );

    let (_, c) = get("mem_guarded_table");
    let c = c
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}\n{}", listing("mem_guarded_table")));
    assert_eq!(c.jump_tables.len(), 1, "{}", listing("mem_guarded_table"));
    assert_eq!(c.jump_tables[0].targets.len(), 2);
    assert!(
        matches!(
            reason("mem_guard_overwritten"),
            SkipReason::UnresolvedIndirectJump { .. }
        ),
        "{}",
        listing("mem_guard_overwritten")
    );

    let (_, c) = get("ptr_tail_call");
    let c = c.as_ref().unwrap();
    assert_eq!(c.exits[0].kind, ExitKind::IndirectTailCall);

    let (_, c) = get("mem_tail_call");
    let c = c.as_ref().unwrap();
    assert_eq!(c.exits[0].kind, ExitKind::IndirectTailCall);

    let (_, c) = get("mem_indexed_jump");
    assert!(
        matches!(c, Err(SkipReason::UnresolvedIndirectJump { .. })),
        "{c:?}"
    );
}
