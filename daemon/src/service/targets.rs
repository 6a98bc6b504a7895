//! Target selection by configuration: which running processes match the
//! file's `[[target]]` selectors (pid, executable path, systemd unit,
//! cgroup). The session rescans /proc every second, so a process that
//! starts later is sampled from its next scan on, and one that exits is
//! dropped from the eBPF `TARGETS` map.
use std::collections::BTreeSet;
use std::path::PathBuf;

use burstyd_common::addr::Pid;

use crate::bursts::options::Record;
use crate::service::config::{Target, TargetSpec};

/// What a process's bursts record besides paths, as its targets say.
pub(crate) type Records = BTreeSet<Record>;

/// The current selection and what changed at the last scan.
#[derive(Debug, Default)]
pub(crate) struct Scanner {
    specs: Vec<TargetSpec>,
    /// Each spec's own `bursts` (parallel to `specs`).
    spec_bursts: Vec<Option<bool>>,
    /// Each spec's own `record` (`None`: it says nothing; parallel to
    /// `specs`).
    spec_record: Vec<Option<Records>>,
    /// The bursty pids whose targets say what their bursts record.
    record: std::collections::BTreeMap<Pid, Records>,
    /// `[bursts] enabled`: for a process no target says anything about.
    bursts_default: bool,
    /// The current pids to trace in bursts (a subset of `current`).
    bursty: BTreeSet<Pid>,
    /// Executable paths resolved through symlinks (as /proc/PID/exe shows
    /// them), parallel to the `Exe` specs.
    exes: Vec<PathBuf>,
    current: BTreeSet<Pid>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) added: Vec<Pid>,
    pub(crate) removed: Vec<Pid>,
}

impl Scanner {
    /// Bursts for the targets that say nothing follow `bursts_default`.
    pub(crate) fn new(targets: Vec<Target>, bursts_default: bool) -> Scanner {
        let mut s = Scanner::default();
        s.set_targets(targets, bursts_default);
        s
    }

    /// Replaces the selectors (reload); the next scan adds and removes.
    pub(crate) fn set_targets(&mut self, targets: Vec<Target>, bursts_default: bool) {
        self.bursts_default = bursts_default;
        self.spec_record = targets
            .iter()
            .map(|t| Some(t.record.as_ref()?.iter().copied().collect()))
            .collect();
        let (specs, bursts) = targets.into_iter().map(|t| (t.spec, t.bursts)).unzip();
        self.spec_bursts = bursts;
        self.set_specs(specs);
    }

    fn set_specs(&mut self, specs: Vec<TargetSpec>) {
        self.exes = specs
            .iter()
            .filter_map(|s| match s {
                TargetSpec::Exe(p) => Some(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())),
                _ => None,
            })
            .collect();
        self.specs = specs;
    }

    pub(crate) fn specs(&self) -> &[TargetSpec] {
        &self.specs
    }

    pub(crate) fn current(&self) -> &BTreeSet<Pid> {
        &self.current
    }

    /// The current pids to trace in bursts: each matched by a target
    /// with `bursts = true`, or by targets that say nothing while
    /// `[bursts] enabled`; never one a target with `bursts = false`
    /// matches.
    pub(crate) fn bursty(&self) -> &BTreeSet<Pid> {
        &self.bursty
    }

    /// What `pid`'s targets ask its bursts to record besides paths
    /// (`record = ["refs", "targets"]`; `record = []`: nothing), or
    /// `None` when they say nothing (`[bursts] record` then). Several
    /// targets that match: everything any of them asks for.
    pub(crate) fn record(&self, pid: Pid) -> Option<&Records> {
        self.record.get(&pid)
    }

    /// Walks /proc once and returns the pids that started or stopped
    /// matching.
    pub(crate) fn scan(&mut self) -> Change {
        let me = Pid(std::process::id());
        let mut now = BTreeSet::new();
        self.bursty.clear();
        self.record.clear();
        if !self.specs.is_empty() {
            for pid in list_pids() {
                if pid == me {
                    continue;
                }
                if let Some((bursts, record)) = self.matches(pid) {
                    now.insert(pid);
                    if bursts {
                        self.bursty.insert(pid);
                        if let Some(r) = record {
                            self.record.insert(pid, r);
                        }
                    }
                }
            }
        }
        let change = Change {
            added: now.difference(&self.current).copied().collect(),
            removed: self.current.difference(&now).copied().collect(),
        };
        self.current = now;
        change
    }

    /// Whether `pid` matches, and if so whether to trace it in bursts and
    /// what they record (see [`Self::record`]).
    fn matches(&self, pid: Pid) -> Option<(bool, Option<Records>)> {
        let mut cgroups: Option<Vec<String>> = None;
        let mut exe: Option<Option<PathBuf>> = None;
        let (mut hit_any, mut bursts_on) = (false, false);
        let mut record: Option<Records> = None;
        for (i, (spec, bursts)) in self.specs.iter().zip(&self.spec_bursts).enumerate() {
            let hit = match spec {
                TargetSpec::Pid(p) => *p == pid,
                TargetSpec::Exe(_) => {
                    let e = exe.get_or_insert_with(|| read_exe(pid));
                    e.as_ref().is_some_and(|e| {
                        self.exes.iter().any(|want| want == e)
                            || self
                                .specs
                                .iter()
                                .any(|s| matches!(s, TargetSpec::Exe(p) if p == e))
                    })
                }
                TargetSpec::Unit(u) => cgroups
                    .get_or_insert_with(|| read_cgroups(pid))
                    .iter()
                    .any(|c| c.split('/').any(|part| part == u)),
                TargetSpec::Cgroup(want) => cgroups
                    .get_or_insert_with(|| read_cgroups(pid))
                    .iter()
                    .any(|c| cgroup_within(c, want)),
            };
            if hit {
                match bursts {
                    Some(false) => return Some((false, None)),
                    Some(true) => bursts_on = true,
                    None => bursts_on |= self.bursts_default,
                }
                if let Some(Some(r)) = self.spec_record.get(i) {
                    record.get_or_insert_default().extend(r);
                }
                hit_any = true;
            }
        }
        hit_any.then_some((bursts_on, record))
    }
}

