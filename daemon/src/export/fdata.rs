//! `edges.fdata`: the edge profile the path counts of bursty tracing imply,
//! in BOLT's branch-profile format, for `llvm-bolt -data=`, with the
//! indirect calls the call-target profile saw ([`indirect_calls`]).
use std::collections::{BTreeMap, HashMap};

use crate::bursts::counts::PathView;
use crate::bursts::decode::TupleKind;
use crate::bursts::facts::{ModuleFacts, PathFacts};
use crate::bursts::traced::{Traced, TracedModule};
use crate::bursts::tuples::Summaries;

/// `edges.fdata`: the edge profile derived from the paths, in BOLT's
/// branch-profile format (`1 FUNC FROM 1 FUNC TO MISPREDS COUNT`,
/// offsets in hex from the function start), for `llvm-bolt -data=`.
/// FROM is the last byte of the source block (inside its branch), TO the
/// target block's start; call fall-throughs are not branches for BOLT
/// and are left out.
///
/// `counts` may hold several modules' functions: those of module `m` are
/// its `fid_base + index`.
pub(crate) fn fdata(m: &ModuleFacts, counts: &PathView<'_>) -> Fdata {
    use userspace_rewriter::analysis::cfg::EdgeKind;
    let (plan, facts, fid_base) = (&m.plan, &m.fdata, m.fid_base);
    let local = |gfid: u32| {
        gfid.checked_sub(fid_base)
            .filter(|&f| (f as usize) < plan.functions.len())
    };
    let mut details: HashMap<u32, Option<PathFacts<'_>>> = HashMap::new();
    let mut edges: std::collections::BTreeMap<(u32, u64, u64), f64> = Default::default();
    for ((_, _, gfid, path), n) in counts.iter() {
        let Some(fid) = local(*gfid) else {
            continue;
        };
        let f = &plan.functions[fid as usize];
        let Some(PathFacts { cfg, numbering }) = details
            .entry(fid)
            .or_insert_with(|| m.path_details(fid as usize))
        else {
            continue;
        };
        let Ok(p) = numbering.regenerate(*path) else {
            continue;
        };
        for (v, idx) in p.edges.iter().copied().chain(p.end_edge) {
            let Some(e) = cfg.edges.iter().filter(|e| e.from == v).nth(idx) else {
                continue;
            };
            // BOLT counts branches: a block that merely falls into the
            // next one (or returns from a call) has none.
            if matches!(e.kind, EdgeKind::CallFallThrough | EdgeKind::FallThrough) {
                continue;
            }
            let Some(&last) = facts.last_insn.get(&fid).and_then(|l| l.get(v)) else {
                continue;
            };
            let from = last - f.start;
            let to = cfg.blocks[e.to].start - f.start;
            *edges.entry((fid, from, to)).or_insert(0.0) += n.estimate;
        }
    }
    let mut out = Fdata::default();
    for ((fid, from, to), n) in edges {
        let n = n.round() as u64;
        if n == 0 {
            continue;
        }
        let f = &plan.functions[fid as usize];
        let name = facts.bolt_names.get(&f.start).unwrap_or(&f.name);
        out.branches.insert((name.clone(), from, to), n);
    }
    out
}

/// The indirect calls of module `m` that the call-target profile
/// `targets` (the estimated one, [`crate::bursts::tuples`]) saw, as BOLT
/// call records: from the call's offset in its function to offset 0 of
/// the callee (the target's offset in its function, where a target is
/// not a function's start), counted by the tuple's estimated
/// occurrences, names as [`fdata`] gives them. A target tuple is a call
/// where the target is in another function, or is its own function's
/// start (a recursive call): an indirect jump within its function (a
/// jump table) is a branch the path profile's edges already count. The
/// profile is one module's, so a target in another module (or in no
/// traced function) is left out; returns how many such ⟨site, target⟩
/// tuples were.
pub(crate) fn indirect_calls(
    traced: &Traced,
    m: &TracedModule,
    targets: &Summaries,
) -> (Fdata, u64) {
    let mut out = Fdata::default();
    let mut elsewhere = 0;
    let name = |local: usize| {
        let f = &m.plan.functions[local];
        m.fdata.bolt_names.get(&f.start).unwrap_or(&f.name).clone()
    };
    let in_m = |avma: u64| {
        let (tm, local) = traced.function(traced.fid_at(avma)?)?;
        std::ptr::eq(tm, m).then_some(local)
    };
    for (k, s) in targets {
        if k.kind != TupleKind::Target || k.module != m.fid_base {
            continue;
        }
        let Some(site_fn) = in_m(k.vaddr.wrapping_add(m.bias)) else {
            continue;
        };
        let from = k.vaddr - m.plan.functions[site_fn].start;
        for &(t, n) in &s.values {
            let Some(to_fn) = in_m(t) else {
                elsewhere += 1;
                continue;
            };
            let to = t.wrapping_sub(m.bias) - m.plan.functions[to_fn].start;
            if (to_fn == site_fn && to != 0) || n == 0 {
                continue;
            }
            *out.calls
                .entry((name(site_fn), from, name(to_fn), to))
                .or_insert(0) += n;
        }
    }
    (out, elsewhere)
}

