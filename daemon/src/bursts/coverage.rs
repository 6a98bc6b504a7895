//! Hot coverage: how much of a traced process's time lands in code the
//! clones instrument. Counting functions says little (a program can have
//! 99% of its functions cloned and its one hot loop not); this weighs
//! every user-mode CPU sample of the process by its event and asks where
//! its leaf PC lies: in a cloned function, elsewhere in the executable
//! (and in which function, skipped for what reason), or in another module
//! (shared libraries, the vdso, JIT code), which is not rewritten.
use std::collections::HashMap;

use userspace_rewriter::analysis::plan::{FunctionStatus, Plan};

/// Where an executable and its cloned functions lie in a process.
#[derive(Clone, Debug, Default)]
pub(crate) struct CodeMap {
    /// `[lo, hi)` of the executable's mappings (AVMAs).
    exe: (u64, u64),
    /// `[start, end)` AVMAs of the cloned functions (of every module),
    /// sorted.
    cloned: Vec<(u64, u64)>,
    /// The shared libraries with clones: name, `[lo, hi)`.
    libraries: Vec<(String, (u64, u64))>,
    /// `[lo, hi)` of the regions holding the clones and burstyd's runtime:
    /// a leaf PC still there (the unwinder maps every copied instruction
    /// back to the original) is in the runtime's own routines.
    clone_regions: Vec<(u64, u64)>,
}

impl CodeMap {
    pub(crate) fn new(exe: (u64, u64), cloned: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut cloned: Vec<_> = cloned.into_iter().collect();
        cloned.sort_unstable();
        CodeMap {
            exe,
            cloned,
            libraries: Vec::new(),
            clone_regions: Vec::new(),
        }
    }

    /// The regions the clones were written to (see `clone_regions`).
    pub(crate) fn add_clone_regions(&mut self, regions: impl IntoIterator<Item = (u64, u64)>) {
        self.clone_regions.extend(regions);
    }

    fn in_runtime(&self, pc: u64) -> bool {
        self.clone_regions
            .iter()
            .any(|&(lo, hi)| (lo..hi).contains(&pc))
    }

    /// More cloned functions and libraries (added to a running attach).
    pub(crate) fn add(
        &mut self,
        cloned: impl IntoIterator<Item = (u64, u64)>,
        libs: impl IntoIterator<Item = (String, (u64, u64))>,
    ) {
        self.cloned.extend(cloned);
        self.cloned.sort_unstable();
        self.libraries.extend(libs);
    }

    /// The shared libraries with clones (name, `[lo, hi)`), for the
    /// coverage of the whole process.
    pub(crate) fn with_libraries(
        mut self,
        libs: impl IntoIterator<Item = (String, (u64, u64))>,
    ) -> Self {
        self.libraries = libs.into_iter().collect();
        self
    }

    fn is_cloned(&self, pc: u64) -> bool {
        let i = self.cloned.partition_point(|r| r.0 <= pc);
        i > 0 && pc < self.cloned[i - 1].1
    }

    fn in_exe(&self, pc: u64) -> bool {
        (self.exe.0..self.exe.1).contains(&pc)
    }
}

/// The event weight of a process's user-mode samples, by where their leaf
/// PC lies.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct HotCoverage {
    /// Every user-mode sample of the process, but those in the runtime.
    pub(crate) total: u64,
    /// Those in burstyd's runtime routines (the clones' instrumentation
    /// calls them): the tracing's own cost, not the program's time, left
    /// out of every share.
    pub(crate) runtime: u64,
    /// Those in the executable.
    pub(crate) in_exe: u64,
    /// Those in a cloned function of the executable.
    pub(crate) instrumented: u64,
    /// Those in a cloned function of any module.
    pub(crate) instrumented_all: u64,
    /// Per shared library with clones.
    pub(crate) libraries: Vec<LibraryCoverage>,
    /// The executable's uninstrumented code that was sampled, heaviest
    /// first: (function, weight, why it is not instrumented).
    pub(crate) missed: Vec<(String, u64, String)>,
}

/// One shared library's share of a process's samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LibraryCoverage {
    pub(crate) name: String,
    /// Weight of the samples whose leaf is in it.
    pub(crate) weight: u64,
    /// Of those, in its cloned functions.
    pub(crate) instrumented: u64,
    /// Its most sampled uninstrumented functions (filled by the caller,
    /// which has its plan: [`HotCoverage::missed_in`]).
    pub(crate) missed: Vec<(String, u64, String)>,
}

