//! A `/debug/pprof/values?seconds=N` (or `targets`) request while it
//! collects.
use std::collections::HashMap;

use burstyd_common::addr::Pid;

use super::tuple_profiles::TupleMark;
use crate::bursts::decode::TupleKind;

/// A `/debug/pprof/values?seconds=N` (`targets`) request being collected:
/// its kind, and each process's tuple profiles when it opened.
pub(super) struct TupleWindow {
    pub(super) kind: TupleKind,
    pub(super) start: std::time::SystemTime,
    pub(super) end: tokio::time::Instant,
    pub(super) before: HashMap<Pid, TupleMark>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
}
