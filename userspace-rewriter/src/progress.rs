//! How far the long per-function work on a big file is (its
//! instructions, CFGs, path numberings, clones and their unwind info), for a caller that tells a person: a hook
//! the calling thread sets ([`with_hook`]), told `(stage, done, total)`
//! as each function of a stage is done. Thread-local: the threads that
//! prepare several modules at once each report their own; without a hook
//! a report costs a thread-local read. The hook is called once per
//! function: it decides itself how often to pass it on.

use std::cell::RefCell;

/// A stage of the per-function work, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Instructions decoded ([`crate::analysis::cfg::analyse`]).
    Instructions,
    /// Control-flow graphs ([`crate::analysis::cfg::analyse`]).
    Cfgs,
    /// Loops, path numberings and checks ([`crate::analysis::plan`]).
    Paths,
    /// The clones' code ([`crate::codegen::generate_excluding`]).
    Clones,
    /// The clones' unwind info ([`crate::codegen::unwind_info::eh_frame`]).
    UnwindInfo,
}

impl Stage {
    /// Its name in a progress line, stable (the daemon's worker process
    /// passes it on as text).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Instructions => "insns",
            Stage::Cfgs => "cfgs",
            Stage::Paths => "paths",
            Stage::Clones => "clones",
            Stage::UnwindInfo => "unwind",
        }
    }

    /// The stage named `s` ([`Self::name`]).
    pub fn from_name(s: &str) -> Option<Stage> {
        [
            Stage::Instructions,
            Stage::Cfgs,
            Stage::Paths,
            Stage::Clones,
            Stage::UnwindInfo,
        ]
        .into_iter()
        .find(|st| st.name() == s)
    }
}

type Hook = Box<dyn FnMut(Stage, usize, usize)>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` told this thread's progress; the hook in place
/// before is back afterwards (also when `f` panics).
pub fn with_hook<R>(hook: impl FnMut(Stage, usize, usize) + 'static, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Hook>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            let _ = HOOK.try_with(|h| *h.borrow_mut() = old);
        }
    }
    let old = HOOK.with(|h| h.borrow_mut().replace(Box::new(hook)));
    let _restore = Restore(old);
    f()
}

/// `done` of the `total` functions of `stage` are done (on this thread).
pub(crate) fn report(stage: Stage, done: usize, total: usize) {
    HOOK.with(|h| {
        // A hook that does this thread's work itself reports nothing.
        if let Ok(mut h) = h.try_borrow_mut()
            && let Some(f) = h.as_mut()
        {
            f(stage, done, total);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn the_hook_hears_its_own_thread_only_and_is_restored() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        report(Stage::Cfgs, 1, 2); // no hook: nothing
        let s = seen.clone();
        with_hook(
            move |st, d, t| s.lock().unwrap().push((st, d, t)),
            || {
                report(Stage::Cfgs, 1, 2);
                std::thread::spawn(|| report(Stage::Paths, 5, 5))
                    .join()
                    .unwrap();
                report(Stage::Clones, 2, 2);
            },
        );
        report(Stage::Paths, 9, 9);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(Stage::Cfgs, 1, 2), (Stage::Clones, 2, 2)]
        );
        for st in [
            Stage::Instructions,
            Stage::Cfgs,
            Stage::Paths,
            Stage::Clones,
            Stage::UnwindInfo,
        ] {
            assert_eq!(Stage::from_name(st.name()), Some(st));
        }
    }
}
