//! GPU memory: root chunks backed from the PMM, evicted in its LRU order.

use super::*;

impl Uvm {
    // ------------------------------------------------------------------------------------
    // GPU memory: roots from the PMM, eviction in its LRU order

    /// Gives block `b` a GPU root, evicting the PMM's choice if none is free.
    pub(super) fn back_block(&mut self, b: u32, st: &mut Stats) -> bool {
        if self.blocks[b as usize].root.is_some() {
            return true;
        }
        let id = match self.pmm.alloc_chunk(BLOCK, ChunkType::User, true) {
            Ok(id) => id,
            Err(_) => return false,
        };
        for ev in self.pmm.take_evicted() {
            let owner = self.root_owner.remove(&ev.addr);
            if let Some(victim) = owner {
                self.evict_block(victim, st);
            }
        }
        let addr = self.pmm.info(id).expect("new chunk").addr;
        let _ = self.pmm.unpin(id);
        self.root_owner.insert(addr, b);
        self.blocks[b as usize].root = Some(id);
        true
    }

    /// The PMM took block `v`'s root: its GPU-only pages move to the CPU.
    pub(super) fn evict_block(&mut self, v: u32, st: &mut Stats) {
        let blk = &mut self.blocks[v as usize];
        let mut moved = 0u64;
        for w in 0..WORDS {
            moved += (blk.gpu[w] & !blk.cpu[w]).count_ones() as u64;
            blk.cpu[w] |= blk.gpu[w];
            blk.gpu[w] = 0;
        }
        blk.root = None;
        blk.thrash.last_to = 2;
        blk.thrash.last_ns = self.clock;
        let bytes = moved * PAGE;
        let c = &self.cfg.costs;
        let t = c.eviction_ns + bytes as f64 / c.link_bw * 1e9;
        st.bytes_d2h += bytes;
        st.evictions += 1;
        st.time_ns += t;
        self.clock += t;
    }

    /// Block `b` has no GPU-resident page left: its root goes back to the PMM.
    pub(super) fn unback_if_empty(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        if count(&blk.gpu) == 0 {
            if let Some(id) = blk.root.take() {
                let addr = self.pmm.info(id).map(|i| i.addr).ok();
                let _ = self.pmm.free(id);
                if let Some(a) = addr {
                    self.root_owner.remove(&a);
                }
            }
        }
    }
}
