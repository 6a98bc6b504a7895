//! Functions that never return: a fixed list of names (`known_noreturn.rs`)
//! plus those found by the fixpoint [`CfgContext::infer_noreturn`]. A call
//! to one ends its block with an exit rather than a call fall-through edge,
//! so the CFG (and the Ball-Larus DAG built on it) has no edge into the
//! padding or the next function that follows such a call.

use super::build::build_cfg;
use super::context::CfgContext;
use super::types::ExitKind;
use crate::analysis::disasm::Insn;
use crate::analysis::functions::{Function, FunctionKind};

impl CfgContext<'_> {
    /// Whether the function starting at `addr` never returns.
    pub(crate) fn is_noreturn(&self, addr: u64) -> bool {
        self.noreturn.contains(&addr)
    }

    /// Starts of all functions known not to return, ascending.
    pub(crate) fn noreturn_functions(&self) -> impl Iterator<Item = u64> + '_ {
        self.noreturn.iter().copied()
    }

    /// Fixpoint: mark as noreturn every function whose CFG builds and all of
    /// whose exits are noreturn calls, traps or tail calls to noreturn
    /// functions (vacuously: also functions with no exit at all). `insns[i]`
    /// is the linear sweep of `functions[i]`. Returns how many were added.
    pub(crate) fn infer_noreturn(&mut self, functions: &[Function], insns: &[Vec<Insn>]) -> usize {
        let mut added = 0;
        loop {
            let mut changed = Vec::new();
            for (f, ins) in functions.iter().zip(insns) {
                if self.noreturn.contains(&f.start) || f.kind == FunctionKind::Plt {
                    continue;
                }
                let Ok(cfg) = build_cfg(f, ins, self, &Default::default()) else {
                    continue;
                };
                let never_returns = cfg.exits.iter().all(|e| match e.kind {
                    ExitKind::NoReturnCall { .. } | ExitKind::Trap => true,
                    ExitKind::TailCall { target } => self.noreturn.contains(&target),
                    _ => false,
                });
                if never_returns {
                    changed.push(f.start);
                }
            }
            if changed.is_empty() {
                return added;
            }
            added += changed.len();
            self.noreturn.extend(changed);
        }
    }
}
