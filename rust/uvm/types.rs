//! What a UVM model is given and returns: page and block sizes, the cost model, the
//! configuration, processors, hints, access patterns, kernels and statistics.

use super::*;

pub const PAGE: u64 = 4096;
/// Pages of a 64 KiB big page: with the prefetcher on, a GPU fault migrates its whole big page
/// (the "basic block" of the driver's tree prefetcher) before the tree rule grows it further.
pub(super) const BIG: usize = 16;
pub const BLOCK: u64 = ROOT_CHUNK_SIZE;
pub(super) const PAGES_PER_BLOCK: usize = (BLOCK / PAGE) as usize; // 512
pub(super) const WORDS: usize = PAGES_PER_BLOCK / 64; // 8
pub(super) const NIL: u32 = u32::MAX;
/// Pattern pages generated at a time (patterns are never materialized whole).
pub(super) const CHUNK: usize = 1 << 16;

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
