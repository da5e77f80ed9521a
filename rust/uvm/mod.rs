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

#[cfg(test)]
mod tests;

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::pmm::{ChunkId, ChunkType, Pmm, PmmConfig, SizeMask, ROOT_CHUNK_SIZE};

pub const PAGE: u64 = 4096;
/// Pages of a 64 KiB big page: with the prefetcher on, a GPU fault migrates its whole big page
/// (the "basic block" of the driver's tree prefetcher) before the tree rule grows it further.
const BIG: usize = 16;
pub const BLOCK: u64 = ROOT_CHUNK_SIZE;
const PAGES_PER_BLOCK: usize = (BLOCK / PAGE) as usize; // 512
const WORDS: usize = PAGES_PER_BLOCK / 64; // 8
const NIL: u32 = u32::MAX;
/// Pattern pages generated at a time (patterns are never materialized whole).
const CHUNK: usize = 1 << 16;

/// How faults are replayed (uvm_perf_fault_replay_policy).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReplayPolicy {
    /// One replay after each VA block's faults are serviced.
    Block,
    /// One replay after each batch (the driver's default).
    Batch,
    /// One replay after all faults of a kernel are serviced.
    Once,
}

/// The cost model. Bandwidths in bytes per second, times in nanoseconds. Every number is
/// named and can be overridden; the defaults are documented in docs/uvm.md.
#[derive(Clone, Debug)]
pub struct Costs {
    /// GPU memory bandwidth (the device table's HBM figure).
    pub hbm_bw: f64,
    /// Host link bandwidth per direction (PCIe Gen3/4/5, NVLink-C2C).
    pub link_bw: f64,
    /// Fraction of the link a GPU reaches reading remote memory in place (zero copy).
    pub remote_efficiency: f64,
    /// CPU memory bandwidth for CPU accesses to CPU-resident pages.
    pub host_bw: f64,
    /// Fetching and pre-processing a batch of faults, and its replay.
    pub batch_ns: f64,
    pub replay_ns: f64,
    /// Servicing one fault (after deduplication).
    pub fault_ns: f64,
    /// Setting up one migration (a DMA of one VA block's pages).
    pub transfer_ns: f64,
    /// Evicting one root chunk (beyond its copy).
    pub eviction_ns: f64,
    /// A CPU page fault (kernel entry, lookup, mapping).
    pub cpu_fault_ns: f64,
    /// A throttled processor's nap (uvm_perf_thrashing_nap).
    pub throttle_ns: f64,
}

