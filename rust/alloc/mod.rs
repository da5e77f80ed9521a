//! The allocator users call: any size, on top of the PMM, with stitching, heap pages,
//! stream-ordered frees and defragmentation. See docs/design.md ("The pool") for the policy
//! and the trace measurements behind its thresholds.
//!
//! ## Model
//! A pool takes *pages* (PMM USER chunks of `page_size`, 2 MiB by default) from its device.
//! Page `i` is physical `[i * page_size, (i + 1) * page_size)`; its kind says what it holds:
//!
//! - `Owned`: held by the pool and either free (in the free-page [`Runs`]) or a middle page of
//!   one stitched allocation.
//! - `Heap`: sub-allocated for small requests (below `small_threshold`) in 256 B granules by
//!   blocks (a TLSF-like good fit over `heap_bins`).
//! - `Large` / `Covered`: the first / a later page of a *large segment*: consecutive pages
//!   covered by one list of blocks that may cross page boundaries.
//!
//! A large request takes, in this order: a free block of a segment that holds it (good fit:
//! one block, contiguous, O(1)); else a *head* (a free block that ends its segment), whole
//! free pages and a *tail* (a free block that starts its segment, or the start of a fresh
//! page). When those pages follow the head (or there is no head and they are one run) the
//! head's segment is extended over them (or a segment is opened on them) and the request is
//! one block of it; else, while free pages are plentiful, a free run that holds the whole
//! request opens a segment for it; otherwise it is *stitched*: its pieces are mapped back to
//! back into the pool's stitching window, so a free page is never "free but unusable" for a
//! large request.
//!
//! Freed large blocks merge with their neighbours and stay in their segment (a segment that
//! is all free goes back to the free pages). Whole free pages inside segments go back to the
//! free pages when a request needs them (`reclaim`: before the pool would grow, and before
//! `trim`/`defrag` give pages to the device), or at once in a pool with a release threshold.
//! A request (or batch) that fails undoes every such change it made (the `journal`).
//!
//! A freed heap block may instead stay whole for the request that comes next, when that
//! request is of its size and would be placed there anyway (`cache.rs`): its slot is
//! `Cached`, its memory counts as free, and anything but that request gives it back first.
//!
//! ## Invariants (checked by `validate`)
//! - A `Heap` page, or a segment from its `Large` page over its `Covered` pages, is covered by
//!   its blocks, in address order, linked `prev`/`next`; no two free blocks touch; a free
//!   block is in exactly the bins its kind and position say (heap: `heap_bins`; large:
//!   `large_bins`, and `suffix_bins` iff it ends its segment, else `prefix_bins` iff it starts
//!   it); no page or segment is one free block (its pages are free instead).
//! - A page is free iff it is in a free run; `Owned` pages not free belong to the runs of one
//!   live or freeing allocation.
//! - `by_ptr`, once built, maps the pointer of every live or freeing allocation that is not
//!   in a pending batch record (`batches`) or served from a step's plan (`step.rs`), and
//!   nothing else; every record entry names a live
//!   or freeing allocation.
//! - A `Cached` slot holds one heap block of exactly its rounded size and is the one slot the
//!   size cache holds, under that size; nothing else is in the cache.

#![deny(unsafe_code)]

mod batch;
pub mod bins;
mod blocks;
mod cache;
#[cfg(test)]
mod cache_props;
mod config;
mod defrag;
#[cfg(test)]
mod golden;
mod grow;
mod heads;
mod journal;
mod ops;
mod pages;
mod place;
mod pressure;
mod ptrindex;
mod ptrmap;
pub(crate) mod runs;
mod slots;
mod stats;
mod step;
mod step_plan;
#[cfg(test)]
mod step_props;
mod step_serve;
#[cfg(test)]
mod step_tests;
mod stitch;
mod streams;
mod table;
#[cfg(test)]
mod tests;
mod types;
mod validate;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use smallvec::SmallVec;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::pmm::{ChunkId, ChunkType, Pmm};
use crate::units::format_size;
use crate::va::Va;
use bins::{bin_of, Bins, Link, LinkRead, LinkWrite, NIL, NUM_BINS};
use cache::SizeCache;
use ptrmap::PtrMap;
use runs::Runs;
use table::{Aligned32, Table};

use config::*;
use types::*;

pub use config::{Device, PoolConfig, DEFAULT_SMALL_THRESHOLD, GRANULE};
use defrag::Copying;
pub use defrag::DefragPlan;
pub use stats::{Histogram, PageSnapshot, PoolStats};
pub use step::{StepCounts, DEFAULT_RECORD_STEPS};
pub use types::{AllocId, AllocInfo, DefragReport, Request, ScopeReport};

