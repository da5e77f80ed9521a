//! The search over positions under a target height: each item of a group, in a given order,
//! goes at the lowest offset where it fits below the target or at the highest (its top at
//! the target, or below the lowest placed item in its way), and when an item fits nowhere
//! the search goes back to the last item that stands in its way and tries that one's other
//! position (conflict-directed backjumping, as in TelaMalloc's search: Maas et al., ASPLOS
//! 2023), within a bounded number of steps.
//!
//! The top position is what no greedy placement makes: an item put high, above space that is
//! free when it is placed and taken only by items placed after it. On a training step where
//! big short-lived blocks come and go between pairs of long-lived blocks that overlap the
//! pairs of the step before, the greedy orders put each pair just above the previous one and
//! rotate the pairs over three slots, one of them empty at every peak; alternating the pairs
//! between the bottom and the top leaves no hole (`docs/plan.md`, octnca).
//!
//! Only the big items (from 1/64 of the best peak on) branch. The small ones go at the lowest
//! offset where they fit, placed in time order before the big ones (a floor the big ones
//! sit on) or after them (in the holes they leave, either held under the target, so that one
//! that fits nowhere sends the search back, or anywhere): on octnca the first way reaches
//! within 0.11 % of the bound; on the generated loop of `tests.rs` only the second reaches
//! it, where small blocks under the floor would push every pair up.
//!
//! The target is searched from the bound up (the bound first, then a bisection between the
//! bound and the best plan yet), each try within its own share of the work.

use std::cmp::Reverse;

use super::bound::It;
use super::place::Placement;

const NONE: u64 = u64::MAX;

/// A group's items with, for each, the items whose lifetimes overlap its own (`adj`, in
/// compressed rows), built once for every try.
pub struct Stack<'a> {
    items: &'a [It],
    sizes: Vec<u64>,
    row: Vec<u32>,
    adj: Vec<u32>,
}

/// Items get both positions only from this fraction of the best peak on (1/64): the small
/// ones go at the lowest offset only, so that the search branches on the items that shape
/// the layout.
const SMALL_SHIFT: u32 = 6;

