//! `validate()`: recompute every counter from the trees and cross-check every list against
//! the invariants stated in `mod.rs`. Returns the first violation found, as text.

use super::*;

impl Pmm {
    /// Checks every invariant; `Err` names the first one broken.
    #[allow(clippy::needless_range_loop)] // [type][order][zero] indices name the list in errors
    pub fn validate(&self) -> std::result::Result<(), String> {
        let mut counts = [[[0u64; NUM_STATES]; NUM_ORDERS]; NUM_TYPES];
        let mut linked = [[[0u64; 2]; NUM_ORDERS]; NUM_TYPES];
        let mut live_nodes = 0usize;
        let mut pinned_total = 0u64;
        let mut in_eviction = 0u64;
        let unowned: std::collections::HashSet<u32> = self.unowned.iter().map(|r| r.0).collect();
        if unowned.len() != self.unowned.len() {
            return Err("a root appears twice in the unowned set".into());
        }
        for r in 0..self.num_roots() {
            let node = &self.nodes[r as usize];
            let root = &self.roots[r as usize];
            if node.addr != r as u64 * ROOT_CHUNK_SIZE || node.shift as u32 != ROOT_CHUNK_SHIFT {
                return Err(format!(
                    "root {r} has address {:#x} and shift {}",
                    node.addr, node.shift
                ));
            }
            if node.parent != NIL || !node.live {
                return Err(format!("root {r} has a parent or is not live"));
            }
            if (node.state == ChunkState::PmaOwned) != unowned.contains(&r) {
                return Err(format!(
                    "root {r} is {} but unowned set says otherwise",
                    node.state.name()
                ));
            }
            if root.in_eviction {
                in_eviction += 1;
            }
            if node.state == ChunkState::PmaOwned {
                if root.list.is_some() || root.pinned != 0 || root.in_eviction || node.linked {
                    return Err(format!(
                        "device-owned root {r} is on a list, pinned or in eviction"
                    ));
                }
                live_nodes += 1; // root slots stay live while the device owns them
                continue;
            }
            let mut pinned = 0u32;
            let mut stack = vec![r];
            while let Some(i) = stack.pop() {
                live_nodes += 1;
                let n = &self.nodes[i as usize];
                let size = n.size();
                if !n.live {
                    return Err(format!(
                        "chunk {:#x} is reachable but its slot is vacant",
                        n.addr
                    ));
                }
                if n.addr % size != 0 {
                    return Err(format!(
                        "chunk {:#x} is not aligned to its size {size}",
                        n.addr
                    ));
                }
                if !self.size_mask(n.ctype).contains(size) {
                    return Err(format!(
                        "chunk {:#x} has size {size}, not in its type's mask",
                        n.addr
                    ));
                }
                if (n.addr >> ROOT_CHUNK_SHIFT) as u32 != r || n.ctype != node.ctype {
                    return Err(format!(
                        "chunk {:#x} is outside its root or of another type",
                        n.addr
                    ));
                }
                counts[n.ctype as usize][order_of(n.shift as u32)][n.state as usize] += 1;
                let should_link = n.state == ChunkState::Free && !root.in_eviction;
                if n.linked != should_link {
                    return Err(format!(
                        "chunk {:#x} ({}) linked={} but should be {}",
                        n.addr,
                        n.state.name(),
                        n.linked,
                        should_link
                    ));
                }
                if n.linked {
                    linked[n.ctype as usize][order_of(n.shift as u32)][n.is_zero as usize] += 1;
                }
                if n.state == ChunkState::TempPinned {
                    pinned += 1;
                }
                match n.state {
                    ChunkState::IsSplit => {
                        let child_shift = self
                            .size_mask(n.ctype)
                            .child_shift(n.shift as u32)
                            .ok_or_else(|| {
                                format!("chunk {:#x} of the smallest size is split", n.addr)
                            })?;
                        if n.children_log2 as u32 != n.shift as u32 - child_shift {
                            return Err(format!(
                                "chunk {:#x} has the wrong number of children",
                                n.addr
                            ));
                        }
                        let mut allocated = 0u32;
                        for k in 0..n.num_children() {
                            let c = &self.nodes[(n.first_child + k) as usize];
                            if c.parent != i || c.shift as u32 != child_shift {
                                return Err(format!(
                                    "child {k} of {:#x} has the wrong parent or size",
                                    n.addr
                                ));
                            }
                            if c.addr != n.addr + ((k as u64) << child_shift) {
                                return Err(format!(
                                    "child {k} of {:#x} sits at {:#x}, not parent + {k} * child size",
                                    n.addr, c.addr
                                ));
                            }
                            if c.state != ChunkState::Free {
                                allocated += 1;
                            }
                            stack.push(n.first_child + k);
                        }
                        if allocated != n.allocated || allocated == 0 {
                            return Err(format!(
                                "split chunk {:#x}: allocated count {} but {} children are not free \
                                 (must be 0 < allocated <= children)",
                                n.addr, n.allocated, allocated
                            ));
                        }
                    }
                    ChunkState::PmaOwned => {
                        return Err(format!("non-root chunk {:#x} is pma_owned", n.addr));
                    }
                    _ => {
                        if n.first_child != NIL || n.allocated != 0 {
                            return Err(format!("leaf chunk {:#x} has children", n.addr));
                        }
                    }
                }
            }
            if pinned != root.pinned {
                return Err(format!(
                    "root {r} counts {} pinned chunks, found {pinned}",
                    root.pinned
                ));
            }
            pinned_total += pinned as u64;
            if root.list.is_some() != self.root_evictable(r) {
                return Err(format!(
                    "root {r}: on an LRU list = {}, evictable = {}",
                    root.list.is_some(),
                    self.root_evictable(r)
                ));
            }
        }
        if counts != self.counts {
            return Err("chunk counters differ from a walk of the trees".into());
        }
        if pinned_total != self.pinned_total || in_eviction != self.in_eviction {
            return Err("pinned or in-eviction totals differ from a walk".into());
        }
        // Free lists: each entry is a linked free chunk with the list's key; lengths match.
        for t in 0..NUM_TYPES {
            for o in 0..NUM_ORDERS {
                for z in 0..2 {
                    let l = &self.free_lists[t][o][z];
                    let (mut n, mut prev, mut i) = (0u64, NIL, l.head);
                    while i != NIL {
                        let node = &self.nodes[i as usize];
                        if !node.linked || node.prev != prev || self.list_key(i) != (t, o, z) {
                            return Err(format!(
                                "free list [{t}][{o}][{z}] is corrupt at {:#x}",
                                node.addr
                            ));
                        }
                        n += 1;
                        if n > l.len {
                            return Err(format!(
                                "free list [{t}][{o}][{z}] is longer than its count"
                            ));
                        }
                        prev = i;
                        i = node.next;
                    }
                    if n != l.len || prev != l.tail || n != linked[t][o][z] {
                        return Err(format!("free list [{t}][{o}][{z}] length or tail is wrong"));
                    }
                }
            }
        }
        for list in RootList::ALL {
            let l = &self.root_lists[list as usize];
            let (mut n, mut prev, mut r) = (0u64, NIL, l.head);
            while r != NIL {
                let root = &self.roots[r as usize];
                if root.list != Some(list) || root.prev != prev {
                    return Err(format!("{} list is corrupt at root {r}", list.name()));
                }
                n += 1;
                if n > l.len {
                    return Err(format!("{} list is longer than its count", list.name()));
                }
                prev = r;
                r = root.next;
            }
            if n != l.len || prev != l.tail {
                return Err(format!("{} list length or tail is wrong", list.name()));
            }
        }
        let on_lists = self.roots.iter().filter(|r| r.list.is_some()).count() as u64;
        if on_lists != self.root_lists.iter().map(|l| l.len).sum::<u64>() {
            return Err("roots marked on LRU lists differ from the lists".into());
        }
        // No slot leaks: every live slot is reachable, every vacant run is vacant.
        let live_slots = self.nodes.iter().filter(|n| n.live).count();
        if live_slots != live_nodes {
            return Err(format!(
                "{} live chunk slots but {live_nodes} reachable: a chunk leaked",
                live_slots
            ));
        }
        for (log2, runs) in self.vacant_runs.iter().enumerate() {
            for &first in runs {
                if (first..first + (1 << log2)).any(|k| self.nodes[k as usize].live) {
                    return Err("a vacant run holds a live chunk".into());
                }
            }
        }
        Ok(())
    }
}
