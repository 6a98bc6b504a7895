//! The calling context tree of a traced process's paths (Ammons, Ball &
//! Larus): one node per calling context, shared prefixes sharing nodes,
//! built as records arrive.
//!
//! A burst's records know the functions entered *in* the burst. What lies
//! above the function where it started comes from the stack sample of the
//! very overflow that started it (same thread, same moment): the eBPF
//! program flags the sample it sent the burst signal with
//! (`SAMPLE_BURST_SIGNAL`), the pipeline keeps those samples' unwound
//! stacks per thread ([`StartStacks`]), and the burst's START record (its
//! thread and interrupted pc, which is the sample's `rip`) takes its stack
//! from there. The signal is sent before the sample is written, and the
//! handler runs only after the eBPF program returned, so a START's sample
//! is always in the sample ring before the START is in the burst ring: the
//! session drains the sample ring first.
//!
//! Nodes are capped ([`MAX_NODES`]): a context that would need more counts
//! in its deepest existing prefix, and the overflow is counted.
use std::collections::VecDeque;

use rustc_hash::FxHashMap;

/// Nodes of one process's tree at most (about 40 bytes each, with the
/// index).
pub(crate) const MAX_NODES: usize = 1 << 18;

/// Node 0: the caller is unknown (a burst without its stack sample: the
/// context starts at the function where the burst began).
pub(crate) const UNKNOWN: u32 = 0;
/// Node 1: the thread's root (the stack sample was unwound to its end:
/// `_start`, `clone3`'s thread start).
pub(crate) const ROOT: u32 = 1;

/// A frame of a context: a function of a traced module (its fid), or an
/// address outside every traced function ([`FOREIGN`] | index into
/// [`Contexts::foreign`]).
pub(crate) type Frame = u32;
/// The bit of a [`Frame`] that is an address, not a fid.
pub(crate) const FOREIGN: u32 = 1 << 31;

/// A stack frame as the sampled stack gives it, placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameKey {
    /// In function `fid` of a traced module.
    Function(u32),
    /// A return address (or, at the leaf, a pc) outside them.
    Address(u64),
}

/// Calling contexts, interned as a tree of `(parent, frame)` nodes so that
/// counting a path allocates nothing.
pub(crate) struct Contexts {
    nodes: Vec<(u32, Frame)>,
    index: FxHashMap<(u32, Frame), u32>,
    /// The addresses of foreign frames.
    foreign: Vec<u64>,
    foreign_index: FxHashMap<u64, u32>,
    /// Contexts cut short because the tree was full.
    pub(crate) overflow: u64,
    /// The index's answers lately, direct-mapped by `(parent, frame)`
    /// (nodes are never taken out, so an answer stays true): a burst
    /// enters the same few functions from the same few contexts over and
    /// over, and the index is too big to stay in the processor's caches.
    recent: Box<[(u32, Frame, u32)]>,
}

/// Entries of [`Contexts::recent`] (a power of two).
const RECENT: usize = 1 << 12;

impl Default for Contexts {
    fn default() -> Self {
        Contexts {
            nodes: vec![(UNKNOWN, u32::MAX), (UNKNOWN, u32::MAX)],
            index: FxHashMap::default(),
            foreign: Vec::new(),
            foreign_index: FxHashMap::default(),
            overflow: 0,
            recent: vec![(u32::MAX, 0, 0); RECENT].into_boxed_slice(),
        }
    }
}

