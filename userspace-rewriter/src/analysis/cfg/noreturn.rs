//! Functions that never return: a fixed list of names ([`KNOWN_NORETURN`])
//! plus those found by the fixpoint [`CfgContext::infer_noreturn`]. A call
//! to one ends its block with an exit rather than a call fall-through edge,
//! so the CFG (and the Ball-Larus DAG built on it) has no edge into the
//! padding or the next function that follows such a call.

use super::{CfgContext, ExitKind, build_cfg};
use crate::analysis::disasm::Insn;
use crate::analysis::functions::{Function, FunctionKind};

/// Names of functions that never return (matched without `@plt` and symbol
/// versions).
const KNOWN_NORETURN: &[&str] = &[
    "abort",
    "exit",
    "_exit",
    "_Exit",
    "quick_exit",
    "__stack_chk_fail",
    "__stack_chk_fail_local",
    "__assert_fail",
    "__assert_perror_fail",
    "__assert",
    "__cxa_throw",
    "__cxa_rethrow",
    "__cxa_bad_cast",
    "__cxa_bad_typeid",
    "__cxa_throw_bad_array_new_length",
    "__cxa_pure_virtual",
    "_Unwind_Resume",
    "__fortify_fail",
    "__chk_fail",
    "__libc_fatal",
    "__libc_start_main",
    "err",
    "errx",
    "verr",
    "verrx",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
    "pthread_exit",
    "thrd_exit",
    "__pthread_unwind",
    "__pthread_unwind_next",
    "_ZSt9terminatev",
];

/// Whether `name` (already without `@plt`/version) is a known noreturn
/// function (also libstdc++'s `std::__throw_*` helpers).
pub(crate) fn is_known_noreturn(name: &str) -> bool {
    KNOWN_NORETURN.contains(&name) || name.starts_with("_ZSt") && name.contains("__throw_")
}

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