impl HotCoverage {
    /// `leaf_weights`: event weight per leaf PC (AVMA, original code: the
    /// unwinder maps clone PCs back) of the process's user-mode samples.
    pub(crate) fn measure(
        code: &CodeMap,
        plan: &Plan,
        bias: u64,
        leaf_weights: &HashMap<u64, u64>,
    ) -> Self {
        let mut c = HotCoverage {
            libraries: code
                .libraries
                .iter()
                .map(|(n, _)| LibraryCoverage {
                    name: n.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let mut exe_missed: HashMap<u64, u64> = HashMap::new();
        for (&pc, &w) in leaf_weights {
            if code.in_runtime(pc) {
                c.runtime += w;
                continue;
            }
            c.total += w;
            let cloned = code.is_cloned(pc);
            if cloned {
                c.instrumented_all += w;
            }
            if !code.in_exe(pc) {
                if let Some(i) = code
                    .libraries
                    .iter()
                    .position(|(_, r)| (r.0..r.1).contains(&pc))
                {
                    c.libraries[i].weight += w;
                    if cloned {
                        c.libraries[i].instrumented += w;
                    }
                }
                continue;
            }
            c.in_exe += w;
            if cloned {
                c.instrumented += w;
            } else {
                exe_missed.insert(pc, w);
            }
        }
        c.missed = missed_functions(plan, bias, &exe_missed);
        c
    }

    /// A library's most sampled uninstrumented functions, like
    /// [`Self::missed`] for the executable.
    pub(crate) fn missed_in(
        code: &CodeMap,
        plan: &Plan,
        bias: u64,
        range: (u64, u64),
        leaf_weights: &HashMap<u64, u64>,
    ) -> Vec<(String, u64, String)> {
        let here: HashMap<u64, u64> = leaf_weights
            .iter()
            .filter(|&(&pc, _)| (range.0..range.1).contains(&pc) && !code.is_cloned(pc))
            .map(|(&pc, &w)| (pc, w))
            .collect();
        missed_functions(plan, bias, &here)
    }

    /// One line for the exit summary: "hot coverage: 62.0% of the
    /// executable's user-mode samples (1234 of them, 97.0% of the
    /// process's) land in instrumented code; most sampled uninstrumented:
    /// f 30.1% (skipped: ...), ...".
    pub(crate) fn describe(&self, top: usize) -> String {
        // (Weights are the event's, e.g. nanoseconds of cpu-clock: only
        // shares of them are shown.)
        if self.total == 0 {
            return "hot coverage: no user-mode sample of the process".into();
        }
        if self.in_exe == 0 {
            return "hot coverage: none of the process's user-mode samples is in the executable"
                .into();
        }
        let pct = |w: u64, of: u64| 100.0 * w as f64 / of.max(1) as f64;
        let mut s = format!(
            "hot coverage: {:.1}% of the executable's user-mode samples land in instrumented code (the executable holds {:.1}% of the process's user-mode samples)",
            pct(self.instrumented, self.in_exe),
            pct(self.in_exe, self.total),
        );
        if !self.missed.is_empty() {
            let list: Vec<_> = self
                .missed
                .iter()
                .take(top)
                .map(|(f, w, why)| format!("{f} {:.1}% ({why})", pct(*w, self.in_exe)))
                .collect();
            s += &format!("; most sampled uninstrumented: {}", list.join(", "));
        }
        if !self.libraries.is_empty() {
            let mut libs: Vec<_> = self.libraries.iter().filter(|l| l.weight > 0).collect();
            libs.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.name.cmp(&b.name)));
            let list: Vec<_> = libs
                .iter()
                .take(top)
                .map(|l| {
                    let mut t = format!(
                        "{} {:.1}% of them in instrumented code",
                        l.name,
                        pct(l.instrumented, l.weight)
                    );
                    let m: Vec<_> = l
                        .missed
                        .iter()
                        .take(3)
                        .map(|(f, w, why)| format!("{f} {:.1}% ({why})", pct(*w, l.weight)))
                        .collect();
                    if !m.is_empty() {
                        t += &format!(", most sampled uninstrumented: {}", m.join(", "));
                    }
                    t
                })
                .collect();
            s += &format!(
                ". Over all modules: {:.1}% of the process's user-mode samples land in instrumented code",
                pct(self.instrumented_all, self.total)
            );
            if !list.is_empty() {
                s += &format!(" (libraries: {})", list.join("; "));
            }
        }
        if self.runtime > 0 {
            s += &format!(
                ". Left out: {:.1}% of all user-mode samples, in burstyd's runtime routines (the tracing's own cost)",
                pct(self.runtime, self.runtime + self.total)
            );
        }
        s
    }
}

/// The functions of `plan` (loaded with `bias`) the uninstrumented leaf
/// PCs `weights` lie in, heaviest first: (name, weight, why it is not
/// instrumented).
fn missed_functions(
    plan: &Plan,
    bias: u64,
    weights: &HashMap<u64, u64>,
) -> Vec<(String, u64, String)> {
    let mut starts: Vec<(u64, usize)> = plan
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| (f.start, i))
        .collect();
    starts.sort_unstable();
    let mut missed: HashMap<Option<usize>, u64> = HashMap::new();
    for (&pc, &w) in weights {
        let svma = pc.wrapping_sub(bias);
        let i = starts.partition_point(|s| s.0 <= svma);
        let f = i
            .checked_sub(1)
            .map(|i| starts[i].1)
            .filter(|&f| svma < plan.functions[f].start + plan.functions[f].size.max(1));
        *missed.entry(f).or_insert(0) += w;
    }
    let mut missed: Vec<_> = missed
        .into_iter()
        .map(|(f, w)| match f {
            Some(f) => {
                let f = &plan.functions[f];
                let why = match &f.status {
                    FunctionStatus::Skipped { reason } => format!("skipped: {reason}"),
                    FunctionStatus::Plt => "PLT stub".to_owned(),
                    FunctionStatus::Analyzed(_) => "analysed, not cloned".to_owned(),
                };
                (f.name.clone(), w, why)
            }
            None => (
                "(outside any known function)".to_owned(),
                w,
                "no symbol or analysis covers it".to_owned(),
            ),
        })
        .collect();
    missed.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    missed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of a real (small, stripped) executable.
    fn plan() -> Plan {
        let exe = std::fs::read("/bin/ls").unwrap();
        let (report, _) = userspace_rewriter::analysis::plan::analyze_with_insns(
            &exe,
            &userspace_rewriter::analysis::plan::PlanOptions::default(),
        )
        .unwrap();
        report.plan
    }

