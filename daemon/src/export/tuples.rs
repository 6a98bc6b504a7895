//! `values.pb.gz` and `targets.pb.gz`: the tuple profiles of bursty
//! tracing ([`crate::bursts::tuples`]) as pprof. One sample per ⟨site,
//! value⟩ (a load and a value it loaded; an indirect call or jump and a
//! target it went to), and per site one for its other values (those the
//! profile's bound did not keep, label `value` = `other`); the stack is
//! the site alone, its function and source line as `paths.pb.gz` names
//! them ([`function_name`], the module's `.debug_line`), at the site's
//! address in the process. Values: `tuples/count`, the occurrences the
//! compressor's outputs stand for (estimated: count × rate), and with
//! exact copies (an evaluation) `reference/count`, the occurrences
//! counted one by one. Labels: `value` (hex), `invariance` (the site's
//! most frequent value's share of its occurrences, four decimals; and
//! `reference_invariance` with exact copies), `symbol` (the site's
//! function's raw name); numeric `pid` and `site` (the site's static
//! address, as `nm` and `objdump` print it); in `targets.pb.gz` also
//! `target`, the
//! target's function (`name+0x10` inside one; its address where no
//! symbol names it). `burstyd values` reads them back
//! ([`crate::values`]).
use std::collections::HashMap;

use super::pprof::{LineKey, ProfileBuilder};
use crate::bursts::decode::TupleKind;
use crate::bursts::traced::Traced;
use crate::bursts::tuples::{SiteSummary, Summaries};
use crate::stacks::symbolize::function_name;

/// The sample type of the estimated occurrences.
pub(crate) const ESTIMATED: &str = "tuples";
/// The sample type of the exact copies' occurrences.
pub(crate) const REFERENCE: &str = "reference";
/// The label of a tuple's value (hex), and its value on a site's other
/// values' sample.
pub(crate) const VALUE_LABEL: &str = "value";
pub(crate) const OTHER: &str = "other";
/// The labels of the site's invariance in the estimated profile and in
/// the reference.
pub(crate) const INVARIANCE_LABEL: &str = "invariance";
pub(crate) const REFERENCE_INVARIANCE_LABEL: &str = "reference_invariance";
/// The numeric label of the site's static address.
pub(crate) const SITE_LABEL: &str = "site";
/// The label of a target's function (`targets.pb.gz`).
pub(crate) const TARGET_LABEL: &str = "target";

/// The file a kind of tuple goes to.
pub(crate) fn file_name(kind: TupleKind) -> &'static str {
    match kind {
        TupleKind::Target => "targets.pb.gz",
        _ => "values.pb.gz",
    }
}

/// The builder of one kind's profile, which every process with tuples
/// adds to; `reference`: some process had exact copies.
pub(crate) fn tuples_builder(kind: TupleKind, reference: bool) -> ProfileBuilder {
    let mut types = vec![(ESTIMATED, "count")];
    if reference {
        types.push((REFERENCE, "count"));
    }
    let mut b = ProfileBuilder::new(&types, (ESTIMATED, "count"), 1);
    b.add_comment(match kind {
        TupleKind::Target => "call-target profile from bursty tracing: one sample per <indirect call or jump, target>; the stack is the site alone; label target = the target's function, value = its address in the process",
        _ => "value profile from bursty tracing: one sample per <load, value loaded>; the stack is the load alone; label value = the value (hex)",
    });
    b.add_comment(&format!("{ESTIMATED}/count: the occurrences the runtime compressor's outputs stand for (each output: its sampling rate's); a site's values beyond the profile's bound are one sample, label {VALUE_LABEL}={OTHER}; label {INVARIANCE_LABEL}: the share of its site's occurrences its most frequent value holds"));
    if reference {
        b.add_comment(&format!("{REFERENCE}/count: the exact copies of the same tuples (every tuple, one each), the reference the sampled profile is measured against; label {REFERENCE_INVARIANCE_LABEL}: the site's invariance there"));
    }
    b.set_default_sample_type(ESTIMATED);
    b
}

