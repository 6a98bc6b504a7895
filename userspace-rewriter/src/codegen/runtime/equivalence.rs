//! Differential test against the runtime `clone.rs` emits today.
//!
//! The two are not comparable byte for byte (`CodeAssembler` picks other,
//! equivalent encodings), so both are run from the same states and their
//! effects compared: every byte of the control block, the ring, the tables
//! and the ucontext, the return-address slot, and every register a routine
//! must preserve (plus rax where it is a result).
//!
//! The old runtime comes from `clone::generate` with an empty plan: its
//! code is then the runtime alone. Only the handler and restorer addresses
//! are public, so the routines' entries are found by decoding (see
//! [`old_entries`]). This test goes when `clone.rs` uses this module.
use std::collections::BTreeSet;

use burstyd_common::burst::{PATH_INVALID, ShadowEntry};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};

use super::testing::{CLONE_HI, CLONE_LO, FRAME_CLOBBERS, Harness, Regs};
use super::{NO_PATH, Runtime};
use crate::codegen::{Layout, generate};

/// The old runtime, generated for `h`'s control block at code page 1.
fn old_runtime(h: &Harness) -> Runtime {
    let plan = crate::analysis::plan::Plan {
        build_id: None,
        pie: false,
        k: 0,
        summary: Default::default(),
        functions: Vec::new(),
    };
    let analysis = crate::analysis::cfg::Analysis {
        functions: Vec::new(),
        insns: Vec::new(),
        cfgs: Vec::new(),
        noreturn: Vec::new(),
    };
    let code = h.code_page(1);
    let layout = Layout {
        bias: 0,
        control: h.control(),
        code,
    };
    let image = generate(&plan, &analysis, &layout).expect("old runtime");
    assert_eq!((image.table_len, image.fn_table_len), (0, 0));
    let len = (image.code_range.1 - code) as usize;
    let bytes = image.bytes[..len].to_vec();
    let e = old_entries(&bytes, code);
    assert_eq!((e[7], e[8]), (image.handler, image.restorer));
    Runtime {
        bytes,
        emit: e[0],
        lookup: e[1],
        lookup_fn: e[2],
        end: e[3],
        enter: e[4],
        back: e[5],
        exit: e[6],
        handler: e[7],
        restorer: e[8],
    }
}

/// The routines' entries in emission order (emit, lookup, lookup_fn, end,
/// enter, back, exit, handler, restorer): the first instruction, and every
/// instruction after a `ret`, `jmp` or `int3` that no branch targets.
fn old_entries(bytes: &[u8], ip: u64) -> Vec<u64> {
    let insns: Vec<Instruction> = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE)
        .into_iter()
        .collect();
    let targets: BTreeSet<u64> = insns
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            )
        })
        .map(|i| i.near_branch_target())
        .collect();
    let mut entries = vec![ip];
    for w in insns.windows(2) {
        let ends = matches!(
            w[0].flow_control(),
            FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::Interrupt
        );
        if ends && !targets.contains(&w[1].ip()) {
            entries.push(w[1].ip());
        }
    }
    assert_eq!(entries.len(), 9, "routine entries {entries:x?}");
    // Cross-check: the handler calls rt_lookup and rt_emit.
    let calls: BTreeSet<u64> = insns
        .iter()
        .filter(|i| i.is_call_near() && i.ip() >= entries[7])
        .map(|i| i.near_branch_target())
        .collect();
    assert_eq!(calls, BTreeSet::from([entries[0], entries[1]]));
    entries
}

/// xorshift64*: deterministic, good enough to pick cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// A sorted table of up to 5 pairs over a few nearby originals.
fn random_table(r: &mut Rng) -> Vec<(u64, u64)> {
    let mut t: Vec<(u64, u64)> = (0..r.below(6))
        .map(|_| (0x40_1000 + 4 * r.below(12), CLONE_LO + 8 * r.below(64)))
        .collect();
    t.sort_unstable();
    t.dedup_by_key(|e| e.0);
    t
}

