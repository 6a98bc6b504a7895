//! Sequitur (Nevill-Manning & Witten, "Identifying hierarchical structure
//! in sequences: a linear-time algorithm", JAIR 1997): a context-free
//! grammar built from a sequence one symbol at a time, in linear time,
//! that keeps two properties: no pair of adjacent symbols (digram)
//! appears twice in it without overlapping (*digram uniqueness*), and
//! every rule but the start rule is used at least twice (*rule utility*).
//! Its rules are the sequence's repeated substrings, hierarchically:
//! Larus compressed whole-program paths with it, Chilimbi data reference
//! traces, whose hot data streams are its rules (see [`super::hot`]).
//!
//! A transcription of the reference implementation's `classes.cc` onto
//! an arena: symbols are nodes of one circular doubly-linked list per
//! rule (through the rule's guard node), digrams are indexed by their
//! first node. Terminals are `u32` ids below [`RULE_BIT`].

use rustc_hash::FxHashMap;

/// Symbols at or above this are rules (`RULE_BIT | rule`).
pub(crate) const RULE_BIT: u32 = 1 << 31;
const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    prev: u32,
    next: u32,
    /// The symbol (a terminal, or `RULE_BIT | rule`); a guard's is its
    /// rule's, never compared (see [`Grammar::same`]).
    value: u32,
    guard: bool,
}

#[derive(Clone, Copy, Debug)]
struct Rule {
    guard: u32,
    /// Nonterminals that refer to it.
    uses: u32,
    alive: bool,
}

/// A grammar under construction.
pub(crate) struct Grammar {
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    rules: Vec<Rule>,
    free_rules: Vec<u32>,
    /// Digram (two symbol values) → its first node.
    digrams: FxHashMap<u64, u32>,
    /// Terminals appended.
    len: u64,
}

impl Default for Grammar {
    fn default() -> Self {
        Self::new()
    }
}

impl Grammar {
    /// An empty grammar: the start rule (rule 0) with nothing in it.
    pub(crate) fn new() -> Self {
        let mut g = Grammar {
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            rules: Vec::new(),
            free_rules: Vec::new(),
            digrams: FxHashMap::default(),
            len: 0,
        };
        g.new_rule();
        g
    }

    /// Terminals appended so far.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Appends terminal `t` (below [`RULE_BIT`]) to the start rule.
    pub(crate) fn push(&mut self, t: u32) {
        assert!(t < RULE_BIT, "terminal {t} out of range");
        self.len += 1;
        let last = self.last(0);
        let n = self.new_node(t);
        self.insert_after(last, n);
        let prev = self.nodes[n as usize].prev;
        if !self.is_guard(prev) {
            self.check(prev);
        }
    }

    /// The live rules, the start rule first, each with its right-hand
    /// side (terminals, and rules as `RULE_BIT | rule`).
    pub(crate) fn rules(&self) -> Vec<(u32, Vec<u32>)> {
        let mut out = Vec::new();
        for (r, rule) in self.rules.iter().enumerate() {
            if !rule.alive {
                continue;
            }
            let mut rhs = Vec::new();
            let mut n = self.nodes[rule.guard as usize].next;
            while !self.is_guard(n) {
                rhs.push(self.nodes[n as usize].value);
                n = self.nodes[n as usize].next;
            }
            out.push((r as u32, rhs));
        }
        out
    }

    fn new_rule(&mut self) -> u32 {
        let r = match self.free_rules.pop() {
            Some(r) => r,
            None => {
                self.rules.push(Rule {
                    guard: NONE,
                    uses: 0,
                    alive: false,
                });
                (self.rules.len() - 1) as u32
            }
        };
        let g = self.new_node(RULE_BIT | r);
        self.nodes[g as usize].guard = true;
        self.nodes[g as usize].prev = g;
        self.nodes[g as usize].next = g;
        self.rules[r as usize] = Rule {
            guard: g,
            uses: 0,
            alive: true,
        };
        r
    }

