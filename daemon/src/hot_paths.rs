//! `burstyd hot-paths`: the paths of a `paths.pb.gz` that hold most of a
//! metric, reported as Ammons, Ball & Larus report the hot paths of the
//! SPEC benchmarks. Some terms used here:
//! - a path's *share* is its part of the profile's total metric;
//! - *hot paths* are those whose share is at least a threshold (1% by
//!   default);
//! - a hot path is *dense* when its rate (metric per execution) is at least
//!   the program's average, and *sparse* otherwise;
//! - the report also gives how *concentrated* the metric is: how few paths
//!   hold 50, 90 and 99% of it.
//!
//! A path is a function's Ball-Larus path (labels `symbol` and `path`),
//! summed over its calling contexts and processes. The metric is a sample
//! type of the profile (`--metric`, the profile's default type unless
//! given); `executions/count` gives each path's executions.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, bail};

use crate::export::pprof::Profile;

pub(crate) struct HotPathOptions<'a> {
    /// The sample type to rank by; the profile's default when `None`.
    pub(crate) metric: Option<&'a str>,
    /// The share (percent) a path must hold to be hot.
    pub(crate) threshold_pct: f64,
    /// How many of the hottest paths to list.
    pub(crate) top: usize,
    pub(crate) json: bool,
}

/// One path, summed over its contexts.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct PathRow {
    /// The leaf pseudo-frame: `f path N: L12→L14`.
    pub(crate) name: String,
    pub(crate) executions: u64,
    pub(crate) metric: u64,
    /// The 95% confidence interval's half-width of its executions, in
    /// percent of them (the profile's `ci95_ppm` label; the widest of its
    /// processes'); none in a full trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ci95_pct: Option<f64>,
}

/// The report.
#[derive(Debug, PartialEq, serde::Serialize)]
pub(crate) struct Report {
    /// `type/unit` of the metric.
    pub(crate) metric: String,
    pub(crate) threshold_pct: f64,
    /// Paths executed (or with some of the metric).
    pub(crate) paths: usize,
    pub(crate) executions: u64,
    pub(crate) total: u64,
    /// (percent of the metric, fewest paths that hold it), for 50, 90, 99.
    pub(crate) concentration: Vec<(f64, usize)>,
    pub(crate) hot: Group,
    pub(crate) dense: Group,
    pub(crate) sparse: Group,
    /// The hottest paths, by metric.
    pub(crate) top: Vec<PathRow>,
}

/// Some paths and what they hold.
#[derive(Debug, Default, PartialEq, serde::Serialize)]
pub(crate) struct Group {
    pub(crate) paths: usize,
    pub(crate) metric: u64,
    pub(crate) executions: u64,
}

pub(crate) fn run(profile: &Path, opts: &HotPathOptions) -> anyhow::Result<()> {
    if !(opts.threshold_pct > 0.0 && opts.threshold_pct <= 100.0) {
        bail!(
            "--threshold {} is not a percentage above 0 and at most 100",
            opts.threshold_pct
        );
    }
    let prof = crate::export::pprof::read_file(profile)?;
    let (metric, rows) =
        rows(&prof, opts.metric).with_context(|| format!("reading {}", profile.display()))?;
    let r = report(metric, rows, opts.threshold_pct, opts.top);
    let text = if opts.json {
        serde_json::to_string_pretty(&r)? + "\n"
    } else {
        human(&r, profile)
    };
    crate::sys::print_stdout(&text)
}

