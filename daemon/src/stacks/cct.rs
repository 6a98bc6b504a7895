//! Calling context trees (Ammons, Ball & Larus, "Exploiting hardware
//! performance counters with flow and context sensitive profiling", §3):
//! one tree per thread, a node per distinct calling context, each node
//! holding the samples and the hardware-event weight observed *in* that
//! context. Shared prefixes share nodes, so memory grows with the number of
//! distinct contexts, not with the number of samples.
//!
//! Frames are raw addresses here; [`crate::export::context`] symbolizes them when a
//! profile is written.
use std::collections::HashMap;

use burstyd_common::addr::{Avma, FrameAddress, Pid};
use rustc_hash::FxHashMap;

use super::unwind::frame_address;

/// One frame of a calling context, outermost first when inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum FrameAddr {
    /// A user frame: the interrupted instruction, or a caller's return
    /// address (looked up minus one, see [`FrameAddress::lookup_address`]).
    User(FrameAddress),
    /// A kernel frame (from `bpf_get_stack`; all but the first are return
    /// addresses).
    Kernel(FrameAddress),
    /// Marks a context whose outer frames are missing (the user stack copy
    /// ended, or a module had no unwind information).
    Truncated,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) parent: u32,
    pub(crate) frame: FrameAddr,
    pub(crate) samples: u64,
    pub(crate) weight: u64,
}

/// A thread's tree. Node 0 is the root (the thread itself).
#[derive(Debug)]
pub(crate) struct ThreadTree {
    pub(crate) pid: Pid,
    pub(crate) tid: u32,
    /// The thread's name (`comm`) as last seen.
    pub(crate) thread_name: String,
    pub(crate) nodes: Vec<Node>,
    /// (parent node, frame) -> child node. Fx: hashed once per frame per
    /// sample, keys are small integers, no untrusted input.
    children: FxHashMap<(u32, FrameAddr), u32>,
}

impl ThreadTree {
    fn new(pid: Pid, tid: u32) -> Self {
        ThreadTree {
            pid,
            tid,
            thread_name: String::new(),
            nodes: vec![Node {
                parent: u32::MAX,
                frame: FrameAddr::Truncated,
                samples: 0,
                weight: 0,
            }],
            children: FxHashMap::default(),
        }
    }

    /// Records one sample whose context is `frames`, outermost first.
    fn add(&mut self, frames: impl Iterator<Item = FrameAddr>, weight: u64) {
        let cur = self.insert(frames);
        let n = &mut self.nodes[cur as usize];
        n.samples += 1;
        n.weight += weight;
    }

    /// The node for context `frames` (outermost first), created if new.
    fn insert(&mut self, frames: impl Iterator<Item = FrameAddr>) -> u32 {
        let mut cur = 0u32;
        for f in frames {
            let next = self.nodes.len() as u32;
            cur = *self.children.entry((cur, f)).or_insert_with(|| {
                self.nodes.push(Node {
                    parent: cur,
                    frame: f,
                    samples: 0,
                    weight: 0,
                });
                next
            });
        }
        cur
    }

    /// The context of node `i`, innermost (leaf) first, root excluded.
    pub(crate) fn context(&self, mut i: u32, out: &mut Vec<FrameAddr>) {
        out.clear();
        while i != 0 {
            let n = &self.nodes[i as usize];
            out.push(n.frame);
            i = n.parent;
        }
    }
}

/// All calling context trees of one profile interval.
#[derive(Debug, Default)]
pub(crate) struct Cct {
    /// Keyed by (process, thread id).
    pub(crate) threads: HashMap<(Pid, u32), ThreadTree>,
    /// Process names: the main thread's name at its latest sample (so a
    /// process that `exec`s is named for the program it became), else
    /// `/proc/PID/comm` at first sight.
    pub(crate) process_names: HashMap<Pid, String>,
    pub(crate) samples: u64,
}