impl<'a> Stack<'a> {
    /// The overlap lists of `items` (every size below 2^64); `None` when there are more than
    /// `max_pairs` overlapping pairs.
    pub fn new(items: &'a [It], max_pairs: u64) -> Option<Stack<'a>> {
        let n = items.len();
        let mut by_start: Vec<u32> = (0..n as u32).collect();
        by_start.sort_unstable_by_key(|&i| (items[i as usize].s, i));
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut active: Vec<u32> = Vec::new();
        for &i in &by_start {
            let s = items[i as usize].s;
            active.retain(|&j| items[j as usize].e > s);
            if (pairs.len() + active.len()) as u64 > max_pairs {
                return None;
            }
            pairs.extend(active.iter().map(|&j| (i, j)));
            active.push(i);
        }
        let mut deg = vec![0u32; n + 1];
        for &(a, b) in &pairs {
            deg[a as usize] += 1;
            deg[b as usize] += 1;
        }
        let mut row = vec![0u32; n + 1];
        for i in 0..n {
            row[i + 1] = row[i] + deg[i];
        }
        let mut fill = row.clone();
        let mut adj = vec![0u32; 2 * pairs.len()];
        for &(a, b) in &pairs {
            adj[fill[a as usize] as usize] = b;
            fill[a as usize] += 1;
            adj[fill[b as usize] as usize] = a;
            fill[b as usize] += 1;
        }
        Some(Stack {
            items,
            sizes: items.iter().map(|it| it.size as u64).collect(),
            row,
            adj,
        })
    }

    /// What one try costs at most per step taken (the overlap lists looked at).
    pub fn pairs(&self) -> u64 {
        self.adj.len() as u64
    }

    fn nbrs(&self, i: u32) -> &[u32] {
        &self.adj[self.row[i as usize] as usize..self.row[i as usize + 1] as usize]
    }

    /// A placement of every item in `order` with its peak at most `target`, or `None` once
    /// `work` (items looked at) passes `limit` or the search runs out of positions.
    pub fn place(
        &self,
        order: &[u32],
        target: u64,
        small: u64,
        bounded: bool,
        limit: u64,
        work: &mut u64,
    ) -> Option<Placement> {
        let n = order.len();
        let mut pos = vec![0u32; self.items.len()];
        for (k, &x) in order.iter().enumerate() {
            pos[x as usize] = k as u32;
        }
        let mut off = vec![NONE; self.items.len()];
        // per depth: the positions to try, the next one, the depths in its way
        let mut cands: Vec<[u64; 2]> = vec![[NONE; 2]; n];
        let mut next = vec![0u8; n];
        let mut conflict: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut near: Vec<(u64, u64)> = Vec::new();

        let mut depth = 0usize;
        let mut fresh = true;
        while depth < n {
            let x = order[depth];
            if fresh {
                near.clear();
                for &j in self.nbrs(x) {
                    let o = off[j as usize];
                    if o != NONE {
                        near.push((o, o + self.sizes[j as usize]));
                    }
                }
                *work += near.len() as u64 + 1;
                if *work > limit {
                    return None;
                }
                let size = self.sizes[x as usize];
                cands[depth] = if size >= small {
                    positions(&mut near, size, target, true)
                } else {
                    positions(
                        &mut near,
                        size,
                        if bounded { target } else { u64::MAX },
                        false,
                    )
                };
                next[depth] = 0;
                conflict[depth].clear();
            } else {
                off[x as usize] = NONE;
            }
            let k = next[depth] as usize;
            if k < 2 && cands[depth][k] != NONE {
                off[x as usize] = cands[depth][k];
                next[depth] += 1;
                depth += 1;
                fresh = true;
                continue;
            }
            // x fits nowhere: back to the latest item in its way
            *work += self.nbrs(x).len() as u64 + 1;
            if *work > limit {
                return None;
            }
            let mut back: Vec<u32> = std::mem::take(&mut conflict[depth]);
            back.extend(
                self.nbrs(x)
                    .iter()
                    .map(|&j| pos[j as usize])
                    .filter(|&p| (p as usize) < depth),
            );
            let j = *back.iter().max()? as usize;
            back.retain(|&p| (p as usize) != j);
            back.sort_unstable();
            back.dedup();
            conflict[j].extend(back);
            for &y in &order[j + 1..depth] {
                off[y as usize] = NONE;
            }
            depth = j;
            fresh = false;
        }
        let peak = order
            .iter()
            .map(|&x| off[x as usize] + self.sizes[x as usize])
            .max()
            .unwrap_or(0);
        Some(Placement {
            offsets: off
                .iter()
                .map(|&o| if o == NONE { 0 } else { o as u128 })
                .collect(),
            peak: peak as u128,
        })
    }
}

/// The lowest and the highest offset where `size` fits among the ranges `near` (sorted
/// here) below `target` (the highest only if `both` and not the lowest); `NONE` where there
/// is none. Example: ranges [2, 4) and [6, 8), target 10, size 2: 0 and 8; size 3: none.
fn positions(near: &mut [(u64, u64)], size: u64, target: u64, both: bool) -> [u64; 2] {
    near.sort_unstable_by_key(|r| r.0);
    let (mut low, mut high) = (NONE, NONE);
    let mut cur = 0u64;
    let mut gap = |from: u64, to: u64| {
        let to = to.min(target);
        if to > from && to - from >= size {
            if low == NONE {
                low = from;
            }
            high = to - size;
        }
    };
    for &(a, b) in near.iter() {
        if cur >= target {
            break;
        }
        if a > cur {
            gap(cur, a);
        }
        cur = cur.max(b);
    }
    gap(cur, target);
    if !both || high == low {
        high = NONE;
    }
    [low, high]
}

/// Overlapping pairs past this many: no search (the overlap lists would take too much memory).
const MAX_PAIRS: u64 = 4_000_000;

/// Tries of a target per group: the bound, then a bisection up to the best plan's peak.
const TRIES: u32 = 8;

/// Work one try may do, in multiples of the group's overlapping pairs and items.
const TRY_FACTOR: u64 = 4;

/// Work all the tries of a group may do, in multiples of its overlapping pairs and items.
const GROUP_FACTOR: u64 = 32;

/// Work one try may do at least (under a millisecond).
const MIN_TRY: u64 = 1 << 15;

/// Lowers `best`, a plan of `items`, towards `bound` by the search under a target, while the
/// budget lasts; `best` changes only for a lower peak.
pub fn improve(items: &[It], bound: u128, best: &mut Placement, budget: &mut u64) {
    if best.peak <= bound || items.len() > u32::MAX as usize / 2 {
        return;
    }
    let Some(st) = Stack::new(items, MAX_PAIRS.min(*budget)) else {
        return;
    };
    let g = items
        .iter()
        .fold(0u64, |g, it| gcd(g, it.size as u64))
        .max(1);
    let (mut lo, mut hi) = ((bound as u64).div_ceil(g), best.peak as u64 / g);
    let size = st.pairs() + items.len() as u64;
    let per_try = TRY_FACTOR.saturating_mul(size).max(MIN_TRY);
    // what building the overlap lists cost, and all this group's tries may cost
    *budget = budget.saturating_sub(size);
    let mut left = GROUP_FACTOR.saturating_mul(size).max(MIN_TRY * 4);
    let small = (hi * g) >> SMALL_SHIFT;
    // the big items in an order the search branches on, the small ones in time order
    // before or after them (best first on the corpus)
    let orders = [
        (with_small(items, small, area_order(items), true), false),
        (with_small(items, small, time_order(items), false), true),
        (with_small(items, small, time_order(items), false), false),
        (with_small(items, small, area_order(items), false), true),
    ];
    let mut tries = 0;
    while lo < hi && tries < TRIES {
        // the bound first, then halfway
        let t = if tries == 0 { lo } else { lo + (hi - lo) / 2 };
        tries += 1;
        let mut found = None;
        for (order, bounded) in &orders {
            if *budget < per_try || left < per_try {
                return;
            }
            let mut work = 0;
            let got = st.place(order, t * g, small, *bounded, per_try, &mut work);
            *budget = budget.saturating_sub(work);
            left = left.saturating_sub(work);
            if got.as_ref().is_some_and(|p| p.peak < best.peak) {
                found = got;
                break;
            }
        }
        match found {
            Some(p) => {
                hi = (p.peak as u64).div_ceil(g);
                *best = p;
            }
            None => lo = t + 1,
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The items of `order` from `small` bytes on, in that order, with the smaller ones in time
/// order before them (`first`) or after them.
fn with_small(items: &[It], small: u64, order: Vec<u32>, first: bool) -> Vec<u32> {
    let (big, rest): (Vec<u32>, Vec<u32>) = order
        .into_iter()
        .partition(|&i| items[i as usize].size >= small as u128);
    let mut rest = rest;
    rest.sort_by_key(|&i| (items[i as usize].s, Reverse(items[i as usize].size), i));
    if first {
        rest.extend(big);
        rest
    } else {
        let mut big = big;
        big.extend(rest);
        big
    }
}

/// By start, the larger first on ties.
fn time_order(items: &[It]) -> Vec<u32> {
    let mut o: Vec<u32> = (0..items.len() as u32).collect();
    o.sort_by_key(|&i| (items[i as usize].s, Reverse(items[i as usize].size), i));
    o
}

/// By size × lifetime, the largest first.
fn area_order(items: &[It]) -> Vec<u32> {
    let mut o: Vec<u32> = (0..items.len() as u32).collect();
    let area = |it: &It| it.size * (it.e - it.s) as u128;
    o.sort_by_key(|&i| (Reverse(area(&items[i as usize])), items[i as usize].s, i));
    o
}

#[cfg(test)]
mod tests {
    use super::positions;
    const N: u64 = super::NONE;

    #[test]
    fn positions_are_the_lowest_and_highest_fit_below_the_target() {
        assert_eq!(positions(&mut [(2, 4), (6, 8)], 2, 10, true), [0, 8]);
        assert_eq!(positions(&mut [(2, 4), (6, 8)], 3, 10, true), [N, N]);
        assert_eq!(positions(&mut [(2, 4), (6, 8)], 2, 10, false), [0, N]);
        assert_eq!(positions(&mut [(0, 4)], 6, 10, true), [4, N]);
        assert_eq!(positions(&mut [(0, 4)], 3, 10, true), [4, 7]);
    }
}
