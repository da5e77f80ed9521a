//! buddy: a plain power-of-two buddy over the device.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::Model;

/// A binary buddy over the device's address space, 512 B up to the largest power of two that
/// fits, as the PMM splits and merges chunks but with every power of two and above 2 MiB too.
/// A request takes the smallest free block of at least its size rounded up to a power of two.
/// Reserved: the 2 MiB root chunks that hold any allocated block (what the PMM would have taken
/// from the device), the last one only up to the capacity.
pub struct Buddy {
    capacity: u64,
    free: Vec<BTreeSet<u64>>,
    by_id: FxHashMap<u32, (u64, u32)>,
    /// root index -> bytes allocated in it (roots with none are absent)
    root_used: FxHashMap<u64, u64>,
    reserved: u64,
}

const BUDDY_MIN: u32 = 9;
const ROOT_SHIFT: u32 = 21;

impl Buddy {
    pub fn new(capacity: u64) -> Self {
        let max_order = 63 - capacity.max(512).leading_zeros();
        let mut free = vec![BTreeSet::new(); max_order as usize + 1];
        let mut a = 0u64;
        while a + (1 << BUDDY_MIN) <= capacity {
            let mut o = max_order;
            while o > BUDDY_MIN && (a % (1 << o) != 0 || a + (1 << o) > capacity) {
                o -= 1;
            }
            free[o as usize].insert(a);
            a += 1 << o;
        }
        Buddy {
            capacity,
            free,
            by_id: FxHashMap::default(),
            root_used: FxHashMap::default(),
            reserved: 0,
        }
    }

    /// The bytes of root `root` inside the device.
    fn root_span(&self, root: u64) -> u64 {
        let start = root << ROOT_SHIFT;
        (1u64 << ROOT_SHIFT).min(self.capacity.saturating_sub(start))
    }

    fn account(&mut self, addr: u64, order: u32, add: bool) {
        let size = 1u64 << order;
        let first = addr >> ROOT_SHIFT;
        let last = (addr + size - 1) >> ROOT_SHIFT;
        for root in first..=last {
            let part = size.min(1 << ROOT_SHIFT);
            let span = self.root_span(root);
            let u = self.root_used.entry(root).or_insert(0);
            let before = *u;
            *u = if add {
                *u + part
            } else {
                u.saturating_sub(part)
            };
            let now = *u;
            if now == 0 {
                self.root_used.remove(&root);
            }
            match (before == 0, now == 0) {
                (true, false) => self.reserved += span,
                (false, true) => self.reserved -= span,
                _ => {}
            }
        }
    }
}

impl Model for Buddy {
    fn alloc(&mut self, id: u32, size: u64, _stream: u64) -> Option<u64> {
        self.free(id);
        let order = (64 - size.max(1).saturating_sub(1).leading_zeros()).max(BUDDY_MIN);
        let k = (order as usize..self.free.len()).find(|&k| !self.free[k].is_empty())?;
        let addr = self.free[k].pop_first()?;
        for j in (order as usize..k).rev() {
            self.free[j].insert(addr + (1 << j));
        }
        self.by_id.insert(id, (addr, order));
        self.account(addr, order, true);
        Some(addr)
    }
    fn free(&mut self, id: u32) {
        let Some((mut addr, mut order)) = self.by_id.remove(&id) else {
            return;
        };
        self.account(addr, order, false);
        while (order as usize) + 1 < self.free.len() {
            let buddy = addr ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            addr = addr.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(addr);
    }
    fn reserved(&self) -> u64 {
        self.reserved
    }
    fn largest_free(&self) -> u64 {
        // the largest free block inside a root that is in use
        (0..self.free.len().min(ROOT_SHIFT as usize + 1))
            .rev()
            .find(|&o| {
                self.free[o]
                    .iter()
                    .any(|&a| self.root_used.contains_key(&(a >> ROOT_SHIFT)))
            })
            .map_or(0, |o| 1 << o)
    }
    fn free_bytes(&self) -> u64 {
        let used: u64 = self.by_id.values().map(|&(_, o)| 1u64 << o).sum();
        self.reserved().saturating_sub(used)
    }
    fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.by_id.values().map(|&(a, o)| (a, 1u64 << o)).collect()
    }
    fn validate(&self) -> Result<(), String> {
        let spans: u64 = self.root_used.keys().map(|&r| self.root_span(r)).sum();
        if spans != self.reserved {
            return Err(format!(
                "buddy: roots span {spans} B, reserved {}",
                self.reserved
            ));
        }
        Ok(())
    }
}
