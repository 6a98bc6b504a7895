//! burstyd's `summary.json` (written next to the profiles): the run's
//! counters and each traced process's, under their `/metrics` names.
//! Tests read these figures instead of the log's summary lines.
use std::path::Path;

use serde_json::Value;

/// The whole `summary.json`.
#[derive(Clone, Debug)]
pub struct Summary {
    pub json: Value,
}

/// One process traced in bursts.
#[derive(Clone, Debug)]
pub struct Process<'a> {
    pub json: &'a Value,
}

/// Reads `dir/summary.json` (panics, with the directory's listing, when
/// it is missing or malformed).
pub fn read_summary(dir: &Path) -> Summary {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        let listing: Vec<_> = std::fs::read_dir(dir)
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        panic!("{}: {e} (the directory holds {listing:?})", path.display())
    });
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}:\n{text}", path.display()));
    assert_eq!(json["version"], 1, "{text}");
    Summary { json }
}

/// A count (non-negative integer) at `key` of `v`, or a panic naming it.
fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {key} in {v:#}"))
}

fn real(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key} in {v:#}"))
}

impl Summary {
    /// A run-wide counter by its metric name (`burstyd_samples_total`).
    pub fn metric(&self, name: &str) -> u64 {
        count(&self.json["metrics"], name)
    }

    /// A run-wide labelled counter's value for `label`
    /// (`burstyd_burst_signals_declined_total`, `signal_blocked`).
    pub fn metric_by(&self, name: &str, label: &str) -> u64 {
        count(&self.json["metrics"][name], label)
    }

    pub fn samples(&self) -> u64 {
        self.metric("burstyd_samples_total")
    }

    /// Link-map changes the traced processes' handlers were signalled for.
    pub fn link_map_signalled(&self) -> u64 {
        self.metric_by("burstyd_link_map_changes_total", "signalled")
    }

    /// Every process traced in bursts, in the order they were reported.
    pub fn processes(&self) -> Vec<Process<'_>> {
        self.json["processes"]
            .as_array()
            .unwrap_or_else(|| panic!("no processes in {:#}", self.json))
            .iter()
            .map(|json| Process { json })
            .collect()
    }

    /// The process traced in bursts: the first one reported (a run traces
    /// its command; panics when none was traced).
    pub fn traced(&self) -> Process<'_> {
        self.processes()
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no process traced in bursts: {:#}", self.json))
    }

    /// The traced process `pid`.
    pub fn process(&self, pid: u32) -> Process<'_> {
        self.processes()
            .into_iter()
            .find(|p| p.pid() == pid)
            .unwrap_or_else(|| panic!("pid {pid} not traced: {:#}", self.json))
    }
}

impl Process<'_> {
    pub fn pid(&self) -> u32 {
        count(self.json, "pid") as u32
    }

    pub fn exe(&self) -> &str {
        self.json["exe"].as_str().unwrap_or_default()
    }

    /// One of its counters by metric name (`burstyd_traced_bursts_total`).
    pub fn metric(&self, name: &str) -> u64 {
        count(&self.json["metrics"], name)
    }

    pub fn metric_by(&self, name: &str, label: &str) -> u64 {
        count(&self.json["metrics"][name], label)
    }

    /// Bursts taken.
    pub fn taken(&self) -> u64 {
        self.metric("burstyd_traced_bursts_total")
    }

    /// Bursts cut short.
    pub fn truncated(&self) -> u64 {
        self.metric("burstyd_traced_bursts_truncated_total")
    }

    pub fn records_lost(&self) -> u64 {
        self.metric("burstyd_traced_records_lost_total")
    }

    /// Memory mode: data references read from the bursts.
    pub fn references(&self) -> u64 {
        self.metric("burstyd_traced_references_total")
    }

    pub fn bad_records(&self) -> u64 {
        self.metric("burstyd_traced_bad_records_total")
    }

    pub fn paths(&self) -> u64 {
        self.metric("burstyd_traced_paths_total")
    }

    /// Signals its handler declined for `reason` (`busy`,
    /// `pc_not_rewritten`, `budget_0`, `behind`).
    pub fn declined(&self, reason: &str) -> u64 {
        self.metric_by("burstyd_traced_bursts_declined_total", reason)
    }

    /// The share (0-100) of the executable's user-mode samples that land
    /// in instrumented code.
    pub fn exe_coverage_pct(&self) -> f64 {
        100.0 * real(&self.json["hot_coverage"], "exe_ratio")
    }

    /// The share (0-100) of the process's user-mode samples, over all
    /// modules, that land in instrumented code.
    pub fn all_coverage_pct(&self) -> f64 {
        100.0 * real(&self.json["hot_coverage"], "all_ratio")
    }

    /// The share (0-100) of the process's user-mode samples in its
    /// executable.
    pub fn exe_share_pct(&self) -> f64 {
        100.0 * real(&self.json["hot_coverage"], "exe_share")
    }

    /// The executable's sampled uninstrumented functions, heaviest first:
    /// (function, share (0-100) of the executable's samples, why).
    pub fn missed_in_exe(&self) -> Vec<(String, f64, String)> {
        let hot = &self.json["hot_coverage"];
        let in_exe = real(hot, "in_exe");
        hot["missed"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
                let pct = 100.0 * real(m, "weight") / in_exe.max(1.0);
                (s("function"), pct, s("why"))
            })
            .collect()
    }

    /// The libraries with clones, by name.
    pub fn libraries(&self) -> Vec<String> {
        self.json["hot_coverage"]["libraries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// The sampled uninstrumented functions, the executable's and the
    /// libraries': (function, why).
    pub fn missed(&self) -> Vec<(String, String)> {
        let hot = &self.json["hot_coverage"];
        let libs = hot["libraries"].as_array().into_iter().flatten();
        std::iter::once(&hot["missed"])
            .chain(libs.map(|l| &l["missed"]))
            .filter_map(Value::as_array)
            .flatten()
            .map(|m| {
                let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
                (s("function"), s("why"))
            })
            .collect()
    }

    /// The hot coverage object, for messages.
    pub fn hot_coverage(&self) -> String {
        format!("{:#}", self.json["hot_coverage"])
    }

    /// The whole object, for messages.
    pub fn describe(&self) -> String {
        format!("{:#}", self.json)
    }
}
