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
//! A freed one-block allocation whose size keeps being asked for may instead keep its block,
//! unmerged, for the next request of that size (`cache.rs`): its slot is `Cached`, its memory
//! counts as free, and the cache goes back before the pool would grow.
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
//!   in a pending batch record (`batches`), and nothing else; every record entry names a live
//!   or freeing allocation.
//! - A `Cached` slot holds one block of exactly its rounded size and is in the size cache
//!   once, under that size; nothing else is in the cache.

#![deny(unsafe_code)]

pub mod bins;
mod cache;
#[cfg(test)]
mod golden;
mod ptrmap;
pub(crate) mod runs;
mod stats;
mod table;
#[cfg(test)]
mod tests;

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
use bins::{bin_of, Bins, Link, LinkRead, LinkWrite, NIL, NUM_BINS};
use cache::{Lookup, SizeCache};
use ptrmap::PtrMap;
use runs::Runs;
use table::Table;

pub use stats::{Histogram, PageSnapshot, PoolStats};

/// Every request is rounded up to a multiple of this (CUDA's allocation alignment).
pub const GRANULE: u64 = 256;

/// Allocation latency is timed on one call in this many. (Two clock reads per timed call: at
/// one in 16 they were 3 % of a mixed churn pair, 122 against 126 ns untimed; at one in 64,
/// under 1 %, and a million calls still give 15,000 samples.)
const LATENCY_SAMPLE: u64 = 64;

/// Longest window range (in pages) kept in the window cache.
const WINDOW_CACHE: usize = 64;

/// How many items of a request's own bin a good-fit search looks at.
const SCAN: usize = 8;
/// The same for a small request in the heap pages: none, it takes the head of the first bin
/// whose blocks all hold it (within 1/16 of its size). Walking the own bin is a chain of
/// dependent loads; with 16 bins a power of two instead of 8 the walk no longer paid for
/// itself: mixed churn pair 103.5 → 101 ns in the profiling loop, fill to failure 99.65 % (8
/// candidates) → 99.63 % (none), against 99.62 % with 8 bins and 8 candidates
/// (benches/RESULTS.md, sixth session).
const HEAP_SCAN: usize = 0;
/// The same for a request placed in a free block of a large segment: 2 instead of 8 left the
/// fill to failure and the traces' reserve unchanged and saved 1–2 ns a mixed churn pair; 0
/// raised resnet50's peak reserved ÷ peak live from 1.0137 to 1.0211. 1 instead of 2 (ninth
/// session): the churn with the device reserved 78.9 → 76.4 ns (min of six interleaved
/// runs), the fill unchanged, resnet50's peak reserve 1.0092 → 1.0122 of its peak live (its
/// smallest capacity unchanged); 0 then gave 1.0256 (benches/RESULTS.md).
const LARGE_SCAN: usize = 1;

/// Under pressure (the pages the pool could still get, held or not, under 1/`PRESSURE_DIV`
/// of its limit), placement looks harder for a close fit, as memory left in slivers now may
/// be what a later request lacks: a free block of a large segment is the best fit among
/// `BEST_SCAN` candidates of two bins, a tail the best fit among `TAIL_SCAN`, and up to
/// `PAIR_SCAN` heads are tried for the one whose tail fits a free page start most closely.
/// Fill to failure at 2 MiB pages, 40 seeds: 99.636 → 99.714 %; the real traces' peak reserve
/// and smallest capacity unchanged (benches/RESULTS.md, seventh session; 16 or 64 heads
/// instead of 4 needed two more pages for resnet50 at its smallest capacity). Not with room
/// to spare: pairing on every stitched request cost the mixed churn 5 ns a pair.
const PRESSURE_DIV: u64 = 8;
const BEST_SCAN: usize = 4;
const TAIL_SCAN: usize = 16;
const PAIR_SCAN: usize = 4;

/// A large request whose layout would need the stitching window takes a free run that holds
/// it whole instead, while whole free pages are at least 1/`RUN_FIRST_DIV` of the pool's
/// (`place_large`). 16: resnet50's peak reserved ÷ peak live 1.0092 → 1.0137 (1/32: 1.0152,
/// 1/64: 1.0226, over its 1.02 target), fill to failure unchanged, the mixed churn's stitched
/// requests 87 → 39 per thousand pairs (benches/RESULTS.md).
const RUN_FIRST_DIV: u64 = 16;

/// `defrag` slides an allocation of a large segment down over a free block only if that
/// block is at least 1/`SLIDE_MIN_DIV` of the allocation's length: a copy engine that cannot
/// copy overlapping ranges (CUDA's) moves it in pieces of the free block's length, so at
/// most this many (queued, then waited for once). 1024 rather than 64 (thirteenth session):
/// with every allocation movable, the fill to failure at 2 MiB pages 99.893 → 99.929 %
/// (40 seeds), as most holes left inside pages are small beside what would slide over them.
const SLIDE_MIN_DIV: u64 = 1024;

/// `compact_pages` walks the large segments and heap pages again while a walk moved something, at most
/// this many times: a stitched allocation's slide frees space after its tail, in another
/// segment, which a later walk can slide the next allocation over.
const COMPACT_PASSES: usize = 8;

/// How many batch records (see `Pool::batches`) wait outside the pointer index at most.
const BATCH_RECORDS: usize = 64;

/// Indexes of `Pool::primary` and `Pool::secondary` (see there).
const LARGE: usize = 0;
const HEAP: usize = 1;
const SUFFIX: usize = 1;
const PREFIX: usize = 2;

/// A device: the PMM that hands out its physical memory and the backend that holds it.
pub struct Device {
    pub pmm: Arc<Mutex<Pmm>>,
    pub backend: Arc<dyn Backend>,
}

/// How a pool behaves. Sizes in bytes.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// The mapping unit: a power of two, a PMM USER chunk size, a multiple of the backend's
    /// granularity.
    pub page_size: u64,
    /// Requests below this go to heap pages; the rest are laid out over large pages.
    pub small_threshold: u64,
    /// Reserved when the pool is made.
    pub initial_size: u64,
    /// The most the pool may reserve (None: the device's capacity).
    pub max_size: Option<u64>,
    /// Free pages above this many bytes go back to the device at once (None: keep them until
    /// `trim`, `defrag` or `close`), like `cudaMemPoolAttrReleaseThreshold`.
    pub release_threshold: Option<u64>,
    /// Zero memory when it is freed (before anyone can reuse it).
    pub scrub: bool,
    /// Keep a freed one-block allocation whole for the next request of its exact size
    /// (`cache.rs`); off with a release threshold, whose pages go back as they free up.
    pub size_cache: bool,
    /// A tail may take a free page prefix at most this much larger than itself (bytes);
    /// otherwise it takes a fresh page, whose remainder stays usable as a head.
    pub tail_slack: u64,
    /// Run `validate` after every mutation and panic on a broken invariant (tests).
    pub check: bool,
}

impl PoolConfig {
    pub fn new(page_size: u64) -> Self {
        PoolConfig {
            page_size,
            small_threshold: DEFAULT_SMALL_THRESHOLD.min(page_size / 2),
            initial_size: 0,
            max_size: None,
            release_threshold: None,
            scrub: false,
            size_cache: true,
            tail_slack: page_size / 16,
            check: false,
        }
    }
}

/// A block freed by `free_batch` and not yet merged (in its `links.prev`; never a block index).
const PENDING: u32 = NIL - 1;

/// The longest block a large segment holds, in granules (larger requests are stitched).
const MAX_BLOCK: u64 = 1 << 31;

/// The default heap threshold; docs/design.md has the measurements that chose it.
pub const DEFAULT_SMALL_THRESHOLD: u64 = 1 << 20;

/// A handle to an allocation: its slot and the generation of the allocation it names.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllocId {
    index: u32,
    generation: u32,
}

impl AllocId {
    pub fn to_bits(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }
    pub fn from_bits(bits: u64) -> Self {
        AllocId {
            index: bits as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

/// What a caller may ask for.
#[derive(Copy, Clone, Debug, Default)]
pub struct Request {
    /// Bytes, at least 1.
    pub size: u64,
    pub stream: u64,
    /// The allocation may be moved by `defrag` (its pointer changes).
    pub movable: bool,
    /// A scope from `open_scope` (0: none).
    pub scope: u32,
}

/// What a caller learns about an allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocInfo {
    pub id: AllocId,
    pub ptr: u64,
    pub size: u64,
    pub rounded: u64,
    pub stream: u64,
    pub freeing: bool,
    pub movable: bool,
    pub stitched: bool,
    pub pins: u32,
    pub scope: u32,
}

/// What `defrag` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefragReport {
    /// Allocations that changed address (each counted once).
    pub moved_allocs: u64,
    /// Bytes copied (an allocation that moved twice counts twice).
    pub moved_bytes: u64,
    /// Heap pages emptied (the pages a large segment's compaction frees are in
    /// `bytes_released`).
    pub pages_emptied: u64,
    /// Free pages given back to the device at the end.
    pub bytes_released: u64,
    /// (allocation, old pointer, new pointer), one per allocation moved, in the order they
    /// first moved.
    pub moves: Vec<(AllocId, u64, u64)>,
}

impl DefragReport {
    /// One move per allocation: an allocation slid inside its page and then moved out of it
    /// keeps its first old pointer and takes its last new one.
    fn merge_moves(&mut self) {
        let mut first: FxHashMap<AllocId, usize> = FxHashMap::default();
        let mut merged: Vec<(AllocId, u64, u64)> = Vec::with_capacity(self.moves.len());
        for &(id, old, new) in &self.moves {
            match first.get(&id) {
                Some(&i) => merged[i].2 = new,
                None => {
                    first.insert(id, merged.len());
                    merged.push((id, old, new));
                }
            }
        }
        self.moves = merged;
        self.moved_allocs = self.moves.len() as u64;
    }
}

/// What closing a scope did: the allocations made inside it that were still live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeReport {
    pub allocs: u64,
    pub freed: u64,
    pub leaked: Vec<AllocInfo>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum PageKind {
    /// Not held by the pool.
    Absent,
    /// Held, and either free (in a free run) or a middle page of a stitched allocation; which
    /// one is not written per page (a 64 MiB allocation would touch 32 pages twice): the free
    /// runs and the stitches say it, and the on-demand walks read them there.
    Owned,
    Heap,
    /// The first page of a large *segment*: one or more consecutive pages covered by one
    /// list of blocks, which may cross page boundaries (a large allocation placed in it is
    /// contiguous in the direct map).
    Large,
    /// A later page of a large segment; its blocks are listed from the segment's first page.
    Covered,
}

/// A piece of a heap page or a large segment. Its primary bin links live in it, and it knows
/// its page kind, so the hot paths touch one cache line per block (the page table is not
/// read); 32 bytes, so two share a cache line and none straddles one. A used block is in no
/// bin, so its links hold its allocation instead (`owner`); the secondary links (suffix and
/// prefix bins, only ever used by free large blocks at a segment's ends) live beside the
/// blocks, in `Pool::sec_links`.
#[derive(Copy, Clone, Debug)]
#[repr(align(32))]
struct Block {
    /// The page the block starts in, and its offset there in granules.
    page: u32,
    off: u32,
    /// Length in granules: within the page for a heap block; a large block may run on into
    /// the next pages of its segment.
    len: u32,
    /// Neighbours in the page or segment (NIL at its ends).
    prev: u32,
    next: u32,
    free: bool,
    /// In a heap page (else a large segment).
    heap: bool,
    /// Free and binned: its primary bin and secondary bins (`SUFFIX`, `PREFIX` or 0), as
    /// computed when it went in, so that taking it out does not compute them again.
    binsec: u16,
    /// Free: links in the primary bins (heap or large). Used: `prev` is the owner's slot.
    links: Link,
}

const _: () = assert!(std::mem::size_of::<Block>() == 32);
// `Block::binsec` holds a bin in its low 12 bits and the secondary bins above them
const _: () = assert!(NUM_BINS <= 1 << 12 && PREFIX < 1 << 4);
const _: () = assert!(std::mem::size_of::<Alloc>() == 64);

impl Block {
    /// The primary bin it was filed under (free and binned).
    #[inline(always)]
    fn bin(&self) -> usize {
        (self.binsec & 0xfff) as usize
    }

    /// Its secondary bins (`SUFFIX`, `PREFIX` or 0).
    #[inline(always)]
    fn sec(&self) -> usize {
        (self.binsec >> 12) as usize
    }
    /// The allocation a used block belongs to.
    #[inline]
    fn owner(&self) -> u32 {
        debug_assert!(!self.free);
        self.links.prev
    }
}

#[inline(always)]
fn bin_op<L: LinkWrite + ?Sized>(
    bins: &mut Bins,
    links: &mut L,
    item: u32,
    bin: usize,
    insert: bool,
) {
    if insert {
        bins.push(links, item, bin)
    } else {
        bins.remove(links, item, bin)
    }
}

/// The primary links of every block, for [`Bins`].
struct BlockLinks<'a>(&'a mut Table<Block>);
struct BlockLinksRef<'a>(&'a Table<Block>);

impl LinkRead for BlockLinks<'_> {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self.0[i as usize].links
    }
}

impl LinkWrite for BlockLinks<'_> {
    #[inline]
    fn link_mut(&mut self, i: u32) -> &mut Link {
        &mut self.0[i as usize].links
    }
}

impl LinkRead for BlockLinksRef<'_> {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self.0[i as usize].links
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    Vacant,
    Live,
    /// Freed on a stream; waits for that stream's fence.
    Freeing,
    /// The memory of an arena batch (`alloc_arena`): not an allocation a caller sees; its
    /// members point into it, and it goes back when the last of them is freed.
    Group,
    /// Freed, its block kept whole in the exact-size cache (`cache.rs`) for the next request
    /// of its size: not an allocation a caller sees (its handle is stale), and its memory
    /// counts as free.
    Cached,
}

/// Where an allocation's memory is. Small and `Copy`: stitched layouts live in their own
/// arena (moving a large enum through every call cost a fifth of the allocation path).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Layout {
    None,
    /// One block in a heap or large page.
    Block(u32),
    /// An entry of `Pool::stitches`.
    Stitched(u32),
    /// Part of the memory of the group (arena batch) in that slot.
    Member(u32),
}

/// How the members of a batch record lie, for `free_batch` (see `vacate_record`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Record {
    /// Back to back in one used block, in their order (a batch placed in one block): the
    /// block is the first member's, and is cut into one block per member only when the
    /// record goes into the pointer index (`cut_uncut`), so a `free_batch` of the whole
    /// batch gives back one block that was never cut.
    Uncut(u32),
    /// All the members of arena (group) slot `g`.
    Group(u32),
}

/// The members of a batch not yet in the pointer index (see `Pool::batches`), as (pointer,
/// slot) in the order returned, and how they lie. The shape is set when the batch is made and
/// stays true while the record exists: a member's block or group changes only when that
/// member is freed or moved, and each of those paths first moves the records into the index
/// (`unindex`), which ends them (checked by `validate`). So `free_batch` need not walk the
/// blocks again to find it (a ninth of a batch pair's instructions), and a batch in one
/// block need not be cut into blocks unless a member is freed or looked up on its own.
#[derive(Clone, Debug)]
struct BatchRecord {
    shape: Record,
    members: Vec<(u64, u32)>,
}

