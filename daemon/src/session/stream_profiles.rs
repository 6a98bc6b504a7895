//! The hot data streams of memory mode (`--record refs`): at the end,
//! `hot-streams.json` for the first traced process (and
//! `hot-streams-<pid>.json` for each, with several), from the
//! references its bursts recorded ([`crate::bursts::data_refs`]).
use tracing::{info, warn};

use super::Session;
use crate::bursts::tracer::Finished;
use crate::streams::hot::HotOptions;

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
            report.dropped = d.dropped;
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