impl Cct {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds a sample of thread `tid` of process `pid`.
    ///
    /// `user` is the unwound user stack innermost first (`user[0]` is the
    /// interrupted pc, the rest return addresses); `kernel` likewise.
    /// `truncated` says the user stack's outer end is missing.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        pid: Pid,
        tid: u32,
        thread_name: &str,
        user: &[u64],
        kernel: &[u64],
        truncated: bool,
        weight: u64,
    ) {
        let tree = self
            .threads
            .entry((pid, tid))
            .or_insert_with(|| ThreadTree::new(pid, tid));
        if tree.thread_name != thread_name {
            tree.thread_name = thread_name.to_owned();
        }
        let trunc = truncated.then_some(FrameAddr::Truncated);
        // With a kernel stack, the user pc is where the thread entered the
        // kernel (a syscall's return address); it is then a return address
        // too, as far as line lookup goes.
        let in_kernel = !kernel.is_empty();
        let users = user.iter().enumerate().rev().map(|(i, &addr)| {
            FrameAddr::User(if in_kernel {
                FrameAddress::ReturnAddress(Avma(addr))
            } else {
                frame_address(i, addr)
            })
        });
        let kernels = kernel
            .iter()
            .enumerate()
            .rev()
            .map(|(i, &addr)| FrameAddr::Kernel(frame_address(i, addr)));
        tree.add(trunc.into_iter().chain(users).chain(kernels), weight);
        self.samples += 1;
    }

    /// Adds every context of `other` (with its samples and weight) to
    /// this tree set.
    pub(crate) fn merge(&mut self, other: &Cct) {
        let mut ctx = Vec::new();
        for (key, t) in &other.threads {
            let tree = self
                .threads
                .entry(*key)
                .or_insert_with(|| ThreadTree::new(t.pid, t.tid));
            tree.thread_name.clone_from(&t.thread_name);
            for (i, n) in t.nodes.iter().enumerate() {
                if n.samples == 0 {
                    continue;
                }
                t.context(i as u32, &mut ctx);
                let node = tree.insert(ctx.iter().rev().copied());
                let dst = &mut tree.nodes[node as usize];
                dst.samples += n.samples;
                dst.weight += n.weight;
            }
        }
        // `other` is the later interval: its names are the newer ones.
        for (pid, name) in &other.process_names {
            self.name_process(*pid, true, || name.clone());
        }
        self.samples += other.samples;
    }

    /// Records the name of process `pid`: `exact` names (the main thread's
    /// name at sample time) replace what is known; others only fill a gap.
    pub(crate) fn name_process(&mut self, pid: Pid, exact: bool, name: impl FnOnce() -> String) {
        match self.process_names.get_mut(&pid) {
            Some(known) if exact => {
                let name = name();
                if *known != name {
                    *known = name;
                }
            }
            Some(_) => {}
            None => {
                self.process_names.insert(pid, name());
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.samples == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_for_the_program_its_main_thread_runs_now() {
        let mut cct = Cct::new();
        // `burstyd run`'s gate is sampled before it execs the command.
        cct.name_process(Pid(5), true, || "burstyd".into());
        // Another thread's view never renames a known process...
        cct.name_process(Pid(5), false, || "worker".into());
        assert_eq!(cct.process_names[&Pid(5)], "burstyd");
        // ...the main thread after exec does.
        cct.name_process(Pid(5), true, || "xz".into());
        assert_eq!(cct.process_names[&Pid(5)], "xz");
        // An unknown process takes whatever is offered first.
        cct.name_process(Pid(6), false, || "from-proc".into());
        assert_eq!(cct.process_names[&Pid(6)], "from-proc");
        // Merging a later interval takes its names.
        let mut total = Cct::new();
        total.name_process(Pid(5), false, || "burstyd".into());
        total.merge(&cct);
        assert_eq!(total.process_names[&Pid(5)], "xz");
    }

    #[test]
    fn shared_prefixes_share_nodes_and_weights_stay_in_their_context() {
        let mut cct = Cct::new();
        // main(0x10) -> a(0x20) -> leaf(0x30), twice; main -> b(0x40) once.
        cct.add(Pid(1), 1, "t", &[0x30, 0x20, 0x10], &[], false, 5);
        cct.add(Pid(1), 1, "t", &[0x30, 0x20, 0x10], &[], false, 7);
        cct.add(Pid(1), 1, "t", &[0x40, 0x10], &[], false, 1);
        let t = &cct.threads[&(Pid(1), 1)];
        // root + main + a + leaf + b
        assert_eq!(t.nodes.len(), 5);
        let leaf = t
            .nodes
            .iter()
            .position(|n| n.frame == FrameAddr::User(FrameAddress::InstructionPointer(Avma(0x30))))
            .unwrap();
        assert_eq!((t.nodes[leaf].samples, t.nodes[leaf].weight), (2, 12));
        let mut ctx = Vec::new();
        t.context(leaf as u32, &mut ctx);
        let addrs: Vec<u64> = ctx
            .iter()
            .map(|f| match f {
                FrameAddr::User(a) => a.address().0,
                _ => 0,
            })
            .collect();
        assert_eq!(addrs, vec![0x30, 0x20, 0x10]);
        assert_eq!(cct.samples, 3);

        // Merging a copy doubles every count without adding nodes.
        let mut twice = Cct::new();
        twice.merge(&cct);
        twice.merge(&cct);
        let t2 = &twice.threads[&(Pid(1), 1)];
        assert_eq!(t2.nodes.len(), 5);
        assert_eq!(t2.nodes.iter().map(|n| n.weight).sum::<u64>(), 26);
        assert_eq!(twice.samples, 6);
    }

    #[test]
    fn kernel_frames_sit_below_the_user_frames() {
        let mut cct = Cct::new();
        cct.add(
            Pid(2),
            3,
            "t",
            &[0x401000, 0x400500],
            &[0xffff_0001, 0xffff_0002],
            true,
            1,
        );
        let t = &cct.threads[&(Pid(2), 3)];
        let leaf = t.nodes.iter().position(|n| n.samples == 1).unwrap();
        let mut ctx = Vec::new();
        t.context(leaf as u32, &mut ctx);
        assert_eq!(
            ctx,
            vec![
                FrameAddr::Kernel(FrameAddress::InstructionPointer(Avma(0xffff_0001))),
                FrameAddr::Kernel(FrameAddress::ReturnAddress(Avma(0xffff_0002))),
                FrameAddr::User(FrameAddress::ReturnAddress(Avma(0x401000))),
                FrameAddr::User(FrameAddress::ReturnAddress(Avma(0x400500))),
                FrameAddr::Truncated,
            ]
        );
    }
}
