//! Tests of [`super`] (`graph.rs`), and graphs other tests build on.
use super::*;

pub(crate) fn graph(succs: &[&[usize]], exits: &[usize]) -> Graph {
    Graph {
        succs: succs.iter().map(|s| s.to_vec()).collect(),
        entry: 0,
        exits: exits.to_vec(),
        extra_entries: Vec::new(),
    }
}

/// Tiny deterministic PRNG (splitmix64) for generated test graphs.
pub(crate) struct Rng(pub u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random graph of 1..=max_n nodes, mostly forward edges with some
/// backward ones, self loops and parallel edges, so that loops, nested
/// loops and irreducible regions all occur.
pub(crate) fn random_graph(rng: &mut Rng, max_n: usize) -> Graph {
    let n = 1 + rng.below(max_n as u64) as usize;
    let mut succs = vec![Vec::new(); n];
    for (v, s) in succs.iter_mut().enumerate() {
        let deg = match rng.below(10) {
            0..=1 => 0,
            2..=5 => 1,
            6..=8 => 2,
            _ => 3,
        };
        for _ in 0..deg {
            let w = if rng.below(4) == 0 || v + 1 >= n {
                rng.below(n as u64) as usize
            } else {
                v + 1 + rng.below((n - v - 1) as u64) as usize
            };
            s.push(w);
        }
    }
    let mut exits = Vec::new();
    for v in 0..n {
        if rng.below(5) == 0 {
            exits.push(v);
        }
    }
    Graph {
        succs,
        entry: 0,
        exits,
        extra_entries: Vec::new(),
    }
}

/// Dominance by definition: `a` dominates `b` iff `b` is unreachable
/// once `a` is removed (or a == b).
fn brute_dominates(g: &Graph, a: usize, b: usize) -> bool {
    let r = reachable(g);
    if !r[a] || !r[b] {
        return false;
    }
    if a == b {
        return true;
    }
    if a == g.entry {
        return true;
    }
    let mut seen = vec![false; g.len()];
    seen[a] = true;
    seen[g.entry] = true;
    let mut st = vec![g.entry];
    while let Some(v) = st.pop() {
        for &w in &g.succs[v] {
            if !seen[w] {
                seen[w] = true;
                st.push(w);
            }
        }
    }
    !seen[b]
}

fn idoms(g: &Graph) -> Vec<Option<usize>> {
    let d = dominators(g);
    (0..g.len()).map(|v| d.idom(v)).collect()
}

#[test]
fn graph_straight_line() {
    let g = graph(&[&[1], &[2], &[3], &[]], &[3]);
    assert_eq!(idoms(&g), vec![None, Some(0), Some(1), Some(2)]);
    let d = dominators(&g);
    assert!(d.dominates(0, 3) && d.dominates(2, 3) && d.dominates(3, 3));
    assert!(!d.dominates(3, 2));
    let l = loops(&g, &d);
    assert!(l.back_edges.is_empty() && l.loops.is_empty() && !l.irreducible);
    assert_eq!(reverse_postorder(&g), vec![0, 1, 2, 3]);
}

#[test]
fn graph_diamond() {
    // 0 -> {1, 2} -> 3
    let g = graph(&[&[1, 2], &[3], &[3], &[]], &[3]);
    assert_eq!(idoms(&g), vec![None, Some(0), Some(0), Some(0)]);
    let d = dominators(&g);
    assert!(!d.dominates(1, 3) && !d.dominates(2, 3));
    let l = loops(&g, &d);
    assert!(l.back_edges.is_empty() && l.loops.is_empty() && !l.irreducible);
}

#[test]
fn graph_nested_loops() {
    // 0 -> 1 (outer header) -> 2 (inner header) -> 3 -> {2 (inner back), 4}
    // 4 -> {1 (outer back), 5}; 5 exit.
    let g = graph(&[&[1], &[2], &[3], &[2, 4], &[1, 5], &[]], &[5]);
    assert_eq!(
        idoms(&g),
        vec![None, Some(0), Some(1), Some(2), Some(3), Some(4)]
    );
    let d = dominators(&g);
    let l = loops(&g, &d);
    assert_eq!(l.back_edges, vec![(3, 0), (4, 0)]);
    assert!(l.retreating_non_back.is_empty() && !l.irreducible);
    assert_eq!(l.loops.len(), 2);
    assert_eq!(
        l.loops[0],
        Loop {
            header: 1,
            body: vec![1, 2, 3, 4],
            back_edges: vec![(4, 0)],
            parent: None
        }
    );
    assert_eq!(
        l.loops[1],
        Loop {
            header: 2,
            body: vec![2, 3],
            back_edges: vec![(3, 0)],
            parent: Some(0)
        }
    );
    assert_eq!(l.innermost_loop_of(3), Some(1));
    assert_eq!(l.innermost_loop_of(4), Some(0));
    assert_eq!(l.innermost_loop_of(5), None);
    assert_eq!(l.cut_edges(), vec![(3, 0), (4, 0)]);
}

#[test]
fn graph_loop_with_two_back_edges() {
    // 0 -> 1 (header) -> {2, 3}; 2 -> {1, 4}; 3 -> {1, 4}; 4 exit.
    let g = graph(&[&[1], &[2, 3], &[1, 4], &[1, 4], &[]], &[4]);
    assert_eq!(idoms(&g), vec![None, Some(0), Some(1), Some(1), Some(1)]);
    let d = dominators(&g);
    let l = loops(&g, &d);
    assert_eq!(l.back_edges, vec![(2, 0), (3, 0)]);
    assert_eq!(
        l.loops,
        vec![Loop {
            header: 1,
            body: vec![1, 2, 3],
            back_edges: vec![(2, 0), (3, 0)],
            parent: None
        }]
    );
    assert!(!l.irreducible);
}

#[test]
fn graph_self_loop() {
    // 0 -> 1; 1 -> {1, 2}; 2 exit.
    let g = graph(&[&[1], &[1, 2], &[]], &[2]);
    assert_eq!(idoms(&g), vec![None, Some(0), Some(1)]);
    let d = dominators(&g);
    let l = loops(&g, &d);
    assert_eq!(l.back_edges, vec![(1, 0)]);
    assert_eq!(
        l.loops,
        vec![Loop {
            header: 1,
            body: vec![1],
            back_edges: vec![(1, 0)],
            parent: None
        }]
    );
    assert!(!l.irreducible);
}

#[test]
fn graph_irreducible_two_entries() {
    // 0 -> {1, 2}; 1 -> {2, 3}; 2 -> {1}; 3 exit.
    // The cycle {1, 2} is entered at both 1 and 2: neither dominates
    // the other, so there is no back edge and no natural loop.
    let g = graph(&[&[1, 2], &[2, 3], &[1], &[]], &[3]);
    assert_eq!(idoms(&g), vec![None, Some(0), Some(0), Some(1)]);
    let d = dominators(&g);
    assert!(!d.dominates(1, 2) && !d.dominates(2, 1));
    let l = loops(&g, &d);
    assert!(l.back_edges.is_empty());
    assert!(l.loops.is_empty());
    // DFS visits 0, 1, 2 (via 1's first successor); 2 -> 1 retreats.
    assert_eq!(l.retreating_non_back, vec![(2, 0)]);
    assert!(l.irreducible);
    assert_eq!(l.cut_edges(), vec![(2, 0)]);
    assert!(l.is_cut(2, 0) && !l.is_cut(0, 1));
}

#[test]
fn graph_irreducible_inside_loop_and_unreachable() {
    // 0 -> 1 (header); 1 -> {2, 3}; 2 -> 3; 3 -> {2, 4}; 4 -> {1, 5};
    // 5 exit; 6 -> 1 is unreachable.
    let g = graph(&[&[1], &[2, 3], &[3], &[2, 4], &[1, 5], &[], &[1]], &[5]);
    let d = dominators(&g);
    assert_eq!(
        idoms(&g),
        vec![None, Some(0), Some(1), Some(1), Some(3), Some(4), None]
    );
    assert!(!d.is_reachable(6));
    let l = loops(&g, &d);
    assert_eq!(l.back_edges, vec![(4, 0)]);
    assert_eq!(l.retreating_non_back, vec![(3, 0)]);
    assert!(l.irreducible);
    assert_eq!(l.loops.len(), 1);
    assert_eq!(l.loops[0].body, vec![1, 2, 3, 4]);
    assert_eq!(
        reachable(&g),
        vec![true, true, true, true, true, true, false]
    );
}

#[test]
fn graph_validate() {
    assert_eq!(graph(&[], &[]).validate(), Err(GraphError::Empty));
    assert!(graph(&[&[1]], &[]).validate().is_err());
    assert!(graph(&[&[]], &[3]).validate().is_err());
    let mut g = graph(&[&[]], &[]);
    g.entry = 2;
    assert!(g.validate().is_err());
    assert!(graph(&[&[1], &[]], &[1]).validate().is_ok());
}

/// Checks dominators against the definition and loops against their
/// defining properties on a few hundred generated graphs.
#[test]
fn graph_random_properties() {
    let mut rng = Rng(0x6275_7273_7479);
    let mut irreducible_seen = 0;
    let mut loops_seen = 0;
    for _ in 0..400 {
        let g = random_graph(&mut rng, 9);
        g.validate().unwrap();
        let d = dominators(&g);
        let r = reachable(&g);
        for a in 0..g.len() {
            for b in 0..g.len() {
                assert_eq!(
                    d.dominates(a, b),
                    brute_dominates(&g, a, b),
                    "{g:?} {a} {b}"
                );
            }
            // idom is the closest strict dominator.
            if let Some(i) = d.idom(a) {
                assert!(brute_dominates(&g, i, a) && i != a);
                for x in 0..g.len() {
                    if x != a && brute_dominates(&g, x, a) {
                        assert!(brute_dominates(&g, x, i));
                    }
                }
            } else {
                assert!(a == g.entry || !d.is_reachable(a));
            }
        }
        let l = loops(&g, &d);
        if l.irreducible {
            irreducible_seen += 1;
        }
        loops_seen += l.loops.len();
        for &(v, i) in &l.back_edges {
            assert!(d.dominates(g.succs[v][i], v));
        }
        for &(v, i) in &l.retreating_non_back {
            assert!(!d.dominates(g.succs[v][i], v));
        }
        // Every back edge (by dominance) among reachable edges is found.
        for v in 0..g.len() {
            for (i, &w) in g.succs[v].iter().enumerate() {
                if d.is_reachable(v) && d.dominates(w, v) {
                    assert!(l.back_edges.contains(&(v, i)));
                }
            }
        }
        // Cutting back and retreating edges leaves the reachable graph acyclic.
        assert!(acyclic_without(&g, &l.cut_edges(), &r));
        for lp in &l.loops {
            for &x in &lp.body {
                assert!(d.dominates(lp.header, x));
            }
            if let Some(p) = lp.parent {
                assert!(lp.body.iter().all(|x| l.loops[p].body.contains(x)));
            }
        }
    }
    assert!(irreducible_seen > 10, "{irreducible_seen}");
    assert!(loops_seen > 100, "{loops_seen}");
}

fn acyclic_without(g: &Graph, cut: &[(usize, usize)], r: &[bool]) -> bool {
    let n = g.len();
    let mut indeg = vec![0usize; n];
    for v in (0..n).filter(|&v| r[v]) {
        for (i, &w) in g.succs[v].iter().enumerate() {
            if !cut.contains(&(v, i)) {
                indeg[w] += 1;
            }
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&v| r[v] && indeg[v] == 0).collect();
    let mut done = 0;
    while let Some(v) = ready.pop() {
        done += 1;
        for (i, &w) in g.succs[v].iter().enumerate() {
            if !cut.contains(&(v, i)) {
                indeg[w] -= 1;
                if indeg[w] == 0 {
                    ready.push(w);
                }
            }
        }
    }
    done == r.iter().filter(|&&x| x).count()
}
