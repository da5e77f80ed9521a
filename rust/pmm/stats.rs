//! Two tiers of statistics: [`PmmStats`] from the always-current counters (cheap, O(sizes)),
//! and the detailed walk in `validate`, which recomputes the same numbers from the trees.

use super::*;

/// A picture of the PMM from its counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmmStats {
    pub vidmem: u64,
    pub num_roots: u64,
    /// Roots still owned by the device.
    pub roots_pma_owned: u64,
    /// Roots taken by the PMM that are wholly free (cached).
    pub roots_free: u64,
    /// Live chunks by [type][order][state]; order 0 is 256 B, order 13 is 2 MiB.
    pub chunks: [[[u64; NUM_STATES]; NUM_ORDERS]; NUM_TYPES],
    /// Bytes in free chunks (taken from the device, not allocated).
    pub free_bytes: u64,
    /// Free bytes by chunk order.
    pub free_bytes_by_order: [u64; NUM_ORDERS],
    /// Bytes in allocated chunks (TempPinned or Allocated).
    pub allocated_bytes: u64,
    /// Bytes in TempPinned chunks.
    pub pinned_bytes: u64,
    pub pinned_chunks: u64,
    /// The largest free chunk the PMM holds (0 if none).
    pub largest_free_chunk: u64,
    /// Roots on each LRU list (unused, discarded, used).
    pub root_list_len: [u64; NUM_ROOT_LISTS],
    pub roots_in_eviction: u64,
    pub counters: PmmCounters,
}

impl PmmStats {
    /// Bytes the PMM holds from the device.
    pub fn reserved_bytes(&self) -> u64 {
        (self.num_roots - self.roots_pma_owned) * ROOT_CHUNK_SIZE
    }
}

impl Pmm {
    pub fn stats(&self) -> PmmStats {
        let mut free_bytes_by_order = [0u64; NUM_ORDERS];
        let (mut free_bytes, mut allocated_bytes, mut pinned_bytes) = (0u64, 0u64, 0u64);
        let mut largest_free_chunk = 0u64;
        for t in 0..NUM_TYPES {
            for (o, by_state) in self.counts[t].iter().enumerate() {
                let size = 1u64 << (o as u32 + MIN_CHUNK_SHIFT);
                let free = by_state[ChunkState::Free as usize];
                free_bytes_by_order[o] += free * size;
                free_bytes += free * size;
                if free > 0 {
                    largest_free_chunk = largest_free_chunk.max(size);
                }
                let pinned = by_state[ChunkState::TempPinned as usize];
                pinned_bytes += pinned * size;
                allocated_bytes += (pinned + by_state[ChunkState::Allocated as usize]) * size;
            }
        }
        let root_order = order_of(ROOT_CHUNK_SHIFT);
        let roots_free = (0..NUM_TYPES)
            .map(|t| self.counts[t][root_order][ChunkState::Free as usize])
            .sum();
        PmmStats {
            vidmem: self.config.vidmem,
            num_roots: self.roots.len() as u64,
            roots_pma_owned: self.unowned.len() as u64,
            roots_free,
            chunks: self.counts,
            free_bytes,
            free_bytes_by_order,
            allocated_bytes,
            pinned_bytes,
            pinned_chunks: self.pinned_total,
            largest_free_chunk,
            root_list_len: [
                self.root_lists[0].len,
                self.root_lists[1].len,
                self.root_lists[2].len,
            ],
            roots_in_eviction: self.in_eviction,
            counters: self.counters,
        }
    }
}