    #[test]
    fn samples_are_split_by_where_their_leaf_lies() {
        let plan = plan();
        let bias = 0x1000_0000;
        let analysed: Vec<_> = plan
            .functions
            .iter()
            .filter(|f| matches!(f.status, FunctionStatus::Analyzed(_)) && f.size >= 16)
            .take(2)
            .collect();
        let (a, b) = (analysed[0], analysed[1]);
        // a is cloned, b is not.
        // A library with one cloned function at 0x7fff_0000_0000.
        let lib = 0x7fff_0000_0000;
        let code = CodeMap::new(
            (bias, bias + (1 << 40)),
            [
                (bias + a.start, bias + a.start + a.size),
                (lib, lib + 0x100),
            ],
        )
        .with_libraries([("libc.so.6".to_owned(), (lib - 0x1000, lib + 0x10000))]);
        let mut code = code;
        code.add_clone_regions([(0x4000_0000, 0x4010_0000)]);
        let weights = HashMap::from([
            (0x4000_0040, 25), // the runtime: left out
            (bias + a.start + 1, 60),
            (bias + b.start + 1, 30),
            (lib + 0x10, 6),       // the library's cloned function
            (lib + 0x200, 4),      // the library, not cloned
            (0x7ffe_0000_0000, 1), // elsewhere (the vdso)
        ]);
        let c = HotCoverage::measure(&code, &plan, bias, &weights);
        assert_eq!((c.total, c.in_exe, c.instrumented), (101, 90, 60));
        assert_eq!(c.runtime, 25);
        assert_eq!(c.instrumented_all, 66);
        assert_eq!(
            (
                c.libraries.len(),
                c.libraries[0].weight,
                c.libraries[0].instrumented
            ),
            (1, 10, 6)
        );
        assert_eq!(
            c.missed,
            [(b.name.clone(), 30, "analysed, not cloned".to_owned())]
        );
        let line = c.describe(3);
        assert!(
            line.contains("66.7% of the executable's")
                && line.contains("holds 89.1%")
                && line.contains("Over all modules: 65.3% of the process's")
                && line.contains("libc.so.6 60.0% of them in instrumented code")
                && line.contains(&format!("{} 33.3% (analysed, not cloned)", b.name))
                && line.contains("Left out: 19.8% of all user-mode samples, in burstyd's runtime"),
            "{line}"
        );
    }
}