/// The paths of a burstyd path profile and the metric's name: each
/// path's executions and metric, summed over its samples (contexts,
/// processes). A sample without the `symbol` and `path` labels is not a
/// path and is left out.
pub(crate) fn rows(prof: &Profile, metric: Option<&str>) -> anyhow::Result<(String, Vec<PathRow>)> {
    let s = |i: i64| prof.string_table.get(i as usize).map_or("", String::as_str);
    let types: Vec<(&str, &str)> = prof
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    let Some(ex) = types.iter().position(|t| t.0 == "executions") else {
        bail!("no `executions` sample type: not a burstyd path profile (paths.pb.gz)");
    };
    let m = match metric {
        Some(want) => types
            .iter()
            .position(|t| t.0 == want || format!("{}/{}", t.0, t.1) == want)
            .with_context(|| {
                let have: Vec<String> = types.iter().map(|t| format!("{}/{}", t.0, t.1)).collect();
                format!(
                    "no sample type `{want}` (the profile has {})",
                    have.join(", ")
                )
            })?,
        None => {
            let default = s(prof.default_sample_type);
            types
                .iter()
                .position(|t| !default.is_empty() && t.0 == default)
                .unwrap_or(types.len() - 1)
        }
    };
    let (symbol, path) = (key(prof, "symbol"), key(prof, "path"));
    let ci95 = key(prof, crate::export::paths::CI95_LABEL);
    let locations: HashMap<u64, &crate::export::pprof::Location> =
        prof.location.iter().map(|l| (l.id, l)).collect();
    let functions: HashMap<u64, i64> = prof.function.iter().map(|f| (f.id, f.name)).collect();
    let mut by_path: HashMap<(i64, i64), PathRow> = HashMap::new();
    for sample in &prof.sample {
        let label = |k: Option<i64>| {
            let k = k?;
            sample.label.iter().find(|l| l.key == k)
        };
        let (Some(sym), Some(num)) = (label(symbol), label(path)) else {
            continue;
        };
        let value = |i: usize| sample.value.get(i).copied().unwrap_or(0).max(0) as u64;
        let row = by_path.entry((sym.str, num.num)).or_insert_with(|| {
            let name = sample
                .location_id
                .first()
                .and_then(|id| locations.get(id))
                .and_then(|l| l.line.first())
                .and_then(|line| functions.get(&line.function_id))
                .map(|&n| s(n).to_owned())
                .unwrap_or_else(|| format!("{} path {}", s(sym.str), num.num));
            PathRow {
                name,
                executions: 0,
                metric: 0,
                ci95_pct: None,
            }
        });
        row.executions += value(ex);
        row.metric += value(m);
        if let Some(l) = label(ci95) {
            let pct = l.num as f64 / 1e4;
            row.ci95_pct = Some(row.ci95_pct.map_or(pct, |c| c.max(pct)));
        }
    }
    let (t, u) = types[m];
    Ok((format!("{t}/{u}"), by_path.into_values().collect()))
}

/// The string-table index of label key `name`.
fn key(prof: &Profile, name: &str) -> Option<i64> {
    prof.string_table
        .iter()
        .position(|s| s == name)
        .map(|i| i as i64)
}

/// The report over `rows`: concentration, hot paths at `threshold_pct`
/// split into dense and sparse, and the `top` hottest.
pub(crate) fn report(
    metric: String,
    mut rows: Vec<PathRow>,
    threshold_pct: f64,
    top: usize,
) -> Report {
    rows.retain(|r| r.executions > 0 || r.metric > 0);
    rows.sort_by(|a, b| b.metric.cmp(&a.metric).then_with(|| a.name.cmp(&b.name)));
    let total: u64 = rows.iter().map(|r| r.metric).sum();
    let executions: u64 = rows.iter().map(|r| r.executions).sum();
    let concentration = [50.0, 90.0, 99.0]
        .into_iter()
        .map(|pct| {
            // The fewest paths (heaviest first) whose metric reaches pct.
            let want = total as f64 * pct / 100.0;
            let mut sum = 0u64;
            let n = rows
                .iter()
                .position(|r| {
                    sum += r.metric;
                    sum as f64 >= want
                })
                .map_or(rows.len(), |i| i + 1);
            (pct, if total == 0 { 0 } else { n })
        })
        .collect();
    let average = total as f64 / executions.max(1) as f64;
    let (mut hot, mut dense, mut sparse) = (Group::default(), Group::default(), Group::default());
    for r in rows
        .iter()
        .filter(|r| total > 0 && r.metric as f64 * 100.0 >= threshold_pct * total as f64)
    {
        let rate = r.metric as f64 / r.executions.max(1) as f64;
        for g in [
            &mut hot,
            if rate >= average {
                &mut dense
            } else {
                &mut sparse
            },
        ] {
            g.paths += 1;
            g.metric += r.metric;
            g.executions += r.executions;
        }
    }
    Report {
        metric,
        threshold_pct,
        paths: rows.len(),
        executions,
        total,
        concentration,
        hot,
        dense,
        sparse,
        top: rows.into_iter().take(top).collect(),
    }
}

