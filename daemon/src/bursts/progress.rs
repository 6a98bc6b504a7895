//! What the attach thread is doing and how far it is, for a person and
//! for `/metrics`: the work under way (an attach's first step, a
//! process's libraries, libraries loaded since), its phase, its modules
//! and how far each is. A cold attach of a big program takes tens of
//! seconds (python3.11's: 10-40 s); this is what the log says every few
//! seconds meanwhile ([`log_if_due`]), what `/metrics` shows
//! (`burstyd_attach_progress_ratio`) and what `/debug/pprof/paths`
//! answers while nothing is traced yet.
//!
//! One piece of work at a time (the attach thread does one thing at a
//! time); its modules are prepared on several threads, each reporting
//! its own module ([`in_module`]), or read from a worker process's
//! progress lines ([`report`]).
//!
//! How far a module is: by the functions done in each stage of its
//! preparation, the stages weighed by their share of a worker's time on
//! python3.11 (reading and decoding 15%, control-flow graphs 10%, path
//! numberings 6%, clones 37%, their unwind info 23%, the rest: reading
//! the file, writing the cache entry); a module found in the plan cache
//! is done at once. The whole work: its modules weighed by their files'
//! sizes. A guide for a person, not a measurement.
use std::sync::Mutex;
use std::time::{Duration, Instant};

use burstyd_common::addr::Pid;
use userspace_rewriter::progress::Stage;

/// What the work is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The first step of an attach: the executable (and, for a held
    /// command, its libraries); nothing is traced before it ends.
    Attach,
    /// The second step: the libraries it maps, while the executable's
    /// clones already take bursts.
    Libraries,
    /// Libraries loaded since the attach (`dlopen`), or found hot.
    Loaded,
}

/// Where the work is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Each module's plan and clones: from the plan cache, a worker
    /// process, or an analysis here.
    Analysing,
    /// The clones generated (or moved) for the addresses chosen.
    Generating,
    /// The target stopped for the mappings and the writes.
    Injecting,
}

impl Phase {
    fn words(self) -> &'static str {
        match self {
            Phase::Analysing => "analysing",
            Phase::Generating => "generating the clones of",
            Phase::Injecting => "injecting",
        }
    }
}

/// The share of a module's preparation done when a stage starts and
/// when it ends.
fn stage_span(stage: Stage) -> (f64, f64) {
    match stage {
        Stage::Instructions => (0.02, 0.16),
        Stage::Cfgs => (0.16, 0.26),
        Stage::Paths => (0.26, 0.32),
        Stage::Clones => (0.32, 0.69),
        Stage::UnwindInfo => (0.69, 0.92),
    }
}

/// A stage under way and its functions done of all.
pub(crate) type StageDone = (Stage, usize, usize);

#[derive(Clone, Debug)]
struct ModuleState {
    /// Its maps path.
    path: String,
    /// Its file's size: its weight in the whole.
    bytes: u64,
    /// Done (0 to 1).
    fraction: f64,
    /// The stage under way and its functions done of all.
    stage: Option<StageDone>,
}

impl ModuleState {
    fn done(&self) -> bool {
        self.fraction >= 1.0
    }
}

#[derive(Debug)]
struct Work {
    /// Tells one piece of work from the next (a [`Guard`] clears its own).
    serial: u64,
    pid: Pid,
    /// The executable's file name.
    exe: String,
    step: Step,
    phase: Phase,
    started: Instant,
    modules: Vec<ModuleState>,
    /// When the log last said how far it is.
    logged: Option<Instant>,
}