    fn new_node(&mut self, value: u32) -> u32 {
        let node = Node {
            prev: NONE,
            next: NONE,
            value,
            guard: false,
        };
        match self.free_nodes.pop() {
            Some(n) => {
                self.nodes[n as usize] = node;
                n
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// A nonterminal node for rule `r` (a use of it).
    fn new_nonterminal(&mut self, r: u32) -> u32 {
        self.rules[r as usize].uses += 1;
        self.new_node(RULE_BIT | r)
    }

    fn is_guard(&self, n: u32) -> bool {
        self.nodes[n as usize].guard
    }

    fn rule_of(&self, n: u32) -> Option<u32> {
        let v = self.nodes[n as usize].value;
        (!self.is_guard(n) && v & RULE_BIT != 0).then_some(v & !RULE_BIT)
    }

    fn first(&self, r: u32) -> u32 {
        self.nodes[self.rules[r as usize].guard as usize].next
    }

    fn last(&self, r: u32) -> u32 {
        self.nodes[self.rules[r as usize].guard as usize].prev
    }

    fn next(&self, n: u32) -> u32 {
        self.nodes[n as usize].next
    }

    fn prev(&self, n: u32) -> u32 {
        self.nodes[n as usize].prev
    }

    /// Whether nodes `a` and `b` hold the same symbol (guards never do).
    fn same(&self, a: u32, b: u32) -> bool {
        !self.is_guard(a)
            && !self.is_guard(b)
            && self.nodes[a as usize].value == self.nodes[b as usize].value
    }

    fn key(&self, n: u32) -> u64 {
        let a = self.nodes[n as usize].value;
        let b = self.nodes[self.next(n) as usize].value;
        (u64::from(a) << 32) | u64::from(b)
    }

    /// Links `left` to `right`, keeping the index right for runs of three
    /// equal symbols (the reference implementation's triple fix).
    fn join(&mut self, left: u32, right: u32) {
        if self.nodes[left as usize].next != NONE {
            self.delete_digram(left);
            let (rp, rn) = (
                self.nodes[right as usize].prev,
                self.nodes[right as usize].next,
            );
            if rp != NONE && rn != NONE && self.same(right, rp) && self.same(right, rn) {
                let k = self.key(right);
                self.digrams.insert(k, right);
            }
            let (lp, ln) = (
                self.nodes[left as usize].prev,
                self.nodes[left as usize].next,
            );
            if lp != NONE && ln != NONE && self.same(left, ln) && self.same(left, lp) {
                let k = self.key(lp);
                self.digrams.insert(k, lp);
            }
        }
        self.nodes[left as usize].next = right;
        self.nodes[right as usize].prev = left;
    }

    fn insert_after(&mut self, n: u32, y: u32) {
        let next = self.next(n);
        self.join(y, next);
        self.join(n, y);
    }

    /// Removes the digram starting at `n` from the index, if indexed there.
    fn delete_digram(&mut self, n: u32) {
        if self.is_guard(n) || self.is_guard(self.next(n)) {
            return;
        }
        let k = self.key(n);
        if self.digrams.get(&k) == Some(&n) {
            self.digrams.remove(&k);
        }
    }

    /// Unlinks and frees node `n` (not a guard), giving up its rule's use.
    fn delete(&mut self, n: u32) {
        let (p, nx) = (self.prev(n), self.next(n));
        self.join(p, nx);
        self.delete_digram(n);
        if let Some(r) = self.rule_of(n) {
            self.rules[r as usize].uses -= 1;
        }
        self.free_nodes.push(n);
    }

    /// Looks the digram at `n` up: indexes it if new; replaces both
    /// occurrences by a rule if it repeats without overlap. Whether it was
    /// there already.
    fn check(&mut self, n: u32) -> bool {
        if self.is_guard(n) || self.is_guard(self.next(n)) {
            return false;
        }
        let k = self.key(n);
        match self.digrams.get(&k).copied() {
            None => {
                self.digrams.insert(k, n);
                false
            }
            Some(m) => {
                if self.next(m) != n {
                    self.matched(n, m);
                }
                true
            }
        }
    }

    /// `ss` and `m` start the same digram: both become a rule's use.
    fn matched(&mut self, ss: u32, m: u32) {
        let r = if self.is_guard(self.prev(m)) && self.is_guard(self.next(self.next(m))) {
            // `m` is a whole rule already.
            let r = self.nodes[self.prev(m) as usize].value & !RULE_BIT;
            self.substitute(ss, r);
            r
        } else {
            let r = self.new_rule();
            for x in [ss, self.next(ss)] {
                let y = match self.rule_of(x) {
                    Some(sub) => self.new_nonterminal(sub),
                    None => self.new_node(self.nodes[x as usize].value),
                };
                let last = self.last(r);
                self.insert_after(last, y);
            }
            self.substitute(m, r);
            self.substitute(ss, r);
            let f = self.first(r);
            let k = self.key(f);
            self.digrams.insert(k, f);
            r
        };
        // Rule utility: a rule the new one used up is inlined.
        let f = self.first(r);
        if let Some(sub) = self.rule_of(f)
            && self.rules[sub as usize].uses == 1
        {
            self.expand(f);
        }
    }

    /// Replaces the digram at `s` by a use of rule `r`.
    fn substitute(&mut self, s: u32, r: u32) {
        let q = self.prev(s);
        let a = self.next(q);
        self.delete(a);
        let b = self.next(q);
        self.delete(b);
        let y = self.new_nonterminal(r);
        self.insert_after(q, y);
        if !self.check(q) {
            let nx = self.next(q);
            self.check(nx);
        }
    }

    /// `n`, the last use of its rule, is replaced by the rule's contents.
    fn expand(&mut self, n: u32) {
        let left = self.prev(n);
        let right = self.next(n);
        let r = self.rule_of(n).expect("a nonterminal");
        let f = self.first(r);
        let l = self.last(r);
        // The rule goes (its guard with it).
        let g = self.rules[r as usize].guard;
        self.rules[r as usize].alive = false;
        self.free_rules.push(r);
        self.free_nodes.push(g);
        if !self.is_guard(right) {
            let k = self.key(n);
            if self.digrams.get(&k) == Some(&n) {
                self.digrams.remove(&k);
            }
        }
        self.free_nodes.push(n);
        self.join(left, f);
        self.join(l, right);
        if !self.is_guard(right) {
            let k = self.key(l);
            self.digrams.insert(k, l);
        }
    }
}

/// Appends the terminals rule `r` derives (from [`Grammar::rules`], by
/// rule) to `out`.
pub(crate) fn expand(rules: &FxHashMap<u32, Vec<u32>>, r: u32, out: &mut Vec<u32>) {
    for &s in &rules[&r] {
        if s & RULE_BIT != 0 {
            expand(rules, s & !RULE_BIT, out);
        } else {
            out.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds the grammar of `input` and checks what Sequitur promises:
    /// the start rule expands to the input, every other rule is used at
    /// least twice and is at least two symbols long, and no digram occurs
    /// twice (the two occurrences of a run of three equal symbols
    /// overlap, and count once).
    fn check(input: &[u32]) -> Vec<(u32, Vec<u32>)> {
        let mut g = Grammar::new();
        for &t in input {
            g.push(t);
        }
        let rules = g.rules();
        let by: FxHashMap<u32, Vec<u32>> = rules.iter().cloned().collect();
        let mut out = Vec::new();
        expand(&by, 0, &mut out);
        assert_eq!(out, input, "{rules:?}");
        let mut uses: FxHashMap<u32, u32> = FxHashMap::default();
        let mut seen: FxHashMap<(u32, u32), (u32, usize)> = FxHashMap::default();
        for (r, rhs) in &rules {
            if *r != 0 {
                assert!(rhs.len() >= 2, "rule {r}: {rhs:?} in {rules:?}");
            }
            for (i, w) in rhs.windows(2).enumerate() {
                if let Some(&(r0, i0)) = seen.get(&(w[0], w[1])) {
                    let overlap = r0 == *r && i0 + 1 == i;
                    assert!(
                        overlap,
                        "digram {w:?} twice ({r0}:{i0}, {r}:{i}) in {rules:?}"
                    );
                } else {
                    seen.insert((w[0], w[1]), (*r, i));
                }
            }
            for &s in rhs {
                if s & RULE_BIT != 0 {
                    *uses.entry(s & !RULE_BIT).or_default() += 1;
                }
            }
        }
        for (r, _) in &rules {
            if *r != 0 {
                assert!(
                    uses.get(r).copied().unwrap_or(0) >= 2,
                    "rule {r} used under twice: {rules:?}"
                );
            }
        }
        rules
    }

    #[test]
    fn the_papers_examples() {
        // "abcdbc" -> S = a A d A, A = b c.
        let rules = check(&[1, 2, 3, 4, 2, 3]);
        assert_eq!(rules.len(), 2);
        // "abcdbcabcd": S = C A C... with A = bc used in B = aA, C = Bd.
        check(&[1, 2, 3, 4, 2, 3, 1, 2, 3, 4]);
        // Runs of one symbol: "aaaa" -> S = A A, A = a a.
        let rules = check(&[7, 7, 7, 7]);
        assert_eq!(rules.len(), 2, "{rules:?}");
        check(&[7, 7, 7]);
        check(&[7; 33]);
    }

    /// Random sequences over small alphabets (many repeats, runs,
    /// overlaps): the properties hold for every one.
    #[test]
    fn random_sequences_keep_the_properties() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..3000 {
            let alphabet = 1 + (case % 5) as u64;
            let len = (rand() % 200) as usize;
            let input: Vec<u32> = (0..len).map(|_| (rand() % alphabet) as u32).collect();
            check(&input);
        }
        // Long periodic input with noise: a deep hierarchy.
        let input: Vec<u32> = (0..20_000u32)
            .map(|i| if i % 97 == 0 { 1000 + i } else { i % 13 })
            .collect();
        let rules = check(&input);
        assert!(
            rules.len() > 5 && rules[0].1.len() < 2000,
            "{}",
            rules[0].1.len()
        );
    }
}