impl Contexts {
    /// The node for `frame` called from context `parent` (`parent` itself
    /// when the tree is full).
    pub(crate) fn child(&mut self, parent: u32, frame: Frame) -> u32 {
        let h = ((u64::from(parent) << 32 | u64::from(frame)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            >> (64 - RECENT.trailing_zeros())) as usize;
        let r = self.recent[h];
        if r.0 == parent && r.1 == frame {
            return r.2;
        }
        let next = self.nodes.len() as u32;
        let n = if let Some(&n) = self.index.get(&(parent, frame)) {
            n
        } else if self.nodes.len() >= MAX_NODES {
            self.overflow += 1;
            return parent;
        } else {
            self.index.insert((parent, frame), next);
            self.nodes.push((parent, frame));
            next
        };
        self.recent[h] = (parent, frame, n);
        n
    }

    /// The frame for `key`.
    pub(crate) fn frame(&mut self, key: FrameKey) -> Frame {
        match key {
            FrameKey::Function(fid) => fid,
            FrameKey::Address(a) => {
                let next = self.foreign.len() as u32;
                let i = *self.foreign_index.entry(a).or_insert(next);
                if i == next {
                    self.foreign.push(a);
                }
                FOREIGN | i
            }
        }
    }

    /// The frames of a context, outermost first, and whether it reaches
    /// the thread's root.
    pub(crate) fn frames(&self, mut node: u32) -> (Vec<Frame>, bool) {
        let mut out = Vec::new();
        while node > ROOT {
            let (parent, frame) = self.nodes[node as usize];
            out.push(frame);
            node = parent;
        }
        out.reverse();
        (out, node == ROOT)
    }

    /// The functions of a context that are traced functions, outermost
    /// first (tests).
    #[cfg(test)]
    pub(crate) fn fids(&self, node: u32) -> Vec<u32> {
        self.frames(node)
            .0
            .into_iter()
            .filter(|f| f & FOREIGN == 0)
            .collect()
    }

    /// The address of a foreign frame.
    pub(crate) fn address(&self, frame: Frame) -> Option<u64> {
        (frame & FOREIGN != 0)
            .then(|| self.foreign.get((frame & !FOREIGN) as usize).copied())
            .flatten()
    }

    /// Nodes in the tree (the two roots included).
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Bytes the tree holds (nodes, index, foreign addresses), roughly.
    pub(crate) fn bytes(&self) -> usize {
        self.nodes.capacity() * 8
            + self.index.capacity() * 16
            + self.foreign.capacity() * 8
            + self.foreign_index.capacity() * 16
    }
}

/// A stack sample that came with a burst signal.
#[derive(Clone, Debug)]
pub(crate) struct StartStack {
    /// The interrupted pc (the sample's `rip`).
    pub(crate) pc: u64,
    /// The unwound user stack: the pc, then return addresses.
    pub(crate) frames: Vec<u64>,
    /// The unwind reached the thread's root.
    pub(crate) complete: bool,
}

/// Samples kept per process until their START arrives: the burst rings
/// are drained every 100 ms (a START takes its sample then, even if its
/// records are counted later), when up to a thousand samples a second per
/// CPU may have sent a signal.
const KEPT: usize = 4096;

/// The stacks of one process's burst signals, oldest first, waiting for
/// their START records.
#[derive(Default)]
pub(crate) struct StartStacks {
    waiting: VecDeque<(u32, StartStack)>,
}

impl StartStacks {
    pub(crate) fn push(&mut self, tid: u32, s: StartStack) {
        if self.waiting.len() >= KEPT {
            self.waiting.pop_front();
        }
        self.waiting.push_back((tid, s));
    }

    /// The stack of the burst that started on `tid` at `pc`: the oldest
    /// waiting sample of that thread with that pc. The thread's older ones
    /// were signals that started no burst (the handler declined them):
    /// they are dropped.
    pub(crate) fn take(&mut self, tid: u32, pc: u64) -> Option<StartStack> {
        let i = self
            .waiting
            .iter()
            .position(|(t, s)| *t == tid && s.pc == pc)?;
        let found = self.waiting.remove(i).map(|e| e.1);
        let mut k = 0;
        self.waiting.retain(|(t, _)| {
            k += 1;
            k > i || *t != tid
        });
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(pc: u64) -> StartStack {
        StartStack {
            pc,
            frames: vec![pc, 0x1000],
            complete: true,
        }
    }

    #[test]
    fn a_start_takes_its_own_sample_and_drops_older_ones() {
        let mut s = StartStacks::default();
        s.push(7, stack(0x10));
        s.push(7, stack(0x20));
        s.push(8, stack(0x20));
        s.push(7, stack(0x30));
        assert_eq!(s.take(7, 0x20).map(|x| x.pc), Some(0x20));
        // 0x10 was dropped with it; 0x30 waits; thread 8's is its own.
        assert!(s.take(7, 0x10).is_none());
        assert_eq!(s.take(7, 0x30).map(|x| x.pc), Some(0x30));
        assert_eq!(s.take(8, 0x20).map(|x| x.pc), Some(0x20));
        assert!(s.take(9, 0x20).is_none());
    }

    #[test]
    fn the_latest_samples_are_kept() {
        let mut s = StartStacks::default();
        for pc in 0..KEPT as u64 + 20 {
            s.push(1, stack(pc));
        }
        assert!(s.take(1, 19).is_none());
        assert!(s.take(1, 20).is_some());
        assert_eq!(s.waiting.len(), KEPT - 1);
    }

    #[test]
    fn the_tree_is_capped_and_counts_what_it_cuts() {
        let mut c = Contexts::default();
        let mut node = ROOT;
        for f in 0..(MAX_NODES as u32 + 10) {
            node = c.child(node, f);
        }
        assert_eq!(c.len(), MAX_NODES);
        assert_eq!(c.overflow, 12);
        // Existing nodes are still found.
        assert_eq!(c.child(ROOT, 0), 2);
        let (frames, rooted) = c.frames(node);
        assert!(rooted);
        assert_eq!(frames.len(), MAX_NODES - 2);
    }

    #[test]
    fn foreign_frames_keep_their_addresses() {
        let mut c = Contexts::default();
        let a = c.frame(FrameKey::Address(0x7f00_1234));
        let b = c.frame(FrameKey::Address(0x7f00_1234));
        let f = c.frame(FrameKey::Function(5));
        assert_eq!(a, b);
        assert_eq!(f, 5);
        assert_eq!(c.address(a), Some(0x7f00_1234));
        assert_eq!(c.address(f), None);
        let n = c.child(UNKNOWN, a);
        let n = c.child(n, f);
        assert_eq!(c.frames(n), (vec![a, 5], false));
        assert_eq!(c.fids(n), vec![5]);
    }
}