static WORK: Mutex<Option<Work>> = Mutex::new(None);
static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn with_work<R>(f: impl FnOnce(&mut Option<Work>) -> R) -> R {
    f(&mut WORK.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The work under way until dropped.
pub(crate) struct Guard(u64);

impl Drop for Guard {
    fn drop(&mut self) {
        with_work(|w| {
            if w.as_ref().is_some_and(|w| w.serial == self.0) {
                *w = None;
            }
        });
    }
}

impl Guard {
    /// The work goes on to `phase`.
    pub(crate) fn phase(&self, phase: Phase) {
        with_work(|w| {
            if let Some(w) = w.as_mut().filter(|w| w.serial == self.0) {
                w.phase = phase;
            }
        });
    }
}

/// `step` for `pid` (executable `exe`, a path or name) begins, on the
/// modules at `modules` (maps path, file size).
pub(crate) fn begin(
    pid: Pid,
    exe: &str,
    step: Step,
    modules: impl IntoIterator<Item = (String, u64)>,
) -> Guard {
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let exe = exe.rsplit('/').next().unwrap_or(exe).to_owned();
    let modules = modules
        .into_iter()
        .map(|(path, bytes)| ModuleState {
            path,
            bytes,
            fraction: 0.0,
            stage: None,
        })
        .collect();
    with_work(|w| {
        *w = Some(Work {
            serial,
            pid,
            exe,
            step,
            phase: Phase::Analysing,
            started: Instant::now(),
            modules,
            logged: None,
        })
    });
    Guard(serial)
}

fn update(path: &str, f: impl FnOnce(&mut ModuleState)) {
    with_work(|w| {
        if let Some(m) = w
            .as_mut()
            .and_then(|w| w.modules.iter_mut().find(|m| m.path == path))
        {
            f(m);
        }
    });
}

/// The module at `path` is ready (its clones made or moved).
pub(crate) fn done(path: &str) {
    update(path, |m| {
        m.fraction = 1.0;
        m.stage = None;
    });
}

thread_local! {
    /// The module this thread prepares ([`in_module`]).
    static MODULE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f`, the preparation of the module at `path`, with what the
/// rewriter does on this thread (and [`report`]) counted for it.
pub(crate) fn in_module<R>(path: &str, f: impl FnOnce() -> R) -> R {
    let old = MODULE.with(|m| m.replace(Some(path.to_owned())));
    let hook_path = path.to_owned();
    let r = userspace_rewriter::progress::with_hook(
        move |stage, n, total| set_stage(&hook_path, stage, n, total),
        f,
    );
    MODULE.with(|m| *m.borrow_mut() = old);
    r
}

/// `done` of the `total` functions of `stage` of this thread's module
/// ([`in_module`]) are done: a worker process's progress line.
pub(crate) fn report(stage: Stage, n: usize, total: usize) {
    if let Some(path) = MODULE.with(|m| m.borrow().clone()) {
        set_stage(&path, stage, n, total);
    }
}

fn set_stage(path: &str, stage: Stage, n: usize, total: usize) {
    let (lo, hi) = stage_span(stage);
    let f = lo + (hi - lo) * n.min(total) as f64 / total.max(1) as f64;
    update(path, |m| {
        if !m.done() {
            m.fraction = m.fraction.max(f);
            m.stage = Some((stage, n, total));
        }
    });
}

/// The work under way, as it is now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) pid: Pid,
    pub(crate) exe: String,
    pub(crate) step: Step,
    pub(crate) phase: Phase,
    pub(crate) elapsed: Duration,
    pub(crate) modules_done: usize,
    pub(crate) modules: usize,
    /// Done, 0 to 1 (its modules weighed by size).
    pub(crate) ratio: f64,
    /// The biggest module under way (else the next): its file name and
    /// stage.
    pub(crate) current: Option<(String, Option<StageDone>)>,
}

/// The work under way, if any.
pub(crate) fn now() -> Option<Snapshot> {
    with_work(|w| w.as_ref().map(snapshot))
}

fn snapshot(w: &Work) -> Snapshot {
    let total: u64 = w.modules.iter().map(|m| m.bytes.max(1)).sum();
    let done: f64 = w
        .modules
        .iter()
        .map(|m| m.bytes.max(1) as f64 * m.fraction)
        .sum();
    // The biggest module under way, else the next one.
    let current = w
        .modules
        .iter()
        .filter(|m| !m.done() && (m.fraction > 0.0 || m.stage.is_some()))
        .max_by_key(|m| m.bytes)
        .or_else(|| w.modules.iter().find(|m| !m.done()))
        .map(|m| {
            let name = m.path.rsplit('/').next().unwrap_or(&m.path).to_owned();
            (name, m.stage)
        });
    Snapshot {
        pid: w.pid,
        exe: w.exe.clone(),
        step: w.step,
        phase: w.phase,
        elapsed: w.started.elapsed(),
        modules_done: w.modules.iter().filter(|m| m.done()).count(),
        modules: w.modules.len(),
        ratio: if total == 0 {
            0.0
        } else {
            (done / total as f64).clamp(0.0, 1.0)
        },
        current,
    }
}

impl Snapshot {
    /// Whole percent done.
    pub(crate) fn percent(&self) -> u64 {
        (self.ratio * 100.0).floor() as u64
    }

    /// One line for a person: what, how far, for how long.
    pub(crate) fn describe(&self) -> String {
        let Snapshot { pid, exe, .. } = self;
        let what = match self.step {
            Step::Attach => format!("attaching to {exe} (pid {pid})"),
            Step::Libraries => format!("cloning the shared libraries of {exe} (pid {pid})"),
            Step::Loaded => format!("cloning more libraries of {exe} (pid {pid})"),
        };
        let stage = |st: &Option<StageDone>| {
            st.map(|(stage, n, total)| {
                let doing = match stage {
                    Stage::Instructions => "instructions",
                    Stage::Cfgs => "control-flow graphs",
                    Stage::Paths => "path numberings",
                    Stage::Clones => "clones",
                    Stage::UnwindInfo => "unwind info",
                };
                format!("{doing} for {n} of {total} functions")
            })
        };
        let phase = self.phase.words();
        let pct = self.percent();
        let mut s = match (&self.current, self.modules) {
            (Some((name, st)), 1) => match stage(st) {
                Some(st) => format!("{what}: {phase} {name}, {pct}% ({st})"),
                None => format!("{what}: {phase} {name}, {pct}%"),
            },
            (_, 1) => format!("{what}: {phase} 1 module, {pct}%"),
            (current, n) => {
                let mut s = format!(
                    "{what}: {phase} {n} modules ({} done), {pct}% in all",
                    self.modules_done
                );
                if let Some((name, st)) = current {
                    match stage(st) {
                        Some(st) => s += &format!(" ({name}: {st})"),
                        None => s += &format!(" ({name} under way)"),
                    }
                }
                s
            }
        };
        s += &format!(", {} s so far", self.elapsed.as_secs());
        s
    }
}

/// Work shorter than this says nothing more than it did before.
pub(crate) const QUIET_FOR: Duration = Duration::from_secs(3);
/// Then a line this often.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// Logs how far the work under way is, once it has lasted
/// [`QUIET_FOR`], then every [`EVERY`] (called every second).
pub(crate) fn log_if_due() {
    let line = with_work(|w| {
        let w = w.as_mut()?;
        let now = Instant::now();
        let due = match w.logged {
            None => now.duration_since(w.started) >= QUIET_FOR,
            Some(t) => now.duration_since(t) >= EVERY,
        };
        if !due {
            return None;
        }
        w.logged = Some(now);
        Some(snapshot(w).describe())
    });
    if let Some(line) = line {
        tracing::info!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_weighs_modules_by_size_and_names_the_one_under_way() {
        let _g = begin(
            Pid(42),
            "/usr/bin/python3.11",
            Step::Attach,
            [
                ("/usr/bin/python3.11".to_owned(), 300),
                ("/usr/lib/libc.so.6".to_owned(), 100),
            ],
        );
        let s = now().unwrap();
        assert_eq!((s.ratio, s.modules_done, s.modules), (0.0, 0, 2));
        done("/usr/lib/libc.so.6");
        in_module("/usr/bin/python3.11", || {
            report(Stage::Clones, 50, 100);
        });
        let s = now().unwrap();
        // libc 1 × 100, python (0.32 + 0.37 × 0.5) × 300.
        assert!(
            (s.ratio - (100.0 + 0.505 * 300.0) / 400.0).abs() < 1e-9,
            "{s:?}"
        );
        assert_eq!(s.modules_done, 1);
        assert_eq!(s.percent(), 62);
        let line = s.describe();
        assert!(line.starts_with("attaching to python3.11 (pid 42): analysing 2 modules (1 done), 62% in all (python3.11: clones for 50 of 100 functions), "), "{line}");
        assert!(!line.contains('{') && !line.contains("Some("), "{line}");
        // Out of a module, reports go nowhere.
        report(Stage::Cfgs, 1, 1);
        assert_eq!(now().unwrap().ratio, s.ratio);
        drop(_g);
        assert!(now().is_none());
    }
}
