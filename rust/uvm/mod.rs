//! A model of unified (managed) memory under oversubscription, after the UVM driver:
//! managed ranges in 2 MiB VA blocks of 4 KiB pages; GPU faults serviced in batches; the
//! bitmap-tree prefetcher; eviction of root chunks in the PMM's LRU order; thrashing detection
//! with throttling and pinning; hints (prefetch, preferred location, accessed-by, read-mostly);
//! zero-copy ranges. Time comes from a named cost model (`Costs`), so results are estimates
//! that can be compared across policies and hardware, not measurements.
//!
//! Sources followed (NVIDIA open-gpu-kernel-modules, kernel-open/nvidia-uvm): uvm_va_block.c
//! (residency, migration), uvm_perf_prefetch.c (bitmap tree, threshold 51 %),
//! uvm_perf_thrashing.c (threshold 3, lapse 500 µs, pin threshold 10, pin duration),
//! uvm_gpu_replayable_faults.c (batches of 256, replay policies), uvm_pmm_gpu.c (eviction).
//! docs/uvm.md lists where the model simplifies.

#![deny(unsafe_code)]

mod heuristics;
mod kernels;
mod mask;
mod memory;
#[cfg(test)]
mod tests;
mod types;
mod validate;

pub use types::*;

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::pmm::{ChunkId, ChunkType, Pmm, PmmConfig, SizeMask, ROOT_CHUNK_SIZE};
use mask::*;

/// One 2 MiB VA block of a managed range.
#[derive(Clone, Debug, Default)]
struct VaBlock {
    range: u32,
    gpu: Mask,
    cpu: Mask,
    /// Pages that were ever populated (first touch needs no copy).
    touched: Mask,
    /// The GPU root chunk backing it while any page is GPU-resident.
    root: Option<ChunkId>,
    /// Striped to the CPU: the GPU reads it in place over the link.
    remote: bool,
    thrash: Thrash,
}

#[derive(Clone, Debug)]
struct Range {
    first_block: u32,
    pages: u64,
    preferred: Option<Processor>,
    accessed_by_gpu: bool,
    read_mostly: bool,
    zero_copy: bool,
}

/// Thrashing state of a VA block (uvm_perf_thrashing.c keeps it per page; gpumm keeps it
/// per 2 MiB block so that 100 GiB working sets stay cheap: a block "migrates" when any of its
/// pages moves, and ping-pong is a change of direction within the lapse).
#[derive(Copy, Clone, Debug, Default)]
struct Thrash {
    last_ns: f64,
    /// 0: never migrated; 1: last moved to the GPU; 2: to the CPU
    last_to: u8,
    burst: u32,
    throttles: u32,
    pinned_until: f64,
    counted: bool,
}

/// Faults waiting for service: blocks in first-fault order with their faulted pages.
#[derive(Default)]
struct Batch {
    blocks: Vec<(u32, Mask)>,
    faults: usize,
}

/// The model. Deterministic for a seed.
pub struct Uvm {
    cfg: UvmConfig,
    pmm: Pmm,
    blocks: Vec<VaBlock>,
    ranges: Vec<Range>,
    root_owner: FxHashMap<u64, u32>,
    /// Per block: its slot in the pending fault batch (NIL: none).
    pend_slot: Vec<u32>,
    clock: f64,
    rng: u64,
    /// Totals over everything run so far.
    pub total: Stats,
}

/// SplitMix64: a tiny generator whose sequence never changes with a crate version, so a
/// seed always gives the same run.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Uvm {
    pub fn new(cfg: UvmConfig) -> Result<Self> {
        let vidmem = cfg.vidmem / BLOCK * BLOCK;
        if vidmem == 0 {
            return Err(Error::InvalidSize(
                "vidmem below one 2 MiB root chunk".into(),
            ));
        }
        if cfg.fault_batch == 0 || cfg.prefetch_threshold > 100 {
            return Err(Error::InvalidArgument(
                "fault_batch must be positive and prefetch_threshold at most 100".into(),
            ));
        }
        let mut pc = PmmConfig::new(
            vidmem,
            SizeMask::from_sizes(&[PAGE, 64 << 10, BLOCK])?,
            SizeMask::from_sizes(&[256, PAGE, 64 << 10, BLOCK])?,
        );
        pc.check = false;
        let rng = cfg.seed ^ 0x5EED;
        Ok(Uvm {
            pmm: Pmm::new(pc)?,
            blocks: Vec::new(),
            ranges: Vec::new(),
            root_owner: FxHashMap::default(),
            pend_slot: Vec::new(),
            clock: 0.0,
            rng,
            total: Stats::default(),
            cfg,
        })
    }

    pub fn config(&self) -> &UvmConfig {
        &self.cfg
    }

    pub fn pmm(&self) -> &Pmm {
        &self.pmm
    }

    /// A managed range of `size` bytes (whole pages), resident nowhere until touched.
    pub fn alloc_managed(&mut self, size: u64) -> Result<u32> {
        if size == 0 {
            return Err(Error::InvalidSize(
                "a managed range needs at least 1 byte".into(),
            ));
        }
        let pages = size.div_ceil(PAGE);
        let nblocks = pages.div_ceil(PAGES_PER_BLOCK as u64);
        if self.blocks.len() as u64 + nblocks > u32::MAX as u64 {
            return Err(Error::InvalidSize("too many managed blocks".into()));
        }
        let id = self.ranges.len() as u32;
        let first_block = self.blocks.len() as u32;
        self.blocks.extend((0..nblocks).map(|_| VaBlock {
            range: id,
            ..VaBlock::default()
        }));
        self.pend_slot.resize(self.blocks.len(), NIL);
        self.ranges.push(Range {
            first_block,
            pages,
            preferred: None,
            accessed_by_gpu: false,
            read_mostly: false,
            zero_copy: false,
        });
        Ok(id)
    }

    fn range(&self, r: u32) -> Result<&Range> {
        self.ranges
            .get(r as usize)
            .ok_or_else(|| Error::InvalidHandle(format!("no managed range {r}")))
    }

    /// Pages in a range.
    pub fn range_pages(&self, r: u32) -> Result<u64> {
        Ok(self.range(r)?.pages)
    }

    pub fn advise(&mut self, r: u32, advice: Advice) -> Result<()> {
        self.range(r)?;
        let range = &mut self.ranges[r as usize];
        match advice {
            Advice::PreferredLocation(p) => range.preferred = Some(p),
            Advice::AccessedBy(p) => range.accessed_by_gpu = p == Processor::Gpu,
            Advice::ReadMostly => range.read_mostly = true,
            Advice::ZeroCopy => range.zero_copy = true,
        }
        Ok(())
    }

    /// Bytes of vidmem backing managed pages.
    pub fn vidmem_used(&self) -> u64 {
        self.root_owner.len() as u64 * BLOCK
    }

    /// Bytes resident on the GPU and on the CPU (a duplicated page counts on both).
    pub fn resident(&self) -> (u64, u64) {
        let g: u64 = self.blocks.iter().map(|b| count(&b.gpu) as u64).sum();
        let c: u64 = self.blocks.iter().map(|b| count(&b.cpu) as u64).sum();
        (g * PAGE, c * PAGE)
    }

    fn pages_in_block(&self, b: u32) -> usize {
        let blk = &self.blocks[b as usize];
        let r = &self.ranges[blk.range as usize];
        let idx = (b - r.first_block) as u64;
        (r.pages - idx * PAGES_PER_BLOCK as u64).min(PAGES_PER_BLOCK as u64) as usize
    }
}
