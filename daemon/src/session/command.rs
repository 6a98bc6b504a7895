//! The session's signals, and `burstyd run`'s command.
//!
//! SIGINT, SIGTERM and SIGHUP are blocked in every thread from the start
//! of `main` (`sys::block_session_signals`) and read here from a
//! signalfd, which says who sent each one. With `--pid` or system-wide,
//! SIGINT/SIGTERM end the session and SIGHUP reloads the configuration.
//! Under `run`, burstyd is a wrapper: all three are passed on to the
//! command, every time (a second ^C too), and the session ends when the
//! command exits; burstyd then exits with the command's status. A signal
//! the command already got is not passed on a second time: one the
//! terminal sent to the foreground process group the command shares with
//! burstyd (^C, a hangup), or one the command sent itself. While the final
//! profile is written the signals wait, pending, and are passed on once
//! burstyd waits for the command again.
use std::process::ExitStatus;

use anyhow::Context as _;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::process::Child;

use crate::sys::{SigInfo, SignalFd, process_group, send_signal, signal_name};

/// The signals the session handles (`sys::SESSION_SIGNALS`).
pub(super) struct Signals(AsyncFd<SignalFd>);

impl Signals {
    pub(super) fn new() -> std::io::Result<Self> {
        let fd = SignalFd::new()?;
        // SAFETY: `SignalFd` owns its descriptor and always returns it,
        // open, from `as_raw_fd` until it is dropped with the `AsyncFd`.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Signals(fd))
    }

    /// The next signal (cancel-safe: nothing is read until one is there).
    pub(super) async fn recv(&mut self) -> std::io::Result<SigInfo> {
        loop {
            let mut ready = self.0.readable().await?;
            if let Ok(r) = ready.try_io(|fd| fd.get_ref().read()) {
                return r;
            }
        }
    }
}

/// `burstyd run`'s command: the child and, once it has exited, its status.
pub(crate) struct Command {
    child: Child,
    pid: u32,
    status: Option<ExitStatus>,
    /// The exec gate's report pipe (read end, non-blocking): the errno of
    /// an exec that failed; closed empty by one that succeeded.
    report: Option<std::os::fd::OwnedFd>,
}

impl Command {
    pub(crate) fn new(child: Child, report: Option<std::os::fd::OwnedFd>) -> Self {
        let pid = child.id().unwrap_or(0);
        Command {
            child,
            pid,
            status: None,
            report,
        }
    }

    /// Whether the command never ran: its exec failed (the gate said so
    /// before it exited 127 or 126).
    pub(super) fn exec_failed(&self) -> bool {
        use std::os::fd::AsRawFd;
        let Some(fd) = &self.report else {
            return false;
        };
        let mut code = [0u8; 4];
        // SAFETY: reading into a valid 4-byte buffer from our own pipe.
        let n = unsafe { libc::read(fd.as_raw_fd(), code.as_mut_ptr().cast(), code.len()) };
        n > 0
    }

    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    pub(super) fn exited(&self) -> bool {
        self.status.is_some()
    }

    /// The command's exit (cancel-safe, like `Child::wait`). A command
    /// that ended while the attach thread traced it (an exec that failed
    /// before its entry point) was reaped by that thread's ptrace wait:
    /// its status is taken from there.
    pub(super) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        let s = match self.child.wait().await {
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                // The attach thread notes the status right after its wait
                // returns: give it that moment.
                let mut st = None;
                for _ in 0..200 {
                    st = userspace_rewriter::inject::reaped_status(self.pid as i32);
                    if st.is_some() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                ExitStatus::from_raw(st.ok_or(e)?)
            }
            r => r?,
        };
        self.status = Some(s);
        Ok(s)
    }

    /// Passes `sig` on to the command, unless it got it already.
    pub(super) fn forward(&self, sig: &SigInfo) {
        let name = signal_name(sig.signo);
        if self.exited() {
            return;
        }
        let same_group = match (process_group(self.pid), process_group(0)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if !needs_forwarding(sig, self.pid, same_group) {
            tracing::info!(
                "{name}: the command (pid {}) got it too; waiting for it to exit",
                self.pid
            );
            return;
        }
        match send_signal(self.pid, sig.signo) {
            Ok(()) => tracing::info!(
                "{name}: passed on to the command (pid {}); waiting for it to exit",
                self.pid
            ),
            Err(e) => tracing::warn!("passing {name} on to the command (pid {}): {e}", self.pid),
        }
    }

    /// After the session: waits for the command to exit (if it has not),
    /// still passing signals on.
    pub(super) async fn finish(mut self) -> anyhow::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let mut signals = match Signals::new() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("reading signals ({e}): they no longer reach the command");
                None
            }
        };
        loop {
            tokio::select! {
                s = self.wait() => return s.context("waiting for the command"),
                r = recv(&mut signals) => match r {
                    Ok(sig) => self.forward(&sig),
                    Err(e) => {
                        tracing::warn!("reading signals ({e}): they no longer reach the command");
                        signals = None;
                    }
                },
            }
        }
    }
}

/// The next signal; never without a source.
async fn recv(signals: &mut Option<Signals>) -> std::io::Result<SigInfo> {
    match signals {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Whether a signal burstyd got still has to reach the command (pid
/// `command`, in burstyd's own process group or not): not when the
/// terminal sent it to the whole foreground group (`SI_KERNEL`), the
/// command's too, nor when the command sent it.
fn needs_forwarding(sig: &SigInfo, command: u32, same_group: bool) -> bool {
    match sig.code {
        libc::SI_KERNEL => !same_group,
        libc::SI_USER => sig.pid != command,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(code: i32, pid: u32) -> SigInfo {
        SigInfo {
            signo: libc::SIGINT,
            code,
            pid,
        }
    }

    #[test]
    fn forwards_what_the_command_did_not_get() {
        // kill(burstyd): passed on, twice as well as once.
        assert!(needs_forwarding(&sig(libc::SI_USER, 100), 200, true));
        // ^C in the terminal reached the whole foreground group.
        assert!(!needs_forwarding(&sig(libc::SI_KERNEL, 0), 200, true));
        // ... unless the command left burstyd's group.
        assert!(needs_forwarding(&sig(libc::SI_KERNEL, 0), 200, false));
        // The command signalling burstyd gets no echo.
        assert!(!needs_forwarding(&sig(libc::SI_USER, 200), 200, true));
        // sigqueue(3) and the like.
        assert!(needs_forwarding(&sig(libc::SI_QUEUE, 100), 200, true));
    }
}