/// One pool: the core behind `gpumm.MemoryPool`. Not thread safe by itself; the bindings
/// hold it behind a lock.
#[derive(Clone)]
pub struct Pool {
    cfg: PoolConfig,
    dev: Arc<Device>,
    /// Page size in granules and as a shift of bytes.
    pg: u32,
    page_shift: u32,
    /// log2 of `pg`.
    gshift: u32,
    /// `pg / HEAP_END_DIV`: the least heap request that `carves_at_block_end` (a field, so
    /// that the test on every heap request is one compare).
    heap_end_units: u32,
    /// The largest request the pool can ever serve, in bytes (`max_size()`: fixed when made).
    max_bytes: u64,
    small_units: u64,
    slack_units: u32,
    /// Per page: its kind; its first block (Heap and Large pages only: not written for the
    /// others); its PMM chunk (bits of its ChunkId) while the pool holds it. Three arrays, so
    /// that opening or freeing a segment of many pages writes one byte a page (with one
    /// 16-byte record a page, the two page walks of a batch placed in one segment were 5 %
    /// of a batch pair).
    pages: Table<PageKind>,
    page_first: Table<u32>,
    page_chunk: Table<u64>,
    free_pages: Runs,
    /// The direct map and the stitching window (`crate::va`).
    va: Va<Runs>,
    /// Free whole pages inside large segments go back to the free pages at once (a pool with
    /// a release threshold), not only when a request needs them (`reclaim`).
    eager: bool,
    /// Changes of the request (or batch) being placed; see [`Change`].
    journal: Vec<Change>,
    blocks: Blocks,
    /// The secondary bin links of each block (see [`Block`]).
    sec_links: Table<Link>,
    vacant_blocks: Vec<u32>,
    /// Primary bins of free blocks, indexed by `Block::heap` (`LARGE`, `HEAP`); secondary bins
    /// of free large blocks at a segment's end (`SUFFIX`) or start (`PREFIX`; index 0 unused).
    /// (Which secondary bins a free block belongs in is computed without branches: 0.56 fewer
    /// mispredictions a mixed pair than with them; an earlier form that also
    /// computed the bin choice itself without branches measured slower: benches/RESULTS.md.)
    primary: [Bins; 2],
    secondary: [Bins; 3],
    allocs: Table<Alloc>,
    vacant_allocs: Vec<u32>,
    stitches: Vec<Stitch>,
    vacant_stitches: Vec<u32>,
    /// Pointer → slot, built on the first call that names an allocation by pointer (a pool
    /// used only through handles never pays for it: it was 170 of the 950 instructions of an
    /// alloc + free pair).
    by_ptr: Option<PtrMap>,
    /// The members of recent batches (`alloc_batch` in one block, `alloc_arena`) as
    /// (pointer, slot), in the order returned, not yet in `by_ptr`: a `free_batch` of the same
    /// pointers frees them without touching the index (two hash probes a member were a
    /// quarter of a batch pair); any other lookup by pointer moves them into `by_ptr` first
    /// (`ptr_lookup`), and so does a member freed or moved by any other path (`unindex`), so
    /// every entry names a live or freeing allocation that the index does not hold.
    batches: Vec<BatchRecord>,
    streams: FxHashMap<u64, StreamState>,
    fence_stream: FxHashMap<u64, u64>,
    /// Backend fences (CUDA events) of pending frees, by pool fence.
    events: FxHashMap<u64, u64>,
    next_fence: u64,
    scopes: FxHashMap<u32, Vec<(u32, u32)>>,
    next_scope: u32,
    counters: Counters,
    latency: Histogram,
    closed: bool,
    /// The stream of the first request, and whether a request on another stream has come
    /// since: while every request is on one stream, its work runs in order and a free by that
    /// stream needs no event (`free_when_done`).
    first_stream: Option<u64>,
    streams_mixed: bool,
    /// Whether a request of `small_threshold` or more has come (`place`, `place_batch`):
    /// until one does, the lossy rule keeps small requests in heap pages (`Pool::lossy`).
    served_large: bool,
    /// The heap page opened last (or that `extend_heap` ran a heap segment on over): where
    /// the next small requests go, so `heap_ends_for` leaves its free end to them in a pool
    /// of at least `SMALL_POOL`. NIL until one opens.
    last_heap_open: u32,
    /// A freed heap block kept for the next request if it is of its size (see `cache.rs`);
    /// on unless pages go back to the device as they free up (a release threshold), and off
    /// for good once the pool closes. (An undo frees without caching: `Settle::Exact`.)
    cache: SizeCache,
    /// Free heap blocks filed or taken out so far (`rebin`).
    heap_changes: u64,
    /// (block, `heap_changes`) of the last block `holds_in_place` passed: the same block
    /// with nothing filed or taken out of the heap bins since passes again (`cache.rs`).
    cache_ok: (u32, u64),
    /// Steps recorded or served from a plan (`step.rs`).
    steps: step::Steps,
    /// The free block after the last large request below a page (`grow.rs`; NIL: none).
    frontier: u32,
    /// The length in granules of the last large allocation freed (`grow.rs`).
    last_freed: u64,
    /// A request is being placed by `place_last_resort` (see there).
    last_resort: bool,
    /// The last resort's rules (`pressure::LAST_LAYOUT`, `pressure::LAST_HEAP_ENDS`): all in
    /// every pool, fewer in tests.
    last_resort_rules: u8,
}

fn invalid_size(msg: String) -> Error {
    Error::InvalidSize(msg)
}

