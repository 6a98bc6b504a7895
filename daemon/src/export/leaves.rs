//! The leaves of a pprof profile read back (`burstyd analyze --profile`):
//! event weight per leaf address of one executable, for its hot coverage.
use std::collections::HashMap;

/// The samples of a pprof profile (burstyd's `context.pb.gz`, or any with
/// mappings and addresses) whose leaf lies in the executable `file`, for
/// [`crate::bursts::coverage::HotCoverage::measure`] with bias 0: event weight (the profile's last
/// value) per leaf SVMA of `file`'s code, plus the weight of the same
/// processes' (by `pid` label, when there is one) user-mode samples
/// elsewhere under one PC outside `file`. Kernel leaves (`[kernel...]`
/// mappings, or locations without a mapping) are skipped to the first
/// user frame. The mapping is recognised by build ID, else by path.
pub(crate) struct ProfileLeaves {
    pub(crate) weights: HashMap<u64, u64>,
    /// `[lo, hi)`: SVMAs of `file` (everything below [`ELSEWHERE`]).
    pub(crate) exe: (u64, u64),
    /// Samples whose leaf was in `file` (the profile's first value, a
    /// count in burstyd's profiles).
    pub(crate) samples: u64,
}

/// A PC no executable has: where other modules' samples are put.
const ELSEWHERE: u64 = u64::MAX - 1;

impl ProfileLeaves {
    pub(crate) fn read(
        profile: &super::pprof::Profile,
        file: &std::path::Path,
        elf: &userspace_rewriter::analysis::elf::ElfInfo,
    ) -> Self {
        let strings = &profile.string_table;
        let str_at = |i: i64| strings.get(i as usize).map(String::as_str).unwrap_or("");
        let build_id = elf
            .build_id
            .as_ref()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>());
        let canonical = std::fs::canonicalize(file).ok();
        // Mappings of `file`, with the bias that turns their addresses into
        // SVMAs; and kernel mappings.
        let mut ours: HashMap<u64, u64> = HashMap::new();
        let mut kernel = std::collections::HashSet::new();
        for m in &profile.mapping {
            let name = str_at(m.filename);
            if name.starts_with("[kernel") {
                kernel.insert(m.id);
                continue;
            }
            let by_id = build_id
                .as_deref()
                .is_some_and(|b| !b.is_empty() && str_at(m.build_id) == b);
            let by_path = canonical.is_some()
                && std::fs::canonicalize(name.trim_end_matches(" (deleted)")).ok() == canonical;
            if (by_id || by_path)
                && let Some(bias) = elf.load_bias_for(m.memory_start, m.file_offset, true)
            {
                ours.insert(m.id, bias);
            }
        }
        let locations: HashMap<u64, &super::pprof::Location> =
            profile.location.iter().map(|l| (l.id, l)).collect();
        let pid_key = strings.iter().position(|s| s == "pid").map(|i| i as i64);
        let pid_of = |s: &super::pprof::Sample| {
            pid_key
                .and_then(|k| s.label.iter().find(|l| l.key == k))
                .map(|l| (l.str, l.num))
        };
        // The user leaf of each sample: (mapping, address).
        let leaf = |s: &super::pprof::Sample| {
            s.location_id
                .iter()
                .filter_map(|id| locations.get(id))
                .find(|l| l.mapping_id != 0 && !kernel.contains(&l.mapping_id))
                .map(|l| (l.mapping_id, l.address))
        };
        let mut weights: HashMap<u64, u64> = HashMap::new();
        let mut samples = 0;
        let mut pids = std::collections::HashSet::new();
        for s in &profile.sample {
            let w = s.value.last().copied().unwrap_or(0).max(0) as u64;
            if let Some((m, addr)) = leaf(s)
                && let Some(&bias) = ours.get(&m)
            {
                *weights.entry(addr.wrapping_sub(bias)).or_insert(0) += w;
                samples += s.value.first().copied().unwrap_or(0).max(0) as u64;
                pids.insert(pid_of(s));
            }
        }
        for s in &profile.sample {
            let w = s.value.last().copied().unwrap_or(0).max(0) as u64;
            if let Some((m, _)) = leaf(s)
                && !ours.contains_key(&m)
                && pids.contains(&pid_of(s))
            {
                *weights.entry(ELSEWHERE).or_insert(0) += w;
            }
        }
        ProfileLeaves {
            weights,
            exe: (elf.base_svma().unwrap_or(0), ELSEWHERE),
            samples,
        }
    }
}