/// A random state of everything the routines read.
fn randomize(h: &mut Harness, r: &mut Rng) {
    let table = random_table(r);
    h.set_table(&table);
    let fn_table = random_table(r);
    h.set_fn_table(&fn_table);
    let p = h.prog_rsp();
    let depth = r.below(6) as usize;
    for i in 0..depth {
        let rsp = p.wrapping_add_signed(r.pick(&[-0x80, -0x40, -8, 0, 8, 0x40, 0x100]));
        let any = r.next();
        let path = r.pick(&[0, 7, PATH_INVALID, any]);
        h.ctl_mut().shadow[i] = ShadowEntry { rsp, path };
    }
    let originals = [0x40_1000, 0x40_1004, 0x40_1008, 0x40_1013, 0x40_2000];
    let orig = r.pick(&originals);
    let ret = r.pick(&[CLONE_LO, CLONE_HI - 1, CLONE_HI, CLONE_LO - 1, orig]);
    h.set_ret_slot(ret);
    let rip = r.pick(&originals);
    h.set_uc_word(super::handler::UC_RIP as usize, rip);
    let (any1, any2) = (r.next(), r.next());
    let head = 2 * r.below(40);
    let used = (2 * r.below(9)).min(head);
    let c = h.ctl_mut();
    c.depth = depth as u64;
    c.armed = r.below(2) as u32;
    c.active = r.pick(&[0, 0, 1]);
    c.burst_len = r.pick(&[0, 1, 50, u64::MAX]);
    c.budget = r.pick(&[0, 1, 2, 1000, u64::MAX]);
    c.owner = r.pick(&[0, any1]);
    c.path = r.pick(&[0, 5, PATH_INVALID, any2]);
    c.head = head;
    c.tail = head - used;
    for n in [
        &mut c.ended,
        &mut c.bursts,
        &mut c.lost_records,
        &mut c.truncated,
    ] {
        *n = r.below(3);
    }
}

/// One routine call: (which, name, args, what it may clobber, rax a
/// result).
type Case = (
    fn(&Runtime) -> u64,
    &'static str,
    Regs,
    &'static [&'static str],
    bool,
);

fn random_case(r: &mut Rng, ucontext: u64) -> Case {
    let mut regs = Regs::sentinel();
    let (any, small) = (r.next(), r.below(8));
    regs.rax = r.pick(&[any, small, 0x40_1004, 0x40_1008]);
    match r.below(8) {
        0 => {
            regs.rdx = r.next();
            (|rt| rt.emit, "emit", regs, &["rcx"], false)
        }
        1 => (|rt| rt.lookup, "lookup", regs, FRAME_CLOBBERS, true),
        2 => (|rt| rt.lookup_fn, "lookup_fn", regs, FRAME_CLOBBERS, true),
        3 => (|rt| rt.end, "end", regs, FRAME_CLOBBERS, false),
        4 => (|rt| rt.enter, "enter", regs, FRAME_CLOBBERS, false),
        5 => (|rt| rt.back, "back", regs, FRAME_CLOBBERS, false),
        6 => {
            regs.rax = r.below(100) | r.pick(&[0, u64::from(NO_PATH)]);
            regs.rcx = r.below(4);
            (|rt| rt.exit, "exit", regs, FRAME_CLOBBERS, false)
        }
        _ => {
            (regs.rdi, regs.rsi, regs.rdx) = (40, 0x1234, ucontext);
            let clobbers: &[&str] = &["rax", "rcx", "rdx", "rsi", "rdi", "r9", "r10", "r11"];
            (|rt| rt.handler, "handler", regs, clobbers, false)
        }
    }
}

/// 4000 random calls: the old and the new runtime leave the same state.
#[test]
fn same_behaviour_as_the_clone_rs_runtime() {
    let mut h = Harness::new();
    let old = old_runtime(&h);
    h.load(1, &old.bytes);
    let new = h.rt.clone();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seen = BTreeSet::new();
    for i in 0..4000 {
        randomize(&mut h, &mut r);
        let (which, name, regs, clobbers, result) = random_case(&mut r, h.ucontext());
        seen.insert(name);
        let start = h.data();
        let old_regs = h.call(which(&old), regs);
        let old_data = h.data();
        h.set_data(&start);
        let new_regs = h.call(which(&new), regs);
        let new_data = h.data();
        regs.assert_preserved(&new_regs, clobbers);
        if result {
            assert_eq!(old_regs.rax, new_regs.rax, "case {i}: {name} result");
        }
        assert_eq!(old_data.1, new_data.1, "case {i}: {name} return address");
        if old_data.0 != new_data.0 {
            let at = (0..old_data.0.len())
                .find(|&k| old_data.0[k] != new_data.0[k])
                .unwrap();
            panic!(
                "case {i}: {name} differs at byte {at:#x} of the mapping: old {:#x}, new {:#x}",
                old_data.0[at], new_data.0[at]
            );
        }
        // And the old one keeps the same register contract.
        regs.assert_preserved(&old_regs, clobbers);
    }
    assert_eq!(seen.len(), 8, "every routine was called");
}
