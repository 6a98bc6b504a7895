//! Burst records → [`BurstEvent`]s: the one place that knows how the
//! injected runtime encodes a record (`burstyd_common::burst`: two words,
//! the tag in bits 60..64 of the first). Everything after this works on
//! events; a new record kind is one variant here, one arm in [`decode`]
//! (and one in the raw-trace line, [`BurstEvent`]'s `Display`), and one
//! consumer.
use std::fmt;

use burstyd_common::burst::{
    END_BUDGET, END_LEFT_CLONES, END_LEFT_UNSEEN, PATH_END_BACK_EDGE, PATH_END_NORETURN,
    PATH_END_RETURN, PATH_END_TAIL, PATH_INVALID, REC_COST, REC_END, REC_ENTER, REC_PATH, REC_REF,
    REC_START, REC_TUPLE, REC_UNWIND, REF_KIND_SHIFT, REF_LOAD, REF_RMW, REF_STORE, TAG_SHIFT,
    TUPLE_COUNT_MAX, TUPLE_COUNT_SHIFT, TUPLE_EXACT, TUPLE_KIND_SHIFT, TUPLE_SITE_MASK,
    TUPLE_TARGET, TUPLE_VALUE,
};

/// One record of the burst ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BurstEvent {
    /// A burst began on thread `tid`, at the interrupted (original) `pc`.
    /// `slot`: its burst slot (its records come from that slot's
    /// sub-ring); `running`: the bursts running in the process right after
    /// it claimed the slot, itself included.
    Start {
        tid: u32,
        pc: u64,
        slot: u8,
        running: u8,
    },
    /// The clone of function `fid` (an index into the plan's functions) was
    /// entered.
    Enter { fid: u32 },
    /// A Ball-Larus path of function `fid` ended.
    Path {
        fid: u32,
        end: PathEnd,
        /// The path number (the path register without the flag bit).
        path: u64,
        /// The path's start was not observed (the burst began mid-path, or
        /// the activation is older than the burst): `path` is not a path
        /// number.
        partial: bool,
    },
    /// The measured cost of the path recorded just before: time-stamp
    /// counter ticks, exclusive of the functions it called.
    Cost { ticks: u64 },
    /// A jump went to a frame further up the stack (an exception landed in
    /// a handler, `longjmp`): the activations entered since, all but the
    /// outermost `depth`, are over.
    Unwind { depth: u64 },
    /// The burst ended. `ticks`: time-stamp-counter ticks from its first
    /// record after the START to its end (0: unknown, no record came).
    End { reason: EndReason, ticks: u64 },
    /// Memory mode: the instruction at (original) `pc` is about to
    /// access data at `addr`.
    Ref { pc: u64, kind: RefKind, addr: u64 },
    /// A tuple of the tuple profiles (`--record values,targets`): the
    /// instruction at (original) `site` produced `value` (a load's value,
    /// an indirect call's or jump's original target), `count` times among
    /// the runtime compressor's outputs (1 to `TUPLE_COUNT_MAX`: outputs
    /// its associative table merged). `exact`: the exact copy written for
    /// an evaluation (every tuple, one each), not a sampler's output.
    Tuple {
        kind: TupleKind,
        site: u64,
        value: u64,
        count: u32,
        exact: bool,
    },
    /// A record with an unknown tag (or a tuple that stands for no
    /// output: a count of 0).
    Malformed { w0: u64, w1: u64 },
}

/// What a data reference does (`REF_*` kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefKind {
    Load,
    Store,
    /// A read-modify-write.
    Rmw,
    /// A kind this daemon does not know.
    Other(u8),
}

impl RefKind {
    fn from_code(k: u64) -> Self {
        match k {
            REF_LOAD => RefKind::Load,
            REF_STORE => RefKind::Store,
            REF_RMW => RefKind::Rmw,
            k => RefKind::Other(k as u8),
        }
    }

