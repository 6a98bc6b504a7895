//! The hot data streams of memory mode (`--record refs`): at the end,
//! `hot-streams.json` for the first traced process (and
//! `hot-streams-<pid>.json` for each, with several), from the
//! references its bursts recorded ([`crate::bursts::data_refs`]); per
//! interval, `hot-streams-<time>.json` of every process's references in
//! it (published on `/debug/pprof/streams` and pushed as `APP.streams`);
//! and for a `/debug/pprof/streams?seconds=N` window. An interval's or a
//! window's streams come from the processes' recent-reference logs
//! ([`crate::streams::recent`]), in a grammar of their own: the streams
//! of one process or several (the same program's streams merge by
//! signature, as pprof merges stacks).
use std::collections::HashMap;
use std::time::SystemTime;

use tracing::{info, warn};

use super::Session;
use super::stream_window::StreamWindow;
use crate::bursts::data_refs::DataRefs;
use crate::bursts::tracer::Finished;
use crate::hot_streams::Report;
use crate::streams::hot::HotOptions;
use crate::streams::references::References;
use burstyd_common::addr::Pid;

impl Session {
    /// Writes each finished process's hot data streams (nothing when no
    /// process was traced in memory mode).
    pub(super) fn write_stream_profiles(&self, finished: &[Finished]) {
        let with: Vec<_> = finished
            .iter()
            .filter_map(|f| Some((f.traced.pid, f.data_refs.as_ref()?)))
            .collect();
        let Some(&(first, _)) = with.first() else {
            return;
        };
        let output = &self.opts.output;
        let _ = std::fs::create_dir_all(output);
        for &(pid, d) in &with {
            let mut report = crate::hot_streams::report(&d.refs, &HotOptions::default());
            report.dropped = d.dropped + d.skipped;
            let json = match serde_json::to_string_pretty(&report) {
                Ok(j) => j + "\n",
                Err(e) => {
                    warn!(%pid, "hot data streams: {e}");
                    continue;
                }
            };
            let mut names = Vec::new();
            if pid == first {
                names.push("hot-streams.json".to_string());
            }
            if with.len() > 1 {
                names.push(format!("hot-streams-{pid}.json"));
            }
            for name in names {
                match crate::export::write_atomic(output, &name, json.as_bytes()) {
                    Ok(_) => info!(
                        %pid,
                        "hot data streams: {} hold {:.1}% of the {} its bursts recorded (wrote {})",
                        crate::words::count(report.streams.len() as u64, "stream", "streams"),
                        100.0 * report.hot_share,
                        crate::words::count(report.references, "reference", "references"),
                        output.join(&name).display()
                    ),
                    Err(e) => warn!("writing {}: {e}", output.join(&name).display()),
                }
            }
        }
    }
}

impl Session {
    /// Every memory-mode process's references, live and released.
    fn data_refs(&self) -> Vec<(Pid, &DataRefs)> {
        let live = self
            .bursts
            .tracers()
            .iter()
            .filter_map(|t| Some((t.pid(), t.data_refs()?)));
        let released = self
            .released
            .finished
            .iter()
            .filter_map(|f| Some((f.traced.pid, f.data_refs.as_ref()?)));
        live.chain(released).collect()
    }

    /// Each memory-mode process's position in its recent references.
    fn stream_positions(&self) -> HashMap<Pid, u64> {
        self.data_refs()
            .into_iter()
            .map(|(pid, d)| (pid, d.recent.position()))
            .collect()
    }

    /// The hot streams of every process's references since `from` (a
    /// process not in it: all it has); `None` when no process is traced
    /// in memory mode.
    fn streams_since(&self, from: &HashMap<Pid, u64>) -> Option<Report> {
        let logs = self.data_refs();
        if logs.is_empty() {
            return None;
        }
        let mut refs = References::new();
        let mut lost = 0;
        for (pid, d) in logs {
            let at = from.get(&pid).copied().unwrap_or(0);
            lost += d.recent.copy_since(at, &d.refs.modules, &mut refs);
        }
        let mut report = crate::hot_streams::report(&refs, &HotOptions::default());
        report.dropped = lost;
        Some(report)
    }

    /// Every interval: the hot streams of the references recorded in it,
    /// as `hot-streams-<time>.json` (none when there were none),
    /// published on `/debug/pprof/streams` and pushed.
    pub(super) fn write_interval_streams(&mut self, start: SystemTime, end: SystemTime) {
        let now = self.stream_positions();
        let marks = std::mem::replace(&mut self.stream_marks, now);
        let Some(report) = self.streams_since(&marks) else {
            return;
        };
        if report.references == 0 {
            return;
        }
        let json = match serde_json::to_string_pretty(&report) {
            Ok(j) => j + "\n",
            Err(e) => {
                warn!("interval hot data streams: {e}");
                return;
            }
        };
        let name = format!("hot-streams-{}.json", super::files::timestamp(end));
        let output = &self.opts.output;
        match crate::export::write_atomic(output, &name, json.as_bytes()) {
            Ok(p) => info!("wrote {}", p.display()),
            Err(e) => warn!(
                "cannot write the interval's hot data streams {}: {e}",
                output.join(&name).display()
            ),
        }
        if let Some(p) = &self.svc.pusher {
            let nanos = |t: SystemTime| {
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i64)
            };
            match crate::export::streams::streams_pprof(
                &report,
                nanos(start),
                nanos(end) - nanos(start),
            ) {
                Ok(gz) => super::intervals::push_streams(p, &gz, start, end, &self.out.meta),
                Err(e) => warn!("encoding the interval's hot data streams: {e}"),
            }
        }
        crate::service::http::set_streams_report(json.into_bytes());
    }

    /// `/debug/pprof/streams?seconds=N`: from now, the hot streams of
    /// every process traced in memory mode (503 while a first process is
    /// being attached, 404 when none is traced).
    pub(super) fn open_stream_window(
        &mut self,
        d: std::time::Duration,
        reply: tokio::sync::oneshot::Sender<Result<Vec<u8>, String>>,
    ) {
        if self.bursts.active() {
            self.on_burst_tick();
        }
        let from = self.stream_positions();
        if from.is_empty() {
            let _ = reply.send(Err(self.nothing_traced(
                "in memory mode",
                " (trace with --record refs, or [bursts] record = [\"refs\"])",
            )));
            return;
        }
        self.stream_windows.push(StreamWindow {
            end: tokio::time::Instant::now() + d,
            from,
            reply,
        });
    }

    /// Answers the stream windows whose time is up.
    pub(super) fn finish_stream_windows(&mut self) {
        let done = self.take_due(|s| &mut s.stream_windows, |w| w.end);
        if done.is_empty() {
            return;
        }
        for w in done {
            let answer = self
                .streams_since(&w.from)
                .ok_or_else(|| {
                    format!(
                        "{}no process is traced in memory mode now",
                        crate::service::http::NOT_FOUND
                    )
                })
                .and_then(|r| {
                    serde_json::to_vec_pretty(&r)
                        .map(|mut j| {
                            j.push(b'\n');
                            j
                        })
                        .map_err(|e| e.to_string())
                });
            let _ = w.reply.send(answer);
        }
    }
}