fn human(r: &Report, profile: &Path) -> String {
    let pct = |v: u64, of: u64| 100.0 * v as f64 / of.max(1) as f64;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "hot paths of {} by {}: {} paths executed {} times",
        profile.display(),
        r.metric,
        r.paths,
        r.executions
    );
    if r.total == 0 {
        let _ = writeln!(o, "no path has any {}", r.metric);
        return o;
    }
    let conc: Vec<String> = r
        .concentration
        .iter()
        .map(|(p, n)| format!("{p}% of it in {n} paths"))
        .collect();
    let _ = writeln!(o, "concentration: {}", conc.join(", "));
    let group = |g: &Group| {
        format!(
            "{} paths, {:.1}% of the {} and {:.1}% of the executions",
            g.paths,
            pct(g.metric, r.total),
            r.metric,
            pct(g.executions, r.executions)
        )
    };
    let _ = writeln!(
        o,
        "hot paths (each with at least {}% of the {}): {}",
        r.threshold_pct,
        r.metric,
        group(&r.hot)
    );
    let _ = writeln!(
        o,
        "  dense (rate at or above the average of {:.3} per execution): {}",
        r.total as f64 / r.executions.max(1) as f64,
        group(&r.dense)
    );
    let _ = writeln!(o, "  sparse: {}", group(&r.sparse));
    // The executions' 95% interval, where the profile has one (not a
    // full trace).
    let with_ci = r.top.iter().any(|p| p.ci95_pct.is_some());
    let ci = |p: &PathRow| match (with_ci, p.ci95_pct) {
        (false, _) => String::new(),
        (true, Some(c)) => format!(" {:>7}", format!("±{c:.1}%")),
        (true, None) => format!(" {:>7}", "-"),
    };
    let _ = writeln!(
        o,
        "{:>4} {:>7} {:>7} {:>7}{} {:>9}  path",
        "rank",
        "metric",
        "cum",
        "execs",
        if with_ci {
            format!(" {:>7}", "±ci95")
        } else {
            String::new()
        },
        "rate/avg"
    );
    let average = r.total as f64 / r.executions.max(1) as f64;
    let mut cum = 0;
    for (i, p) in r.top.iter().enumerate() {
        cum += p.metric;
        let rate = p.metric as f64 / p.executions.max(1) as f64;
        let _ = writeln!(
            o,
            "{:>4} {:>6.1}% {:>6.1}% {:>6.1}%{} {:>8.2}x  {}",
            i + 1,
            pct(p.metric, r.total),
            pct(cum, r.total),
            pct(p.executions, r.executions),
            ci(p),
            rate / average.max(f64::MIN_POSITIVE),
            p.name
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, executions: u64, metric: u64) -> PathRow {
        PathRow {
            name: name.into(),
            executions,
            metric,
            ci95_pct: None,
        }
    }

    /// Ten paths built so that every figure is known: `slow` holds half
    /// the metric in 1% of the executions (dense), `cheap` 30% of the
    /// metric in 90% of them (sparse), eight cold paths 2.5% each.
    #[test]
    fn concentration_and_dense_and_sparse_paths() {
        let mut rows = vec![row("slow", 10, 500), row("cheap", 900, 300)];
        for i in 0..8 {
            rows.push(row(&format!("cold{i}"), 11, 25));
        }
        rows.push(row("never", 0, 0));
        let r = report("cycles/count".into(), rows, 3.0, 3);
        assert_eq!(r.paths, 10);
        assert_eq!((r.total, r.executions), (1000, 998));
        // 50%: slow alone; 90%: slow, cheap and 4 of the cold ones (800 +
        // 4 * 25 = 900); 99%: all ten.
        assert_eq!(r.concentration, vec![(50.0, 1), (90.0, 6), (99.0, 10)]);
        // At 3%, the cold paths (2.5%) are not hot.
        assert_eq!(
            r.hot,
            Group {
                paths: 2,
                metric: 800,
                executions: 910
            }
        );
        assert_eq!(
            (
                r.dense.paths,
                r.dense.metric,
                r.sparse.paths,
                r.sparse.metric
            ),
            (1, 500, 1, 300)
        );
        let names: Vec<&str> = r.top.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["slow", "cheap", "cold0"]);
        // Of the three listed, at 2% cold0 is hot too (25 in 11
        // executions: dense, above the average rate).
        let r2 = report("cycles/count".into(), r.top.clone(), 2.0, 10);
        assert_eq!((r2.hot.paths, r2.dense.paths), (3, 2));
        let text = human(&r, Path::new("paths.pb.gz"));
        assert!(
            text.contains("50% of it in 1 paths, 90% of it in 6 paths"),
            "{text}"
        );
        assert!(
            text.contains("   1   50.0%   50.0%    1.0%    49.90x  slow"),
            "{text}"
        );
    }

    #[test]
    fn a_profile_without_the_metric_is_refused() {
        let prof = Profile {
            sample_type: vec![],
            string_table: vec![String::new()],
            ..Default::default()
        };
        let e = rows(&prof, None).unwrap_err().to_string();
        assert!(e.contains("not a burstyd path profile"), "{e}");
    }

    /// The profile `export::paths` writes, read back: one row per (symbol,
    /// path), summed over its contexts.
    #[test]
    fn rows_sum_a_path_over_its_contexts() {
        use crate::export::pprof::{LineKey, MappingKey, ProfileBuilder};
        let mut b = ProfileBuilder::new(
            &[("executions", "count"), ("cpu-clock", "nanoseconds")],
            ("cpu-clock", "nanoseconds"),
            1,
        );
        let m = b.mapping(
            &MappingKey {
                start: 0x1000,
                limit: 0x2000,
                file_offset: 0,
                filename: "/bin/f".into(),
                build_id: String::new(),
            },
            true,
        );
        // As `export::paths` writes them: the leaf location holds the
        // path's pseudo-frame inlined into its function.
        let mut loc = |addr: u64, names: &[&str]| {
            let lines: Vec<LineKey> = names
                .iter()
                .map(|n| LineKey {
                    function: (*n).into(),
                    file: String::new(),
                    line: 0,
                })
                .collect();
            b.location(m, addr, &lines)
        };
        let (p3, p4) = (
            loc(0x1010, &["f path 3: L1→L2", "f"]),
            loc(0x1010, &["f path 4: L1→L3", "f"]),
        );
        let (g, h) = (loc(0x1100, &["g"]), loc(0x1200, &["h"]));
        let sym: &[(&str, &str)] = &[("symbol", "f")];
        b.sample(vec![p3, g], vec![10, 100], sym, &[("path", 3)]);
        b.sample(vec![p3, h], vec![5, 50], sym, &[("path", 3)]);
        b.sample(vec![p4, g], vec![1, 7], sym, &[("path", 4)]);
        let prof = b.finish();
        let (metric, mut rs) = rows(&prof, None).unwrap();
        rs.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(metric, "cpu-clock/nanoseconds");
        assert_eq!(
            rs,
            vec![
                row("f path 3: L1→L2", 15, 150),
                row("f path 4: L1→L3", 1, 7)
            ]
        );
        let (metric, rs) = rows(&prof, Some("executions")).unwrap();
        assert_eq!(metric, "executions/count");
        assert_eq!(rs.iter().map(|r| r.metric).sum::<u64>(), 16);
        let e = rows(&prof, Some("cycles")).unwrap_err().to_string();
        assert!(e.contains("executions/count, cpu-clock/nanoseconds"), "{e}");
    }
}