    fn code(self) -> u64 {
        match self {
            RefKind::Load => REF_LOAD,
            RefKind::Store => REF_STORE,
            RefKind::Rmw => REF_RMW,
            RefKind::Other(k) => u64::from(k),
        }
    }
}

/// What a tuple is made of (`TUPLE_*` kinds, the exact copy's bit
/// apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum TupleKind {
    /// ⟨load, value loaded⟩: the value profile.
    Value,
    /// ⟨indirect call or jump, original target⟩: the call-target profile.
    Target,
    /// A kind this daemon does not know.
    Other(u8),
}

impl TupleKind {
    fn from_code(k: u64) -> Self {
        match k {
            TUPLE_VALUE => TupleKind::Value,
            TUPLE_TARGET => TupleKind::Target,
            k => TupleKind::Other(k as u8),
        }
    }

    fn code(self) -> u64 {
        match self {
            TupleKind::Value => TUPLE_VALUE,
            TupleKind::Target => TUPLE_TARGET,
            TupleKind::Other(k) => u64::from(k),
        }
    }
}

/// How a path ended (`REC_PATH` kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PathEnd {
    /// At a return: the activation is over.
    Return,
    /// At a back edge: the loop goes round again.
    BackEdge,
    /// At a tail call: the activation is over.
    Tail,
    /// At a call that does not return, or a jump out of the clones.
    NoReturn,
    /// A kind this daemon does not know (the path still counts).
    Other(u8),
}

/// Why a burst ended (`REC_END` reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EndReason {
    /// Its checks ran out.
    Budget,
    /// The thread left the clones at a point with no way back into them.
    LeftClones,
    /// The thread had left the clones unseen; its next burst signal ended
    /// the burst (its ticks run past the real end).
    LeftUnseen,
    /// A reason this daemon does not know.
    Other(u8),
}

impl PathEnd {
    fn from_code(kind: u64) -> Self {
        match kind {
            PATH_END_RETURN => PathEnd::Return,
            PATH_END_BACK_EDGE => PathEnd::BackEdge,
            PATH_END_TAIL => PathEnd::Tail,
            PATH_END_NORETURN => PathEnd::NoReturn,
            k => PathEnd::Other(k as u8),
        }
    }

    fn code(self) -> u64 {
        match self {
            PathEnd::Return => PATH_END_RETURN,
            PathEnd::BackEdge => PATH_END_BACK_EDGE,
            PathEnd::Tail => PATH_END_TAIL,
            PathEnd::NoReturn => PATH_END_NORETURN,
            PathEnd::Other(k) => u64::from(k),
        }
    }

    /// The path ended its function's activation.
    pub(crate) fn leaves_function(self) -> bool {
        matches!(self, PathEnd::Return | PathEnd::Tail)
    }
}

impl EndReason {
    fn from_code(reason: u64) -> Self {
        match reason {
            END_BUDGET => EndReason::Budget,
            END_LEFT_CLONES => EndReason::LeftClones,
            END_LEFT_UNSEEN => EndReason::LeftUnseen,
            r => EndReason::Other(r as u8),
        }
    }

    fn code(self) -> u64 {
        match self {
            EndReason::Budget => END_BUDGET,
            EndReason::LeftClones => END_LEFT_CLONES,
            EndReason::LeftUnseen => END_LEFT_UNSEEN,
            EndReason::Other(r) => u64::from(r),
        }
    }
}

