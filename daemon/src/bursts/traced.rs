//! What the exporters need to know about a traced process: its modules
//! with clones in `fid` order, its functions by address, the calling
//! contexts of burst stack samples, and the CFGs and path numberings of
//! the functions its paths ran through.
use std::path::PathBuf;

use burstyd_common::addr::Pid;
use std::collections::HashMap;
use userspace_rewriter::analysis::plan::FunctionStatus;

use super::contexts;
use super::coverage;
use super::facts;

/// Per function of module `m`, in fid order: its number of paths (none
/// without numbering) and the fid of its family (the first part of the
/// function it belongs to, see [`PathCounts`]).
pub(super) fn fid_facts(m: &facts::ModuleFacts) -> impl Iterator<Item = (Option<u64>, u32)> + '_ {
    m.plan.functions.iter().map(move |f| {
        let paths = match &f.status {
            FunctionStatus::Analyzed(fa) => fa.paths,
            _ => None,
        };
        (paths, m.fid_base + f.family as u32)
    })
}

/// What the exporters need to know about a traced process and its
/// modules with clones.
pub(crate) struct Traced {
    pub(crate) pid: Pid,
    /// `/proc/PID/exe`.
    pub(crate) exe: PathBuf,
    /// The executable first, then the libraries, in `fid` order.
    pub(crate) modules: Vec<TracedModule>,
    /// Where the modules and their clones' originals are (hot coverage).
    pub(crate) code: coverage::CodeMap,
    /// Every function of every module by address: `(AVMA start, end,
    /// fid)`, sorted ([`Self::reindex`]).
    pub(super) index: Vec<(u64, u64, u32)>,
    /// How often the index was rebuilt (what was learnt of it is stale
    /// once it moves).
    pub(super) generation: u64,
}

/// One module with clones.
pub(crate) struct TracedModule {
    pub(crate) facts: facts::ModuleFacts,
    /// The file with the module's DWARF lines, opened while the process
    /// lives (its files may be gone when its paths are exported) and
    /// parsed only while they are: python3.11's lines take 40 MB parsed.
    pub(super) lines_file: Option<std::fs::File>,
}

impl TracedModule {
    pub(super) fn new(pid: Pid, exe: &std::path::Path, facts: facts::ModuleFacts) -> Self {
        let file = if facts.is_exe {
            exe.to_owned()
        } else {
            facts
                .debug_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("/proc/{pid}/root{}", facts.path)))
        };
        TracedModule {
            lines_file: std::fs::File::open(file).ok(),
            facts,
        }
    }

    /// `(file, line)` of the SVMAs `addrs` that the module's DWARF has.
    pub(crate) fn lines(&self, addrs: &[u64]) -> HashMap<u64, (Option<String>, u32)> {
        match &self.lines_file {
            Some(f) => crate::stacks::lines::lines_in_file(f, addrs),
            None => HashMap::new(),
        }
    }
}

impl std::ops::Deref for TracedModule {
    type Target = facts::ModuleFacts;
    fn deref(&self) -> &facts::ModuleFacts {
        &self.facts
    }
}

impl Traced {
    /// `(file, line)` of each module's SVMAs in `wanted` (one list per
    /// module, in `fid` order), as [`TracedModule::lines`] finds them.
    pub(crate) fn lines_of(&self, wanted: &[Vec<u64>]) -> Vec<HashMap<u64, (Option<String>, u32)>> {
        self.modules
            .iter()
            .zip(wanted)
            .map(|(m, w)| m.lines(w))
            .collect()
    }

    /// The module of record `fid`, and the function's index in its plan.
    pub(crate) fn function(&self, fid: u32) -> Option<(&TracedModule, usize)> {
        let i = self
            .modules
            .partition_point(|m| m.fid_base <= fid)
            .checked_sub(1)?;
        let m = &self.modules[i];
        let local = (fid - m.fid_base) as usize;
        (local < m.plan.functions.len()).then_some((m, local))
    }

    /// Rebuilds the address index once the modules changed.
    pub(super) fn reindex(&mut self) {
        self.index = self
            .modules
            .iter()
            .flat_map(|m| {
                m.plan.functions.iter().enumerate().map(|(i, f)| {
                    let a = f.start.wrapping_add(m.bias);
                    (a, a + f.size.max(1), m.fid_base + i as u32)
                })
            })
            .collect();
        self.index.sort_unstable();
        self.generation += 1;
    }

    /// The function of a traced module that holds `avma`.
    pub(crate) fn fid_at(&self, avma: u64) -> Option<u32> {
        let i = self.index.partition_point(|e| e.0 <= avma).checked_sub(1)?;
        let (_, end, fid) = self.index[i];
        (avma < end).then_some(fid)
    }

