//! A plan's items split into groups planned apart: the items live over the whole span of a
//! group go at its bottom, and what is left splits where no item is live.
//!
//! Why neither step can make the best plan worse: an item live over a group's whole span is a
//! band across every instant of the group, so in any plan of the group the bands can be taken
//! out (everything above a band moves down by its height, which keeps every pair apart) and
//! put back at the bottom, at the same peak. Groups that share no instant never meet, so each
//! starts at the same base and the peak is the highest of theirs.

use super::bound::It;

/// Splitting stops this deep (each level sorts its items, so a tower of nested lifetimes
/// costs at most this many sorts); what is left is one group.
const MAX_DEPTH: u32 = 48;

/// A group to place with the greedy orders: item indices, the offset its plan starts at.
pub struct Group {
    pub idx: Vec<u32>,
    pub base: u128,
}

/// Sets the offsets of the items stacked at the bottom of their groups and returns the
/// groups left to plan.
pub fn split(items: &[It], offsets: &mut [u128], root: Vec<u32>) -> Vec<Group> {
    let mut out = Vec::new();
    let mut work = vec![(root, 0u128, 0u32)];
    while let Some((mut idx, mut base, depth)) = work.pop() {
        if idx.is_empty() {
            continue;
        }
        if depth >= MAX_DEPTH {
            out.push(Group { idx, base });
            continue;
        }
        let lo = idx.iter().map(|&i| items[i as usize].s).min().unwrap_or(0);
        let hi = idx.iter().map(|&i| items[i as usize].e).max().unwrap_or(0);
        let (mut bands, rest): (Vec<u32>, Vec<u32>) = idx.drain(..).partition(|&i| {
            let it = &items[i as usize];
            it.s == lo && it.e == hi
        });
        bands.sort_unstable_by(|&a, &b| {
            items[b as usize]
                .size
                .cmp(&items[a as usize].size)
                .then(a.cmp(&b))
        });
        for &i in &bands {
            offsets[i as usize] = base;
            base += items[i as usize].size;
        }
        let parts = components(items, rest);
        if bands.is_empty() && parts.len() == 1 {
            out.extend(parts.into_iter().map(|idx| Group { idx, base }));
        } else {
            // reversed, so that groups come out in time order
            work.extend(parts.into_iter().rev().map(|p| (p, base, depth + 1)));
        }
    }
    out
}

/// The items split where none is live, in time order; each part sorted by start.
fn components(items: &[It], mut idx: Vec<u32>) -> Vec<Vec<u32>> {
    idx.sort_unstable_by_key(|&i| (items[i as usize].s, i));
    let mut parts: Vec<Vec<u32>> = Vec::new();
    let mut reach = 0u32;
    for i in idx {
        let it = &items[i as usize];
        match parts.last_mut() {
            Some(p) if it.s < reach => p.push(i),
            _ => parts.push(vec![i]),
        }
        reach = reach.max(it.e);
    }
    parts
}
