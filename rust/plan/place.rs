//! The greedy placement of one order: each item, in turn, at the lowest offset (first fit) or
//! in the smallest gap (best fit) left by the items already placed whose lifetimes overlap
//! its own.
//!
//! The items overlapping `[s, e)` are those live at `s` (a stabbing query on a segment tree
//! over instants, each placed item stored at the O(log T) nodes that cover its lifetime; the
//! lists of the nodes are linked through one arena, 4 bytes a node and 8 an entry) and
//! those starting inside `(s, e)` (a range of an ordered set by start): two disjoint sets,
//! found in O(log T + k) for k of them. Over a whole order the k add up to the number of
//! overlapping pairs, whatever the order ([`super::bound::overlapping_pairs`]), which is what
//! the budget is charged before a placement starts.
//!
//! The placer counts in `u64` (a group whose sizes add up past `u64::MAX` gets the time-order
//! plan only, [`fits_u64`]): no offset a greedy placement makes exceeds the sum of the sizes
//! below it, and the gaps sort twice as fast as in 128 bits.

use std::collections::BTreeSet;

use super::bound::It;

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// the lowest offset where the item fits
    First,
    /// the smallest gap the item fits in, else the top
    Best,
}

/// Places the items of one group (lifetimes in ranks from 0) again and again in given orders.
pub struct Placer<'a> {
    items: &'a [It],
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    leaves: usize,
    /// the first entry of each node's list (NONE: empty)
    head: Vec<u32>,
    /// (item, next entry of the same node)
    entries: Vec<(u32, u32)>,
    starts: BTreeSet<(u32, u32)>,
    near: Vec<(u64, u64)>,
}

/// Whether every greedy placement of `items` stays within `u64` (their sizes add up to it).
pub fn fits_u64(items: &[It]) -> bool {
    items.iter().map(|it| it.size).sum::<u128>() <= u64::MAX as u128
}

/// One placement: the offsets of the group's items (by their index in the group) and the
/// highest address they reach.
#[derive(Default)]
pub struct Placement {
    pub offsets: Vec<u128>,
    pub peak: u128,
}

impl<'a> Placer<'a> {
    pub fn new(items: &'a [It]) -> Placer<'a> {
        let span = items
            .iter()
            .map(|it| it.e as usize)
            .max()
            .unwrap_or(0)
            .max(1);
        // a bottom-up segment tree of any size: a point's nodes are its leaf's ancestors
        let leaves = span;
        Placer {
            items,
            // callers check `fits_u64` first, so every size fits
            sizes: items.iter().map(|it| it.size as u64).collect(),
            offsets: vec![0; items.len()],
            leaves,
            head: vec![NONE; 2 * leaves],
            entries: Vec::new(),
            starts: BTreeSet::new(),
            near: Vec::new(),
        }
    }

    /// Places every item in `order` (each index once), or gives up as soon as one reaches
    /// `limit` (no better than a plan already had). `work` counts the placed items looked at.
    pub fn place(
        &mut self,
        order: &[u32],
        fit: Fit,
        limit: u128,
        work: &mut u64,
    ) -> Option<Placement> {
        self.head.fill(NONE);
        self.entries.clear();
        self.starts.clear();
        let mut peak = 0u64;
        for &x in order {
            let it = self.items[x as usize];
            self.gather(it);
            *work = work.saturating_add(self.near.len() as u64 + 1);
            let size = self.sizes[x as usize];
            let off = gap(&mut self.near, size, fit);
            let top = off.saturating_add(size);
            if top as u128 >= limit {
                return None;
            }
            peak = peak.max(top);
            self.offsets[x as usize] = off;
            self.insert(x, it);
        }
        Some(Placement {
            offsets: self.offsets.iter().map(|&o| o as u128).collect(),
            peak: peak as u128,
        })
    }

    /// The (offset, end) of every placed item whose lifetime overlaps `it`'s, in `near`.
    fn gather(&mut self, it: It) {
        self.near.clear();
        let (sizes, offsets) = (&self.sizes, &self.offsets);
        let mut node = it.s as usize + self.leaves;
        while node >= 1 {
            let mut e = self.head[node];
            while e != NONE {
                let (j, next) = self.entries[e as usize];
                let o = offsets[j as usize];
                self.near.push((o, o + sizes[j as usize]));
                e = next;
            }
            node >>= 1;
        }
        if it.s + 1 < it.e {
            for &(_, j) in self.starts.range((it.s + 1, 0)..(it.e, 0)) {
                let o = offsets[j as usize];
                self.near.push((o, o + sizes[j as usize]));
            }
        }
    }

    /// Stores `x` at the nodes covering `[s, e)` and in the set of starts.
    fn insert(&mut self, x: u32, it: It) {
        let (mut l, mut r) = (it.s as usize + self.leaves, it.e as usize + self.leaves);
        while l < r {
            if l & 1 == 1 {
                self.push(l, x);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.push(r, x);
            }
            l >>= 1;
            r >>= 1;
        }
        self.starts.insert((it.s, x));
    }

    fn push(&mut self, node: usize, x: u32) {
        let e = self.entries.len() as u32;
        self.entries.push((x, self.head[node]));
        self.head[node] = e;
    }
}

/// Where an item of `size` goes among the ranges `near` holds (sorted here by offset).
/// Example: ranges [0, 4) and [6, 10), size 2: first fit and best fit give 4; size 3: 10.
pub fn gap(near: &mut [(u64, u64)], size: u64, fit: Fit) -> u64 {
    near.sort_unstable_by_key(|r| r.0);
    let mut cur = 0u64;
    let mut best: Option<(u64, u64)> = None;
    for &(a, b) in near.iter() {
        if a > cur && a - cur >= size {
            match fit {
                Fit::First => return cur,
                Fit::Best => {
                    let g = a - cur;
                    if best.is_none_or(|(bg, _)| g < bg) {
                        best = Some((g, cur));
                    }
                }
            }
        }
        cur = cur.max(b);
    }
    best.map_or(cur, |(_, o)| o)
}
