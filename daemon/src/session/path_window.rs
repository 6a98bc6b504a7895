//! A `/debug/pprof/paths?seconds=N` request while it collects.
use std::collections::HashMap;

use burstyd_common::addr::Pid;

use crate::bursts::counts::Tallies;

/// A `/debug/pprof/paths?seconds=N` request being collected: each traced
/// process's counts and sampled event per PC when it opened.
pub(super) struct PathWindow {
    pub(super) start: std::time::SystemTime,
    pub(super) end: tokio::time::Instant,
    pub(super) before: HashMap<Pid, Tallies>,
    pub(super) leaf_before: HashMap<Pid, HashMap<u64, u64>>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}