    /// [`Self::fid_at`], with the addresses around `avma` that have the
    /// same answer: `(fid, lo, hi)`, every address of `lo..hi` in `fid`.
    pub(crate) fn fid_span_at(&self, avma: u64) -> Option<(u32, u64, u64)> {
        let i = self.index.partition_point(|e| e.0 <= avma).checked_sub(1)?;
        let (lo, end, fid) = self.index[i];
        let hi = self.index.get(i + 1).map_or(end, |e| end.min(e.0));
        (avma < end).then_some((fid, lo, hi))
    }

    /// A burst's stack sample as context frames, outermost first, down to
    /// the function the burst began in. A leaf in a PLT stub is left out
    /// (the stub jumps to its target, which the burst enters).
    pub(crate) fn context_frames(&self, s: &contexts::StartStack) -> Vec<contexts::FrameKey> {
        let mut out = Vec::with_capacity(s.frames.len());
        for (i, &a) in s.frames.iter().enumerate() {
            // Return addresses point after their call.
            let lookup = if i == 0 { a } else { a.wrapping_sub(1) };
            match self.fid_at(lookup) {
                Some(fid) => {
                    let plt = self.function(fid).is_some_and(|(m, l)| {
                        matches!(m.plan.functions[l].status, FunctionStatus::Plt)
                    });
                    if !(i == 0 && plt) {
                        out.push(contexts::FrameKey::Function(fid));
                    }
                }
                None => out.push(contexts::FrameKey::Address(a)),
            }
        }
        out.reverse();
        out
    }

    /// What path `path` of function `fid` costs in the original code, in
    /// quarter cycles: its blocks' static costs added up
    /// (`userspace_rewriter::analysis::cost`); `None` where the function
    /// has no path numbering or the number is not a path.
    pub(crate) fn path_cost(&self, fid: u32, path: u64) -> Option<u64> {
        let (m, local) = self.function(fid)?;
        let d = m.path_details(local)?;
        let p = d.numbering.regenerate(path).ok()?;
        Some(
            p.blocks
                .iter()
                .map(|&b| u64::from(d.cfg.blocks.get(b).map_or(0, |b| b.cost)))
                .sum(),
        )
    }

    /// The executable.
    pub(crate) fn exe_module(&self) -> &TracedModule {
        &self.modules[0]
    }

    /// The CFGs and path numberings of functions `fids` (those that have
    /// them), read once each.
    pub(crate) fn path_details(
        &self,
        fids: impl IntoIterator<Item = u32>,
    ) -> HashMap<u32, facts::PathFacts<'_>> {
        let mut out = HashMap::new();
        for fid in fids {
            if let std::collections::hash_map::Entry::Vacant(v) = out.entry(fid)
                && let Some(d) = self.function(fid).and_then(|(m, i)| m.path_details(i))
            {
                v.insert(d);
            }
        }
        out
    }
}

/// A module of [`test_traced`]: `(path, bias, fid_base, functions)`,
/// each function `(name, SVMA start, size)`.
#[cfg(test)]
pub(crate) type TestModule<'a> = (&'a str, u64, u32, &'a [(&'a str, u64, u64)]);

/// A traced process made by hand for unit tests: its modules (see
/// [`TestModule`]; their functions PLT stubs as far as the plan says: no
/// CFGs, no lines), the first the executable; its function index built.
#[cfg(test)]
pub(crate) fn test_traced(modules: &[TestModule]) -> Traced {
    let modules = modules
        .iter()
        .enumerate()
        .map(|(i, &(path, bias, fid_base, functions))| {
            let functions: Vec<serde_json::Value> = functions
                .iter()
                .enumerate()
                .map(|(k, &(name, start, size))| {
                    serde_json::json!({"name": name, "start": start, "size": size,
                        "sources": [], "cold_part": false, "family": k, "status": "plt"})
                })
                .collect();
            let plan = serde_json::from_value(serde_json::json!({
                "build_id": null, "pie": true, "k": 4,
                "summary": userspace_rewriter::analysis::plan::Summary::default(),
                "functions": functions,
            }))
            .expect("a plan");
            TracedModule {
                facts: facts::ModuleFacts {
                    path: path.to_owned(),
                    is_exe: i == 0,
                    plan,
                    bias,
                    range: (bias, bias + (1 << 32)),
                    ino: 0,
                    fid_base,
                    fdata: super::fdata_facts::FdataFacts {
                        bolt_names: HashMap::new(),
                        last_insn: HashMap::new(),
                    },
                    details: None,
                    details_failed: Default::default(),
                    debug_file: None,
                },
                lines_file: None,
            }
        })
        .collect();
    let mut t = Traced {
        pid: Pid(1),
        exe: "/nonexistent".into(),
        modules,
        code: Default::default(),
        index: Vec::new(),
        generation: 0,
    };
    t.reindex();
    t
}