#[derive(Clone, Debug, Default)]
struct Stitch {
    /// A free block that ended at its page's end (NIL: none).
    head: u32,
    /// Whole pages, in mapping order.
    runs: SmallVec<[(u32, u32); 4]>,
    /// A block that starts at its page's start (NIL: none).
    tail: u32,
    /// Pages of the stitching window (NIL: addressed through the direct map).
    window: u32,
    window_len: u32,
}

/// A change to the pages of large segments made while placing a request, kept until the
/// request (or its batch) has succeeded so that a failure can undo it exactly.
#[derive(Copy, Clone, Debug)]
enum Change {
    /// `split_out` of free block `b`, which was `orig`, gave pages `[p0, p1)` back to the
    /// free pages; `right` is the free block it left at `p1` (NIL: none).
    Split {
        b: u32,
        orig: Block,
        right: u32,
        p0: u32,
        p1: u32,
    },
    /// Free pages `[p, p + n)` were appended to the segment whose last block is `b`.
    Extend { b: u32, p: u32, n: u32 },
    /// Page `p` was taken from the device.
    Grow { p: u32 },
}

/// One allocation slot: 64 bytes, one cache line (the rounded size is not stored: it is
/// `units()`; with it the slot took two lines, and the free path's first load missed on both).
#[derive(Clone, Debug)]
#[repr(align(64))]
struct Alloc {
    generation: u32,
    state: State,
    size: u64,
    ptr: u64,
    stream: u64,
    movable: bool,
    pins: u32,
    scope: u32,
    /// The fence of a pending stream-ordered free.
    fence: u64,
    layout: Layout,
    /// A group: how many of its members are not yet freed.
    members: u32,
}

impl Alloc {
    /// The size in granules (the size rounded up to `GRANULE`).
    #[inline]
    fn units(&self) -> u64 {
        self.size.div_ceil(GRANULE)
    }
}

#[derive(Default, Debug)]
struct StreamState {
    /// Pending frees, oldest first: (fence, slot, generation).
    pending: VecDeque<(u64, u32, u32)>,
    /// Pending frees by rounded size, for reuse on the same stream.
    reuse: FxHashMap<u64, Vec<(u32, u32)>>,
}

/// Always-current counters (the cheap tier of the statistics).
#[derive(Clone, Debug, Default)]
struct Counters {
    live_bytes: u64,
    used_bytes: u64,
    freeing_bytes: u64,
    reserved_bytes: u64,
    peak_live: u64,
    peak_used: u64,
    peak_reserved: u64,
    allocs: u64,
    frees: u64,
    failures: u64,
    stitched: u64,
    reused: u64,
    cache_hits: u64,
    calls: u64,
    pages_taken: u64,
    pages_released: u64,
}

