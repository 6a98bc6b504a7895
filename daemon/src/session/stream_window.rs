//! A `/debug/pprof/streams?seconds=N` request while it collects.
use std::collections::HashMap;

use burstyd_common::addr::Pid;

/// A `/debug/pprof/streams?seconds=N` request being collected: each
/// memory-mode process's recent-reference position when it opened.
pub(super) struct StreamWindow {
    pub(super) end: tokio::time::Instant,
    pub(super) from: HashMap<Pid, u64>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}
