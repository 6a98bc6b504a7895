//! `burstyd run`'s command, held at its entry point until its clones are
//! in place: the command waits on a gate (a pipe burstyd holds) before it
//! execs; the attach thread seizes it, releases the gate and runs it to its
//! entry point.

use burstyd_common::addr::Pid;
use tracing::{info, warn};

/// `burstyd run` releases its command just before the session starts; the
/// exec replaces the gate (burstyd itself) within milliseconds.
/// `run`'s command `pid`, still waiting on its `gate` to exec: becomes
/// its tracer, releases the gate, and runs it to its entry point
/// ([`hold::run_to_entry`]). Whether it is held there now (by this
/// thread); otherwise it runs (or ended), and why is logged.
pub(crate) fn hold_command(pid: Pid, gate: std::os::fd::OwnedFd) -> bool {
    use userspace_rewriter::inject::hold;
    let seized = hold::seize_before_exec(pid);
    drop(gate);
    if let Err(e) = seized {
        warn!(%pid, "cannot hold the command at its entry point ({e}); it starts at once and bursts begin after the analysis");
        return false;
    }
    match hold::run_to_entry(pid) {
        Ok(hold::Entry::Held(entry)) => {
            info!(%pid, "holding the command at its entry point {entry:#x} until its clones are in place");
            true
        }
        Ok(hold::Entry::Static) => {
            info!(%pid, "a static executable: it starts at once, and bursts begin after the analysis");
            false
        }
        Err(e) => {
            if crate::sys::process_running(pid) {
                warn!(%pid, "cannot hold the command at its entry point ({e}); bursts begin after the analysis");
            }
            false
        }
    }
}

pub(crate) fn wait_for_exec(pid: Pid) {
    let me = std::fs::read_link("/proc/self/exe").ok();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match crate::sys::exe_link(pid) {
            Ok(p) if Some(&p) != me.as_ref() => {
                // Let the dynamic loader map the libraries and set up TLS.
                std::thread::sleep(std::time::Duration::from_millis(5));
                return;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            Err(_) => return,
        }
    }
}