/// Is cgroup path `c` the cgroup `want` or below it?
fn cgroup_within(c: &str, want: &str) -> bool {
    want == "/" || c == want || (c.starts_with(want) && c.as_bytes().get(want.len()) == Some(&b'/'))
}

/// The thread-group ids in /proc.
fn list_pids() -> Vec<Pid> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok().map(Pid))
        .collect()
}

/// /proc/PID/exe without the " (deleted)" suffix; None for kernel threads
/// and vanished processes.
pub(crate) fn read_exe(pid: Pid) -> Option<PathBuf> {
    let p = crate::sys::exe_link(pid).ok()?;
    let s = p.to_str()?;
    Some(PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(s)))
}

/// The process's cgroup paths: the unified (v2) hierarchy's and, on
/// v1/hybrid hosts, the systemd hierarchy's (where systemd puts units).
fn read_cgroups(pid: Pid) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| parse_cgroups(&t))
        .unwrap_or_default()
}

fn parse_cgroups(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(3, ':');
            let (id, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            ((id == "0" && ctrl.is_empty()) || ctrl == "name=systemd").then(|| path.to_string())
        })
        .collect()
}

/// `pid 12`, `pids 12, 34`, `no process`: a list of pids for a person.
pub(crate) fn describe_pids(pids: &[Pid]) -> String {
    match pids {
        [] => "no process".to_string(),
        [p] => format!("pid {p}"),
        _ => {
            let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
            format!("pids {}", list.join(", "))
        }
    }
}

/// What in `specs` cannot match a process, and why: an executable path
/// that does not exist (a typo: `/usr/bin/pyhton3`), a pid that is no
/// process. Units and cgroups may appear later and are not judged.
pub(crate) fn unmatchable(specs: &[TargetSpec]) -> Vec<String> {
    specs
        .iter()
        .filter_map(|s| match s {
            TargetSpec::Exe(p) if !p.exists() => Some(format!(
                "target exe {}: no such file, so no process can match it (a typo?)",
                p.display()
            )),
            TargetSpec::Exe(p) if !p.is_file() => Some(format!(
                "target exe {}: not a file, so no process can match it",
                p.display()
            )),
            TargetSpec::Pid(p) if !crate::sys::process_exists(*p) => {
                Some(format!("target pid {p}: no such process"))
            }
            _ => None,
        })
        .collect()
}

