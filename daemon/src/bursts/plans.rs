//! Where a module's plan and clones come from: the plan cache, a worker
//! process that makes the cache entry ([`super::worker`]), or, without a
//! cache (or should the worker fail), an analysis in the daemon; and the
//! notes the attach log gives about it.

use tracing::warn;

use super::cache;
use super::modules::Module;
use super::worker;

use super::prepare::{Analysed, Made, WorkerReport, analyse_fresh};

/// Finds `module` in the plan cache, or has a worker process make its
/// entry there ([`super::worker`]), or (without a cache, or should the
/// worker fail) analyses it in this process.
pub(super) fn analyse(module: Module) -> anyhow::Result<Analysed> {
    let id = module.hash;
    let key = cache::get().map(|_| module.key());
    if let (Some(cache), Some(k)) = (cache::get(), key.as_deref()) {
        let mut found = cache.load(k).map(|e| (e, None));
        if found.is_none() && cache.usable() {
            match worker::prepare(&module, k) {
                Ok(report) => match cache.load(k) {
                    Some(e) => found = Some((e, Some(report))),
                    None => warn!(
                        "{}: the worker's plan cache entry cannot be read; analysing it in the daemon",
                        module.path
                    ),
                },
                Err(e) => warn!("{}: {e:#}; analysing it in the daemon", module.path),
            }
        }
        if let Some(((plan, entry), worker)) = found {
            // Moving cached clones is quick: as good as ready.
            super::progress::done(&module.path);
            return Ok(Analysed {
                module,
                plan,
                made: Made::Cached(Some(Box::new(entry))),
                id,
                fid_base: 0,
                outgrew: 0,
                key: None,
                worker,
            });
        }
    }
    let mut a = analyse_fresh(module, id)?;
    a.key = key;
    Ok(a)
}

/// `" (N of M modules from the plan cache)"`, or nothing when none was;
/// then what worker processes made, if any ([`worker_note`]).
pub(super) fn cached_note(analysed: &[Analysed]) -> String {
    let n = analysed.iter().filter(|a| a.cached_before()).count();
    let workers = worker_note(analysed);
    if n == 0 {
        return workers;
    }
    format!(
        " ({n} of {} modules from the plan cache){workers}",
        analysed.len()
    )
}

/// `" (N analysed in worker processes; their peak RSS up to X MB)"`, or
/// nothing.
pub(super) fn worker_note(analysed: &[Analysed]) -> String {
    let reports: Vec<&WorkerReport> = analysed.iter().filter_map(|a| a.worker.as_ref()).collect();
    let Some(peak) = reports.iter().map(|r| r.peak_rss_bytes).max() else {
        return String::new();
    };
    format!(
        " ({} analysed in worker processes; their peak RSS up to {:.1} MB)",
        reports.len(),
        peak as f64 / 1e6
    )
}

/// `" (N from the plan cache)"`, or nothing for none.
pub(super) fn from_cache_note(n: usize) -> String {
    if n == 0 {
        return String::new();
    }
    format!(" ({n} from the plan cache)")
}
