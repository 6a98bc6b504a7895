//! One rescan of the service's configured targets, applied to the sampler.
use crate::sampling::sampler::Sampler;
use crate::service::metrics::METRICS;
use crate::service::targets::Scanner;
use crate::stacks::table::ProcessTable;

/// One rescan of the configured targets: new pids into `TARGETS`, exited
/// or no longer matching ones out.
pub(super) fn apply_scan(scanner: &mut Scanner, sampler: &mut Sampler, procs: &mut ProcessTable) {
    let change = scanner.scan();
    for pid in change.added {
        match sampler.add_target(pid) {
            Ok(()) => tracing::info!(
                "target pid {pid} ({}) appeared; sampling it",
                crate::sys::comm(pid).unwrap_or_else(|| "?".into())
            ),
            Err(e) => tracing::warn!("adding target pid {pid}: {e}"),
        }
    }
    for pid in change.removed {
        if let Err(e) = sampler.remove_target(pid) {
            tracing::warn!("removing target pid {pid}: {e}");
        }
        if !crate::sys::process_running(pid) {
            procs.mark_exited(pid);
            tracing::info!("target pid {pid} exited");
        } else {
            tracing::info!("pid {pid} no longer matches the targets; not sampling it");
        }
    }
    METRICS.targets.set(scanner.current().len() as u64);
}