/// Decodes one record (`w0`, `w1`) as the injected runtime wrote it.
pub(crate) fn decode(w0: u64, w1: u64) -> BurstEvent {
    match w0 >> TAG_SHIFT {
        // w0 = tag | tid, w1 = interrupted PC.
        REC_START => BurstEvent::Start {
            tid: w0 as u32,
            pc: w1,
            slot: (w0 >> burstyd_common::burst::START_SLOT_SHIFT) as u8,
            running: (w0 >> burstyd_common::burst::START_RUNNING_SHIFT) as u8,
        },
        // w0 = tag | fid, w1 = 0.
        REC_ENTER => BurstEvent::Enter { fid: w0 as u32 },
        // w0 = tag | kind << 32 | fid, w1 = path register.
        REC_PATH => BurstEvent::Path {
            fid: w0 as u32,
            end: PathEnd::from_code((w0 >> 32) & 0xf),
            path: w1 & !PATH_INVALID,
            partial: w1 & PATH_INVALID != 0,
        },
        // w0 = tag, w1 = ticks.
        REC_COST => BurstEvent::Cost { ticks: w1 },
        // w0 = tag, w1 = shadow depth left.
        REC_UNWIND => BurstEvent::Unwind { depth: w1 },
        // w0 = tag | reason, w1 = ticks.
        REC_END => BurstEvent::End {
            reason: EndReason::from_code(w0 & 0xff),
            ticks: w1,
        },
        // w0 = tag | kind << 56 | pc, w1 = address.
        REC_REF => BurstEvent::Ref {
            pc: w0 & ((1 << REF_KIND_SHIFT) - 1),
            kind: RefKind::from_code((w0 >> REF_KIND_SHIFT) & 0xf),
            addr: w1,
        },
        // w0 = tag | kind << 56 | count << 47 | site, w1 = value; a
        // record stands for one output at least.
        REC_TUPLE => {
            let code = (w0 >> TUPLE_KIND_SHIFT) & 0xf;
            let count = (w0 >> TUPLE_COUNT_SHIFT) & TUPLE_COUNT_MAX;
            if count == 0 {
                return BurstEvent::Malformed { w0, w1 };
            }
            BurstEvent::Tuple {
                kind: TupleKind::from_code(code & !TUPLE_EXACT),
                site: w0 & TUPLE_SITE_MASK,
                value: w1,
                count: count as u32,
                exact: code & TUPLE_EXACT != 0,
            }
        }
        _ => BurstEvent::Malformed { w0, w1 },
    }
}