/// Warns of each target in `specs` that cannot match (at start and at
/// each reload).
pub(crate) fn warn_unmatchable(specs: &[TargetSpec]) {
    for why in unmatchable(specs) {
        tracing::warn!("{why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_parsing_and_matching() {
        assert_eq!(
            parse_cgroups("0::/system.slice/nginx.service\n"),
            ["/system.slice/nginx.service"]
        );
        assert_eq!(
            parse_cgroups("12:cpu:/x\n1:name=systemd:/user.slice/u.scope\n0::/\n"),
            ["/user.slice/u.scope", "/"]
        );
        assert!(cgroup_within("/system.slice/a.service", "/system.slice"));
        assert!(cgroup_within("/system.slice", "/system.slice"));
        assert!(!cgroup_within("/system.slicex/a", "/system.slice"));
        assert!(cgroup_within("/anything", "/"));
    }

    #[test]
    fn finds_ourselves_by_exe_pid_and_cgroup() {
        let me = Pid(std::process::id());
        // The scanner never selects burstyd itself, so look at our parent
        // through a child process instead: spawn `sleep`.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = Pid(child.id());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let exe = read_exe(pid).unwrap();
        let cg = read_cgroups(pid).pop().unwrap();
        for spec in [
            TargetSpec::Pid(pid),
            TargetSpec::Exe(exe.clone()),
            TargetSpec::Cgroup(cg.clone()),
        ] {
            let mut s = Scanner::new(vec![spec.clone().into()], false);
            let c = s.scan();
            assert!(c.added.contains(&pid), "{spec}: {c:?}");
            assert!(
                !c.added.contains(&me),
                "{spec}: selected the scanner itself"
            );
        }
        let mut s = Scanner::new(vec![TargetSpec::Pid(pid).into()], false);
        assert_eq!(s.scan().added, [pid]);
        assert!(s.bursty().is_empty());
        // Bursts: the default, a target's own yes, and a no that wins.
        let on = |b: Option<bool>| Target {
            spec: TargetSpec::Pid(pid),
            bursts: b,
            record: None,
        };
        for (targets, default, want) in [
            (vec![on(None)], true, true),
            (vec![on(Some(true))], false, true),
            (vec![on(Some(true)), on(Some(false))], true, false),
            (vec![on(None), on(Some(false))], true, false),
        ] {
            let mut b = Scanner::new(targets.clone(), default);
            b.scan();
            assert_eq!(b.bursty().contains(&pid), want, "{targets:?} {default}");
        }
        // A target's own `record`: what any matching target asks for.
        let rec = |r: Option<Vec<Record>>| Target {
            spec: TargetSpec::Pid(pid),
            bursts: Some(true),
            record: r,
        };
        let set = |r: &[Record]| Some(r.iter().copied().collect::<Records>());
        for (targets, want) in [
            (vec![rec(None)], None),
            (vec![rec(Some(vec![Record::Refs]))], set(&[Record::Refs])),
            (vec![rec(Some(vec![]))], set(&[])),
            (
                vec![rec(Some(vec![])), rec(Some(vec![Record::Refs]))],
                set(&[Record::Refs]),
            ),
            (vec![rec(None), rec(Some(vec![]))], set(&[])),
            (
                vec![
                    rec(Some(vec![Record::Values])),
                    rec(Some(vec![Record::Targets, Record::Values])),
                ],
                set(&[Record::Values, Record::Targets]),
            ),
        ] {
            let mut b = Scanner::new(targets.clone(), false);
            b.scan();
            assert_eq!(b.record(pid).cloned(), want, "{targets:?}");
        }
        assert_eq!(s.scan(), Change::default());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(s.scan().removed, [pid]);
        assert!(s.current().is_empty());
    }

    #[test]
    fn targets_that_cannot_match_are_named() {
        let specs = [
            TargetSpec::Exe("/usr/bin/pyhton3-no-such".into()),
            TargetSpec::Exe("/usr/bin".into()),
            TargetSpec::Exe("/proc/self/exe".into()),
            TargetSpec::Pid(Pid(u32::MAX / 2)),
            TargetSpec::Pid(Pid(std::process::id())),
            TargetSpec::Unit("nosuch.service".into()),
        ];
        let why = unmatchable(&specs);
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(why[0].contains("/usr/bin/pyhton3-no-such"));
        assert!(why[2].contains(&(u32::MAX / 2).to_string()));
        assert_eq!(describe_pids(&[]), "no process");
        assert_eq!(describe_pids(&[Pid(3)]), "pid 3");
        assert_eq!(describe_pids(&[Pid(3), Pid(4)]), "pids 3, 4");
    }
}