/// One module's edge profile for BOLT: count per branch `(function, from
/// offset, to offset)` within a function, and per call `(function, from
/// offset, callee, to offset)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fdata {
    branches: BTreeMap<(String, u64, u64), u64>,
    calls: BTreeMap<(String, u64, String, u64), u64>,
}

impl Fdata {
    pub(crate) fn is_empty(&self) -> bool {
        self.branches.is_empty() && self.calls.is_empty()
    }

    /// Adds `other`'s counts (the same binary in several processes, or
    /// its calls to its branches).
    pub(crate) fn merge(&mut self, other: &Fdata) {
        for (b, n) in &other.branches {
            *self.branches.entry(b.clone()).or_insert(0) += n;
        }
        for (c, n) in &other.calls {
            *self.calls.entry(c.clone()).or_insert(0) += n;
        }
    }

    /// The profile in BOLT's format, one branch a line, then one call a
    /// line: `1 FUNC FROM 1 FUNC TO MISPREDS COUNT` (offsets in hex; a
    /// call's second function is the callee).
    pub(crate) fn text(&self) -> String {
        let branches = self
            .branches
            .iter()
            .map(|((name, from, to), n)| format!("1 {name} {from:x} 1 {name} {to:x} 0 {n}\n"));
        let calls = self.calls.iter().map(|((name, from, callee, to), n)| {
            format!("1 {name} {from:x} 1 {callee} {to:x} 0 {n}\n")
        });
        branches.chain(calls).collect()
    }
}

/// The module part of a module's edge profile's name: `None` for the
/// executable of a process (`edges.fdata`, `edges-<pid>.fdata`), the
/// file name of a library (`edges-<library>.fdata`,
/// `edges-<pid>-<library>.fdata`) and of the executable of a program the
/// process exec'd away from (a shell wrapper's `edges-<pid>-dash.fdata`:
/// the process's executable is the program it exec'd last).
pub(crate) fn fdata_module(m: &crate::bursts::traced::TracedModule, execd: bool) -> Option<String> {
    (!m.is_exe || execd).then(|| m.name().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_profiles_add_counts_per_branch_and_print_in_bolt_format() {
        let one = |name: &str, from, to, n| Fdata {
            branches: [((name.to_owned(), from, to), n)].into_iter().collect(),
            ..Default::default()
        };
        let mut a = one("main", 0x10, 0x20, 3);
        a.merge(&one("main", 0x10, 0x20, 4));
        a.merge(&one("f/1", 0x3, 0x0, 1));
        assert_eq!(a.text(), "1 f/1 3 1 f/1 0 0 1\n1 main 10 1 main 20 0 7\n");
        assert!(!a.is_empty() && Fdata::default().is_empty());
        // Calls after the branches, the callee second.
        let mut c = Fdata::default();
        c.calls.insert(("main".into(), 0x10, "f/1".into(), 0), 5);
        assert!(!c.is_empty());
        a.merge(&c);
        a.merge(&c);
        assert_eq!(
            a.text(),
            "1 f/1 3 1 f/1 0 0 1\n1 main 10 1 main 20 0 7\n1 main 10 1 f/1 0 0 10\n"
        );
    }

    /// The call-target profile's calls in the module: from the call's
    /// offset to the callee's start (BOLT's name where it has one; a
    /// target inside a function at its offset), counted by estimated
    /// occurrences; a jump within the function is not a call; a target in
    /// another module, or in no traced function, is counted and left
    /// out; another module's sites are not this module's.
    #[test]
    fn indirect_calls_of_the_module() {
        use crate::bursts::tuples::{SiteKey, SiteSummary};
        const EXE: u64 = 0x5555_0000_0000;
        const LIB: u64 = 0x7f00_0000_0000;
        let mut traced = crate::bursts::traced::test_traced(&[
            (
                "/bin/prog",
                EXE,
                0,
                &[("dispatch", 0x1000, 0x100), ("handler", 0x2000, 0x40)],
            ),
            ("/lib/libx.so", LIB, 2, &[("libf", 0x3000, 0x40)]),
        ]);
        traced.modules[0]
            .facts
            .fdata
            .bolt_names
            .insert(0x2000, "handler/1".into());
        let site = |module, vaddr| SiteKey {
            kind: TupleKind::Target,
            module,
            vaddr,
        };
        let targets: Summaries = [
            (
                site(0, 0x1010),
                SiteSummary {
                    total: 100,
                    values: vec![
                        (EXE + 0x2000, 60),
                        (EXE + 0x2008, 5),
                        (EXE + 0x1080, 10),
                        (EXE + 0x1000, 4),
                        (LIB + 0x3000, 20),
                        (0x1234, 1),
                    ],
                },
            ),
            (
                site(2, 0x3010),
                SiteSummary {
                    total: 7,
                    values: vec![(EXE + 0x2000, 7)],
                },
            ),
        ]
        .into();
        let (f, elsewhere) = indirect_calls(&traced, &traced.modules[0], &targets);
        assert_eq!(
            f.text(),
            "1 dispatch 10 1 dispatch 0 0 4\n1 dispatch 10 1 handler/1 0 0 60\n1 dispatch 10 1 handler/1 8 0 5\n"
        );
        assert_eq!(elsewhere, 2);
        let (lib, elsewhere) = indirect_calls(&traced, &traced.modules[1], &targets);
        assert!(lib.is_empty());
        assert_eq!(elsewhere, 1);
    }
}
