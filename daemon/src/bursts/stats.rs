//! The counts a traced process's bursts add up to, and its samples
//! between two drains.

/// The samples of a traced process between two drains of its records.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Activity {
    /// All of them (it ran).
    pub(crate) samples: u64,
    /// Those whose pc was in its clones.
    pub(crate) in_clones: u64,
}

/// Totals reported at the end.
#[derive(Clone, Debug, Default)]
pub(crate) struct BurstStats {
    pub(crate) functions_rewritten: usize,
    pub(crate) functions_skipped: usize,
    pub(crate) bursts: u64,
    pub(crate) bursts_truncated: u64,
    pub(crate) declined_busy: u64,
    pub(crate) declined_pc: u64,
    /// Signals handled with `--burst 0` (straight back to the original).
    pub(crate) declined_budget: u64,
    /// Signals declined because the daemon was behind (the burst's
    /// sub-ring more than half full): a burst then could have lost
    /// records.
    pub(crate) declined_behind: u64,
    pub(crate) records: u64,
    pub(crate) records_lost: u64,
    pub(crate) paths: u64,
    pub(crate) partial_paths: u64,
    pub(crate) bad_records: u64,
    /// Bursts ended by the daemon: their thread left the clones without a
    /// check (an exception or longjmp into original code).
    pub(crate) reaped: u64,
    /// Memory mode: data references read, and those not analysed (the
    /// bound on references held was reached, or no traced function holds
    /// the instruction).
    pub(crate) references: u64,
    pub(crate) references_dropped: u64,
    /// Time-stamp-counter ticks the program spent in bursts (those whose
    /// end said how long they ran), and in those that recorded
    /// references, and how many of those there were.
    pub(crate) burst_ticks: u64,
    pub(crate) refs_burst_ticks: u64,
    pub(crate) refs_bursts: u64,
    /// Tuple records read (`--record values,targets`), and those left out
    /// of the tuple profiles (a site in no traced function, beyond the
    /// bound on sites, or a kind this daemon does not know).
    pub(crate) tuple_records: u64,
    pub(crate) tuples_dropped: u64,
}

impl BurstStats {
    /// Signals the handler declined, for every reason.
    pub(crate) fn declined(&self) -> u64 {
        self.declined_busy + self.declined_pc + self.declined_budget + self.declined_behind
    }

    /// Adds `o`'s counts (the burst and record counts, not the
    /// functions).
    pub(crate) fn add(&mut self, o: &BurstStats) {
        self.bursts += o.bursts;
        self.bursts_truncated += o.bursts_truncated;
        self.declined_busy += o.declined_busy;
        self.declined_pc += o.declined_pc;
        self.declined_budget += o.declined_budget;
        self.declined_behind += o.declined_behind;
        self.records += o.records;
        self.records_lost += o.records_lost;
        self.paths += o.paths;
        self.partial_paths += o.partial_paths;
        self.bad_records += o.bad_records;
        self.reaped += o.reaped;
        self.references += o.references;
        self.references_dropped += o.references_dropped;
        self.burst_ticks += o.burst_ticks;
        self.refs_burst_ticks += o.refs_burst_ticks;
        self.refs_bursts += o.refs_bursts;
        self.tuple_records += o.tuple_records;
        self.tuples_dropped += o.tuples_dropped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_every_burst_count_but_the_functions() {
        let one = BurstStats {
            functions_rewritten: 7,
            functions_skipped: 2,
            bursts: 1,
            bursts_truncated: 2,
            declined_busy: 3,
            declined_pc: 4,
            declined_budget: 5,
            declined_behind: 6,
            records: 7,
            records_lost: 8,
            paths: 9,
            partial_paths: 10,
            bad_records: 11,
            reaped: 12,
            references: 13,
            references_dropped: 14,
            burst_ticks: 15,
            refs_burst_ticks: 16,
            refs_bursts: 17,
            tuple_records: 18,
            tuples_dropped: 19,
        };
        let mut t = BurstStats::default();
        t.add(&one);
        t.add(&one);
        assert_eq!(t.declined(), 2 * (3 + 4 + 5 + 6));
        assert_eq!(
            (t.bursts, t.bursts_truncated, t.records, t.records_lost),
            (2, 4, 14, 16)
        );
        assert_eq!(
            (t.paths, t.partial_paths, t.bad_records, t.reaped),
            (18, 20, 22, 24)
        );
        assert_eq!((t.references, t.references_dropped), (26, 28));
        assert_eq!(
            (t.burst_ticks, t.refs_burst_ticks, t.refs_bursts),
            (30, 32, 34)
        );
        assert_eq!((t.tuple_records, t.tuples_dropped), (36, 38));
        assert_eq!((t.functions_rewritten, t.functions_skipped), (0, 0));
    }
}
