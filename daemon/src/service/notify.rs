//! systemd's readiness protocol (`sd_notify`): datagrams such as `READY=1`,
//! `STATUS=...`, `WATCHDOG=1` and `STOPPING=1` sent to `$NOTIFY_SOCKET`.
//! Without that variable (not started by systemd with `Type=notify`) every
//! call is a no-op. No libsystemd needed: the protocol is one datagram.
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

pub(crate) struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` (a path, or `@name` for the abstract
    /// namespace).
    pub(crate) fn from_env() -> Self {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|p| {
            let p = p.to_string_lossy().into_owned();
            let addr = match p.strip_prefix('@') {
                Some(name) => SocketAddr::from_abstract_name(name.as_bytes()).ok()?,
                None => SocketAddr::from_pathname(&p).ok()?,
            };
            Self::socket_for(addr)
        });
        Notifier { target }
    }

    fn socket_for(addr: SocketAddr) -> Option<(UnixDatagram, SocketAddr)> {
        let sock = UnixDatagram::unbound().ok()?;
        // Never block the daemon on a slow reader: a full receive queue
        // (net.unix.max_dgram_qlen, 10 by default) drops the message.
        sock.set_nonblocking(true).ok()?;
        Some((sock, addr))
    }

    /// Sends one notification (newline-separated `KEY=value` lines).
    pub(crate) fn send(&self, msg: &str) {
        if let Some((sock, addr)) = &self.target
            && let Err(e) = sock.send_to_addr(msg.as_bytes(), addr)
        {
            tracing::debug!("sd_notify({msg:?}): {e}");
        }
    }

    pub(crate) fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
    }

    pub(crate) fn status(&self, status: &str) {
        self.send(&format!("STATUS={status}"));
    }

    pub(crate) fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={status}"));
    }

    pub(crate) fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    /// How often to ping the watchdog: half of `$WATCHDOG_USEC`, if it is
    /// set and meant for this process (`$WATCHDOG_PID`).
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.target.as_ref()?;
        if let Ok(pid) = std::env::var("WATCHDOG_PID")
            && pid.parse::<u32>().ok() != Some(std::process::id())
        {
            return None;
        }
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        (usec > 0).then(|| Duration::from_micros(usec / 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("burstyd-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            target: Notifier::socket_for(SocketAddr::from_pathname(&path).unwrap()),
        };
        n.ready("sampling");
        let mut buf = [0u8; 256];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=sampling");
        // A reader that stops reading must not stall the daemon: the queue
        // fills (max_dgram_qlen) and further messages are dropped.
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            n.watchdog();
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn disabled_without_a_socket() {
        let n = Notifier { target: None };
        assert!(n.target.is_none());
        assert_eq!(n.watchdog_interval(), None);
        n.ready("no-op");
    }
}