/// The event as one line of the raw trace (`--save-bursts`, JSON).
impl fmt::Display for BurstEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BurstEvent::Start {
                tid,
                pc,
                slot,
                running,
            } => {
                write!(
                    f,
                    "{{\"burst\":\"start\",\"tid\":{tid},\"pc\":\"{pc:#x}\",\"slot\":{slot},\"running\":{running}}}"
                )
            }
            BurstEvent::Enter { fid } => write!(f, "{{\"enter\":{fid}}}"),
            BurstEvent::Path {
                fid,
                end,
                path,
                partial,
            } => {
                // The path register as recorded, flag bit included.
                let register = if partial { path | PATH_INVALID } else { path };
                write!(
                    f,
                    "{{\"path\":{register},\"fid\":{fid},\"kind\":{}}}",
                    end.code()
                )
            }
            BurstEvent::Unwind { depth } => write!(f, "{{\"unwind\":{depth}}}"),
            BurstEvent::Cost { ticks } => write!(f, "{{\"cost\":{ticks}}}"),
            BurstEvent::End { reason, ticks } => {
                write!(
                    f,
                    "{{\"burst\":\"end\",\"reason\":{},\"ticks\":{ticks}}}",
                    reason.code()
                )
            }
            BurstEvent::Ref { pc, kind, addr } => write!(
                f,
                "{{\"ref\":\"{addr:#x}\",\"pc\":\"{pc:#x}\",\"kind\":{}}}",
                kind.code()
            ),
            BurstEvent::Tuple {
                kind,
                site,
                value,
                count,
                exact,
            } => write!(
                f,
                "{{\"tuple\":\"{value:#x}\",\"site\":\"{site:#x}\",\"kind\":{},\"count\":{count},\"exact\":{exact}}}",
                kind.code()
            ),
            BurstEvent::Malformed { w0, w1 } => {
                write!(f, "{{\"malformed\":[\"{w0:#x}\",\"{w1:#x}\"]}}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(t: u64) -> u64 {
        t << TAG_SHIFT
    }

    /// A reference carries its instruction, its kind and its address; its
    /// raw-trace line says all three.
    #[test]
    fn ref_carries_pc_kind_and_address() {
        let ev = decode(
            tag(REC_REF) | REF_RMW << REF_KIND_SHIFT | 0x7f12_3456_789a,
            0x5555_0000_1238,
        );
        assert_eq!(
            ev,
            BurstEvent::Ref {
                pc: 0x7f12_3456_789a,
                kind: RefKind::Rmw,
                addr: 0x5555_0000_1238
            }
        );
        assert_eq!(
            ev.to_string(),
            r#"{"ref":"0x555500001238","pc":"0x7f123456789a","kind":2}"#
        );
        let load = decode(tag(REC_REF) | 0x40_1000, 8);
        assert!(matches!(
            load,
            BurstEvent::Ref {
                kind: RefKind::Load,
                ..
            }
        ));
    }

    /// A tuple carries its kind, site, value and count, and whether it is
    /// an exact copy; its raw-trace line says all five.
    #[test]
    fn tuple_carries_kind_site_value_count_and_exactness() {
        let ev = decode(
            tag(REC_TUPLE)
                | TUPLE_TARGET << TUPLE_KIND_SHIFT
                | 300 << TUPLE_COUNT_SHIFT
                | 0x7f12_3456_789a,
            0x5555_0000_1238,
        );
        assert_eq!(
            ev,
            BurstEvent::Tuple {
                kind: TupleKind::Target,
                site: 0x7f12_3456_789a,
                value: 0x5555_0000_1238,
                count: 300,
                exact: false,
            }
        );
        assert_eq!(
            ev.to_string(),
            r#"{"tuple":"0x555500001238","site":"0x7f123456789a","kind":1,"count":300,"exact":false}"#
        );
        // The exact copy of a value tuple, the largest count and site; a
        // value with every bit set.
        let ev = decode(
            tag(REC_TUPLE)
                | (TUPLE_VALUE | TUPLE_EXACT) << TUPLE_KIND_SHIFT
                | TUPLE_COUNT_MAX << TUPLE_COUNT_SHIFT
                | TUPLE_SITE_MASK,
            u64::MAX,
        );
        assert_eq!(
            ev,
            BurstEvent::Tuple {
                kind: TupleKind::Value,
                site: TUPLE_SITE_MASK,
                value: u64::MAX,
                count: TUPLE_COUNT_MAX as u32,
                exact: true,
            }
        );
        assert!(
            ev.to_string()
                .ends_with(r#""kind":0,"count":511,"exact":true}"#)
        );
        // An unknown kind is kept as such; a count of 0 stands for nothing.
        assert!(matches!(
            decode(
                tag(REC_TUPLE) | 5 << TUPLE_KIND_SHIFT | 1 << TUPLE_COUNT_SHIFT,
                0
            ),
            BurstEvent::Tuple {
                kind: TupleKind::Other(5),
                exact: false,
                ..
            }
        ));
        let w0 = tag(REC_TUPLE) | 0x40_1000;
        assert_eq!(decode(w0, 7), BurstEvent::Malformed { w0, w1: 7 });
    }

    #[test]
    fn start_carries_tid_and_pc() {
        assert_eq!(
            decode(tag(REC_START) | 4242, 0x40_1136),
            BurstEvent::Start {
                tid: 4242,
                pc: 0x40_1136,
                slot: 0,
                running: 0,
            }
        );
        // Slot 5, three bursts running.
        assert_eq!(
            decode(tag(REC_START) | 3 << 40 | 5 << 32 | 4242, 0x40_1136),
            BurstEvent::Start {
                tid: 4242,
                pc: 0x40_1136,
                slot: 5,
                running: 3,
            }
        );
    }

    #[test]
    fn enter_carries_the_function() {
        assert_eq!(
            decode(tag(REC_ENTER) | 17, 0),
            BurstEvent::Enter { fid: 17 }
        );
    }

    #[test]
    fn cost_carries_the_ticks() {
        let ev = decode(tag(REC_COST), 12345);
        assert_eq!(ev, BurstEvent::Cost { ticks: 12345 });
        assert_eq!(ev.to_string(), "{\"cost\":12345}");
    }

    #[test]
    fn unwind_carries_the_depth_left() {
        let ev = decode(tag(REC_UNWIND), 3);
        assert_eq!(ev, BurstEvent::Unwind { depth: 3 });
        assert_eq!(ev.to_string(), "{\"unwind\":3}");
    }

    #[test]
    fn path_kinds() {
        let path = |kind: u64, w1: u64| decode(tag(REC_PATH) | kind << 32 | 9, w1);
        for (kind, end) in [
            (PATH_END_RETURN, PathEnd::Return),
            (PATH_END_BACK_EDGE, PathEnd::BackEdge),
            (PATH_END_TAIL, PathEnd::Tail),
            (PATH_END_NORETURN, PathEnd::NoReturn),
            (7, PathEnd::Other(7)),
        ] {
            assert_eq!(
                path(kind, 5),
                BurstEvent::Path {
                    fid: 9,
                    end,
                    path: 5,
                    partial: false
                },
                "kind {kind}"
            );
        }
        assert!(PathEnd::Return.leaves_function() && PathEnd::Tail.leaves_function());
        assert!(!PathEnd::BackEdge.leaves_function() && !PathEnd::NoReturn.leaves_function());
    }

    #[test]
    fn partial_path_keeps_its_register() {
        let ev = decode(
            tag(REC_PATH) | PATH_END_BACK_EDGE << 32 | 3,
            PATH_INVALID | 12,
        );
        assert_eq!(
            ev,
            BurstEvent::Path {
                fid: 3,
                end: PathEnd::BackEdge,
                path: 12,
                partial: true
            }
        );
        // The raw trace shows the register as written.
        assert_eq!(
            ev.to_string(),
            format!("{{\"path\":{},\"fid\":3,\"kind\":1}}", PATH_INVALID | 12)
        );
    }

    #[test]
    fn end_reasons() {
        let end = |reason: u64| decode(tag(REC_END) | reason, 4321);
        assert_eq!(
            end(END_BUDGET),
            BurstEvent::End {
                reason: EndReason::Budget,
                ticks: 4321
            }
        );
        assert_eq!(
            end(END_LEFT_CLONES),
            BurstEvent::End {
                reason: EndReason::LeftClones,
                ticks: 4321
            }
        );
        assert_eq!(
            end(END_LEFT_UNSEEN),
            BurstEvent::End {
                reason: EndReason::LeftUnseen,
                ticks: 4321
            }
        );
        assert_eq!(
            end(0x1_05),
            BurstEvent::End {
                reason: EndReason::Other(5),
                ticks: 4321
            }
        );
    }

    #[test]
    fn unknown_tags_are_malformed() {
        for t in [0, 9, 15] {
            let w0 = tag(t) | 1;
            assert_eq!(decode(w0, 2), BurstEvent::Malformed { w0, w1: 2 });
        }
    }

    #[test]
    fn raw_trace_lines() {
        let lines: Vec<String> = [
            (tag(REC_START) | 2 << 40 | 1 << 32 | 77, 0x1000),
            (tag(REC_ENTER) | 2, 0),
            (tag(REC_PATH) | PATH_END_RETURN << 32 | 2, 3),
            (tag(REC_END) | END_LEFT_CLONES, 900),
        ]
        .iter()
        .map(|&(w0, w1)| decode(w0, w1).to_string())
        .collect();
        assert_eq!(
            lines,
            [
                r#"{"burst":"start","tid":77,"pc":"0x1000","slot":1,"running":2}"#,
                r#"{"enter":2}"#,
                r#"{"path":3,"fid":2,"kind":0}"#,
                r#"{"burst":"end","reason":1,"ticks":900}"#,
            ]
        );
    }
}