/// The values of a site both profiles know, most frequent (estimated,
/// then exact) first.
fn site_values(s: &SiteSummary, r: Option<&SiteSummary>) -> Vec<u64> {
    let mut out: Vec<u64> = s.values.iter().map(|v| v.0).collect();
    for &(v, _) in r.map_or(&[][..], |r| &r.values) {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// The name of a target: its traced function's (`+0x10` where it is not
/// the start), else what `foreign` knows of the address, else the
/// address.
fn target_name(traced: &Traced, t: u64, foreign: &HashMap<u64, String>) -> String {
    if let Some((m, local)) = traced.fid_at(t).and_then(|fid| traced.function(fid)) {
        let f = &m.plan.functions[local];
        let name = function_name(&m.path, &f.name);
        let off = t.wrapping_sub(f.start.wrapping_add(m.bias));
        return if off == 0 {
            name
        } else {
            format!("{name}+{off:#x}")
        };
    }
    foreign
        .get(&t)
        .cloned()
        .unwrap_or_else(|| format!("{t:#x}"))
}

/// Adds a traced process's tuples of `kind` to its profile (see
/// [`tuples_builder`]; `reference` as given there). `foreign(addrs)`:
/// names of the targets outside the traced functions (symbolized as in
/// `context.pb.gz`), by address.
#[cfg(test)]
pub(crate) fn add_tuples(
    b: &mut ProfileBuilder,
    traced: &Traced,
    tuples: &crate::bursts::tuples::Tuples,
    kind: TupleKind,
    reference: bool,
    foreign: impl FnOnce(Vec<u64>) -> HashMap<u64, String>,
) {
    let (sampled, exact) = (tuples.sampled.summaries(), tuples.exact.summaries());
    add_summaries(b, traced, &sampled, &exact, kind, reference, foreign);
}

/// [`add_tuples`] of a process's summaries: the sampled profile's and
/// the exact copies' (all it has, or an interval's).
pub(crate) fn add_summaries(
    b: &mut ProfileBuilder,
    traced: &Traced,
    sampled: &Summaries,
    exact: &Summaries,
    kind: TupleKind,
    reference: bool,
    foreign: impl FnOnce(Vec<u64>) -> HashMap<u64, String>,
) {
    let mut sites: Summaries = sampled
        .iter()
        .filter(|(k, _)| k.kind == kind)
        .map(|(k, s)| (*k, s.clone()))
        .collect();
    for k in exact.keys().filter(|k| k.kind == kind) {
        sites.entry(*k).or_default();
    }
    if sites.is_empty() {
        return;
    }
    let module_of = |fid_base: u32| traced.modules.iter().position(|m| m.fid_base == fid_base);
    // Each module's lines of its sites.
    let mut wanted: Vec<Vec<u64>> = vec![Vec::new(); traced.modules.len()];
    for k in sites.keys() {
        if let Some(i) = module_of(k.module) {
            wanted[i].push(k.vaddr);
        }
    }
    let lines = traced.lines_of(&wanted);
    let mut unnamed = Vec::new();
    if kind == TupleKind::Target {
        for (k, s) in &sites {
            let r = exact.get(k);
            unnamed.extend(
                site_values(s, r)
                    .into_iter()
                    .filter(|&t| traced.fid_at(t).is_none()),
            );
        }
        unnamed.sort_unstable();
        unnamed.dedup();
    }
    let foreign = foreign(unnamed);
    let mappings = super::paths::module_mappings(b, traced);
    let pid = i64::from(traced.pid.0);
    for (k, s) in &sites {
        let Some(mi) = module_of(k.module) else {
            continue;
        };
        let m = &traced.modules[mi];
        let avma = k.vaddr.wrapping_add(m.bias);
        let (fname, raw) = match traced.fid_at(avma).and_then(|fid| traced.function(fid)) {
            Some((fm, local)) if std::ptr::eq(fm, m) => {
                let f = &m.plan.functions[local];
                (function_name(&m.path, &f.name), f.name.clone())
            }
            _ => (format!("{}!{:#x}", m.name(), k.vaddr), String::new()),
        };
        let (file, line) = lines[mi].get(&k.vaddr).cloned().unwrap_or((None, 0));
        let loc = b.location(
            mappings[mi],
            avma,
            &[LineKey {
                function: fname,
                file: file.unwrap_or_default(),
                line: i64::from(line),
            }],
        );
        let r = exact.get(k);
        let invariance = format!("{:.4}", s.invariance());
        let r_invariance = r.map(|r| format!("{:.4}", r.invariance()));
        let sample =
            |b: &mut ProfileBuilder, n: u64, rn: u64, value: &str, target: Option<&str>| {
                let mut values = vec![n as i64];
                if reference {
                    values.push(rn as i64);
                }
                let mut labels = vec![
                    (VALUE_LABEL, value),
                    (INVARIANCE_LABEL, invariance.as_str()),
                    ("symbol", raw.as_str()),
                ];
                if let Some(ri) = &r_invariance {
                    labels.push((REFERENCE_INVARIANCE_LABEL, ri.as_str()));
                }
                if let Some(t) = target {
                    labels.push((TARGET_LABEL, t));
                }
                let nums = [("pid", pid), (SITE_LABEL, k.vaddr as i64)];
                b.sample(vec![loc], values, &labels, &nums);
            };
        for v in site_values(s, r) {
            let target = (kind == TupleKind::Target).then(|| target_name(traced, v, &foreign));
            let rn = r.map_or(0, |r| r.count_of(v));
            sample(b, s.count_of(v), rn, &format!("{v:#x}"), target.as_deref());
        }
        let (other, r_other) = (s.other(), r.map_or(0, SiteSummary::other));
        if other > 0 || r_other > 0 {
            let target = (kind == TupleKind::Target).then_some("[other targets]");
            sample(b, other, r_other, OTHER, target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bursts::decode::BurstEvent;
    use crate::bursts::traced::test_traced;
    use crate::bursts::tuples::Tuples;
    use burstyd_common::burst::TupleConfig;

    const EXE: u64 = 0x5555_0000_0000;

    fn tuple(kind: TupleKind, site: u64, value: u64, count: u32, exact: bool) -> BurstEvent {
        BurstEvent::Tuple {
            kind,
            site,
            value,
            count,
            exact,
        }
    }

    /// `(location's function, address, labels, values)` of each sample.
    type Row = (String, u64, Vec<(String, String)>, Vec<i64>);

    fn rows_of(p: &crate::export::pprof::Profile) -> Vec<Row> {
        let s = |i: i64| p.string_table[i as usize].clone();
        p.sample
            .iter()
            .map(|smp| {
                let loc = &p.location[smp.location_id[0] as usize - 1];
                let f = &p.function[loc.line[0].function_id as usize - 1];
                let labels = smp
                    .label
                    .iter()
                    .filter(|l| l.str != 0)
                    .map(|l| (s(l.key), s(l.str)))
                    .collect();
                (s(f.name), loc.address, labels, smp.value.clone())
            })
            .collect()
    }

    /// Values: a sample per ⟨load, value⟩ at the load, most frequent
    /// first, the estimated occurrences (count × rate) and the exact
    /// copies' side by side, the site's invariance on each; a site's
    /// values beyond the bound as one `other` sample; target tuples are
    /// not in it. Targets: named by their function (offset inside it),
    /// by `foreign` outside the traced functions, else by address.
    #[test]
    fn one_sample_per_site_and_value() {
        let traced = test_traced(&[(
            "/bin/prog",
            EXE,
            0,
            &[("load_it", 0x1000, 0x100), ("callee", 0x2000, 0x40)],
        )]);
        let config = TupleConfig {
            sampler: burstyd_common::burst::SAMPLER_RANDOM,
            rate: 10,
            ..Default::default()
        };
        let mut t = Tuples::new(&config);
        let v = TupleKind::Value;
        for ev in [
            tuple(v, EXE + 0x1010, 0x2a, 3, false),
            tuple(v, EXE + 0x1010, 0x7, 1, false),
            tuple(v, EXE + 0x1010, 0x2a, 28, true),
            tuple(v, EXE + 0x1010, 0x7, 12, true),
            tuple(TupleKind::Target, EXE + 0x1020, EXE + 0x2000, 2, false),
            tuple(TupleKind::Target, EXE + 0x1020, EXE + 0x2010, 1, false),
            tuple(TupleKind::Target, EXE + 0x1020, 0x7f00_0000_1000, 1, false),
            tuple(TupleKind::Target, EXE + 0x1020, 0x7f00_0000_2000, 1, false),
        ] {
            t.add(&ev, &traced);
        }
        for i in 0..crate::bursts::tuples::MAX_VALUES as u64 {
            t.add(&tuple(v, EXE + 0x1030, 0x100 + i, 1, false), &traced);
        }
        t.add(&tuple(v, EXE + 0x1030, 0x99, 1, false), &traced);
        let mut b = tuples_builder(v, true);
        add_tuples(&mut b, &traced, &t, v, true, |addrs| {
            assert!(addrs.is_empty(), "values name no targets");
            HashMap::new()
        });
        let p = b.finish();
        let rows = rows_of(&p);
        let label = |r: &Row, k: &str| {
            r.2.iter()
                .find(|l| l.0 == k)
                .map(|l| l.1.clone())
                .unwrap_or_default()
        };
        let first: Vec<_> = rows.iter().filter(|r| r.1 == EXE + 0x1010).collect();
        assert_eq!(first.len(), 2);
        assert_eq!(first[0].0, "load_it");
        assert_eq!(label(first[0], VALUE_LABEL), "0x2a");
        assert_eq!(first[0].3, [30, 28]);
        assert_eq!(label(first[1], VALUE_LABEL), "0x7");
        assert_eq!(first[1].3, [10, 12]);
        assert_eq!(label(first[1], INVARIANCE_LABEL), "0.7500");
        assert_eq!(label(first[1], REFERENCE_INVARIANCE_LABEL), "0.7000");
        assert_eq!(label(first[1], "symbol"), "load_it");
        let site = p.string_table.iter().position(|s| s == SITE_LABEL).unwrap() as i64;
        let num = |smp: &crate::export::pprof::Sample| {
            smp.label.iter().find(|l| l.key == site).map(|l| l.num)
        };
        assert_eq!(num(&p.sample[0]), Some(0x1010));
        // The second load: its values beyond the bound are "other", and
        // the estimated occurrences add up to its total.
        let second: Vec<_> = rows.iter().filter(|r| r.1 == EXE + 0x1030).collect();
        let other = second
            .iter()
            .find(|r| label(r, VALUE_LABEL) == OTHER)
            .unwrap();
        assert_eq!(other.3, [10, 0]);
        let sum: i64 = second.iter().map(|r| r.3[0]).sum();
        assert_eq!(sum, 10 * (crate::bursts::tuples::MAX_VALUES as i64 + 1));
        assert_eq!(rows.len(), 2 + second.len(), "no target in the values");
        let kinds: Vec<String> = p
            .sample_type
            .iter()
            .map(|t| p.string_table[t.r#type as usize].clone())
            .collect();
        assert_eq!(kinds, [ESTIMATED, REFERENCE]);

        let tk = TupleKind::Target;
        let mut b = tuples_builder(tk, false);
        add_tuples(&mut b, &traced, &t, tk, false, |addrs| {
            assert_eq!(addrs, [0x7f00_0000_1000, 0x7f00_0000_2000]);
            [(0x7f00_0000_1000, "libc.so.6!qsort".to_owned())].into()
        });
        let rows = rows_of(&b.finish());
        let targets: Vec<(String, Vec<i64>)> = rows
            .iter()
            .map(|r| (label(r, TARGET_LABEL), r.3.clone()))
            .collect();
        assert_eq!(
            targets,
            [
                ("callee".to_owned(), vec![20]),
                ("callee+0x10".to_owned(), vec![10]),
                ("libc.so.6!qsort".to_owned(), vec![10]),
                ("0x7f0000002000".to_owned(), vec![10]),
            ]
        );
        assert_eq!(label(&rows[0], VALUE_LABEL), format!("{:#x}", EXE + 0x2000));
    }
}