impl Costs {
    pub fn new(hbm_bw: f64, link_bw: f64) -> Self {
        Costs {
            hbm_bw,
            link_bw,
            remote_efficiency: 0.8,
            host_bw: 100e9,
            batch_ns: 15_000.0,
            replay_ns: 5_000.0,
            fault_ns: 300.0,
            transfer_ns: 3_000.0,
            eviction_ns: 10_000.0,
            cpu_fault_ns: 4_000.0,
            throttle_ns: 1_000_000.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct UvmConfig {
    pub vidmem: u64,
    pub costs: Costs,
    pub fault_batch: usize,
    pub replay: ReplayPolicy,
    pub prefetch: bool,
    /// Percent of a subtree that must be populated for the prefetcher to take it (51).
    pub prefetch_threshold: u32,
    pub thrashing: bool,
    /// Migrations within `lapse_ns` of each other that make a page thrashing (3).
    pub thrashing_threshold: u32,
    pub lapse_ns: f64,
    /// Throttles after which a thrashing page is pinned (10).
    pub pin_threshold: u32,
    /// How long a pin lasts, in lapses (300).
    pub pin_lapses: u32,
    pub seed: u64,
    /// Validate every invariant after every fault batch and prefetch (tests; slow).
    pub check: bool,
}

impl UvmConfig {
    pub fn new(vidmem: u64, costs: Costs) -> Self {
        UvmConfig {
            vidmem,
            costs,
            fault_batch: 256,
            replay: ReplayPolicy::Batch,
            prefetch: true,
            prefetch_threshold: 51,
            thrashing: true,
            thrashing_threshold: 3,
            lapse_ns: 500_000.0,
            pin_threshold: 10,
            pin_lapses: 300,
            seed: 0,
            check: false,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Processor {
    Gpu,
    Cpu,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Advice {
    PreferredLocation(Processor),
    /// The processor maps the pages where they are instead of migrating them.
    AccessedBy(Processor),
    /// Read faults duplicate pages instead of moving them; writes collapse the copies.
    ReadMostly,
    /// Pinned host memory (cudaMallocHost): the GPU always reads it over the link.
    ZeroCopy,
}

/// The order in which a kernel touches a range's pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Every page once, in order (a grid-stride loop).
    Streaming,
    /// `chunks` thread blocks each stream their own contiguous part, interleaved.
    BlockStreaming { chunks: u32 },
    /// `touches` random pages (one warp each).
    RandomWarp { touches: u64 },
    /// Every `stride`-th page.
    Strided { stride: u64 },
    /// Explicit page indices within the range.
    Explicit(Vec<u64>),
}

#[derive(Clone, Debug)]
pub struct Kernel {
    pub processor: Processor,
    pub range: u32,
    pub pattern: Pattern,
    pub write: bool,
}

/// What one kernel (or a prefetch) cost and did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub time_ns: f64,
    pub accesses: u64,
    pub faults: u64,
    pub batches: u64,
    pub replays: u64,
    pub cpu_faults: u64,
    pub bytes_h2d: u64,
    pub bytes_d2h: u64,
    pub remote_bytes: u64,
    pub hbm_bytes: u64,
    pub prefetched_pages: u64,
    pub evictions: u64,
    pub thrashing_pages: u64,
    pub throttles: u64,
    pub pins: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.time_ns += o.time_ns;
        self.accesses += o.accesses;
        self.faults += o.faults;
        self.batches += o.batches;
        self.replays += o.replays;
        self.cpu_faults += o.cpu_faults;
        self.bytes_h2d += o.bytes_h2d;
        self.bytes_d2h += o.bytes_d2h;
        self.remote_bytes += o.remote_bytes;
        self.hbm_bytes += o.hbm_bytes;
        self.prefetched_pages += o.prefetched_pages;
        self.evictions += o.evictions;
        self.thrashing_pages += o.thrashing_pages;
        self.throttles += o.throttles;
        self.pins += o.pins;
    }
}

type Mask = [u64; WORDS];

fn get(m: &Mask, i: usize) -> bool {
    m[i / 64] >> (i % 64) & 1 == 1
}
fn set(m: &mut Mask, i: usize) {
    m[i / 64] |= 1 << (i % 64);
}
fn clear(m: &mut Mask, i: usize) {
    m[i / 64] &= !(1 << (i % 64));
}
fn count(m: &Mask) -> u32 {
    m.iter().map(|w| w.count_ones()).sum()
}
fn set_range(m: &mut Mask, lo: usize, hi: usize) {
    let mut i = lo;
    while i < hi {
        let w = i / 64;
        let end = ((w + 1) * 64).min(hi);
        let n = end - i;
        let bits = if n == 64 {
            !0
        } else {
            ((1u64 << n) - 1) << (i % 64)
        };
        m[w] |= bits;
        i = end;
    }
}

fn full_mask(n: usize) -> Mask {
    let mut m = [0u64; WORDS];
    for (w, word) in m.iter_mut().enumerate() {
        let lo = w * 64;
        if n >= lo + 64 {
            *word = !0;
        } else if n > lo {
            *word = (1u64 << (n - lo)) - 1;
        }
    }
    m
}

/// Set bits in the aligned power-of-two region [lo, lo + size) (size ≤ 512).
#[inline]
fn count_aligned(m: &Mask, lo: usize, size: usize) -> u32 {
    if size >= 64 {
        m[lo / 64..(lo + size) / 64]
            .iter()
            .map(|w| w.count_ones())
            .sum()
    } else {
        let bits = (m[lo / 64] >> (lo % 64)) & ((1u64 << size) - 1);
        bits.count_ones()
    }
}

/// Whether any bit is set in the aligned power-of-two region [lo, lo + size).
#[inline]
fn any_aligned(m: &Mask, lo: usize, size: usize) -> bool {
    if size >= 64 {
        m[lo / 64..(lo + size).min(PAGES_PER_BLOCK) / 64]
            .iter()
            .any(|&w| w != 0)
    } else {
        (m[lo / 64] >> (lo % 64)) & ((1u64 << size) - 1) != 0
    }
}

/// Each big page (16 pages) that holds a set bit, whole, within the first `n` pages.
#[inline]
fn grow_to_big_pages(m: &Mask, n: usize) -> Mask {
    let full = full_mask(n);
    let mut out = [0u64; WORDS];
    for w in 0..WORDS {
        let x = m[w];
        if x == 0 {
            continue;
        }
        for q in 0..4 {
            let big = 0xFFFFu64 << (16 * q);
            if x & big != 0 {
                out[w] |= big;
            }
        }
        out[w] &= full[w];
    }
    out
}

/// Set bits in pages [lo, hi).
fn count_range(m: &Mask, lo: usize, hi: usize) -> u32 {
    (lo..hi)
        .step_by(64)
        .map(|s| {
            let e = (s + 64).min(hi);
            let w = m[s / 64];
            let bits = if e - s == 64 {
                w
            } else {
                (w >> (s % 64)) & ((1u64 << (e - s)) - 1)
            };
            bits.count_ones()
        })
        .sum()
}

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

    // ------------------------------------------------------------------------------------
    // GPU memory: roots from the PMM, eviction in its LRU order

    /// Gives block `b` a GPU root, evicting the PMM's choice if none is free.
    fn back_block(&mut self, b: u32, st: &mut Stats) -> bool {
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
    fn evict_block(&mut self, v: u32, st: &mut Stats) {
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
    fn unback_if_empty(&mut self, b: u32) {
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

    // ------------------------------------------------------------------------------------
    // Thrashing (uvm_perf_thrashing.c)

    /// Pages of block `b` are about to move `to` a processor: counts ping-pong (a change of
    /// direction within the lapse), throttles a thrashing block, pins it after
    /// `pin_threshold` throttles. True when the block is pinned: nothing moves, the access is
    /// served in place over the link.
    fn note_migration(&mut self, b: u32, to: Processor, pages: u64, st: &mut Stats) -> bool {
        if !self.cfg.thrashing {
            return false;
        }
        let now = self.clock;
        let cfg = &self.cfg;
        let t = &mut self.blocks[b as usize].thrash;
        if t.pinned_until > now {
            return true;
        }
        let dir = if to == Processor::Gpu { 1 } else { 2 };
        if t.last_to != 0 && t.last_to != dir {
            if now - t.last_ns <= cfg.lapse_ns {
                t.burst += 1;
            } else {
                t.burst = 1;
            }
        }
        t.last_to = dir;
        t.last_ns = now;
        if t.burst < cfg.thrashing_threshold {
            return false;
        }
        if !t.counted {
            t.counted = true;
            st.thrashing_pages += pages;
        }
        t.throttles += 1;
        if t.throttles >= cfg.pin_threshold {
            t.pinned_until = now + cfg.lapse_ns * cfg.pin_lapses as f64;
            t.throttles = 0;
            t.burst = 0;
            st.pins += 1;
            return true;
        }
        st.throttles += 1;
        st.time_ns += cfg.costs.throttle_ns;
        self.clock += cfg.costs.throttle_ns;
        false
    }

    fn pinned(&self, b: u32) -> bool {
        self.blocks[b as usize].thrash.pinned_until > self.clock
    }

    // ------------------------------------------------------------------------------------
    // Prefetch (uvm_perf_prefetch.c): the bitmap tree

    /// Pages to migrate with the faulted ones: every aligned subtree of the block (big page
    /// up to the whole block) that holds a faulted page and in which more than `threshold` %
    /// of the pages are resident on the GPU or faulted now.
    fn prefetch_mask(&self, populated: &Mask, faulted: &Mask, n: usize) -> Mask {
        let mut out = [0u64; WORDS];
        let th = self.cfg.prefetch_threshold;
        let mut size = BIG;
        while size <= PAGES_PER_BLOCK {
            let mut lo = 0;
            while lo < n {
                let hi = (lo + size).min(n);
                // only subtrees holding a fault are counted (a test, then a count)
                if any_aligned(faulted, lo, size) {
                    let pop = if hi - lo == size {
                        count_aligned(populated, lo, size)
                    } else {
                        count_range(populated, lo, hi)
                    };
                    if pop * 100 > th * (hi - lo) as u32 {
                        set_range(&mut out, lo, hi);
                    }
                }
                lo += size;
            }
            size *= 2;
        }
        out
    }

    // ------------------------------------------------------------------------------------
    // Running kernels

    /// Checks a pattern against a range.
    fn check_pattern(&self, pages: u64, pattern: &Pattern) -> Result<()> {
        if let Pattern::Explicit(v) = pattern {
            if let Some(&bad) = v.iter().find(|&&p| p >= pages) {
                return Err(Error::InvalidArgument(format!(
                    "page {bad} is outside the range's {pages} pages"
                )));
            }
        }
        Ok(())
    }

    /// The next up to `CHUNK` page indices of a pattern from position `*pos`, into `out`.
    /// False when the pattern is done.
    fn pattern_chunk(
        &mut self,
        pages: u64,
        pattern: &Pattern,
        pos: &mut u64,
        out: &mut Vec<u64>,
    ) -> bool {
        out.clear();
        let len = match pattern {
            Pattern::Streaming => pages,
            Pattern::Strided { stride } => pages.div_ceil((*stride).max(1)),
            Pattern::BlockStreaming { chunks } => {
                let k = (*chunks as u64).clamp(1, pages);
                pages.div_ceil(k) * k
            }
            Pattern::RandomWarp { touches } => *touches,
            Pattern::Explicit(v) => v.len() as u64,
        };
        while *pos < len && out.len() < CHUNK {
            let i = *pos;
            *pos += 1;
            let p = match pattern {
                Pattern::Streaming => i,
                Pattern::Strided { stride } => i * (*stride).max(1),
                Pattern::BlockStreaming { chunks } => {
                    let k = (*chunks as u64).clamp(1, pages);
                    let per = pages.div_ceil(k);
                    (i % k) * per + i / k
                }
                Pattern::RandomWarp { .. } => splitmix(&mut self.rng) % pages,
                Pattern::Explicit(v) => v[i as usize],
            };
            if p < pages {
                out.push(p);
            }
        }
        !out.is_empty() || *pos < len
    }

    /// Stripes the range between GPU and CPU: `fraction` of its blocks, evenly spread, are
    /// prefetched to the GPU; the GPU reads the others in place over the link.
    pub fn stripe(&mut self, r: u32, fraction: f64) -> Result<Stats> {
        let range = self.range(r)?.clone();
        let f = fraction.clamp(0.0, 1.0);
        let nblocks = range.pages.div_ceil(PAGES_PER_BLOCK as u64) as u32;
        let mut st = Stats::default();
        for j in 0..nblocks {
            let b = range.first_block + j;
            let on_gpu = ((j + 1) as f64 * f).floor() > (j as f64 * f).floor();
            self.blocks[b as usize].remote = !on_gpu;
            if on_gpu {
                let want = full_mask(self.pages_in_block(b));
                self.migrate(b, &want, Processor::Gpu, false, &mut st);
            }
        }
        self.total.add(&st);
        Ok(st)
    }

    /// Moves the whole range to `to` ahead of use (cudaMemPrefetchAsync): bulk copies at link
    /// speed, evicting as needed; no faults.
    pub fn prefetch(&mut self, r: u32, to: Processor) -> Result<Stats> {
        let range = self.range(r)?.clone();
        let mut st = Stats::default();
        let nblocks = range.pages.div_ceil(PAGES_PER_BLOCK as u64) as u32;
        for b in range.first_block..range.first_block + nblocks {
            let want = full_mask(self.pages_in_block(b));
            self.migrate(b, &want, to, false, &mut st);
        }
        self.total.add(&st);
        Ok(st)
    }

    /// Moves the pages of `want` in block `b` to `to` (duplicating for reads of read-mostly
    /// ranges). Returns the number of pages that moved.
    fn migrate(
        &mut self,
        b: u32,
        want: &Mask,
        to: Processor,
        read_dup: bool,
        st: &mut Stats,
    ) -> u64 {
        if to == Processor::Gpu && !self.back_block(b, st) {
            return 0;
        }
        let c = &self.cfg.costs;
        let blk = &mut self.blocks[b as usize];
        let (mut copied, mut moved) = (0u64, 0u64);
        for (w, &wanted) in want.iter().enumerate() {
            let (dst, src) = match to {
                Processor::Gpu => (blk.gpu[w], blk.cpu[w]),
                Processor::Cpu => (blk.cpu[w], blk.gpu[w]),
            };
            let new = wanted & !dst;
            if new == 0 {
                continue;
            }
            moved += new.count_ones() as u64;
            // a page resident nowhere is a first touch: zero-filled, nothing to copy
            copied += (new & src).count_ones() as u64;
            let (d, s) = (dst | new, if read_dup { src } else { src & !new });
            match to {
                Processor::Gpu => (blk.gpu[w], blk.cpu[w]) = (d, s),
                Processor::Cpu => (blk.cpu[w], blk.gpu[w]) = (d, s),
            }
            blk.touched[w] |= new;
        }
        if moved == 0 {
            return 0;
        }
        let bytes = copied * PAGE;
        match to {
            Processor::Gpu => st.bytes_h2d += bytes,
            Processor::Cpu => st.bytes_d2h += bytes,
        }
        let t = c.transfer_ns + bytes as f64 / c.link_bw * 1e9;
        st.time_ns += t;
        self.clock += t;
        if to == Processor::Cpu {
            self.unback_if_empty(b);
        } else if let Some(id) = self.blocks[b as usize].root {
            let _ = self.pmm.mark_root(id, crate::pmm::RootList::Used);
        }
        moved
    }

    /// Runs one kernel: every access in its pattern order, faults batched and serviced,
    /// migrations, prefetch, eviction and thrashing as the driver does them.
    pub fn run_kernel(&mut self, k: &Kernel) -> Result<Stats> {
        let range = self.range(k.range)?.clone();
        self.check_pattern(range.pages, &k.pattern)?;
        let mut st = Stats::default();
        let mut buf = Vec::with_capacity(CHUNK);
        let mut pos = 0u64;
        let mut batch = Batch::default();
        while self.pattern_chunk(range.pages, &k.pattern, &mut pos, &mut buf) {
            st.accesses += buf.len() as u64;
            match k.processor {
                Processor::Gpu => self.run_gpu(&range, &buf, k.write, &mut batch, &mut st),
                Processor::Cpu => self.run_cpu(&range, &buf, k.write, &mut st),
            }
        }
        if !batch.blocks.is_empty() {
            self.service_batch(&mut batch, &range, k.write, &mut st);
        }
        if k.processor == Processor::Gpu && self.cfg.replay == ReplayPolicy::Once && st.faults > 0 {
            st.replays += 1;
            st.time_ns += self.cfg.costs.replay_ns;
            self.clock += self.cfg.costs.replay_ns;
        }
        self.total.add(&st);
        Ok(st)
    }

    fn access_cost(&mut self, remote: u64, hbm: u64, st: &mut Stats) {
        let c = &self.cfg.costs;
        let t =
            hbm as f64 / c.hbm_bw * 1e9 + remote as f64 / (c.link_bw * c.remote_efficiency) * 1e9;
        st.hbm_bytes += hbm;
        st.remote_bytes += remote;
        st.time_ns += t;
        self.clock += t;
    }

    fn run_gpu(
        &mut self,
        range: &Range,
        pages: &[u64],
        write: bool,
        batch: &mut Batch,
        st: &mut Stats,
    ) {
        let remote_range =
            range.zero_copy || (range.accessed_by_gpu && range.preferred == Some(Processor::Cpu));
        if remote_range {
            self.access_cost(pages.len() as u64 * PAGE, 0, st);
            return;
        }
        // With the prefetcher on, faults on one big page coalesce (the whole big page moves).
        let big = self.cfg.prefetch;
        let (mut hbm, mut remote) = (0u64, 0u64);
        for &p in pages {
            let b = range.first_block + (p / PAGES_PER_BLOCK as u64) as u32;
            let i = (p % PAGES_PER_BLOCK as u64) as usize;
            let blk = &self.blocks[b as usize];
            if get(&blk.gpu, i) {
                hbm += PAGE;
                if write && range.read_mostly && get(&blk.cpu, i) {
                    // a write collapses the duplicate
                    clear(&mut self.blocks[b as usize].cpu, i);
                }
                continue;
            }
            if blk.remote || (range.accessed_by_gpu && get(&blk.cpu, i)) || self.pinned(b) {
                remote += PAGE;
                continue;
            }
            let slot = match self.pend_slot[b as usize] {
                NIL => {
                    self.pend_slot[b as usize] = batch.blocks.len() as u32;
                    batch.blocks.push((b, [0; WORDS]));
                    batch.blocks.len() - 1
                }
                s => s as usize,
            };
            let m = &mut batch.blocks[slot].1;
            let dup = if big {
                let g = i / BIG * BIG;
                count_range(m, g, (g + BIG).min(PAGES_PER_BLOCK)) > 0
            } else {
                get(m, i)
            };
            if !dup {
                set(m, i);
                batch.faults += 1;
                st.faults += 1;
            }
            hbm += PAGE; // served from vidmem once the fault is serviced
            if batch.faults >= self.cfg.fault_batch {
                self.access_cost(remote, hbm, st);
                (hbm, remote) = (0, 0);
                self.service_batch(batch, range, write, st);
            }
        }
        self.access_cost(remote, hbm, st);
    }

    fn service_batch(&mut self, batch: &mut Batch, range: &Range, write: bool, st: &mut Stats) {
        let c = self.cfg.costs.clone();
        let t = c.batch_ns + batch.faults as f64 * c.fault_ns;
        st.batches += 1;
        st.time_ns += t;
        self.clock += t;
        let dup = range.read_mostly && !write;
        let blocks = std::mem::take(&mut batch.blocks);
        for (b, faulted) in &blocks {
            self.pend_slot[*b as usize] = NIL;
            let np = self.pages_in_block(*b);
            // a thrashing block pinned where it is: the accesses go over the link
            if self.note_migration(*b, Processor::Gpu, count(faulted) as u64, st) {
                continue;
            }
            let mut want = *faulted;
            if self.cfg.prefetch {
                let blk = &self.blocks[*b as usize];
                // each fault's whole big page, then the tree rule over what that populates
                let grown = grow_to_big_pages(&want, np);
                let mut populated = blk.gpu;
                for w in 0..WORDS {
                    populated[w] |= grown[w];
                }
                let extra = self.prefetch_mask(&populated, &grown, np);
                let mut added = 0u64;
                for w in 0..WORDS {
                    let more = (extra[w] | grown[w]) & !want[w] & !blk.gpu[w];
                    added += more.count_ones() as u64;
                    want[w] |= more;
                }
                st.prefetched_pages += added;
            }
            self.migrate(*b, &want, Processor::Gpu, dup, st);
            if self.cfg.replay == ReplayPolicy::Block {
                st.replays += 1;
                st.time_ns += c.replay_ns;
                self.clock += c.replay_ns;
            }
        }
        batch.blocks = blocks;
        batch.blocks.clear();
        batch.faults = 0;
        if self.cfg.check {
            if let Err(e) = self.validate() {
                panic!("UVM invariant broken after a fault batch: {e}");
            }
        }
        if self.cfg.replay == ReplayPolicy::Batch {
            st.replays += 1;
            st.time_ns += c.replay_ns;
            self.clock += c.replay_ns;
        }
    }

    fn run_cpu(&mut self, range: &Range, pages: &[u64], write: bool, st: &mut Stats) {
        let c = self.cfg.costs.clone();
        let mut local = 0u64;
        for &p in pages {
            let b = range.first_block + (p / PAGES_PER_BLOCK as u64) as u32;
            let i = (p % PAGES_PER_BLOCK as u64) as usize;
            let blk = &mut self.blocks[b as usize];
            let on_gpu = get(&blk.gpu, i);
            if get(&blk.cpu, i) || !on_gpu {
                if !get(&blk.cpu, i) {
                    // first touch on the CPU
                    set(&mut blk.cpu, i);
                    set(&mut blk.touched, i);
                }
                if write && on_gpu {
                    // writing a duplicated page invalidates the GPU copy
                    clear(&mut blk.gpu, i);
                    self.unback_if_empty(b);
                }
                local += PAGE;
                continue;
            }
            // GPU-resident only: a CPU fault
            st.cpu_faults += 1;
            st.faults += 1;
            st.time_ns += c.cpu_fault_ns;
            self.clock += c.cpu_fault_ns;
            if self.note_migration(b, Processor::Cpu, 1, st) {
                // pinned on the GPU: the CPU reads it over the link
                self.access_cost(PAGE, 0, st);
                continue;
            }
            let mut want = [0u64; WORDS];
            set(&mut want, i);
            self.migrate(b, &want, Processor::Cpu, range.read_mostly && !write, st);
            local += PAGE;
        }
        let t = local as f64 / c.host_bw * 1e9;
        st.time_ns += t;
        self.clock += t;
    }

    /// Every invariant: each touched page resident somewhere, vidmem use within capacity and
    /// equal to the blocks holding GPU pages, roots owned consistently, PMM valid.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let mut backed = 0u64;
        for (b, blk) in self.blocks.iter().enumerate() {
            for w in 0..WORDS {
                if blk.touched[w] & !(blk.gpu[w] | blk.cpu[w]) != 0 {
                    return Err(format!("block {b}: a touched page is resident nowhere"));
                }
                if (blk.gpu[w] | blk.cpu[w]) & !blk.touched[w] != 0 {
                    return Err(format!("block {b}: a resident page was never touched"));
                }
            }
            if count(&blk.gpu) > 0 {
                let Some(id) = blk.root else {
                    return Err(format!("block {b} has GPU pages but no root"));
                };
                let addr = self.pmm.info(id).map_err(|e| e.to_string())?.addr;
                if self.root_owner.get(&addr) != Some(&(b as u32)) {
                    return Err(format!("block {b}'s root is not recorded as its own"));
                }
                backed += 1;
            }
        }
        if backed != self.root_owner.len() as u64 {
            return Err(format!(
                "{} roots owned, {backed} blocks backed",
                self.root_owner.len()
            ));
        }
        if self.vidmem_used() > self.cfg.vidmem {
            return Err("vidmem use above capacity".into());
        }
        let pmm = self.pmm.stats();
        if pmm.allocated_bytes != self.vidmem_used() {
            return Err(format!(
                "the PMM has {} allocated but {} back managed pages",
                pmm.allocated_bytes,
                self.vidmem_used()
            ));
        }
        let (g, _) = self.resident();
        if g > self.vidmem_used() {
            return Err("more GPU-resident bytes than vidmem backing them".into());
        }
        self.pmm.validate()
    }
}
