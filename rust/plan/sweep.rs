//! The time-order plan: the items of a group allocated and freed in the order of their
//! lifetimes through a best-fit free list (free ranges by size and by offset, neighbours
//! merged on free, the top range grown in place). O(n log n) whatever the overlaps: the plan
//! every group gets even when the budget allows no greedy placement.

use std::collections::{BTreeMap, BTreeSet};

use super::bound::It;
use super::place::Placement;

/// Plans `items` (lifetimes in ranks) in time order, the frees of an instant before its
/// allocations, allocations of one instant largest first.
pub fn sweep(items: &[It]) -> Placement {
    // (instant, 0 free / 1 alloc, for allocs the size reversed, index)
    let mut ev: Vec<(u32, u8, u128, u32)> = Vec::with_capacity(items.len() * 2);
    for (i, it) in items.iter().enumerate() {
        ev.push((it.s, 1, u128::MAX - it.size, i as u32));
        ev.push((it.e, 0, 0, i as u32));
    }
    ev.sort_unstable();
    let mut free = FreeList::default();
    let mut offsets = vec![0u128; items.len()];
    for (_, kind, _, i) in ev {
        let size = items[i as usize].size;
        if kind == 1 {
            offsets[i as usize] = free.alloc(size);
        } else {
            free.free(offsets[i as usize], size);
        }
    }
    Placement {
        offsets,
        peak: free.top,
    }
}

/// Free ranges below `top`, the highest address ever used.
#[derive(Default)]
struct FreeList {
    by_off: BTreeMap<u128, u128>,
    by_size: BTreeSet<(u128, u128)>,
    top: u128,
}

impl FreeList {
    fn alloc(&mut self, size: u128) -> u128 {
        if let Some(&(fs, fo)) = self.by_size.range((size, 0)..).next() {
            self.take(fo, fs);
            if fs > size {
                self.put(fo + size, fs - size);
            }
            return fo;
        }
        // the range that ends at the top grows in place, else the item goes on top
        if let Some((&fo, &fs)) = self.by_off.iter().next_back() {
            if fo + fs == self.top {
                self.take(fo, fs);
                self.top = fo + size;
                return fo;
            }
        }
        let off = self.top;
        self.top += size;
        off
    }

    fn free(&mut self, mut off: u128, mut size: u128) {
        if let Some((&po, &ps)) = self.by_off.range(..off).next_back() {
            if po + ps == off {
                self.take(po, ps);
                off = po;
                size += ps;
            }
        }
        if let Some(&ns) = self.by_off.get(&(off + size)) {
            self.take(off + size, ns);
            size += ns;
        }
        self.put(off, size);
    }

    fn take(&mut self, off: u128, size: u128) {
        self.by_off.remove(&off);
        self.by_size.remove(&(size, off));
    }

    fn put(&mut self, off: u128, size: u128) {
        self.by_off.insert(off, size);
        self.by_size.insert((size, off));
    }
}
