//! What the exporters and the traced-process index know of one module
//! with clones: its path, plan, bias, range, `fid`s, the facts BOLT's
//! profile needs, and where its CFGs and path numberings are (the plan, or
//! its plan cache entry). A leaf: everything that produces or reads these
//! imports it, it imports none of them.
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use tracing::warn;
use userspace_rewriter::analysis::plan::Plan;

use super::cache;
use super::fdata_facts::FdataFacts;

/// What the exporters need of one module with clones.
pub(crate) struct ModuleFacts {
    /// Its path as `/proc/PID/maps` shows it.
    pub(crate) path: String,
    pub(crate) is_exe: bool,
    pub(crate) plan: Plan,
    /// AVMA − SVMA.
    pub(crate) bias: u64,
    /// `[lo, hi)` of its mappings.
    pub(crate) range: (u64, u64),
    /// The inode of its file.
    pub(crate) ino: u64,
    /// Its functions' `fid`s are `fid_base + index in plan`.
    pub(crate) fid_base: u32,
    /// What `edges.fdata` needs from the file and the analysis.
    pub(crate) fdata: FdataFacts,
    /// Where the plan's CFGs and path numberings are when the plan holds
    /// none: its plan cache entry (see [`ModuleFacts::path_details`]).
    pub(super) details: Option<cache::Details>,
    pub(super) details_failed: std::sync::atomic::AtomicBool,
    /// Its separate debug file (DWARF lines of a stripped library).
    pub(crate) debug_file: Option<PathBuf>,
}

/// A function's CFG and path numbering (see [`ModuleFacts::path_details`]).
pub(crate) struct PathFacts<'a> {
    pub(crate) cfg: Cow<'a, userspace_rewriter::analysis::cfg::Cfg>,
    pub(crate) numbering: Cow<'a, userspace_rewriter::analysis::paths::PathNumbering>,
}

impl ModuleFacts {
    /// The CFG and path numbering of function `local` (index in the
    /// plan), from the plan or, where the plan keeps none, from its plan
    /// cache entry; `None` where it has none (or its entry cannot be
    /// read: said once per module).
    pub(crate) fn path_details(&self, local: usize) -> Option<PathFacts<'_>> {
        if let Some((cfg, numbering)) = self.plan.details_of(local) {
            return Some(PathFacts {
                cfg: Cow::Borrowed(cfg),
                numbering: Cow::Borrowed(numbering),
            });
        }
        match self.details.as_ref()?.get(local) {
            Ok(d) => d.map(|d| PathFacts {
                cfg: Cow::Owned(d.cfg),
                numbering: Cow::Owned(d.numbering),
            }),
            Err(e) => {
                if !self.details_failed.swap(true, Ordering::Relaxed) {
                    warn!("{}: {e:#}; its paths are left out", self.path);
                }
                None
            }
        }
    }

    /// The file name.
    pub(crate) fn name(&self) -> &str {
        Path::new(&self.path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&self.path)
    }
}