/// One pool: the core behind `gpumm.MemoryPool`. Not thread safe by itself; the bindings
/// hold it behind a lock.
pub struct Pool {
    cfg: PoolConfig,
    dev: Arc<Device>,
    /// Page size in granules and as a shift of bytes.
    pg: u32,
    page_shift: u32,
    /// log2 of `pg`.
    gshift: u32,
    /// The largest request the pool can ever serve, in bytes (`max_size()`: fixed when made).
    max_bytes: u64,
    small_units: u64,
    slack_units: u32,
    direct_base: u64,
    /// Per page: its kind; its first block (Heap and Large pages only: not written for the
    /// others); its PMM chunk (bits of its ChunkId) while the pool holds it. Three arrays, so
    /// that opening or freeing a segment of many pages writes one byte a page (with one
    /// 16-byte record a page, the two page walks of a batch placed in one segment were 5 %
    /// of a batch pair).
    pages: Table<PageKind>,
    page_first: Table<u32>,
    page_chunk: Table<u64>,
    free_pages: Runs,
    window_base: u64,
    window_bytes: u64,
    window: Runs,
    /// Freed window ranges of up to `WINDOW_CACHE` pages, by length, kept for reuse as they
    /// are (a stitched allocation of a length seen before takes one in O(1), without the
    /// runs' merging); given back to `window` when it runs short.
    window_cache: Vec<Vec<u32>>,
    /// The backend maps (host, CUDA); a simulated one does not, and its calls are skipped.
    maps: bool,
    /// Free whole pages inside large segments go back to the free pages at once (a pool with
    /// a release threshold), not only when a request needs them (`reclaim`).
    eager: bool,
    /// Changes of the request (or batch) being placed; see [`Change`].
    journal: Vec<Change>,
    /// A batch is being placed: its requests keep the journal for the batch.
    batching: bool,
    blocks: Table<Block>,
    /// The secondary bin links of each block (see [`Block`]).
    sec_links: Table<Link>,
    vacant_blocks: Vec<u32>,
    /// Primary bins of free blocks, indexed by `Block::heap` (`LARGE`, `HEAP`); secondary bins
    /// of free large blocks at a segment's end (`SUFFIX`) or start (`PREFIX`; index 0 unused).
    /// (Which secondary bins a free block belongs in is computed without branches since the
    /// sixth session, 0.56 fewer mispredictions a mixed pair; an earlier form that also
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
    /// A page being emptied by `defrag`: its free blocks stay out of the bins.
    evacuating: u32,
    counters: Counters,
    latency: Histogram,
    closed: bool,
    /// Set by `try_alloc_quick`: the request must not grow the pool or defragment; when it
    /// would, `quick_miss` is set and nothing changes.
    quick: bool,
    quick_miss: bool,
    /// The stream of the first request, and whether a request on another stream has come
    /// since: while every request is on one stream, its work runs in order and a free by that
    /// stream needs no event (`free_when_done`).
    first_stream: Option<u64>,
    streams_mixed: bool,
    /// The error of the request `alloc_inner` just refused (see there).
    alloc_error: Option<Error>,
    /// Freed one-block allocations kept for a request of their size (see `cache.rs`); on
    /// unless pages go back to the device as they free up (a release threshold).
    cache: SizeCache,
    cache_on: bool,
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
        let window_bytes = window_pages as u64 * ps;
        let window_base = backend.reserve(window_bytes)?;
        let mut window = Runs::new(window_pages);
        window.free(0, window_pages);
        let pg = (ps / GRANULE) as u32;
        let mut pool = Pool {
            pg,
            page_shift: ps.trailing_zeros(),
            gshift: pg.trailing_zeros(),
            max_bytes: max.min(num_pages as u64 * ps),
            small_units: cfg.small_threshold.div_ceil(GRANULE),
            slack_units: (cfg.tail_slack / GRANULE) as u32,
            direct_base: backend.direct_base(),
            pages: vec![PageKind::Absent; num_pages as usize].into(),
            page_first: vec![NIL; num_pages as usize].into(),
            page_chunk: vec![0; num_pages as usize].into(),
            free_pages: Runs::new(num_pages),
            window_base,
            window_bytes,
            window,
            window_cache: vec![Vec::new(); WINDOW_CACHE + 1],
            maps: backend.maps(),
            eager: cfg.release_threshold.is_some(),
            journal: Vec::new(),
            batching: false,
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
            evacuating: NIL,
            counters: Counters::default(),
            latency: Histogram::default(),
            closed: false,
            quick: false,
            quick_miss: false,
            first_stream: None,
            streams_mixed: false,
            alloc_error: None,
            cache: SizeCache::default(),
            cache_on: cfg.size_cache && cfg.release_threshold.is_none(),
            cfg,
            dev,
        };
        let want = pool.cfg.initial_size.div_ceil(ps) as u32;
        if !pool.ensure_pages(want) {
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

    // --------------------------------------------------------------------------------------
    // Pages

    /// Takes `n` pages from the device into the free pages: all of them, or none at the
    /// pool's maximum or when the device has fewer (the PMM's batch is all or nothing).
    fn grow(&mut self, n: u32) -> bool {
        if self.quick {
            self.quick_miss = true;
            return false;
        }
        // While the cache holds memory the pool does not grow: the request that asked gives
        // the cache back and tries again (`alloc_inner`; a batch gives it back first).
        if !self.cache.is_empty() {
            return false;
        }
        let ps = self.cfg.page_size;
        if self.counters.reserved_bytes + n as u64 * ps > self.max_size() {
            return false;
        }
        let got = {
            let mut pmm = self.dev.pmm.lock();
            pmm.alloc_chunks(n as usize, ps, ChunkType::User, false)
                .and_then(|ids| pmm.infos(&ids))
        };
        let Ok(infos) = got else { return false };
        // the backend makes the memory (CUDA: cuMemCreate + map); all or nothing
        for (k, info) in infos.iter().enumerate() {
            if self.dev.backend.commit(info.addr, ps).is_err() {
                for done in &infos[..k] {
                    self.dev.backend.discard(done.addr, ps);
                }
                let mut pmm = self.dev.pmm.lock();
                for i in &infos {
                    let _ = pmm.free(i.id);
                }
                return false;
            }
        }
        for info in infos {
            let p = (info.addr >> self.page_shift) as u32;
            self.pages[p as usize] = PageKind::Owned;
            self.page_chunk[p as usize] = info.id.to_bits();
            self.free_pages.free(p, 1);
            self.journal.push(Change::Grow { p });
        }
        self.counters.reserved_bytes += n as u64 * ps;
        self.counters.peak_reserved = self
            .counters
            .peak_reserved
            .max(self.counters.reserved_bytes);
        self.counters.pages_taken += n as u64;
        true
    }

    /// At least `n` free pages, growing from the device as needed (all or nothing).
    fn ensure_pages(&mut self, n: u32) -> bool {
        let have = self.free_pages.free_units();
        have >= n as u64 || self.grow((n as u64 - have) as u32)
    }

    /// Gives free pages back to the device until at most `keep` bytes of them stay.
    /// Returns the bytes released.
    fn release_pages(&mut self, keep: u64) -> u64 {
        let ps = self.cfg.page_size;
        let keep_pages = keep / ps;
        if self.free_pages.free_units() <= keep_pages {
            return 0;
        }
        let mut excess = self.free_pages.free_units() - keep_pages;
        let mut released = Vec::new();
        // Highest addresses first, so what stays is compact.
        for (start, len) in self.free_pages.runs().into_iter().rev() {
            if excess == 0 {
                break;
            }
            self.free_pages.take_run(start);
            let take = (len as u64).min(excess) as u32;
            // keep the front of the run, release its back
            if take < len {
                self.free_pages.free(start, len - take);
            }
            for p in start + len - take..start + len {
                released.push(p);
            }
            excess -= take as u64;
        }
        self.give_back(&released)
    }

    /// Gives pages (taken from the free runs already) back to the device. Returns the bytes.
    fn give_back(&mut self, released: &[u32]) -> u64 {
        let ps = self.cfg.page_size;
        let mut pmm = self.dev.pmm.lock();
        for &p in released {
            let r = pmm.free(ChunkId::from_bits(self.page_chunk[p as usize]));
            debug_assert!(r.is_ok(), "pool page not allocated in the PMM: {r:?}");
            self.pages[p as usize] = PageKind::Absent;
            self.page_chunk[p as usize] = 0;
            self.dev.backend.discard(p as u64 * ps, ps);
        }
        drop(pmm);
        let bytes = released.len() as u64 * ps;
        self.counters.reserved_bytes -= bytes;
        self.counters.pages_released += released.len() as u64;
        bytes
    }

    /// After a free: an empty pool gives its cached blocks back (so that a pool whose
    /// allocations are all freed is all free pages, whatever it cached), and pages above the
    /// release threshold go back to the device.
    #[inline]
    fn after_free(&mut self) {
        if self.counters.used_bytes == 0 {
            self.flush_cache();
        }
        if let Some(th) = self.cfg.release_threshold {
            self.release_pages(th);
        }
    }

    /// A page leaves the free runs to become `kind`.
    fn page_to(&mut self, p: u32, kind: PageKind, first: u32) {
        self.pages[p as usize] = kind;
        if matches!(kind, PageKind::Heap | PageKind::Large) {
            self.page_first[p as usize] = first;
        }
    }

    /// Pages `[p, p + n)` are free again.
    fn pages_free(&mut self, p: u32, n: u32) {
        for q in p..p + n {
            self.page_to(q, PageKind::Owned, NIL);
        }
        self.free_pages.free(p, n);
    }

    /// Where granule `g` of the direct map is: (page, offset in granules).
    #[inline]
    fn locate(&self, g: u64) -> (u32, u32) {
        ((g >> self.gshift) as u32, (g & (self.pg as u64 - 1)) as u32)
    }

    /// The first granule of a block in the direct map.
    #[inline]
    fn start_of(&self, blk: &Block) -> u64 {
        ((blk.page as u64) << self.gshift) + blk.off as u64
    }

    /// The page after the one a block ends in (for a block that ends at a page boundary: the
    /// first page after it).
    #[inline]
    fn page_after(&self, blk: &Block) -> u32 {
        ((self.start_of(blk) + blk.len as u64) >> self.gshift) as u32
    }

    // --------------------------------------------------------------------------------------
    // Blocks

    #[inline]
    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.vacant_blocks.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            self.sec_links.push(Link::UNLINKED);
            (self.blocks.len() - 1) as u32
        }
    }

    #[inline]
    fn drop_block(&mut self, b: u32) {
        self.blocks[b as usize].page = NIL;
        self.vacant_blocks.push(b);
    }

    /// The secondary bins of a free block: `SUFFIX` if it is a large block that ends its
    /// segment, `PREFIX` if one that starts it, else 0 (none). (A free block is never both: a
    /// segment that is one free block goes back to the free pages.)
    #[inline]
    fn secondary_of(blk: &Block) -> usize {
        // (arithmetic, not branches: heap or large follows the random sizes)
        let (suffix, prefix) = (blk.next == NIL, blk.prev == NIL);
        let sec = suffix as usize * SUFFIX + (!suffix & prefix) as usize * PREFIX;
        sec * (!blk.heap) as usize
    }

    /// A free block goes into (`insert`) or out of the bins its page kind and position say.
    /// Blocks of a page being emptied by `defrag` stay out.
    #[inline(always)]
    fn rebin<const INSERT: bool>(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        if blk.page == self.evacuating {
            return;
        }
        let (bin, sec, heap) = if INSERT {
            let (bin, sec) = (bin_of(blk.len), Self::secondary_of(blk));
            blk.binsec = (bin | sec << 12) as u16;
            (bin, sec, blk.heap)
        } else {
            (blk.bin(), blk.sec(), blk.heap)
        };
        let primary = &mut self.primary[heap as usize];
        bin_op(primary, &mut BlockLinks(&mut self.blocks), b, bin, INSERT);
        if sec != 0 {
            bin_op(
                &mut self.secondary[sec],
                &mut self.sec_links,
                b,
                bin,
                INSERT,
            );
        }
    }

    #[inline]
    fn insert_free(&mut self, b: u32) {
        self.rebin::<true>(b)
    }

    #[inline]
    fn remove_free(&mut self, b: u32) {
        self.rebin::<false>(b)
    }

    /// Makes pages `[p, p + n)` (just taken from the free runs) a heap page (`n` = 1) or a
    /// large segment covered by one free block, which is returned, not in any bin.
    fn open_segment(&mut self, p: u32, n: u32, kind: PageKind) -> u32 {
        debug_assert!(kind == PageKind::Large || n == 1);
        for q in p + 1..p + n {
            self.page_to(q, PageKind::Covered, NIL);
        }
        let b = self.new_block(Block {
            page: p,
            off: 0,
            len: n << self.gshift,
            prev: NIL,
            next: NIL,
            free: true,
            heap: kind == PageKind::Heap,
            binsec: 0,
            links: Link::UNLINKED,
        });
        self.page_to(p, kind, b);
        b
    }

    /// Uses `len` granules at `at` granules into free block `b` (not in any bin) for
    /// allocation `a`; the pieces before and after stay free and go to their bins.
    #[inline(always)]
    fn carve(&mut self, b: u32, at: u32, len: u32, a: u32) -> u32 {
        let blk = self.blocks[b as usize];
        debug_assert!(blk.free && at + len <= blk.len);
        if at > 0 {
            let f = self.new_block(Block {
                page: blk.page,
                off: blk.off,
                len: at,
                prev: blk.prev,
                next: b,
                free: true,
                heap: blk.heap,
                binsec: 0,
                links: Link::UNLINKED,
            });
            if blk.prev != NIL {
                self.blocks[blk.prev as usize].next = f;
            } else {
                self.page_first[blk.page as usize] = f;
            }
            self.blocks[b as usize].prev = f;
        }
        let rest = blk.len - at - len;
        let g = self.start_of(&blk) + at as u64;
        if rest > 0 {
            let (page, off) = self.locate(g + len as u64);
            let f = self.new_block(Block {
                page,
                off,
                len: rest,
                prev: b,
                next: blk.next,
                free: true,
                heap: blk.heap,
                binsec: 0,
                links: Link::UNLINKED,
            });
            if blk.next != NIL {
                self.blocks[blk.next as usize].prev = f;
            }
            self.blocks[b as usize].next = f;
        }
        {
            let (page, off) = self.locate(g);
            let u = &mut self.blocks[b as usize];
            u.page = page;
            u.off = off;
            u.len = len;
            u.free = false;
            u.links = Link { prev: a, next: NIL };
        }
        if at > 0 {
            let f = self.blocks[b as usize].prev;
            self.insert_free(f);
        }
        if rest > 0 {
            let f = self.blocks[b as usize].next;
            self.insert_free(f);
        }
        b
    }

    /// Takes a whole free block (not in any bin) for allocation `a`.
    #[inline]
    fn take_whole(&mut self, b: u32, a: u32) {
        let len = self.blocks[b as usize].len;
        self.carve(b, 0, len, a);
    }

    /// A free block in its bins (not one `free_batch` has yet to merge, which it leaves to
    /// `merge_pending`).
    #[inline]
    fn binned_free(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        blk.free && blk.links.prev != PENDING
    }

    /// A used block becomes free and merges with free neighbours; a page left empty becomes
    /// a free page.
    #[inline(always)]
    fn release_block(&mut self, b: u32) {
        let blk = self.blocks[b as usize];
        debug_assert!(!blk.free);
        {
            let u = &mut self.blocks[b as usize];
            u.free = true;
            u.links = Link::UNLINKED;
        }
        if blk.prev != NIL && self.binned_free(blk.prev) {
            let l = blk.prev;
            self.remove_free(l);
            let left = self.blocks[l as usize];
            let u = &mut self.blocks[b as usize];
            u.page = left.page;
            u.off = left.off;
            u.len += left.len;
            u.prev = left.prev;
            if left.prev != NIL {
                self.blocks[left.prev as usize].next = b;
            } else {
                self.page_first[left.page as usize] = b;
            }
            self.drop_block(l);
        }
        let next = self.blocks[b as usize].next;
        if next != NIL && self.binned_free(next) {
            self.remove_free(next);
            self.absorb_next(b);
        }
        self.settle_free(b);
    }

    /// Block `b` takes in the block after it (free, in no bin), which goes.
    #[inline]
    fn absorb_next(&mut self, b: u32) {
        let nx = self.blocks[b as usize].next;
        let right = self.blocks[nx as usize];
        let u = &mut self.blocks[b as usize];
        u.len += right.len;
        u.next = right.next;
        if right.next != NIL {
            self.blocks[right.next as usize].prev = b;
        }
        self.drop_block(nx);
    }

    /// A free block just merged (in no bin) goes where it belongs: back to the free pages if
    /// it is its whole page or segment, else its whole pages out (a pool that releases at
    /// once) or into its bins.
    #[inline(always)]
    fn settle_free(&mut self, b: u32) {
        let u = self.blocks[b as usize];
        if u.prev == NIL && u.next == NIL {
            self.drop_block(b);
            if u.page == self.evacuating {
                self.evacuating = NIL;
            }
            self.pages_free(u.page, u.len >> self.gshift);
        } else if self.eager && !u.heap {
            let _ = self.split_out(b);
        } else {
            self.insert_free(b);
        }
    }

    /// A free large block (in no bin) gives the whole pages inside it back to the free pages;
    /// what is left before them stays free at the end of its segment, what is left after them
    /// starts a new segment. O(1): blocks hold their page, so nothing else moves.
    fn split_out(&mut self, b: u32) -> Option<Change> {
        let blk = self.blocks[b as usize];
        debug_assert!(blk.free && !blk.heap);
        let pg = self.pg as u64;
        let (g0, g1) = (self.start_of(&blk), self.start_of(&blk) + blk.len as u64);
        let (p0, p1) = (g0.div_ceil(pg), g1 / pg);
        if p1 <= p0 {
            self.insert_free(b);
            return None;
        }
        let left = (p0 * pg - g0) as u32;
        let right = (g1 - p1 * pg) as u32;
        let (p0, p1) = (p0 as u32, p1 as u32);
        // What is before the pages: `b` keeps it and now ends its segment.
        let mut spare = NIL;
        if left > 0 {
            let u = &mut self.blocks[b as usize];
            u.len = left;
            u.next = NIL;
        } else {
            if blk.prev != NIL {
                self.blocks[blk.prev as usize].next = NIL;
            }
            spare = b;
        }
        // What is after them starts a segment at p1.
        let mut right_block = NIL;
        if right > 0 {
            let r = Block {
                page: p1,
                off: 0,
                len: right,
                prev: NIL,
                next: blk.next,
                free: true,
                heap: false,
                binsec: 0,
                links: Link::UNLINKED,
            };
            let r = if spare != NIL {
                self.blocks[spare as usize] = r;
                std::mem::replace(&mut spare, NIL)
            } else {
                self.new_block(r)
            };
            if blk.next != NIL {
                self.blocks[blk.next as usize].prev = r;
            }
            self.page_to(p1, PageKind::Large, r);
            self.insert_free(r);
            right_block = r;
        } else if blk.next != NIL {
            self.blocks[blk.next as usize].prev = NIL;
            self.page_to(p1, PageKind::Large, blk.next);
        }
        if left > 0 {
            self.insert_free(b);
        }
        if spare != NIL {
            self.drop_block(spare);
        }
        self.pages_free(p0, p1 - p0);
        Some(Change::Split {
            b,
            orig: blk,
            right: right_block,
            p0,
            p1,
        })
    }

    /// Undoes the changes of the journal after its first `mark`, newest first. The memory
    /// the changes concern must be free again (the failed request or batch given back).
    fn undo_to(&mut self, mark: usize) {
        while self.journal.len() > mark {
            match self.journal.pop().expect("not empty") {
                Change::Split {
                    b,
                    orig,
                    right,
                    p0,
                    p1,
                } => {
                    self.free_pages.take_range(p0, p1 - p0);
                    let pg = self.pg as u64;
                    let g0 = self.start_of(&orig);
                    let has_left = g0 < p0 as u64 * pg;
                    if has_left {
                        self.remove_free(b);
                    }
                    if right != NIL {
                        self.remove_free(right);
                        if right != b {
                            self.drop_block(right);
                        }
                    }
                    if !has_left && right == NIL {
                        // `b` was dropped: take its slot back
                        let i = self
                            .vacant_blocks
                            .iter()
                            .rposition(|&x| x == b)
                            .expect("the split block's slot is vacant");
                        self.vacant_blocks.swap_remove(i);
                    }
                    self.blocks[b as usize] = Block {
                        links: Link::UNLINKED,
                        ..orig
                    };
                    for q in p0..p1 {
                        self.page_to(q, PageKind::Covered, NIL);
                    }
                    if orig.prev != NIL {
                        self.blocks[orig.prev as usize].next = b;
                    } else {
                        self.page_to(orig.page, PageKind::Large, b);
                    }
                    if orig.next != NIL {
                        self.blocks[orig.next as usize].prev = b;
                    }
                    if right != NIL || orig.next != NIL {
                        // p1 is inside the segment again
                        self.page_to(p1, PageKind::Covered, NIL);
                    }
                    self.insert_free(b);
                }
                Change::Extend { b, p, n } => {
                    debug_assert!(self.blocks[b as usize].free);
                    self.remove_free(b);
                    self.blocks[b as usize].len -= n << self.gshift;
                    self.pages_free(p, n);
                    self.insert_free(b);
                }
                Change::Grow { p } => {
                    self.free_pages.take_range(p, 1);
                    self.give_back(&[p]);
                }
            }
        }
    }

    /// Gives whole free pages inside large segments back to the free pages, from the largest
    /// free blocks down, until `want` pages are free or none are left. Called before the pool
    /// would grow (or fail) for pages, and before pages are given back to the device.
    fn reclaim(&mut self, want: u64) {
        if self.free_pages.free_units() >= want || self.primary[LARGE].is_empty() {
            return;
        }
        let lowest = bin_of(self.pg);
        let mut top = NUM_BINS - 1;
        while self.free_pages.free_units() < want {
            // the next non-empty bin down (the bitmap skips the empty ones)
            let Some(bin) = self.primary[LARGE]
                .last_at_or_below(top)
                .filter(|&b| b >= lowest)
            else {
                break;
            };
            top = bin - 1; // bin >= lowest >= 1
            let items: SmallVec<[u32; 16]> = self.primary[LARGE]
                .iter(&BlockLinksRef(&self.blocks), bin)
                .collect();
            for b in items {
                if self.free_pages.free_units() >= want {
                    break;
                }
                if self.blocks[b as usize].page == self.evacuating {
                    continue;
                }
                self.remove_free(b);
                if let Some(c) = self.split_out(b) {
                    self.journal.push(c);
                }
            }
        }
    }

    /// Every whole free page inside large segments back to the free pages, for good (not a
    /// request's change: nothing to undo).
    fn reclaim_all(&mut self) {
        let mark = self.journal.len();
        self.reclaim(u64::MAX);
        self.journal.truncate(mark);
    }

    /// Merges blocks marked free by `release_slot_into` with their free neighbours, one pass
    /// per run of free blocks (freeing a batch of neighbours costs one bin insert, not one
    /// merge each), then bins each run or gives its page or segment back.
    fn merge_pending(&mut self, pending: &[u32]) {
        let mut starts: SmallVec<[u32; 8]> = SmallVec::new();
        for &b in pending {
            if self.blocks[b as usize].page == NIL {
                continue; // absorbed into a run already
            }
            // the run's first block
            let mut s = b;
            loop {
                let pv = self.blocks[s as usize].prev;
                if pv != NIL && self.blocks[pv as usize].free {
                    s = pv;
                } else {
                    break;
                }
            }
            let links = self.blocks[s as usize].links;
            if links.prev == PENDING && links.next == PENDING {
                continue; // the start of a run merged already
            }
            if links.prev != PENDING {
                self.remove_free(s); // a free block from before, in its bins
            }
            // absorb every free block to its right
            loop {
                let nx = self.blocks[s as usize].next;
                if nx == NIL || !self.blocks[nx as usize].free {
                    break;
                }
                if self.blocks[nx as usize].links.prev != PENDING {
                    self.remove_free(nx);
                }
                self.absorb_next(s);
            }
            self.blocks[s as usize].links = Link {
                prev: PENDING,
                next: PENDING,
            };
            starts.push(s);
        }
        for s in starts {
            self.blocks[s as usize].links = Link::UNLINKED;
            self.settle_free(s);
        }
    }

    /// The virtual address of granule `off` of page `p` in the direct map.
    fn direct_addr(&self, p: u32, off: u32) -> u64 {
        self.direct_base + ((p as u64) << self.page_shift) + off as u64 * GRANULE
    }

    // --------------------------------------------------------------------------------------
    // Placement

    fn block_len(&self) -> impl Fn(u32) -> u32 + '_ {
        |i| self.blocks[i as usize].len
    }

    /// A small request: good fit in the heap pages, else a new heap page. Relaxed (on the way
    /// to out of memory): a free block of a large page will do too.
    #[inline]
    fn place_small(&mut self, units: u32, a: u32, relaxed: bool) -> Option<Layout> {
        if let Some(b) = self.primary[HEAP].find_fit(
            &BlockLinksRef(&self.blocks),
            units,
            HEAP_SCAN,
            self.block_len(),
        ) {
            self.remove_free(b);
            return Some(Layout::Block(self.carve(b, 0, units, a)));
        }
        self.reclaim(1);
        if self.ensure_pages(1) {
            let p = self.free_pages.alloc(1).expect("a free page");
            let b = self.open_segment(p, 1, PageKind::Heap);
            return Some(Layout::Block(self.carve(b, 0, units, a)));
        }
        if relaxed {
            return self.place_in_large_block(units, a);
        }
        None
    }

    /// A request in a free block of a large segment (good fit). A block at a segment's start
    /// is used from its end and any other from its start, so what is left keeps touching the
    /// segment's end or start and stays usable as a head or tail.
    #[inline(always)]
    fn place_in_large_block(&mut self, units: u32, a: u32) -> Option<Layout> {
        let links = BlockLinksRef(&self.blocks);
        let b = if self.under_pressure() {
            self.primary[LARGE].find_best(&links, units, BEST_SCAN, self.block_len())
        } else {
            self.primary[LARGE].find_fit(&links, units, LARGE_SCAN, self.block_len())
        }?;
        self.remove_free(b);
        let blk = self.blocks[b as usize];
        let at = if blk.prev == NIL { blk.len - units } else { 0 };
        Some(Layout::Block(self.carve(b, at, units, a)))
    }

    /// A large request: a free block of a large segment that holds it; else a new segment
    /// over a run of free pages that holds it; else head + whole pages + tail, stitched, with
    /// the whole free pages inside segments reclaimed before the pool grows for them.
    fn place_large(&mut self, units: u64, a: u32, relaxed: bool) -> Option<Layout> {
        let pg = self.pg as u64;
        if units <= MAX_BLOCK {
            if let Some(l) = self.place_in_large_block(units as u32, a) {
                return Some(l);
            }
        }
        // Stitched: first make the whole free pages inside segments usable.
        self.reclaim(units.div_ceil(pg) + 1);
        // Head: a free page end that the request can use whole, the largest near enough (if the
        // pages after it are free, the allocation is contiguous: no window, nothing to map).
        // Tail: a free page start that fits it closely, else (NIL) the start of a fresh page.
        let (head, mut tail) = self.pick_head_tail(units);
        let h = self.len_or_0(head);
        let rest = units - h;
        let full = (rest / pg) as u32;
        let t = (rest % pg) as u32;
        let fresh_tail = t > 0 && tail == NIL;
        let mut need = full + fresh_tail as u32;
        if !self.ensure_pages(need) {
            if !relaxed {
                return None;
            }
            // Short of pages: any free page start that holds the tail saves one; a request
            // below a page may also take a free block of a heap page.
            let mut ok = false;
            if fresh_tail {
                if let Some(b) =
                    self.secondary[PREFIX].find_fit(&self.sec_links, t, SCAN, self.block_len())
                {
                    tail = b;
                    need -= 1;
                    ok = self.ensure_pages(need);
                }
            }
            if !ok {
                if units < pg {
                    let b = self.primary[HEAP].find_fit(
                        &BlockLinksRef(&self.blocks),
                        units as u32,
                        SCAN,
                        self.block_len(),
                    )?;
                    self.remove_free(b);
                    return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
                }
                return None;
            }
        }
        // A layout that would need the window (its pages do not follow its head), while the
        // pool holds free pages aplenty: a free run that holds the whole request instead, as a
        // new segment (contiguous: nothing to map). Not when pages are scarce: there the head
        // and tail save pages (fill to failure fell from 99.60 to 98.97 % ungated).
        if units <= MAX_BLOCK
            && need > 0
            && self.free_pages.free_units() * RUN_FIRST_DIV
                >= self.counters.reserved_bytes >> self.page_shift
        {
            let head_ok = head != NIL
                && self
                    .free_pages
                    .run_at(self.page_after(&self.blocks[head as usize]))
                    >= need;
            let whole = units.div_ceil(pg) as u32;
            if !head_ok {
                if let Some(p) = self.free_pages.alloc(whole) {
                    let b = self.open_segment(p, whole, PageKind::Large);
                    return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
                }
            }
        }
        // Commit.
        let mut runs: SmallVec<[(u32, u32); 4]> = SmallVec::new();
        if need > 0 {
            let next_to_head = if head == NIL {
                None
            } else {
                Some(self.page_after(&self.blocks[head as usize]))
            };
            match next_to_head {
                Some(p) if self.free_pages.alloc_at(p, need) => runs.push((p, need)),
                _ => {
                    let ok = self.free_pages.alloc_scattered(need, &mut runs);
                    debug_assert!(ok);
                }
            }
        }
        // Contiguous (the pages follow the head, or there is no head and they are one run, and
        // the tail is the start of their last page): one block of a large segment, extended
        // over the pages, instead of a stitch. Its free is then a block's free, and its pages
        // stay in the segment until a request needs them whole (`reclaim`).
        if (t == 0 || (fresh_tail && tail == NIL)) && units <= MAX_BLOCK && runs.len() <= 1 {
            if head != NIL {
                let after = self.page_after(&self.blocks[head as usize]);
                let pages = match runs.first() {
                    None => Some((after, 0)),
                    Some(&(p, n)) if p == after => Some((p, n)),
                    Some(_) => None,
                };
                if let Some((p, n)) = pages {
                    self.remove_free(head);
                    for q in p..p + n {
                        self.page_to(q, PageKind::Covered, NIL);
                    }
                    self.blocks[head as usize].len += n << self.gshift;
                    if n > 0 {
                        self.journal.push(Change::Extend { b: head, p, n });
                    }
                    return Some(Layout::Block(self.carve(head, 0, units as u32, a)));
                }
            } else if let Some(&(p, n)) = runs.first() {
                let b = self.open_segment(p, n, PageKind::Large);
                return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
            }
        }
        let mut tail_page = NIL;
        if fresh_tail && tail == NIL {
            let last = runs.last_mut().expect("the tail's page");
            tail_page = last.0 + last.1 - 1;
            last.1 -= 1;
            if last.1 == 0 {
                runs.pop();
            }
        }
        if head != NIL {
            self.remove_free(head);
            self.take_whole(head, a);
        }
        if tail_page != NIL {
            let b = self.open_segment(tail_page, 1, PageKind::Large);
            tail = self.carve(b, 0, t, a);
        } else if tail != NIL {
            self.remove_free(tail);
            tail = self.carve(tail, 0, t, a);
        }
        Some(self.new_stitch(Stitch {
            head,
            runs,
            tail,
            window: NIL,
            window_len: 0,
        }))
    }

    fn new_stitch(&mut self, st: Stitch) -> Layout {
        let i = match self.vacant_stitches.pop() {
            Some(i) => {
                self.stitches[i as usize] = st;
                i
            }
            None => {
                self.stitches.push(st);
                (self.stitches.len() - 1) as u32
            }
        };
        Layout::Stitched(i)
    }

    #[inline]
    fn len_or_0(&self, b: u32) -> u64 {
        if b == NIL {
            0
        } else {
            self.blocks[b as usize].len as u64
        }
    }

    /// Whether the pool is under pressure (see `PRESSURE_DIV`): the pages it could still get
    /// from the device within its limit, with the free pages it holds, are under an eighth of
    /// that limit. (Other pools of the same device are not counted: the PMM's lock is not
    /// taken on the hot path.)
    #[inline]
    fn under_pressure(&self) -> bool {
        let max = self.max_size();
        let room = max.saturating_sub(self.counters.reserved_bytes)
            + (self.free_pages.free_units() << self.page_shift);
        room * PRESSURE_DIV < max
    }

    /// The free page start that a tail of a request of `units` after a head of `h` granules
    /// would take, with the granules it would leave unused: `(0, NIL)` when there is no tail,
    /// `(u64::MAX, NIL)` when none is close enough (the tail takes a fresh page).
    fn tail_for(&self, units: u64, h: u64, best: bool) -> (u64, u32) {
        let t = ((units - h) % self.pg as u64) as u32;
        if t == 0 {
            return (0, NIL);
        }
        let prefix = &self.secondary[PREFIX];
        let b = if best {
            prefix.find_best(&self.sec_links, t, TAIL_SCAN, self.block_len())
        } else {
            prefix.find_fit(&self.sec_links, t, SCAN, self.block_len())
        };
        match b {
            Some(b) if self.blocks[b as usize].len - t <= self.slack_units => {
                ((self.blocks[b as usize].len - t) as u64, b)
            }
            _ => (u64::MAX, NIL),
        }
    }

    /// The head and tail of a large request laid out over whole pages (NIL: none, or a fresh
    /// page for the tail): the head from `pick_head` and the tail that fits after it; under
    /// pressure, unless that tail fits exactly, the next `PAIR_SCAN` free page ends that the
    /// request can use whole are tried too, from the largest down, for the head whose tail
    /// leaves the least of its free page start unused.
    fn pick_head_tail(&self, units: u64) -> (u32, u32) {
        let head = self.pick_head(units);
        let pressure = self.under_pressure();
        let (mut waste, mut tail) = self.tail_for(units, self.len_or_0(head), pressure);
        if waste == 0 || !pressure {
            return (head, tail);
        }
        let mut best_head = head;
        let n = units.min(u32::MAX as u64) as u32;
        let suffix = &self.secondary[SUFFIX];
        let mut left = PAIR_SCAN;
        let mut top = bin_of(n);
        'bins: while let Some(bin) = suffix.last_at_or_below(top) {
            for c in suffix.iter(&self.sec_links, bin) {
                if left == 0 {
                    break 'bins;
                }
                if c == head || self.blocks[c as usize].len > n {
                    continue;
                }
                left -= 1;
                let (w, tl) = self.tail_for(units, self.len_or_0(c), true);
                if w < waste {
                    (waste, tail, best_head) = (w, tl, c);
                    if w == 0 {
                        break 'bins;
                    }
                }
            }
            if bin == 0 {
                break;
            }
            top = bin - 1;
        }
        (best_head, tail)
    }

    /// See `place_large`: the largest free page end of at most `units`, near enough (looks
    /// at most at `SCAN` candidates). (Looking further for one whose next pages are free, so
    /// that the allocation is contiguous, found one for 0.25 stitched requests in 80 on the
    /// mixed churn: dropped.)
    fn pick_head(&self, units: u64) -> u32 {
        let n = units.min(u32::MAX as u64) as u32;
        self.secondary[SUFFIX]
            .find_at_most(&self.sec_links, n, SCAN, self.block_len())
            .filter(|&b| self.blocks[b as usize].len <= n)
            .unwrap_or(NIL)
    }

    /// The pages of a stitched layout in mapping order, as physically consecutive segments,
    /// each given to `seg(first page, pages)`.
    #[inline]
    fn for_segments(&self, st: &Stitch, mut seg: impl FnMut(u32, u32)) {
        let mut cur: Option<(u32, u32)> = None;
        let mut push = |p: u32, n: u32| match &mut cur {
            Some(last) if last.0 + last.1 == p => last.1 += n,
            _ => {
                if let Some((q, m)) = cur.replace((p, n)) {
                    seg(q, m);
                }
            }
        };
        if st.head != NIL {
            // it ends its segment, so at a page boundary
            let blk = &self.blocks[st.head as usize];
            push(blk.page, self.page_after(blk) - blk.page);
        }
        for &(s, l) in &st.runs {
            push(s, l);
        }
        if st.tail != NIL {
            push(self.blocks[st.tail as usize].page, 1);
        }
        if let Some((q, m)) = cur {
            seg(q, m);
        }
    }

    /// Gives a placed layout its address: the direct map when its pages are consecutive,
    /// else pages of the stitching window, mapped.
    #[inline]
    fn address(&mut self, layout: Layout) -> Result<u64> {
        match layout {
            Layout::None | Layout::Member(_) => unreachable!("not a placed layout"),
            Layout::Block(b) => {
                let blk = self.blocks[b as usize];
                Ok(self.direct_addr(blk.page, blk.off))
            }
            Layout::Stitched(i) => self.stitch_address(i),
        }
    }

    fn stitch_address(&mut self, i: u32) -> Result<u64> {
        let st = &self.stitches[i as usize];
        let head_off = if st.head == NIL {
            0
        } else {
            self.blocks[st.head as usize].off
        };
        // (counted in place: a vector of the segments, built and moved for every stitched
        // request, was a quarter of an always-stitched pair; it is built only to map)
        let (mut count, mut first, mut total) = (0u32, 0u32, 0u32);
        self.for_segments(st, |p, n| {
            if count == 0 {
                first = p;
            }
            count += 1;
            total += n;
        });
        if count == 1 {
            return Ok(self.direct_addr(first, head_off));
        }
        let w = self
            .window_take(total)
            .ok_or_else(|| Error::OutOfMemory("the pool's stitching window is exhausted".into()))?;
        let ps = self.cfg.page_size;
        let base = self.window_base + ((w as u64) << self.page_shift);
        if self.maps {
            let mut segs: SmallVec<[(u32, u32); 8]> = SmallVec::new();
            self.for_segments(&self.stitches[i as usize], |p, n| segs.push((p, n)));
            let mut va = base;
            for &(p, n) in &segs {
                let len = n as u64 * ps;
                if let Err(e) = self.dev.backend.map(va, (p as u64) << self.page_shift, len) {
                    let _ = self.dev.backend.unmap(base, va - base);
                    self.window_give(w, total);
                    return Err(e);
                }
                va += len;
            }
        }
        let st = &mut self.stitches[i as usize];
        st.window = w;
        st.window_len = total;
        self.counters.stitched += 1;
        Ok(base + head_off as u64 * GRANULE)
    }

    /// Window pages for a stitched allocation: a cached range of that length, else from the
    /// runs, else (the runs being short) after giving every cached range back.
    #[inline]
    fn window_take(&mut self, n: u32) -> Option<u32> {
        if let Some(w) = self.window_cache.get_mut(n as usize).and_then(|v| v.pop()) {
            return Some(w);
        }
        self.window.alloc(n).or_else(|| {
            self.window_flush();
            self.window.alloc(n)
        })
    }

    #[inline]
    fn window_give(&mut self, w: u32, n: u32) {
        match self.window_cache.get_mut(n as usize) {
            Some(v) => v.push(w),
            None => self.window.free(w, n),
        }
    }

    fn window_flush(&mut self) {
        for n in 0..self.window_cache.len() {
            for w in std::mem::take(&mut self.window_cache[n]) {
                self.window.free(w, n as u32);
            }
        }
    }

    /// Returns a layout's memory: blocks, pages and window.
    #[inline(always)]
    fn unplace(&mut self, layout: Layout) {
        match layout {
            Layout::None => {}
            Layout::Member(g) => {
                let x = &mut self.allocs[g as usize];
                x.members -= 1;
                if x.members == 0 {
                    // the last member: the group's memory goes back
                    self.release_group_memory(g);
                }
            }
            Layout::Block(b) => self.release_block(b),
            Layout::Stitched(i) => {
                let st = std::mem::take(&mut self.stitches[i as usize]);
                self.vacant_stitches.push(i);
                if st.window != NIL {
                    if self.maps {
                        let va = self.window_base + ((st.window as u64) << self.page_shift);
                        let len = (st.window_len as u64) << self.page_shift;
                        let r = self.dev.backend.unmap(va, len);
                        debug_assert!(r.is_ok(), "unmap failed: {r:?}");
                    }
                    self.window_give(st.window, st.window_len);
                }
                if st.head != NIL {
                    self.release_block(st.head);
                }
                for (s, l) in st.runs {
                    self.free_pages.free(s, l);
                }
                if st.tail != NIL {
                    self.release_block(st.tail);
                }
            }
        }
    }

    // --------------------------------------------------------------------------------------
    // Allocation slots

    #[inline]
    fn new_slot(&mut self) -> u32 {
        if let Some(i) = self.vacant_allocs.pop() {
            i
        } else {
            self.allocs.push(Alloc {
                generation: 0,
                state: State::Vacant,
                size: 0,
                ptr: 0,
                stream: 0,
                movable: false,
                pins: 0,
                scope: 0,
                fence: 0,
                layout: Layout::None,
                members: 0,
            });
            (self.allocs.len() - 1) as u32
        }
    }

    fn id(&self, a: u32) -> AllocId {
        AllocId {
            index: a,
            generation: self.allocs[a as usize].generation,
        }
    }

    fn info_of(&self, a: u32) -> AllocInfo {
        let x = &self.allocs[a as usize];
        AllocInfo {
            id: self.id(a),
            ptr: x.ptr,
            size: x.size,
            rounded: x.units() * GRANULE,
            stream: x.stream,
            freeing: x.state == State::Freeing,
            movable: x.movable,
            stitched: self.is_stitched(x.layout),
            pins: x.pins,
            scope: x.scope,
        }
    }

    /// Whether a layout (a member's: its group's) is mapped through the stitching window.
    fn is_stitched(&self, layout: Layout) -> bool {
        match layout {
            Layout::Stitched(i) => self.stitches[i as usize].window != NIL,
            Layout::Member(g) => self.is_stitched(self.allocs[g as usize].layout),
            _ => false,
        }
    }

    /// The slot of a handle naming a live allocation.
    #[inline]
    fn resolve(&self, id: AllocId) -> Result<u32> {
        match self.allocs.get(id.index as usize) {
            Some(x) if x.generation == id.generation && x.state == State::Live => Ok(id.index),
            Some(x) if x.generation == id.generation && x.state == State::Freeing => {
                Err(Error::InvalidFree(format!(
                    "allocation {:#x} was already freed on stream {} (fence {})",
                    x.ptr, x.stream, x.fence
                )))
            }
            Some(x) if x.generation > id.generation || x.state == State::Vacant => {
                Err(Error::InvalidFree(
                    "allocation was already freed (double free or stale handle)".into(),
                ))
            }
            _ => Err(Error::InvalidHandle(format!(
                "no allocation {:#x} in this pool",
                id.to_bits()
            ))),
        }
    }

    /// A request's size in granules; a size of 0 or above `max_size()` is refused.
    #[inline(always)]
    fn validate_size(&self, size: u64) -> Result<u64> {
        if size.wrapping_sub(1) >= self.max_bytes {
            return Err(self.size_error(size));
        }
        Ok(size.div_ceil(GRANULE))
    }

    #[cold]
    #[inline(never)]
    fn size_error(&self, size: u64) -> Error {
        if size == 0 {
            return invalid_size("allocation size must be at least 1 byte".into());
        }
        invalid_size(format!(
            "cannot allocate {}: larger than the pool can ever hold ({})",
            format_size(size),
            format_size(self.max_bytes)
        ))
    }

    /// The sizes of a batch, checked (the first bad one's error, as `validate_size` gives it),
    /// rounded and summed in granules (saturating: a sum too large is refused later).
    fn batch_units(&self, sizes: &[u64]) -> Result<u64> {
        let mut total = 0u64;
        for &size in sizes {
            total = total.saturating_add(self.validate_size(size)?);
        }
        Ok(total)
    }

    // --------------------------------------------------------------------------------------
    // Public operations

    /// Allocates `req.size` bytes. On failure nothing is allocated; the error says why.
    pub fn alloc(&mut self, req: Request) -> Result<(AllocId, u64)> {
        self.alloc_req(req, true)
    }

    /// The counters placing a request may change (pages taken); a refused request puts them
    /// back (not a clone of every counter: this is the hot path).
    #[inline]
    fn page_counts(&self) -> [u64; 4] {
        let c = &self.counters;
        [
            c.reserved_bytes,
            c.peak_reserved,
            c.pages_taken,
            c.pages_released,
        ]
    }

    #[inline]
    fn restore_page_counts(&mut self, saved: [u64; 4]) {
        let c = &mut self.counters;
        [
            c.reserved_bytes,
            c.peak_reserved,
            c.pages_taken,
            c.pages_released,
        ] = saved;
    }

    /// A request on `stream`: remembers whether requests have come on more than one stream.
    #[inline]
    fn note_stream(&mut self, stream: u64) {
        match self.first_stream {
            Some(s) if s != stream => self.streams_mixed = true,
            None => self.first_stream = Some(stream),
            _ => {}
        }
    }

    /// `alloc`; `reuse`: a pending free on the request's stream may serve it.
    #[inline]
    fn alloc_req(&mut self, req: Request, reuse: bool) -> Result<(AllocId, u64)> {
        self.open()?;
        let units = self.validate_size(req.size)?;
        self.note_stream(req.stream);
        self.counters.calls += 1;
        let timed = self.counters.calls % LATENCY_SAMPLE == 0;
        let t0 = timed.then(Instant::now);
        let (id, ptr) = self.alloc_inner(req, units, reuse);
        if let Some(t0) = t0 {
            self.latency.record(t0.elapsed().as_nanos() as u64);
        }
        self.check();
        if ptr == 0 {
            return Err(self
                .alloc_error
                .take()
                .expect("a refused request leaves its error"));
        }
        Ok((AllocId::from_bits(id), ptr))
    }

    /// `alloc_req`'s work: (handle bits, pointer), or pointer 0 with the error left in
    /// `alloc_error` (a 16-byte pair comes back in registers; the 32-byte `Result` came back
    /// through memory and was copied with loads wider than its stores, a stall of about 4 ns
    /// an allocation in perf).
    fn alloc_inner(&mut self, req: Request, units: u64, reuse: bool) -> (u64, u64) {
        if reuse {
            if let Some((id, ptr)) = self.reuse(req, units) {
                return (id.to_bits(), ptr);
            }
        }
        match self.cache.take(units) {
            Lookup::Hit(a) => return self.take_cached(a, req, units),
            Lookup::Stale(w) => self.evict_way(w, units),
            Lookup::Miss => {}
        }
        // Memory freed on streams whose work has finished (CUDA events) comes back before the
        // pool would grow for it, and every 64 calls otherwise. (Not between the requests of
        // a batch, which polls before its first: a refused batch undoes its page changes by
        // the block they made, which frees in between could merge away.)
        if !self.events.is_empty()
            && !self.batching
            && (self.free_pages.free_units() == 0 || self.counters.calls % 64 == 0)
        {
            self.poll();
        }
        let saved = self.page_counts();
        let mark = self.journal.len();
        let a = self.new_slot();
        let mut placed = self.place(units, a, false);
        if placed.is_none() && !self.cache.is_empty() && !self.quick {
            // it would grow the pool (which `grow` refuses while the cache holds memory): the
            // cached blocks go back first
            self.undo_to(mark);
            self.flush_cache();
            placed = self.place(units, a, false);
        }
        let layout = match placed {
            Some(l) => l,
            None if self.quick => {
                self.quick_miss = true;
                self.vacant_allocs.push(a);
                self.undo_to(mark);
                return self.refuse(Error::OutOfMemory(String::new()));
            }
            None => {
                // The way to out of memory: compact what may move, then use anything. (Not
                // inside a batch: a refused batch is undone exactly, which a move into pages
                // taken for the batch would prevent.)
                if !self.batching && self.has_movable() {
                    // (the first attempt's page changes are undone first: compaction moves
                    // the blocks they name)
                    self.undo_to(mark);
                    self.defrag_inner();
                }
                match self.place(units, a, true) {
                    Some(l) => l,
                    None => {
                        self.vacant_allocs.push(a);
                        self.undo_to(mark);
                        self.counters.failures += 1;
                        let e = self.oom_error(req.size);
                        return self.refuse(e);
                    }
                }
            }
        };
        let ptr = match self.address(layout) {
            Ok(p) => p,
            Err(e) => {
                // The backend refused the mapping: undo the placement, give back any page
                // taken for it, and leave the counters as they were (one failure counted).
                self.abandon(Some(layout), a, mark, saved);
                self.counters.failures += 1;
                return self.refuse(e);
            }
        };
        if !self.batching {
            self.journal.clear();
        }
        let x = &mut self.allocs[a as usize];
        x.ptr = ptr;
        x.layout = layout;
        self.go_live(a, req, units)
    }

    /// Slot `a` (its pointer and layout set) becomes the live allocation `req` asked for.
    /// Returns (handle bits, pointer). (Inlined into both callers: as a call it cost about
    /// 15 instructions an allocation.)
    #[inline(always)]
    fn go_live(&mut self, a: u32, req: Request, units: u64) -> (u64, u64) {
        let x = &mut self.allocs[a as usize];
        x.state = State::Live;
        x.size = req.size;
        x.stream = req.stream;
        x.movable = req.movable;
        x.pins = 0;
        x.scope = req.scope;
        let ptr = x.ptr;
        if let Some(m) = &mut self.by_ptr {
            m.insert(ptr, a);
        }
        self.count_alloc(req.size, units);
        if req.scope != 0 {
            let g = self.allocs[a as usize].generation;
            if let Some(v) = self.scopes.get_mut(&req.scope) {
                v.push((a, g));
            }
        }
        debug_assert!(ptr != 0, "a pool address is never 0");
        (self.id(a).to_bits(), ptr)
    }

    /// A request served by cached slot `a`, whose block has exactly its rounded size.
    #[inline]
    fn take_cached(&mut self, a: u32, req: Request, units: u64) -> (u64, u64) {
        debug_assert!(self.allocs[a as usize].state == State::Cached);
        debug_assert_eq!(self.allocs[a as usize].units(), units);
        self.counters.cache_hits += 1;
        self.go_live(a, req, units)
    }

    /// Gives every cached block back: merged with its free neighbours and binned, its slot
    /// vacant.
    fn flush_cache(&mut self) {
        if self.cache.is_empty() {
            return;
        }
        for a in self.cache.drain() {
            self.uncache(a);
        }
    }

    /// Gives back the blocks of stale way `w` of the cache, which now follows `units`.
    #[cold]
    fn evict_way(&mut self, w: usize, units: u64) {
        let (slots, n) = self.cache.evict(w, units);
        for &a in &slots[..n] {
            self.uncache(a);
        }
    }

    /// Cached slot `a` gives its block back; the slot is vacant.
    fn uncache(&mut self, a: u32) {
        let x = &mut self.allocs[a as usize];
        debug_assert!(x.state == State::Cached);
        let layout = std::mem::replace(&mut x.layout, Layout::None);
        x.state = State::Vacant;
        self.unplace(layout);
        self.vacant_allocs.push(a);
    }

    /// Undoes a placement for slot `a` that will not be kept: its memory goes back (merged
    /// exactly as it was split: no eager page release in between), the slot is vacant again,
    /// the page changes after `mark` are undone and the page counters are as `saved`.
    fn abandon(&mut self, layout: Option<Layout>, a: u32, mark: usize, saved: [u64; 4]) {
        if let Some(layout) = layout {
            let eager = std::mem::replace(&mut self.eager, false);
            self.unplace(layout);
            self.eager = eager;
        }
        self.vacant_allocs.push(a);
        self.undo_to(mark);
        self.restore_page_counts(saved);
    }

    /// Pages of the stitching window held in `window_cache` (free, not in `window`).
    fn window_cached_pages(&self) -> u64 {
        self.window_cache
            .iter()
            .enumerate()
            .map(|(n, v)| n as u64 * v.len() as u64)
            .sum()
    }

    /// A refused request: its error waits in `alloc_error` for `alloc_req`.
    #[cold]
    fn refuse(&mut self, e: Error) -> (u64, u64) {
        self.alloc_error = Some(e);
        (0, 0)
    }

    /// `alloc` when it is quick: served from the pages the pool holds, without growing it or
    /// compacting. `None` when it is not (nothing changed; call `alloc`). The bindings run
    /// this under the GIL, since releasing and taking back the GIL costs more than the call.
    #[inline]
    pub fn try_alloc_quick(&mut self, req: Request) -> Option<Result<(AllocId, u64)>> {
        self.quick = true;
        self.quick_miss = false;
        let calls = self.counters.calls;
        let r = self.alloc(req);
        self.quick = false;
        if self.quick_miss {
            self.counters.calls = calls;
            self.cache.retry_next();
            return None;
        }
        Some(r)
    }

    /// Whether a free is quick (no scrub, no pages to give back): see `try_alloc_quick`.
    pub fn frees_are_quick(&self) -> bool {
        !self.cfg.scrub && self.cfg.release_threshold.is_none()
    }

    /// After a refused request (its pages given back by `undo_to`): counters as `saved` but
    /// for one more failure.
    fn rollback(&mut self, saved: Counters) {
        let failures = self.counters.failures;
        let calls = self.counters.calls;
        self.counters = saved;
        self.counters.failures = failures + 1;
        self.counters.calls = calls;
    }

    fn place(&mut self, units: u64, a: u32, relaxed: bool) -> Option<Layout> {
        if units < self.small_units {
            self.place_small(units as u32, a, relaxed)
        } else {
            self.place_large(units, a, relaxed)
        }
    }

    #[inline]
    fn count_alloc(&mut self, size: u64, units: u64) {
        let c = &mut self.counters;
        c.allocs += 1;
        c.live_bytes += size;
        c.used_bytes += units * GRANULE;
        c.peak_live = c.peak_live.max(c.live_bytes);
        c.peak_used = c.peak_used.max(c.used_bytes);
    }

    /// Same-stream reuse: memory freed on `req.stream` and still waiting for its fence may
    /// serve a request of the same rounded size on that stream at once (work on one stream
    /// runs in order).
    #[inline]
    fn reuse(&mut self, req: Request, units: u64) -> Option<(AllocId, u64)> {
        if self.streams.is_empty() {
            return None;
        }
        let st = self.streams.get_mut(&req.stream)?;
        let v = st.reuse.get_mut(&units)?;
        while let Some((a, g)) = v.pop() {
            let x = &mut self.allocs[a as usize];
            if x.generation == g && x.state == State::Freeing && x.stream == req.stream {
                x.generation += 1;
                x.state = State::Live;
                x.size = req.size;
                x.movable = req.movable;
                x.scope = req.scope;
                let ptr = x.ptr;
                self.counters.freeing_bytes -= units * GRANULE;
                self.counters.used_bytes -= units * GRANULE;
                self.counters.reused += 1;
                self.count_alloc(req.size, units);
                if req.scope != 0 {
                    if let Some(s) = self.scopes.get_mut(&req.scope) {
                        s.push((a, g + 1));
                    }
                }
                return Some((self.id(a), ptr));
            }
        }
        None
    }

    /// Frees an allocation now.
    pub fn free(&mut self, id: AllocId) -> Result<()> {
        self.open()?;
        let a = self.resolve(id)?;
        self.check_unpinned(a)?;
        let x = &self.allocs[a as usize];
        self.counters.live_bytes -= x.size;
        self.counters.frees += 1;
        self.finish_free(a);
        self.after_free();
        self.check();
        Ok(())
    }

    #[inline]
    fn check_unpinned(&self, a: u32) -> Result<()> {
        let x = &self.allocs[a as usize];
        if x.pins > 0 {
            return Err(Error::InvalidState(format!(
                "allocation {:#x} has {} live views (buffers or DLPack capsules); release them \
                 before freeing it",
                x.ptr, x.pins
            )));
        }
        Ok(())
    }

    /// The memory of slot `a` (live or freeing) goes back; the slot becomes vacant.
    #[inline]
    fn finish_free(&mut self, a: u32) {
        self.unindex(self.allocs[a as usize].ptr);
        self.release_slot(a);
    }

    /// `finish_free` of a slot whose pointer is no longer in the pointer index.
    #[inline]
    fn release_slot(&mut self, a: u32) {
        self.release_slot_into(a, None)
    }

    /// `release_slot`; with `pending`, a one-block layout is only marked free (not merged or
    /// binned) and its block listed there, for `merge_pending`.
    #[inline(always)]
    fn release_slot_into(&mut self, a: u32, pending: Option<&mut Vec<u32>>) {
        let x = &mut self.allocs[a as usize];
        let (ptr, units, freeing) = (x.ptr, x.units(), x.state == State::Freeing);
        x.generation = x.generation.wrapping_add(1);
        if self.cfg.scrub {
            let r = self.dev.backend.zero(ptr, units * GRANULE);
            debug_assert!(r.is_ok(), "scrub failed: {r:?}");
        }
        let x = &mut self.allocs[a as usize];
        let member = matches!(x.layout, Layout::Member(_));
        if pending.is_none()
            && self.cache_on
            && matches!(x.layout, Layout::Block(_))
            && self.cache.admit(units, a)
        {
            // kept whole for the next request of its size
            x.state = State::Cached;
        } else {
            let layout = std::mem::replace(&mut x.layout, Layout::None);
            x.state = State::Vacant;
            match (layout, pending) {
                (Layout::Block(b), Some(pending)) => {
                    let u = &mut self.blocks[b as usize];
                    u.free = true;
                    u.links = Link {
                        prev: PENDING,
                        next: NIL,
                    };
                    pending.push(b);
                }
                (layout, _) => self.unplace(layout),
            }
            self.vacant_allocs.push(a);
        }
        if !member {
            // a member's memory stays used until its group goes back (in `unplace`)
            self.counters.used_bytes -= units * GRANULE;
        }
        if freeing {
            self.counters.freeing_bytes -= units * GRANULE;
        }
    }

    /// Frees the allocation at `ptr` now. A pointer inside an allocation or outside every one
    /// is refused.
    pub fn free_ptr(&mut self, ptr: u64) -> Result<()> {
        let a = self.slot_of_ptr(ptr)?;
        self.free(self.id(a))
    }

    /// The handle of the live allocation at `ptr` (interior and foreign pointers refused).
    pub fn id_of(&mut self, ptr: u64) -> Result<AllocId> {
        self.slot_of_ptr(ptr).map(|a| self.id(a))
    }

    /// The pointer index, built now if this is the first lookup by pointer.
    fn ptr_index(&mut self) -> &PtrMap {
        let allocs = &self.allocs;
        self.by_ptr.get_or_insert_with(|| {
            let mut m = PtrMap::default();
            for (a, x) in allocs.iter().enumerate() {
                if matches!(x.state, State::Live | State::Freeing) {
                    m.insert(x.ptr, a as u32);
                }
            }
            m
        })
    }

    fn slot_of_ptr(&mut self, ptr: u64) -> Result<u32> {
        self.open()?;
        self.ptr_lookup();
        self.slot_of_indexed_ptr(ptr)
    }

    /// `slot_of_ptr` once the pool is known open and the pointer index built.
    #[inline]
    fn slot_of_indexed_ptr(&self, ptr: u64) -> Result<u32> {
        let index = self.by_ptr.as_ref().expect("the pointer index is built");
        if let Some(a) = index.get(ptr) {
            return match self.allocs[a as usize].state {
                State::Freeing => Err(Error::InvalidFree(format!(
                    "{ptr:#x} was already freed on stream {}",
                    self.allocs[a as usize].stream
                ))),
                _ => Ok(a),
            };
        }
        let inside = self.allocs.iter().find(|x| {
            matches!(x.state, State::Live | State::Freeing)
                && ptr > x.ptr
                && ptr < x.ptr + x.units() * GRANULE
        });
        Err(match inside {
            Some(x) => Error::InvalidFree(format!(
                "{ptr:#x} points inside the allocation at {:#x} (interior pointer)",
                x.ptr
            )),
            None => Error::InvalidFree(format!(
                "{ptr:#x} is not an allocation of this pool (foreign pointer or double free)"
            )),
        })
    }

    /// Frees on `stream`: the memory stays "freeing" until the returned fence completes
    /// (`complete` or `synchronize`); until then only `stream` may reuse it.
    pub fn free_async(&mut self, id: AllocId, stream: u64) -> Result<u64> {
        self.open()?;
        let a = self.resolve(id)?;
        self.check_unpinned(a)?;
        let fence = self.next_fence;
        self.next_fence += 1;
        let x = &mut self.allocs[a as usize];
        x.state = State::Freeing;
        x.stream = stream;
        x.fence = fence;
        let (g, units, size) = (x.generation, x.units(), x.size);
        let st = self.streams.entry(stream).or_default();
        st.pending.push_back((fence, a, g));
        st.reuse.entry(units).or_default().push((a, g));
        self.fence_stream.insert(fence, stream);
        if let Some(ev) = self.dev.backend.fence(stream) {
            self.events.insert(fence, ev);
        }
        self.counters.live_bytes -= size;
        self.counters.freeing_bytes += units * GRANULE;
        self.counters.frees += 1;
        self.check();
        Ok(fence)
    }

    /// Frees once the work queued on `stream` so far has finished: stream-ordered behind a
    /// backend fence (a CUDA event, polled by the pool) where the backend has streams, else
    /// at once. `stream` itself may reuse the memory right away. What frameworks' free hooks
    /// call: they free when the host drops a tensor, while kernels may still be using it.
    ///
    /// While every request the pool has served was on `stream` (one PyTorch stream, say), the
    /// free is immediate: whatever reuses the memory is queued on that stream after the work
    /// that used it, as in PyTorch's own allocator. Events start with the second stream.
    pub fn free_when_done(&mut self, id: AllocId, stream: u64) -> Result<()> {
        if !self.streams_mixed && self.first_stream == Some(stream) {
            let a = self.resolve(id)?;
            if self.allocs[a as usize].stream == stream {
                return self.free(id);
            }
        }
        let fence = self.free_async(id, stream)?;
        if !self.events.contains_key(&fence) {
            self.complete(fence)?;
        }
        Ok(())
    }

    /// Fence `fence` has completed: every free on its stream up to it is done. Returns the
    /// number of allocations whose memory became free. A fence that completed before is
    /// accepted and does nothing.
    pub fn complete(&mut self, fence: u64) -> Result<u64> {
        self.open()?;
        if fence == 0 || fence >= self.next_fence {
            return Err(Error::InvalidArgument(format!(
                "fence {fence} was never issued by this pool"
            )));
        }
        let Some(&stream) = self.fence_stream.get(&fence) else {
            return Ok(0);
        };
        let n = self.drain(stream, fence);
        self.after_free();
        self.check();
        Ok(n)
    }

    /// Completes every pending free on `stream` (all streams if None).
    pub fn synchronize(&mut self, stream: Option<u64>) -> Result<u64> {
        self.open()?;
        let streams: Vec<u64> = match stream {
            Some(s) => vec![s],
            None => self.streams.keys().copied().collect(),
        };
        let n = streams.into_iter().map(|s| self.drain(s, u64::MAX)).sum();
        self.after_free();
        self.check();
        Ok(n)
    }

    fn drain(&mut self, stream: u64, upto: u64) -> u64 {
        let Some(mut st) = self.streams.remove(&stream) else {
            return 0;
        };
        let mut n = 0;
        while let Some(&(f, a, g)) = st.pending.front() {
            if f > upto {
                break;
            }
            st.pending.pop_front();
            self.fence_stream.remove(&f);
            if let Some(ev) = self.events.remove(&f) {
                self.dev.backend.fence_drop(ev);
            }
            let x = &self.allocs[a as usize];
            if x.generation == g && x.state == State::Freeing && x.fence == f {
                self.finish_free(a);
                n += 1;
            }
        }
        if !st.pending.is_empty() {
            self.streams.insert(stream, st);
        }
        n
    }

    /// Completes the stream-ordered frees whose backend fence (CUDA event) has been reached.
    /// Returns how many allocations became free. The pool calls it before it grows or fails.
    pub fn poll(&mut self) -> u64 {
        if self.events.is_empty() {
            return 0;
        }
        let mut done: Vec<u64> = self
            .events
            .iter()
            .filter(|&(_, &ev)| self.dev.backend.fence_done(ev))
            .map(|(&f, _)| f)
            .collect();
        done.sort_unstable();
        let mut n = 0;
        for f in done {
            if let Some(&stream) = self.fence_stream.get(&f) {
                n += self.drain(stream, f);
            }
        }
        if n > 0 {
            self.after_free();
        }
        n
    }

    /// Pending stream-ordered frees.
    pub fn pending_frees(&self) -> u64 {
        self.allocs
            .iter()
            .filter(|x| x.state == State::Freeing)
            .count() as u64
    }

    /// Allocates every size in `sizes` (all or none) and appends the pointers to `out`.
    pub fn alloc_batch(&mut self, sizes: &[u64], stream: u64, out: &mut Vec<u64>) -> Result<()> {
        self.open()?;
        let total = self.batch_units(sizes)?;
        self.ptr_index(); // the caller will free by pointer
                          // (a refused batch is undone exactly: nothing cached may merge or grow in between)
        self.flush_cache();
        if self.batch_in_one_block(sizes, total, stream, out) {
            self.check();
            return Ok(());
        }
        if !self.events.is_empty() {
            self.poll();
        }
        let start = out.len();
        let saved = self.counters.clone();
        let mut ids = Vec::with_capacity(sizes.len());
        let check = std::mem::replace(&mut self.cfg.check, false);
        self.batching = true;
        let mut result = Ok(());
        for &size in sizes {
            let req = Request {
                size,
                stream,
                ..Request::default()
            };
            let mark = self.journal.len();
            // (never a pending free's memory: undoing the batch could not give it back as
            // pending)
            match self.alloc_req(req, false) {
                Ok((id, ptr)) => {
                    ids.push((id, mark));
                    out.push(ptr);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.batching = false;
        if result.is_err() {
            // Undo: free what was made and undo the page changes made for it, newest first
            // (so each merges back as it was split), give back pages taken for it, restore the
            // counters, so a refused batch leaves the pool as it was (one failure counted).
            let eager = std::mem::replace(&mut self.eager, false);
            let threshold = self.cfg.release_threshold.take();
            let cache_on = std::mem::replace(&mut self.cache_on, false);
            for (id, mark) in ids.into_iter().rev() {
                let _ = self.free(id);
                self.undo_to(mark);
            }
            self.eager = eager;
            self.cfg.release_threshold = threshold;
            self.cache_on = cache_on;
            out.truncate(start);
            self.counters.failures -= 1; // the failed request inside counted it already
            self.rollback(saved);
        }
        self.journal.clear();
        self.cfg.check = check;
        self.check();
        result
    }

    /// `alloc_batch` with one placement: when the whole batch lands in one block (a free
    /// block that holds it, a heap page, a segment extended or opened for it), the sizes lie
    /// back to back in it, each an allocation freed and reused on its own (the block is cut
    /// into one per size when a member is first named alone: `cut_uncut`). False,
    /// with nothing changed, when it would not (it would be stitched, or the pool would have
    /// to compact or fail): the batch is then placed size by size.
    fn batch_in_one_block(
        &mut self,
        sizes: &[u64],
        total: u64,
        stream: u64,
        out: &mut Vec<u64>,
    ) -> bool {
        if sizes.len() < 2 || total > MAX_BLOCK {
            return false;
        }
        self.note_stream(stream);
        if !self.events.is_empty() {
            self.poll();
        }
        let saved = self.page_counts();
        let mark = self.journal.len();
        let a0 = self.new_slot();
        // Not by growing while the pool holds enough free memory for the batch: the sizes
        // one by one may fit in what it holds, and a pool grows only when nothing fits.
        let c = &self.counters;
        let held_free = c.reserved_bytes - c.used_bytes;
        self.quick = held_free >= total * GRANULE;
        let placed = self.place_batch(total, a0);
        self.quick = false;
        self.quick_miss = false;
        let b = match placed {
            Some(Layout::Block(b)) => b,
            placed => {
                self.abandon(placed, a0, mark, saved);
                return false;
            }
        };
        self.journal.truncate(mark);
        // The members lie back to back in block `b`, which stays whole (its owner is the
        // first member) until the record goes into the pointer index (`cut_uncut`).
        let blk = &self.blocks[b as usize];
        let mut ptr = self.direct_addr(blk.page, blk.off);
        let mut live = 0;
        out.reserve(sizes.len());
        self.open_batch_record(sizes.len(), Record::Uncut(b));
        for (i, &size) in sizes.iter().enumerate() {
            let a = if i == 0 { a0 } else { self.new_slot() };
            self.batch_member(a, size, ptr, stream, Layout::Block(b));
            live += size;
            out.push(ptr);
            ptr += size.div_ceil(GRANULE) * GRANULE;
        }
        self.count_batch(sizes.len(), live, total * GRANULE);
        true
    }

    /// Slot `a` becomes the live allocation of a batch at `ptr` (indexed by pointer).
    #[inline]
    fn batch_member(&mut self, a: u32, size: u64, ptr: u64, stream: u64, layout: Layout) {
        let x = &mut self.allocs[a as usize];
        x.state = State::Live;
        x.size = size;
        x.ptr = ptr;
        x.stream = stream;
        x.movable = false;
        x.pins = 0;
        x.scope = 0;
        x.layout = layout;
        match self.batches.last_mut() {
            Some(rec) => rec.members.push((ptr, a)),
            None => unreachable!("a batch record is open"),
        }
    }

    /// Opens the record of the members of a batch being made (see `batches`). At most
    /// `BATCH_RECORDS` are kept (older ones go into the index), so a `free_batch` looks at a
    /// bounded number of them.
    fn open_batch_record(&mut self, n: usize, shape: Record) {
        if self.batches.len() >= BATCH_RECORDS {
            self.ptr_lookup();
        }
        self.batches.push(BatchRecord {
            shape,
            members: Vec::with_capacity(n),
        });
    }

    /// Whether the entry of a batch record names a live or freeing allocation (always, by the
    /// invariant: checked by `validate`).
    #[inline]
    fn batch_entry_valid(&self, (ptr, a): (u64, u32)) -> bool {
        let x = &self.allocs[a as usize];
        x.ptr == ptr && matches!(x.state, State::Live | State::Freeing)
    }

    /// The pointer index with every pending batch member in it: for a lookup by pointer.
    /// The blocks of uncut records are cut first (each member then has a block of its own).
    fn ptr_lookup(&mut self) {
        self.ptr_index();
        let records = std::mem::take(&mut self.batches);
        for rec in &records {
            if let Record::Uncut(b) = rec.shape {
                self.cut_uncut(b, &rec.members);
            }
        }
        let index = self.by_ptr.as_mut().expect("built");
        for (p, a) in records.into_iter().flat_map(|r| r.members) {
            index.insert(p, a);
        }
    }

    /// Cuts block `b`, which holds the members of an uncut batch record back to back (owned
    /// by the first), into one block per member, each owned by its member: what an
    /// allocation made alone would have.
    fn cut_uncut(&mut self, b: u32, members: &[(u64, u32)]) {
        let whole = self.blocks[b as usize];
        let (mut g, mut prev) = (self.start_of(&whole), whole.prev);
        for (i, &(_, a)) in members.iter().enumerate() {
            let units = self.allocs[a as usize].units();
            let (page, off) = self.locate(g);
            let piece = Block {
                page,
                off,
                len: units as u32,
                prev,
                next: NIL,
                free: false,
                heap: whole.heap,
                binsec: 0,
                links: Link { prev: a, next: NIL },
            };
            let id = if i == 0 {
                self.blocks[b as usize] = piece;
                b
            } else {
                let id = self.new_block(piece);
                self.blocks[prev as usize].next = id;
                self.allocs[a as usize].layout = Layout::Block(id);
                id
            };
            prev = id;
            g += units;
        }
        debug_assert_eq!(g, self.start_of(&whole) + whole.len as u64);
        self.blocks[prev as usize].next = whole.next;
        if whole.next != NIL {
            self.blocks[whole.next as usize].prev = prev;
        }
    }

    /// The allocation at `ptr` leaves the pointer index (it is being freed or moved). One that
    /// was not in it is a batch member waiting in its record: the records go into the index
    /// first (so that no record ever names memory that went back by another path).
    #[inline]
    fn unindex(&mut self, ptr: u64) {
        if let Some(m) = &mut self.by_ptr {
            if m.remove(ptr).is_none() && !self.batches.is_empty() {
                self.ptr_lookup();
                self.by_ptr.as_mut().expect("built").remove(ptr);
            }
        }
    }

    /// When `ptrs` are exactly the members of a pending batch record, in its order, all live
    /// and unpinned: their slots become vacant (their live bytes and frees counted), the
    /// record is consumed, and what it said of how they lie comes back with their rounded
    /// sizes, summed, in granules. Each member is checked and vacated in one pass (one read of
    /// its slot's line, not two); at the first that does not match, the slots vacated so far
    /// are restored and `None` comes back, nothing changed.
    fn vacate_record(&mut self, ptrs: &[u64]) -> Option<(Record, u64)> {
        let i = self.batches.iter().rposition(|r| {
            r.members.len() == ptrs.len() && r.members.first().map(|e| e.0) == ptrs.first().copied()
        })?;
        let rec = &self.batches[i];
        let layout = match rec.shape {
            Record::Uncut(b) => Layout::Block(b),
            Record::Group(g) => Layout::Member(g),
        };
        let (mut live, mut units, mut done) = (0, 0, 0);
        for (&(p, a), &q) in rec.members.iter().zip(ptrs) {
            let x = &mut self.allocs[a as usize];
            if !(p == q && x.ptr == p && x.state == State::Live && x.pins == 0) {
                break;
            }
            debug_assert_eq!(x.layout, layout);
            live += x.size;
            units += x.units();
            x.generation = x.generation.wrapping_add(1);
            x.state = State::Vacant;
            x.layout = Layout::None;
            self.vacant_allocs.push(a);
            done += 1;
        }
        if done < ptrs.len() {
            for &(_, a) in &rec.members[..done] {
                let x = &mut self.allocs[a as usize];
                x.generation = x.generation.wrapping_sub(1);
                x.state = State::Live;
                x.layout = layout;
            }
            self.vacant_allocs.truncate(self.vacant_allocs.len() - done);
            return None;
        }
        let shape = self.batches.swap_remove(i).shape;
        self.counters.live_bytes -= live;
        self.counters.frees += ptrs.len() as u64;
        Some((shape, units))
    }

    /// `n` allocations of a batch made at once: `live` bytes asked, `used` bytes held.
    fn count_batch(&mut self, n: usize, live: u64, used: u64) {
        let c = &mut self.counters;
        c.allocs += n as u64;
        c.live_bytes += live;
        c.used_bytes += used;
        c.peak_live = c.peak_live.max(c.live_bytes);
        c.peak_used = c.peak_used.max(c.used_bytes);
    }

    /// The one placement of `batch_in_one_block`: as `place`, but a large batch takes a run of
    /// free pages that holds it, when no free block does, before trying a head (which would
    /// be stitched unless the pages after it are free): a batch is placed to be one block.
    /// When the pool may grow for it (it does not hold the batch's size free), the pages it
    /// lacks are taken first, so that a batch repeated in a loop finds its run again.
    fn place_batch(&mut self, units: u64, a: u32) -> Option<Layout> {
        if units >= self.small_units {
            if let Some(l) = self.place_in_large_block(units as u32, a) {
                return Some(l);
            }
            let n = units.div_ceil(self.pg as u64) as u32;
            // (growing when the pool may: the batch does not fit in what it holds free)
            if !self.quick && self.free_pages.free_units() < n as u64 {
                self.ensure_pages(n);
            }
            if let Some(p) = self.free_pages.alloc(n) {
                let b = self.open_segment(p, n, PageKind::Large);
                return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
            }
        }
        self.place(units, a, false)
    }

    /// Allocates every size in `sizes` as one arena (all or none): one placement holds them
    /// all, back to back at the pool's 256-byte alignment, and goes back to the pool when the
    /// last of them is freed. Each is an allocation of its own (freed by pointer, alone or in
    /// `free_batch`, listed, tracked), but memory freed early is not reusable until the whole
    /// arena is: for buffers that live and die together (one step's activations, a batch of
    /// staging buffers). It is always one placement (stitched if need be), where
    /// `alloc_batch` places a batch that fits no free range size by size; a batch that fits
    /// one costs about the same either way (benches/RESULTS.md, ninth session).
    pub fn alloc_arena(&mut self, sizes: &[u64], stream: u64, out: &mut Vec<u64>) -> Result<()> {
        self.open()?;
        let total = self.batch_units(sizes)?;
        if total == 0 {
            return Ok(());
        }
        let bytes = total.saturating_mul(GRANULE);
        if bytes > self.max_size() {
            return Err(invalid_size(format!(
                "cannot allocate an arena of {}: larger than the pool can ever hold ({})",
                format_size(bytes),
                format_size(self.max_size())
            )));
        }
        self.ptr_index(); // the caller will free by pointer
        let (peak_live, peak_used) = (self.counters.peak_live, self.counters.peak_used);
        // (never a pending free's memory: that may be a member of another arena)
        let req = Request {
            size: bytes,
            stream,
            ..Request::default()
        };
        let (id, base) = self.alloc_req(req, false)?;
        // The group holds the memory but is not an allocation a caller sees: undo its
        // counting as one; its members are counted instead.
        let g = id.index;
        let c = &mut self.counters;
        c.allocs -= 1;
        c.live_bytes -= bytes;
        c.used_bytes -= bytes;
        c.peak_live = peak_live;
        c.peak_used = peak_used;
        if let Some(m) = &mut self.by_ptr {
            m.remove(base);
        }
        let x = &mut self.allocs[g as usize];
        x.state = State::Group;
        x.members = sizes.len() as u32;
        out.reserve(sizes.len());
        self.open_batch_record(sizes.len(), Record::Group(g));
        let mut ptr = base;
        let mut live = 0;
        for &size in sizes {
            let a = self.new_slot();
            self.batch_member(a, size, ptr, stream, Layout::Member(g));
            live += size;
            out.push(ptr);
            ptr += size.div_ceil(GRANULE) * GRANULE;
        }
        // counted once for all: the members' sizes, and their rounded sizes (the group's)
        self.count_batch(sizes.len(), live, bytes);
        self.check();
        Ok(())
    }

    /// Frees every pointer in `ptrs` (all or none: each must be a live, unpinned allocation,
    /// named once).
    pub fn free_batch(&mut self, ptrs: &[u64]) -> Result<()> {
        self.open()?;
        // (scrubbing zeroes member by member: the general path below)
        if !self.cfg.scrub {
            if let Some((shape, units)) = self.vacate_record(ptrs) {
                match shape {
                    Record::Uncut(b) => self.release_uncut(b, units),
                    Record::Group(g) => self.release_group(g),
                }
                return Ok(());
            }
        }
        self.ptr_lookup();
        // Each pointer leaves the pointer index as it is checked (one probe serves the check
        // and the removal); a pointer named twice is then missing from it. On an error every
        // pointer taken out goes back, and nothing is freed.
        let mut taken: Vec<(u64, u32)> = Vec::with_capacity(ptrs.len());
        let mut result = Ok(());
        for &p in ptrs {
            let index = self.by_ptr.as_mut().expect("the pointer index is built");
            let Some(a) = index.remove(p) else {
                result = Err(if taken.iter().any(|&(q, _)| q == p) {
                    Error::InvalidFree(format!("{p:#x} appears twice in one free"))
                } else {
                    // not in the index: say why (interior, foreign, already freed)
                    self.slot_of_indexed_ptr(p)
                        .expect_err("a pointer missing from the index is refused")
                });
                break;
            };
            taken.push((p, a));
            let x = &self.allocs[a as usize];
            if x.state == State::Freeing {
                result = Err(Error::InvalidFree(format!(
                    "{p:#x} was already freed on stream {}",
                    x.stream
                )));
                break;
            }
            if let Err(e) = self.check_unpinned(a) {
                result = Err(e);
                break;
            }
        }
        if result.is_err() {
            let index = self.by_ptr.as_mut().expect("the pointer index is built");
            for &(p, a) in &taken {
                index.insert(p, a);
            }
            return result;
        }
        self.release_batch(taken.into_iter().map(|e| e.1));
        Ok(())
    }

    /// The block of an uncut batch record whose slots `vacate_record` freed (`units`
    /// granules) goes back at once: one merge with the blocks around, instead of each
    /// member's block marked, listed and merged in turn (`release_batch`, where a batch pair
    /// spent a third of its time).
    fn release_uncut(&mut self, b: u32, units: u64) {
        debug_assert_eq!(units, self.blocks[b as usize].len as u64);
        self.counters.used_bytes -= units * GRANULE;
        self.release_block(b);
        self.after_free();
        self.check();
    }

    /// Arena `g`, whose members' slots `vacate_record` freed, gives its memory back once (as
    /// `unplace` does when its last member goes).
    fn release_group(&mut self, g: u32) {
        self.allocs[g as usize].members = 0;
        self.release_group_memory(g);
        self.after_free();
        self.check();
    }

    /// Arena `g`, whose members are all freed, gives its memory back; its slot is vacant.
    fn release_group_memory(&mut self, g: u32) {
        let x = &mut self.allocs[g as usize];
        debug_assert!(x.state == State::Group && x.members == 0);
        let (units, layout) = (x.units(), std::mem::replace(&mut x.layout, Layout::None));
        x.state = State::Vacant;
        x.generation = x.generation.wrapping_add(1);
        self.unplace(layout);
        self.vacant_allocs.push(g);
        self.counters.used_bytes -= units * GRANULE;
    }

    /// Frees the slots of a checked `free_batch`, merging each run of freed neighbours once.
    fn release_batch(&mut self, slots: impl ExactSizeIterator<Item = u32>) {
        let mut pending = Vec::with_capacity(slots.len());
        for a in slots {
            self.counters.live_bytes -= self.allocs[a as usize].size;
            self.counters.frees += 1;
            self.release_slot_into(a, Some(&mut pending));
        }
        self.merge_pending(&pending);
        self.after_free();
        self.check();
    }

    /// A view of the allocation is exported (buffer, DLPack): it may not be freed or moved
    /// until `unpin`.
    pub fn pin(&mut self, id: AllocId) -> Result<()> {
        self.open()?;
        let a = self.resolve(id)?;
        self.allocs[a as usize].pins += 1;
        Ok(())
    }

    pub fn unpin(&mut self, id: AllocId) -> Result<()> {
        let a = self.resolve(id)?;
        let x = &mut self.allocs[a as usize];
        if x.pins == 0 {
            return Err(Error::InvalidState(format!("{:#x} is not pinned", x.ptr)));
        }
        x.pins -= 1;
        Ok(())
    }

    pub fn info(&self, id: AllocId) -> Result<AllocInfo> {
        self.open()?;
        Ok(self.info_of(self.resolve(id)?))
    }

    /// Every live and freeing allocation.
    pub fn allocations(&self) -> Vec<AllocInfo> {
        (0..self.allocs.len() as u32)
            .filter(|&a| matches!(self.allocs[a as usize].state, State::Live | State::Freeing))
            .map(|a| self.info_of(a))
            .collect()
    }

    /// Writes zeros over an allocation (its rounded size).
    pub fn zero(&mut self, id: AllocId) -> Result<()> {
        self.open()?;
        let a = self.resolve(id)?;
        let x = &self.allocs[a as usize];
        self.dev.backend.zero(x.ptr, x.units() * GRANULE)
    }

    /// The live allocations made in an open scope.
    pub fn scope_allocations(&self, scope: u32) -> Result<Vec<AllocInfo>> {
        let list = self
            .scopes
            .get(&scope)
            .ok_or_else(|| Error::InvalidArgument(format!("no open scope {scope}")))?;
        Ok(list
            .iter()
            .filter(|&&(a, g)| {
                let x = &self.allocs[a as usize];
                x.generation == g && x.state == State::Live
            })
            .map(|&(a, _)| self.info_of(a))
            .collect())
    }

    pub fn open_scope(&mut self) -> Result<u32> {
        self.open()?;
        let s = self.next_scope;
        self.next_scope += 1;
        self.scopes.insert(s, Vec::new());
        Ok(s)
    }

    /// Closes a scope: frees what was allocated inside it and is still live, and says what.
    pub fn close_scope(&mut self, scope: u32) -> Result<ScopeReport> {
        let list = self
            .scopes
            .remove(&scope)
            .ok_or_else(|| Error::InvalidArgument(format!("no open scope {scope}")))?;
        let mut report = ScopeReport {
            allocs: list.len() as u64,
            ..ScopeReport::default()
        };
        if self.closed {
            return Ok(report);
        }
        for (a, g) in list {
            let x = &self.allocs[a as usize];
            if x.generation == g && x.state == State::Live && x.pins == 0 {
                report.leaked.push(self.info_of(a));
                self.counters.live_bytes -= x.size;
                self.counters.frees += 1;
                self.finish_free(a);
                report.freed += 1;
            }
        }
        self.after_free();
        self.check();
        Ok(report)
    }

    /// Gives free pages back to the device until at most `keep` bytes of them stay.
    pub fn trim(&mut self, keep: u64) -> Result<u64> {
        self.open()?;
        self.flush_cache();
        self.reclaim_all();
        let n = self.release_pages(keep);
        self.check();
        Ok(n)
    }

    /// Whether any live allocation may be moved.
    fn has_movable(&self) -> bool {
        self.allocs
            .iter()
            .any(|x| x.state == State::Live && x.movable && x.pins == 0)
    }

    /// Compacts the pool: slides movable allocations of large segments and heap pages down
    /// over the free space before them (`compact_pages`), empties heap pages of movable
    /// allocations into free blocks elsewhere (`evacuate_heap_pages`), copying their bytes,
    /// then gives every free page back to the device.
    pub fn defrag(&mut self) -> Result<DefragReport> {
        self.open()?;
        self.flush_cache();
        let mut report = self.defrag_inner();
        self.reclaim_all();
        report.bytes_released = self.release_pages(0);
        self.check();
        Ok(report)
    }

    /// `defrag`'s moves: large segments and heap pages compacted (`compact_pages`), which
    /// gathers their holes, then heap pages emptied into any free block (`evacuate_heap_pages`). (In that
    /// order the fill to failure with every allocation movable was 99.929 against 99.912 %,
    /// 40 seeds.)
    fn defrag_inner(&mut self) -> DefragReport {
        let mut report = DefragReport::default();
        self.compact_pages(&mut report);
        self.evacuate_heap_pages(&mut report);
        report.merge_moves();
        report
    }

    /// Large segments and heap pages, each walked from its start: a movable allocation that
    /// follows a free block slides down over it (`slide_down`), and the free block, now after
    /// it, takes in the free block that follows, so that the free space of a run of movable
    /// allocations gathers behind them, where its whole pages can go back (`reclaim`) and
    /// what is left touches the next allocation or the end of the segment or page. (Heap
    /// pages too since the thirteenth session: their holes, gathered, take larger allocations
    /// of the heap pages being emptied; the fill to failure with every allocation movable,
    /// 40 seeds, 99.912 → 99.929 %.) A movable stitched allocation whose head follows a free
    /// block slides down through its window the same way (`slide_stitched`; without it
    /// 99.889 %): its head grows into the free block and its tail gives as much back, in the
    /// segment of its last page, where the free space meets what is free after the tail. So
    /// the walks are repeated (`COMPACT_PASSES`) while one moves something. An
    /// allocation that may not move (made without `movable=True`, viewed, freed on a stream,
    /// or part of a batch block) stays, and the walk goes on after it. Holes inside partly
    /// used pages are what a stitched request cannot use (free space is only usable at a
    /// page's start or end): this gathers them into whole pages or into holes large enough
    /// for the allocations of emptied heap pages (`evacuate_heap_pages`).
    fn compact_pages(&mut self, report: &mut DefragReport) {
        for _ in 0..COMPACT_PASSES {
            let moved = report.moved_allocs;
            if !self.compact_pass(report) || report.moved_allocs == moved {
                return;
            }
        }
    }

    /// One walk of `compact_pages` over every large segment and heap page; false when the
    /// backend could not copy (the rest is left as it is).
    fn compact_pass(&mut self, report: &mut DefragReport) -> bool {
        for p in 0..self.pages.len() as u32 {
            if !matches!(self.pages[p as usize], PageKind::Large | PageKind::Heap) {
                continue;
            }
            let mut b = self.page_first[p as usize];
            while b != NIL {
                let next = self.blocks[b as usize].next;
                if next != NIL && self.binned_free(b) {
                    if self.slidable(next)
                        && self.blocks[b as usize].len as u64 * SLIDE_MIN_DIV
                            >= self.blocks[next as usize].len as u64
                    {
                        if !self.slide_down(b, next, report) {
                            return false;
                        }
                        continue; // `b` is now after `next`, merged with what followed
                    }
                    if let Some((i, d)) = self.stitch_slide(b, next) {
                        if !self.slide_stitched(b, i, d, report) {
                            return false;
                        }
                        // `next` is the head, which ends the segment
                        b = next;
                        continue;
                    }
                }
                b = next;
            }
        }
        true
    }

    /// Whether used block `h`, after free block `f`, is the head of a stitched allocation
    /// that may move now, and by how many granules it slides down: `(stitch, d)`. The head
    /// stays in its first page (the window maps from there) and the tail keeps a granule;
    /// `d` is at least 1/`SLIDE_MIN_DIV` of the allocation.
    fn stitch_slide(&self, f: u32, h: u32) -> Option<(u32, u32)> {
        let hb = &self.blocks[h as usize];
        if hb.free {
            return None;
        }
        let x = &self.allocs[hb.owner() as usize];
        let Layout::Stitched(i) = x.layout else {
            return None;
        };
        let st = &self.stitches[i as usize];
        if x.state != State::Live || !x.movable || x.pins > 0 || st.head != h || st.tail == NIL {
            return None;
        }
        let tb = &self.blocks[st.tail as usize];
        let d = self.blocks[f as usize].len.min(hb.off).min(tb.len - 1);
        // (a free block after the tail that a batch free has yet to merge is left alone)
        let pending_after =
            tb.next != NIL && self.blocks[tb.next as usize].free && !self.binned_free(tb.next);
        if d == 0 || (d as u64) * SLIDE_MIN_DIV < x.units() || pending_after {
            return None;
        }
        Some((i, d))
    }

    /// Slides stitched allocation `i` down by `d` granules (see `stitch_slide`): its bytes
    /// move down through its window (an overlapping move), its head takes the last `d`
    /// granules of free block `f` before it, and its tail gives its last `d` back to the free
    /// block after it (or to a new one). Its pages and window stay. False, nothing changed,
    /// when the backend could not copy.
    fn slide_stitched(&mut self, f: u32, i: u32, d: u32, report: &mut DefragReport) -> bool {
        let (h, t) = (
            self.stitches[i as usize].head,
            self.stitches[i as usize].tail,
        );
        let a = self.blocks[h as usize].owner();
        let old = self.allocs[a as usize].ptr;
        let new = old - d as u64 * GRANULE;
        if !self.move_bytes(new, old, self.allocs[a as usize].units() * GRANULE) {
            return false;
        }
        // the head grows down into `f`
        self.remove_free(f);
        let fb = self.blocks[f as usize];
        {
            let hb = &mut self.blocks[h as usize];
            hb.off -= d;
            hb.len += d;
        }
        if fb.len == d {
            self.blocks[h as usize].prev = fb.prev;
            if fb.prev != NIL {
                self.blocks[fb.prev as usize].next = h;
            } else {
                self.page_first[fb.page as usize] = h;
            }
            self.drop_block(f);
        } else {
            self.blocks[f as usize].len -= d;
            self.insert_free(f);
        }
        // the tail gives back its end
        let tb = self.blocks[t as usize];
        self.blocks[t as usize].len -= d;
        let (page, off) = self.locate(self.start_of(&tb) + (tb.len - d) as u64);
        if tb.next != NIL && self.binned_free(tb.next) {
            let n = tb.next;
            self.remove_free(n);
            let nb = &mut self.blocks[n as usize];
            (nb.page, nb.off) = (page, off);
            nb.len += d;
            self.insert_free(n);
        } else {
            let n = self.new_block(Block {
                page,
                off,
                len: d,
                prev: t,
                next: tb.next,
                free: true,
                heap: false,
                binsec: 0,
                links: Link::UNLINKED,
            });
            if tb.next != NIL {
                self.blocks[tb.next as usize].prev = n;
            }
            self.blocks[t as usize].next = n;
            self.insert_free(n);
        }
        self.relocated(a, Layout::Stitched(i), old, new, report);
        true
    }

    /// Whether used block `u` is the whole of a live allocation that may move now.
    fn slidable(&self, u: u32) -> bool {
        let blk = &self.blocks[u as usize];
        if blk.free {
            return false;
        }
        let x = &self.allocs[blk.owner() as usize];
        x.state == State::Live
            && x.movable
            && x.pins == 0
            && x.layout == Layout::Block(u)
            && x.units() == blk.len as u64
    }

    /// Slides used block `u` down over free block `f` just before it (in a large segment):
    /// the allocation's bytes move to `f`'s start (an overlapping move: the backends' `copy`
    /// allows it), `f` follows it and takes in a free block after it. False, nothing changed,
    /// when the backend could not copy.
    fn slide_down(&mut self, f: u32, u: u32, report: &mut DefragReport) -> bool {
        let (fb, ub) = (self.blocks[f as usize], self.blocks[u as usize]);
        let a = ub.owner();
        let old = self.allocs[a as usize].ptr;
        let new = self.direct_addr(fb.page, fb.off);
        let bytes = ub.len as u64 * GRANULE;
        if !self.move_bytes(new, old, bytes) {
            return false;
        }
        self.remove_free(f);
        let (fp, fo) = self.locate(self.start_of(&fb) + ub.len as u64);
        {
            let x = &mut self.blocks[u as usize];
            (x.page, x.off, x.prev, x.next) = (fb.page, fb.off, fb.prev, f);
        }
        {
            let y = &mut self.blocks[f as usize];
            (y.page, y.off, y.prev, y.next) = (fp, fo, u, ub.next);
        }
        if fb.prev != NIL {
            self.blocks[fb.prev as usize].next = u;
        } else {
            self.page_first[fb.page as usize] = u;
        }
        if ub.next != NIL {
            self.blocks[ub.next as usize].prev = f;
            if self.binned_free(ub.next) {
                self.remove_free(ub.next);
                self.absorb_next(f);
            }
        }
        // (binned, not settled: a pool that releases at once would split the segment here;
        // `defrag` and the way to out of memory reclaim the whole pages afterwards)
        self.insert_free(f);
        self.relocated(a, Layout::Block(u), old, new, report);
        true
    }

    /// Moves an allocation's `bytes` from `old` to `new` (the ranges may overlap); in a pool
    /// that scrubs, the part of the old range that the new one does not cover is zeroed, as
    /// memory a free gives back is. False when the backend could not copy.
    fn move_bytes(&self, new: u64, old: u64, bytes: u64) -> bool {
        if self.dev.backend.copy(new, old, bytes).is_err() {
            return false;
        }
        if self.cfg.scrub {
            let (start, end) = if new < old {
                (old.max(new + bytes), old + bytes)
            } else {
                (old, (old + bytes).min(new))
            };
            let r = self.dev.backend.zero(start, end - start);
            debug_assert!(r.is_ok(), "scrub failed: {r:?}");
        }
        true
    }

    /// Heap pages whose every allocation may move are emptied, the emptiest first, each into
    /// free blocks elsewhere: of other heap pages, and of large segments, where the holes
    /// inside partly used pages are ones a large request cannot use, but a small allocation
    /// can. Each allocation of the page, largest first, takes the smallest free block that
    /// holds it (best fit, decreasing: a page is emptied only if all of it fits, which is
    /// checked before anything moves). A free block of a whole page or more is not a
    /// destination (it holds pages a large request can use), and a page that received an
    /// allocation is not emptied afterwards (nothing moves twice). With every allocation
    /// movable, the fill to failure at 2 MiB pages, 40 seeds, is 99.929 %, and 99.778 % with
    /// other heap pages as the only destinations (thirteenth session).
    fn evacuate_heap_pages(&mut self, report: &mut DefragReport) {
        let mut order: Vec<(u32, u32)> = (0..self.pages.len() as u32)
            .filter(|&p| self.pages[p as usize] == PageKind::Heap)
            .map(|p| (self.page_used(p), p))
            .collect();
        order.sort_unstable();
        // every free block that may take an allocation, by (length, block)
        let mut dest: BTreeSet<(u32, u32)> = BTreeSet::new();
        for p in 0..self.pages.len() as u32 {
            if matches!(self.pages[p as usize], PageKind::Heap | PageKind::Large) {
                for b in self.page_blocks(p) {
                    let len = self.blocks[b as usize].len;
                    if len < self.pg && self.binned_free(b) {
                        dest.insert((len, b));
                    }
                }
            }
        }
        let mut received: FxHashSet<u32> = FxHashSet::default();
        for (_, p) in order {
            if received.contains(&p) {
                continue;
            }
            let blocks: Vec<u32> = self.page_blocks(p).collect();
            let (free, mut used): (Vec<u32>, Vec<u32>) = blocks
                .into_iter()
                .partition(|&b| self.blocks[b as usize].free);
            if used.is_empty() || !used.iter().all(|&b| self.slidable(b)) {
                continue;
            }
            used.sort_unstable_by_key(|&b| std::cmp::Reverse(self.blocks[b as usize].len));
            let own: Vec<(u32, u32)> = free
                .iter()
                .map(|&b| (self.blocks[b as usize].len, b))
                .filter(|k| dest.remove(k))
                .collect();
            debug_assert!(self.blocks.len() < (NIL as usize) - used.len());
            if !Self::plan_fits(&mut dest, &used, |b| self.blocks[b as usize].len) {
                dest.extend(own);
                continue;
            }
            for &b in &free {
                self.remove_free(b);
            }
            self.evacuating = p;
            let mut copied = true;
            for b in used {
                let len = self.blocks[b as usize].len;
                let (l, nb) = *dest.range((len, 0)..).next().expect("the plan fits");
                dest.remove(&(l, nb));
                self.remove_free(nb);
                let a = self.blocks[b as usize].owner();
                let nb = self.carve(nb, 0, len, a);
                if l > len {
                    dest.insert((l - len, self.blocks[nb as usize].next));
                }
                let blk = self.blocks[nb as usize];
                if blk.heap {
                    received.insert(blk.page);
                }
                let old = self.allocs[a as usize].ptr;
                let new = self.direct_addr(blk.page, blk.off);
                if !self.move_bytes(new, old, len as u64 * GRANULE) {
                    // the data could not move: it stays, and so does everything after it
                    self.release_block(nb);
                    copied = false;
                    break;
                }
                self.relocated(a, Layout::Block(nb), old, new, report);
                self.release_block(b);
            }
            if self.evacuating == p {
                // not emptied: its free blocks go back to the bins
                self.evacuating = NIL;
                let free: Vec<u32> = self
                    .page_blocks(p)
                    .filter(|&b| self.blocks[b as usize].free)
                    .collect();
                for b in free {
                    self.insert_free(b);
                }
            } else {
                report.pages_emptied += 1;
            }
            if !copied {
                return;
            }
        }
    }

    /// Whether blocks `used` (largest first) all fit in the free blocks of `dest`, each in
    /// the smallest that holds it; `dest` is left as it was.
    fn plan_fits(dest: &mut BTreeSet<(u32, u32)>, used: &[u32], len: impl Fn(u32) -> u32) -> bool {
        // what is left of a block taken goes back under a key no block has (block indices stay
        // far below NIL): NIL - 1, NIL - 2...
        let first_left = NIL - used.len() as u32;
        let mut taken = Vec::with_capacity(used.len());
        let mut left = Vec::with_capacity(used.len());
        let mut fits = true;
        for &b in used {
            let n = len(b);
            let Some(&(l, d)) = dest.range((n, 0)..).next() else {
                fits = false;
                break;
            };
            dest.remove(&(l, d));
            taken.push((l, d));
            if l > n {
                let k = (l - n, NIL - 1 - left.len() as u32);
                dest.insert(k);
                left.push(k);
            }
        }
        for k in &left {
            dest.remove(k);
        }
        // (a remainder taken in turn is not put back: it was never a block)
        dest.extend(taken.into_iter().filter(|&(_, d)| d < first_left));
        fits
    }

    /// Allocation `a` now lives at `new` with `layout` (it was at `old`): its record, the
    /// pointer index and the report follow.
    fn relocated(&mut self, a: u32, layout: Layout, old: u64, new: u64, report: &mut DefragReport) {
        let x = &mut self.allocs[a as usize];
        x.ptr = new;
        x.layout = layout;
        let bytes = x.units() * GRANULE;
        self.unindex(old);
        if let Some(m) = &mut self.by_ptr {
            m.insert(new, a);
        }
        report.moved_allocs += 1;
        report.moved_bytes += bytes;
        report.moves.push((self.id(a), old, new));
    }

    /// Granules in used blocks of a heap or large page (a walk: for defrag and statistics).
    fn page_used(&self, p: u32) -> u32 {
        self.page_blocks(p)
            .map(|b| &self.blocks[b as usize])
            .filter(|b| self.holds(b))
            .map(|b| b.len)
            .sum()
    }

    fn page_blocks(&self, p: u32) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.page_first[p as usize];
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let b = cur;
                cur = self.blocks[b as usize].next;
                b
            })
        })
    }

    /// Frees everything (pending frees included), gives all pages back and refuses every
    /// later call. Refused while any allocation has a live view. Returns how many allocations
    /// were still live.
    pub fn close(&mut self) -> Result<u64> {
        if self.closed {
            return Ok(0);
        }
        if let Some(x) = self
            .allocs
            .iter()
            .find(|x| x.state != State::Vacant && x.pins > 0)
        {
            return Err(Error::InvalidState(format!(
                "cannot close the pool: the allocation at {:#x} has {} live views",
                x.ptr, x.pins
            )));
        }
        self.cache_on = false;
        self.flush_cache();
        let mut live = 0;
        for a in 0..self.allocs.len() as u32 {
            let st = self.allocs[a as usize].state;
            // a group goes back with its last member
            if matches!(st, State::Live | State::Freeing) {
                if st == State::Live {
                    live += 1;
                    self.counters.live_bytes -= self.allocs[a as usize].size;
                }
                self.finish_free(a);
            }
        }
        self.streams.clear();
        self.fence_stream.clear();
        for (_, ev) in self.events.drain() {
            self.dev.backend.fence_drop(ev);
        }
        self.release_pages(0);
        self.dev
            .backend
            .unreserve(self.window_base, self.window_bytes);
        self.closed = true;
        self.check();
        Ok(live)
    }

    fn oom_error(&self, size: u64) -> Error {
        let s = self.stats();
        let device_free = {
            let pmm = self.dev.pmm.lock();
            let st = pmm.stats();
            st.vidmem - st.allocated_bytes
        };
        Error::OutOfMemory(format!(
            "out of memory: cannot allocate {} ({} rounded); pool: live {}, reserved {}, free {} \
             (largest free run {}, fragmentation {:.1} %, largest request it can serve {}), \
             limit {}; device: {} free",
            format_size(size),
            format_size(size.div_ceil(GRANULE) * GRANULE),
            format_size(s.live_bytes),
            format_size(s.reserved_bytes),
            format_size(s.free_bytes),
            format_size(s.largest_free_run),
            s.fragmentation * 100.0,
            format_size(s.largest_request),
            format_size(self.max_size()),
            format_size(device_free),
        ))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
