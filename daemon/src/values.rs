//! `burstyd values`: the tuple profiles a run wrote (`values.pb.gz`, or
//! with `--targets` `targets.pb.gz`; [`crate::export::tuples`]) as a
//! readable report or as JSON: per site (a load; an indirect call or
//! jump), hottest first, its function and line, its executions, its
//! invariance (the share of its most frequent value) and its most
//! frequent values with their shares. Where the run wrote exact copies
//! (an evaluation), each site's figures in them too, and the profile's
//! error against them as Sastry, Bodík & Smith measure it
//! ([`crate::bursts::tuples::profile_error`]).
//!
//! A site is a location of the profile (the same instruction of the same
//! binary at the same address, over the processes that ran it).
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::bursts::decode::TupleKind;
use crate::bursts::tuples::{
    ErrorOptions, ProfileError, SiteKey, SiteSummary, Summaries, profile_error,
};
use crate::export::pprof::Profile;
use crate::export::tuples::{
    ESTIMATED, OTHER, REFERENCE, SITE_LABEL, TARGET_LABEL, VALUE_LABEL, file_name,
};

pub(crate) struct ValueOptions {
    /// The call-target profile rather than the value profile.
    pub(crate) targets: bool,
    /// How many of the hottest sites to list, and values per site.
    pub(crate) top: usize,
    pub(crate) values: usize,
    /// The error's selection (`--min-exec`; the paper's shares).
    pub(crate) error: ErrorOptions,
    pub(crate) json: bool,
}

/// The report.
#[derive(Debug, PartialEq, serde::Serialize)]
pub(crate) struct Report {
    /// `values` or `targets`.
    pub(crate) kind: &'static str,
    /// Sites, and their executions (estimated) in all.
    pub(crate) sites: usize,
    pub(crate) executions: u64,
    /// The profile's error against its exact copies, where it has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<ProfileError>,
    /// The hottest sites.
    pub(crate) top: Vec<SiteRow>,
}

/// One site.
#[derive(Debug, PartialEq, serde::Serialize)]
pub(crate) struct SiteRow {
    pub(crate) function: String,
    /// `file:line` where the module has line info.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) line: Option<String>,
    /// The module's file name, and the site's static address (hex).
    pub(crate) module: String,
    pub(crate) address: String,
    pub(crate) executions: u64,
    pub(crate) invariance: f64,
    /// In the exact copies, where the run made them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reference_executions: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reference_invariance: Option<f64>,
    /// Its most frequent values; the share of the rest.
    pub(crate) values: Vec<ValueRow>,
    pub(crate) other_share: f64,
}

/// One value of a site.
#[derive(Debug, PartialEq, serde::Serialize)]
pub(crate) struct ValueRow {
    /// Hex.
    pub(crate) value: String,
    /// A target's function.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    pub(crate) executions: u64,
    pub(crate) share: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reference_share: Option<f64>,
}

/// `burstyd values OUT`.
pub(crate) fn run(out: &Path, opts: &ValueOptions) -> anyhow::Result<()> {
    let kind = if opts.targets {
        TupleKind::Target
    } else {
        TupleKind::Value
    };
    let file: PathBuf = if out.is_dir() {
        let f = out.join(file_name(kind));
        if !f.exists() {
            bail!(
                "{} has no {}: profile with --record {} to make one",
                out.display(),
                file_name(kind),
                if opts.targets { "targets" } else { "values" }
            );
        }
        f
    } else {
        out.to_path_buf()
    };
    let prof = crate::export::pprof::read_file(&file)?;
    let r = report(&prof, kind, opts).with_context(|| format!("reading {}", file.display()))?;
    let text = if opts.json {
        serde_json::to_string_pretty(&r)? + "\n"
    } else {
        human(&r, &file)
    };
    crate::sys::print_stdout(&text)
}

/// What the report needs of a site besides its counts.
struct SiteFacts {
    function: String,
    line: Option<String>,
    module: String,
    address: u64,
    /// Names of its targets, by value.
    targets: HashMap<u64, String>,
}