impl Pool {
    /// A pool on `dev`. Reserves `initial_size` (rounded up to pages) at once.
    pub fn new(dev: Arc<Device>, cfg: PoolConfig) -> Result<Self> {
        let backend = dev.backend.clone();
        let ps = cfg.page_size;
        let (vidmem, user_sizes) = {
            let pmm = dev.pmm.lock();
            (pmm.config().vidmem, pmm.size_mask(ChunkType::User))
        };
        if !ps.is_power_of_two() || !user_sizes.contains(ps) || ps % backend.granularity() != 0 {
            return Err(invalid_size(format!(
                "page size {} must be a USER chunk size of the device ({}) and a multiple of the \
                 {} backend's granularity ({})",
                format_size(ps),
                user_sizes
                    .sizes()
                    .iter()
                    .map(|&s| format_size(s))
                    .collect::<Vec<_>>()
                    .join(", "),
                backend.name(),
                format_size(backend.granularity())
            )));
        }
        if backend.capacity() < vidmem {
            return Err(Error::InvalidArgument(format!(
                "the backend holds {} but the PMM manages {}",
                format_size(backend.capacity()),
                format_size(vidmem)
            )));
        }
        if cfg.small_threshold >= ps {
            return Err(invalid_size(format!(
                "small_threshold {} must be below the page size {}",
                format_size(cfg.small_threshold),
                format_size(ps)
            )));
        }
        let max = cfg.max_size.unwrap_or(vidmem);
        if cfg.initial_size > max {
            return Err(invalid_size(format!(
                "initial size {} is above the pool's maximum {}",
                format_size(cfg.initial_size),
                format_size(max)
            )));
        }
        let num_pages = (vidmem / ps) as u32;
        // Twice the device: stitched allocations never run out of window before the device
        // runs out of pages, however the window fragments.
        let window_pages = num_pages.saturating_mul(2).max(1);
        let mut window = Runs::new(window_pages);
        window.free(0, window_pages);
        let va = Va::new(&*backend, ps.trailing_zeros(), window, WINDOW_CACHE)?;
        let pg = (ps / GRANULE) as u32;
        let mut pool = Pool {
            pg,
            page_shift: ps.trailing_zeros(),
            gshift: pg.trailing_zeros(),
            heap_end_units: pg.div_ceil(HEAP_END_DIV),
            max_bytes: max.min(num_pages as u64 * ps),
            small_units: cfg.small_threshold.div_ceil(GRANULE),
            slack_units: (cfg.tail_slack / GRANULE) as u32,
            pages: vec![PageKind::Absent; num_pages as usize].into(),
            page_first: vec![NIL; num_pages as usize].into(),
            page_chunk: vec![0; num_pages as usize].into(),
            free_pages: Runs::new(num_pages),
            va,
            eager: cfg.release_threshold.is_some(),
            journal: Vec::new(),
            blocks: Table::new(),
            sec_links: Table::new(),
            vacant_blocks: Vec::new(),
            primary: Default::default(),
            secondary: Default::default(),
            allocs: Table::new(),
            vacant_allocs: Vec::new(),
            stitches: Vec::new(),
            vacant_stitches: Vec::new(),
            by_ptr: None,
            batches: Vec::new(),
            streams: FxHashMap::default(),
            fence_stream: FxHashMap::default(),
            events: FxHashMap::default(),
            next_fence: 1,
            scopes: FxHashMap::default(),
            next_scope: 1,
            counters: Counters::default(),
            latency: Histogram::default(),
            closed: false,
            first_stream: None,
            streams_mixed: false,
            served_large: false,
            last_heap_open: NIL,
            cache: SizeCache::new(cfg.size_cache && cfg.release_threshold.is_none()),
            heap_changes: 0,
            cache_ok: (NIL, u64::MAX),
            steps: step::Steps::default(),
            frontier: NIL,
            last_freed: 0,
            last_resort: false,
            last_resort_rules: pressure::LAST_LAYOUT | pressure::LAST_HEAP_ENDS,
            cfg,
            dev,
        };
        let want = pool.cfg.initial_size.div_ceil(ps) as u32;
        if !pool.ensure_pages(want, Reach::Grow) {
            let got = pool.counters.reserved_bytes;
            pool.close()?;
            return Err(Error::OutOfMemory(format!(
                "cannot reserve {} for the pool: the device gave {}",
                format_size(pool.cfg.initial_size),
                format_size(got)
            )));
        }
        pool.journal.clear();
        pool.check();
        Ok(pool)
    }

    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Bytes held from the device (a counter: O(1), unlike `stats`).
    pub fn reserved_bytes(&self) -> u64 {
        self.counters.reserved_bytes
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    #[inline]
    fn check(&self) {
        if self.cfg.check {
            if let Err(e) = self.validate() {
                panic!("pool invariant broken: {e}");
            }
        }
    }

    #[inline]
    fn open(&self) -> Result<()> {
        if self.closed {
            Err(Error::InvalidState("the pool is closed".into()))
        } else {
            Ok(())
        }
    }

    /// The largest request the pool can ever serve: its `max_size`, at most its device.
    #[inline]
    fn max_size(&self) -> u64 {
        self.max_bytes
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
