//! The physical memory manager (PMM): vidmem as 2 MiB root chunks, split into power-of-two
//! chunks, with per-size free lists, eager merge, root LRU lists and eviction.
//!
//! Modelled on `kernel-open/nvidia-uvm/uvm_pmm_gpu.c`. The facts it follows are listed in
//! `docs/design.md`; where it departs from the driver it says so at the place.
//!
//! # Layout
//! All metadata lives out of band in an index arena (`nodes`), never in the memory it manages.
//! Nodes `0..num_roots` are the root chunks themselves (root `i` covers
//! `[i * 2 MiB, (i + 1) * 2 MiB)`); the children of a split chunk take a contiguous run of
//! node slots, so child `k` of a parent is node `first_child + k`, at address
//! `parent.addr + k * child_size`.
//!
//! # Invariants (checked by [`Pmm::validate`])
//! - A chunk's address is aligned to its size; a chunk with no parent is a 2 MiB root.
//! - Child `k` of a parent sits at `parent.addr + k * child_size`, child size being the next
//!   smaller size in the type's size mask.
//! - A chunk is `IsSplit` iff it has children, and then `0 < allocated <= num_children`, where
//!   `allocated` counts the children that are not `Free` (merge is eager).
//! - A `Free` chunk is on the free list `[type][size][is_zero]` iff its root is not in
//!   eviction; no other chunk is on a free list.
//! - A root is on an LRU list iff it is a USER root that is split or allocated, holds no
//!   `TempPinned` chunk and is not in eviction.
//! - `PmaOwned` roots (still the device's) have no children and sit in the `unowned` set.
//! - Every counter equals what a walk of the trees recomputes.

#![deny(unsafe_code)]

mod alloc;
mod eviction;
mod lists;
mod ops;
mod stats;
mod tree;
mod types;
mod validate;

pub use stats::PmmStats;
pub use types::*;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::units::format_size;
use lists::ListHead;
use tree::{order_of, Node, Root};

/// The physical memory manager of one device.
pub struct Pmm {
    config: PmmConfig,
    nodes: Vec<Node>,
    roots: Vec<Root>,
    /// Vacant runs of child slots, by log2 of their length.
    vacant_runs: Vec<Vec<u32>>,
    /// Roots still owned by the device, lowest address first.
    unowned: BinaryHeap<Reverse<u32>>,
    free_lists: [[[ListHead; 2]; NUM_ORDERS]; NUM_TYPES],
    root_lists: [ListHead; NUM_ROOT_LISTS],
    /// Live chunks by [type][order][state] (PmaOwned roots are counted in `unowned`).
    counts: [[[u64; NUM_STATES]; NUM_ORDERS]; NUM_TYPES],
    pinned_total: u64,
    in_eviction: u64,
    counters: PmmCounters,
    /// Chunks evicted by allocations that were allowed to evict, until `take_evicted`.
    evicted: Vec<ChunkInfo>,
}

impl Pmm {
    pub fn new(config: PmmConfig) -> Result<Self> {
        if config.vidmem == 0 || config.vidmem % ROOT_CHUNK_SIZE != 0 || config.vidmem > MAX_VIDMEM
        {
            return Err(Error::InvalidSize(format!(
                "vidmem must be a non-zero multiple of 2 MiB up to 1 TiB, got {} bytes",
                config.vidmem
            )));
        }
        let num_roots = (config.vidmem / ROOT_CHUNK_SIZE) as u32;
        let mut nodes = Vec::with_capacity(num_roots as usize);
        for i in 0..num_roots {
            let mut n = Node::vacant();
            n.addr = i as u64 * ROOT_CHUNK_SIZE;
            n.shift = ROOT_CHUNK_SHIFT as u8;
            n.live = true;
            nodes.push(n);
        }
        let roots = vec![
            Root {
                prev: NIL,
                next: NIL,
                ..Root::default()
            };
            num_roots as usize
        ];
        Ok(Pmm {
            config,
            nodes,
            roots,
            vacant_runs: vec![Vec::new(); 32],
            unowned: (0..num_roots).map(Reverse).collect(),
            free_lists: [[[ListHead::EMPTY; 2]; NUM_ORDERS]; NUM_TYPES],
            root_lists: [ListHead::EMPTY; NUM_ROOT_LISTS],
            counts: [[[0; NUM_STATES]; NUM_ORDERS]; NUM_TYPES],
            pinned_total: 0,
            in_eviction: 0,
            counters: PmmCounters::default(),
            evicted: Vec::new(),
        })
    }

    pub fn config(&self) -> &PmmConfig {
        &self.config
    }

    pub fn num_roots(&self) -> u32 {
        self.roots.len() as u32
    }

    pub fn size_mask(&self, ctype: ChunkType) -> SizeMask {
        match ctype {
            ChunkType::User => self.config.user_sizes,
            ChunkType::Kernel => self.config.kernel_sizes,
        }
    }

    // ----------------------------------------------------------------------------------

    pub fn counters(&self) -> PmmCounters {
        self.counters
    }

    fn check(&self) {
        if self.config.check {
            if let Err(e) = self.validate() {
                panic!("PMM invariant broken: {e}");
            }
        }
    }

    /// Every chunk currently allocated (TempPinned or Allocated), in address order.
    pub fn allocated_chunks(&self) -> Vec<ChunkInfo> {
        let mut out = Vec::new();
        for r in 0..self.num_roots() {
            for i in self.leaves(r) {
                if self.nodes[i as usize].state.is_allocated() {
                    out.push(self.info_of(i));
                }
            }
        }
        out
    }

    /// The chunks under root `r` that are not split (the root itself when it is whole), in
    /// address order.
    pub(super) fn leaves(&self, r: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack = vec![r];
        while let Some(i) = stack.pop() {
            let n = &self.nodes[i as usize];
            if n.state == ChunkState::IsSplit {
                stack.extend((n.first_child..n.first_child + n.num_children()).rev());
            } else {
                out.push(i);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