/// The report of a tuple profile of `kind` (see [`crate::export::tuples`]).
pub(crate) fn report(
    prof: &Profile,
    kind: TupleKind,
    opts: &ValueOptions,
) -> anyhow::Result<Report> {
    let s = |i: i64| prof.string_table.get(i as usize).map_or("", String::as_str);
    let types: Vec<&str> = prof.sample_type.iter().map(|t| s(t.r#type)).collect();
    let Some(est) = types.iter().position(|t| *t == ESTIMATED) else {
        bail!(
            "no `{ESTIMATED}` sample type: not a burstyd tuple profile (values.pb.gz, targets.pb.gz)"
        );
    };
    let reference = types.iter().position(|t| *t == REFERENCE);
    let key = |name: &str| {
        prof.string_table
            .iter()
            .position(|x| x == name)
            .map(|i| i as i64)
    };
    let (value_key, target_key, site_key) = (key(VALUE_LABEL), key(TARGET_LABEL), key(SITE_LABEL));
    let locations: HashMap<u64, &crate::export::pprof::Location> =
        prof.location.iter().map(|l| (l.id, l)).collect();
    let functions: HashMap<u64, &crate::export::pprof::Function> =
        prof.function.iter().map(|f| (f.id, f)).collect();
    let mappings: HashMap<u64, &crate::export::pprof::Mapping> =
        prof.mapping.iter().map(|m| (m.id, m)).collect();
    // Per location: its values' counts and other values', estimated and
    // exact.
    let mut counts: HashMap<u64, [HashMap<Option<u64>, u64>; 2]> = HashMap::new();
    let mut facts: HashMap<u64, SiteFacts> = HashMap::new();
    for smp in &prof.sample {
        let Some(&loc_id) = smp.location_id.first() else {
            continue;
        };
        let label = |k: Option<i64>| smp.label.iter().find(|l| Some(l.key) == k);
        let Some(v) = label(value_key).map(|l| s(l.str)) else {
            continue;
        };
        let value = if v == OTHER {
            None
        } else {
            let hex = v.strip_prefix("0x").unwrap_or(v);
            Some(u64::from_str_radix(hex, 16).with_context(|| format!("value `{v}`"))?)
        };
        let f = facts.entry(loc_id).or_insert_with(|| {
            let loc = locations.get(&loc_id);
            let line = loc.and_then(|l| l.line.first());
            let func = line.and_then(|l| functions.get(&l.function_id));
            let file = func.map_or("", |f| s(f.filename));
            let module = loc
                .and_then(|l| mappings.get(&l.mapping_id))
                .map_or("", |m| s(m.filename));
            SiteFacts {
                function: func.map_or("?", |f| s(f.name)).to_owned(),
                line: match (file, line.map_or(0, |l| l.line)) {
                    ("", _) | (_, 0) => None,
                    (file, n) => Some(format!("{}:{n}", file.rsplit('/').next().unwrap_or(file))),
                },
                module: module.rsplit('/').next().unwrap_or(module).to_owned(),
                address: label(site_key).map_or(loc.map_or(0, |l| l.address), |l| l.num as u64),
                targets: HashMap::new(),
            }
        });
        if let (Some(v), Some(t)) = (value, label(target_key)) {
            f.targets.insert(v, s(t.str).to_owned());
        }
        let c = counts.entry(loc_id).or_default();
        let n = |i: usize| smp.value.get(i).copied().unwrap_or(0).max(0) as u64;
        *c[0].entry(value).or_default() += n(est);
        if let Some(r) = reference {
            *c[1].entry(value).or_default() += n(r);
        }
    }
    // As the error wants them: a site per location.
    let summaries = |i: usize| -> Summaries {
        counts
            .iter()
            .map(|(&loc, c)| {
                let mut values: Vec<(u64, u64)> = c[i]
                    .iter()
                    .filter_map(|(v, &n)| Some(((*v)?, n)))
                    .filter(|v| v.1 > 0)
                    .collect();
                values.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                let key = SiteKey {
                    kind,
                    module: 0,
                    vaddr: loc,
                };
                (
                    key,
                    SiteSummary {
                        total: c[i].values().sum(),
                        values,
                    },
                )
            })
            .collect()
    };
    let est_sites = summaries(0);
    let ref_sites = reference.map(|_| summaries(1));
    let error = ref_sites
        .as_ref()
        .map(|r| profile_error(&est_sites, r, kind, &opts.error));
    let mut rows: Vec<(&SiteKey, &SiteSummary)> = est_sites.iter().collect();
    rows.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
    let top = rows
        .iter()
        .take(opts.top)
        .map(|&(k, site)| {
            let f = &facts[&k.vaddr];
            // A site the exact copies never saw has no reference figures.
            let r = ref_sites
                .as_ref()
                .and_then(|r| r.get(k))
                .filter(|r| r.total > 0);
            SiteRow {
                function: f.function.clone(),
                line: f.line.clone(),
                module: f.module.clone(),
                address: format!("{:#x}", f.address),
                executions: site.total,
                invariance: site.invariance(),
                reference_executions: r.map(|r| r.total),
                reference_invariance: r.map(SiteSummary::invariance),
                values: site
                    .values
                    .iter()
                    .take(opts.values)
                    .map(|&(v, n)| ValueRow {
                        value: format!("{v:#x}"),
                        target: f.targets.get(&v).cloned(),
                        executions: n,
                        share: site.share(n),
                        reference_share: r.map(|r| r.share(r.count_of(v))),
                    })
                    .collect(),
                other_share: site.share(
                    site.total
                        - site
                            .values
                            .iter()
                            .take(opts.values)
                            .map(|v| v.1)
                            .sum::<u64>(),
                ),
            }
        })
        .collect();
    Ok(Report {
        kind: if kind == TupleKind::Target {
            "targets"
        } else {
            "values"
        },
        sites: est_sites.values().filter(|s| s.total > 0).count(),
        executions: est_sites.values().map(|s| s.total).sum(),
        error,
        top,
    })
}

/// `12.3%`, or `-` for nothing to measure.
fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{:.1}%", 100.0 * x))
}

/// The report as text.
fn human(r: &Report, file: &Path) -> String {
    let (what, sites) = if r.kind == "targets" {
        let sites = crate::words::count(
            r.sites as u64,
            "indirect call or jump",
            "indirect calls or jumps",
        );
        ("call-target profile", sites)
    } else {
        (
            "value profile",
            crate::words::count(r.sites as u64, "load", "loads"),
        )
    };
    let mut out = format!(
        "{what} of {}: {sites}, {} executions (estimated)\n",
        file.display(),
        r.executions
    );
    if let Some(e) = &r.error {
        let _ = writeln!(
            out,
            "error against the exact copies: {} over {} of {}; {} over every tuple of the {} executed often enough",
            pct(e.error),
            crate::words::count(e.tuples as u64, "invariant tuple", "invariant tuples"),
            crate::words::count(e.sites as u64, "site", "sites"),
            pct(e.total_error),
            crate::words::count(e.total_sites as u64, "site", "sites"),
        );
    }
    for (i, s) in r.top.iter().enumerate() {
        let at = s
            .line
            .as_deref()
            .map_or(String::new(), |l| format!(" ({l})"));
        let reference = match (s.reference_executions, s.reference_invariance) {
            (Some(n), Some(inv)) => format!("; exact copies: {n}, invariance {inv:.3}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:>4}. {}{at} {}+{}: {} executions, invariance {:.3}{reference}",
            i + 1,
            s.function,
            s.module,
            s.address,
            s.executions,
            s.invariance
        );
        for v in &s.values {
            // A target no symbol names is its address: the value itself.
            let target = v
                .target
                .as_deref()
                .filter(|t| *t != v.value)
                .map_or(String::new(), |t| format!(" {t}"));
            let reference = v
                .reference_share
                .map_or(String::new(), |x| format!(" (exact {})", pct(Some(x))));
            let _ = writeln!(
                out,
                "        {:>6} {}{target}{reference}",
                pct(Some(v.share)),
                v.value
            );
        }
        if s.other_share > 0.0 {
            let _ = writeln!(out, "        {:>6} other values", pct(Some(s.other_share)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bursts::decode::BurstEvent;
    use crate::bursts::traced::test_traced;
    use crate::bursts::tuples::Tuples;
    use crate::export::tuples::{add_tuples, tuples_builder};
    use burstyd_common::burst::TupleConfig;

    const EXE: u64 = 0x5555_0000_0000;

    fn opts() -> ValueOptions {
        ValueOptions {
            targets: false,
            top: 10,
            values: 2,
            error: ErrorOptions {
                min_exec: 100,
                ..Default::default()
            },
            json: false,
        }
    }

    /// A profile written by `export::tuples` and read back: sites hottest
    /// first with their function, address, executions and invariance;
    /// their values (the first `values`), the rest as other values; the
    /// exact copies' figures and the error against them. By
    /// construction: load A (rate 10) 60 outputs of 1, 20 of 2, 10 of 3
    /// (estimated 600/200/100), exact 550/250/100; load B 5 outputs of 7
    /// (50), exact 50. Selected for the error (100 executions or more):
    /// A's three tuples (B has 50), error (550·|0.611−0.667| + 250·|0.278
    /// −0.222| + 100·0) / 900.
    #[test]
    fn the_report_reads_the_profile_back() {
        let traced = test_traced(&[(
            "/bin/prog",
            EXE,
            0,
            &[("load_a", 0x1000, 0x100), ("load_b", 0x2000, 0x100)],
        )]);
        let config = TupleConfig {
            sampler: burstyd_common::burst::SAMPLER_RANDOM,
            rate: 10,
            reference: true,
            ..Default::default()
        };
        let mut t = Tuples::new(&config);
        let mut add = |site: u64, value: u64, count: u32, exact: bool| {
            t.add(
                &BurstEvent::Tuple {
                    kind: TupleKind::Value,
                    site: EXE + site,
                    value,
                    count,
                    exact,
                },
                &traced,
            )
        };
        for (v, n, exact) in [(1, 60, 550), (2, 20, 250), (3, 10, 100)] {
            add(0x1010, v, n, false);
            add(0x1010, v, exact, true);
        }
        add(0x2020, 7, 5, false);
        add(0x2020, 7, 50, true);
        let mut b = tuples_builder(TupleKind::Value, true);
        add_tuples(&mut b, &traced, &t, TupleKind::Value, true, |_| {
            HashMap::new()
        });
        let p = b.finish();
        let r = report(&p, TupleKind::Value, &opts()).unwrap();
        assert_eq!((r.kind, r.sites, r.executions), ("values", 2, 950));
        let a = &r.top[0];
        assert_eq!(
            (a.function.as_str(), a.address.as_str()),
            ("load_a", "0x1010")
        );
        assert_eq!(a.module, "prog");
        assert_eq!((a.executions, a.reference_executions), (900, Some(900)));
        assert!((a.invariance - 600.0 / 900.0).abs() < 1e-12);
        assert!((a.reference_invariance.unwrap() - 550.0 / 900.0).abs() < 1e-12);
        let values: Vec<(&str, u64)> = a
            .values
            .iter()
            .map(|v| (v.value.as_str(), v.executions))
            .collect();
        assert_eq!(values, [("0x1", 600), ("0x2", 200)]);
        assert!((a.other_share - 100.0 / 900.0).abs() < 1e-12);
        assert_eq!(r.top[1].function, "load_b");
        assert_eq!(r.top[1].invariance, 1.0);
        let e = r.error.unwrap();
        assert_eq!((e.sites, e.tuples, e.total_sites), (1, 3, 1));
        let want = (550.0 * (600.0 / 900.0 - 550.0 / 900.0)
            + 250.0 * (250.0 / 900.0 - 200.0 / 900.0))
            / 900.0;
        assert!((e.error.unwrap() - want).abs() < 1e-12, "{e:?}");
        // The text says the same.
        let text = human(&r, Path::new("values.pb.gz"));
        assert!(
            text.starts_with("value profile of values.pb.gz: 2 loads, 950 executions (estimated)\nerror against the exact copies: "),
            "{text}"
        );
        assert!(
            text.contains(" over 3 invariant tuples of 1 site; "),
            "{text}"
        );
        assert!(text.contains("   1. load_a prog+0x1010: 900 executions, invariance 0.667; exact copies: 900, invariance 0.611\n"), "{text}");
        assert!(
            text.contains("         66.7% 0x1 (exact 61.1%)\n"),
            "{text}"
        );
        assert!(text.contains("         11.1% other values\n"), "{text}");
        // A profile of another kind is not a tuple profile.
        let paths = crate::export::paths::paths_builder("cpu-clock", None).finish();
        assert!(report(&paths, TupleKind::Value, &opts()).is_err());
    }

    /// Targets: each value named by its target's function.
    #[test]
    fn targets_are_named() {
        let traced = test_traced(&[(
            "/bin/prog",
            EXE,
            0,
            &[("call_it", 0x1000, 0x100), ("callee", 0x2000, 0x100)],
        )]);
        let mut t = Tuples::new(&TupleConfig::default());
        t.add(
            &BurstEvent::Tuple {
                kind: TupleKind::Target,
                site: EXE + 0x1008,
                value: EXE + 0x2000,
                count: 4,
                exact: false,
            },
            &traced,
        );
        // Exact copies in the run, none of this site: no reference
        // figures for it.
        let mut b = tuples_builder(TupleKind::Target, true);
        add_tuples(&mut b, &traced, &t, TupleKind::Target, true, |_| {
            HashMap::new()
        });
        let r = report(&b.finish(), TupleKind::Target, &opts()).unwrap();
        assert_eq!(r.kind, "targets");
        assert_eq!(r.error.map(|e| (e.sites, e.error)), Some((0, None)));
        assert_eq!(r.top[0].reference_executions, None);
        let v = &r.top[0].values[0];
        assert_eq!(
            (v.target.as_deref(), v.executions, v.share),
            (Some("callee"), 4, 1.0)
        );
        assert!(v.reference_share.is_none());
    }
}
