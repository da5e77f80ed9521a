//! Models of allocators, each following the stated rules of a real one (docs/replay.md has
//! them with their sources). Every model holds device memory through a capacity check: a
//! request to the device fails when it would take the model past the capacity.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::{Model, StartState};
use crate::alloc::{AllocId, Device, Pool, PoolConfig, Request};
use crate::backend::Simulated;
use crate::error::{Error, Result};
use crate::pmm::{Pmm, PmmConfig, SizeMask};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The models `model_by_name` knows, in the order reports list them.
pub const MODEL_NAMES: [&str; 7] = [
    "gpumm",
    "caching",
    "caching-expandable",
    "rmm-pool",
    "cupy",
    "buddy",
    "driver",
];

/// PyTorch caching-allocator options (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CachingOptions {
    pub expandable_segments: bool,
    /// Blocks at or above this are never split (u64::MAX: unlimited, the default).
    pub max_split_size: u64,
    /// Round requests to this many steps between powers of two (0 or 1: off).
    pub roundup_power2_divisions: u64,
}

impl Default for CachingOptions {
    fn default() -> Self {
        CachingOptions {
            expandable_segments: false,
            max_split_size: u64::MAX,
            roundup_power2_divisions: 0,
        }
    }
}

/// A new model by name at `capacity` bytes of device memory.
pub fn model_by_name(name: &str, capacity: u64, opts: CachingOptions) -> Result<Box<dyn Model>> {
    Ok(match name {
        "gpumm" => Box::new(Gpumm::new(capacity)?),
        "caching" => Box::new(Caching::new(capacity, opts)),
        "caching-expandable" => Box::new(Caching::new(
            capacity,
            CachingOptions {
                expandable_segments: true,
                ..opts
            },
        )),
        "rmm-pool" => Box::new(RmmPool::new(capacity)),
        "cupy" => Box::new(CuPy::new(capacity)),
        "buddy" => Box::new(Buddy::new(capacity)),
        "driver" => Box::new(Driver::new(capacity)),
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown allocator {other:?}; known: {}",
                MODEL_NAMES.join(", ")
            )))
        }
    })
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Device memory handed out to a model: a capacity and a bump pointer for addresses. Each
/// device allocation is followed by a 2 MiB gap, so two of them are never adjacent (separate
/// `cudaMalloc`s are not, and models must not merge across them).
#[derive(Clone, Debug)]
struct DeviceMem {
    capacity: u64,
    reserved: u64,
    next: u64,
}

impl DeviceMem {
    fn new(capacity: u64) -> Self {
        DeviceMem {
            capacity,
            reserved: 0,
            // far above any address a real trace records, so a model's own segments never
            // overlap the ones it takes from the trace
            next: 1 << 56,
        }
    }

    fn fits(&self, n: u64) -> bool {
        self.reserved + n <= self.capacity
    }

    fn take(&mut self, n: u64) -> Option<u64> {
        if !self.fits(n) {
            return None;
        }
        self.reserved += n;
        let a = self.next;
        self.next += round_up(n, 2 * MIB) + 2 * MIB;
        Some(a)
    }

    fn give(&mut self, n: u64) {
        self.reserved -= n;
    }
}

// ------------------------------------------------------------------------------------------
// driver: every request straight from the device

/// Every request is a device allocation of its size rounded to 512 B, freed at once: the
/// lower bound on what any allocator must hold.
pub struct Driver {
    dev: DeviceMem,
    sizes: FxHashMap<u32, u64>,
}

impl Driver {
    pub fn new(capacity: u64) -> Self {
        Driver {
            dev: DeviceMem::new(capacity),
            sizes: FxHashMap::default(),
        }
    }
}

impl Model for Driver {
    fn alloc(&mut self, id: u32, size: u64, _stream: u64) -> Option<u64> {
        let r = round_up(size, 512);
        let a = self.dev.take(r)?;
        self.sizes.insert(id, r);
        Some(a)
    }
    fn free(&mut self, id: u32) {
        if let Some(r) = self.sizes.remove(&id) {
            self.dev.give(r);
        }
    }
    fn reserved(&self) -> u64 {
        self.dev.reserved
    }
    fn largest_free(&self) -> u64 {
        0
    }
    fn free_bytes(&self) -> u64 {
        0
    }
}

// ------------------------------------------------------------------------------------------
// buddy: a plain power-of-two buddy over the device

/// A binary buddy over the device's address space, 512 B up to the largest power of two that
/// fits, as the PMM splits and merges chunks but with every power of two and above 2 MiB too.
/// A request takes the smallest free block of at least its size rounded up to a power of two.
/// Reserved: the 2 MiB root chunks that hold any allocated block (what the PMM would have taken
/// from the device).
pub struct Buddy {
    free: Vec<BTreeSet<u64>>,
    by_id: FxHashMap<u32, (u64, u32)>,
    root_used: Vec<u64>,
    roots_in_use: u64,
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
            free,
            by_id: FxHashMap::default(),
            root_used: vec![0; (capacity >> ROOT_SHIFT) as usize + 1],
            roots_in_use: 0,
        }
    }

    fn account(&mut self, addr: u64, order: u32, add: bool) {
        let size = 1u64 << order;
        let first = addr >> ROOT_SHIFT;
        let last = (addr + size - 1) >> ROOT_SHIFT;
        for root in first..=last {
            let part = size.min(1 << ROOT_SHIFT);
            let u = &mut self.root_used[root as usize];
            let before = *u;
            if add {
                *u += part;
            } else {
                *u -= part;
            }
            match (before == 0, *u == 0) {
                (true, false) => self.roots_in_use += 1,
                (false, true) => self.roots_in_use -= 1,
                _ => {}
            }
        }
    }
}

impl Model for Buddy {
    fn alloc(&mut self, id: u32, size: u64, _stream: u64) -> Option<u64> {
        let order = (64 - (size.max(1) - 1).leading_zeros()).max(BUDDY_MIN);
        let k = (order as usize..self.free.len()).find(|&k| !self.free[k].is_empty())?;
        let addr = self.free[k].pop_first().expect("non-empty");
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
        self.roots_in_use << ROOT_SHIFT
    }
    fn largest_free(&self) -> u64 {
        // the largest free block inside a root that is in use
        (0..self.free.len().min(ROOT_SHIFT as usize + 1))
            .rev()
            .find(|&o| {
                self.free[o]
                    .iter()
                    .any(|&a| self.root_used[(a >> ROOT_SHIFT) as usize] > 0)
            })
            .map_or(0, |o| 1 << o)
    }
    fn free_bytes(&self) -> u64 {
        let used: u64 = self.by_id.values().map(|&(_, o)| 1u64 << o).sum();
        self.reserved().saturating_sub(used)
    }
}

// ------------------------------------------------------------------------------------------
// Blocks in address order with free ones in a size-ordered set: shared by rmm-pool and cupy.

#[derive(Copy, Clone, Debug)]
struct Blk {
    size: u64,
    /// The device allocation (first address) it belongs to: blocks merge only within one.
    chunk: u64,
    free: bool,
    stream: u64,
}

#[derive(Default)]
struct Coalescing {
    blocks: BTreeMap<u64, Blk>,
    /// (stream, size, addr) of free blocks; stream is 0 where streams are not kept apart.
    free: BTreeSet<(u64, u64, u64)>,
    by_id: FxHashMap<u32, u64>,
}

impl Coalescing {
    /// Adds a device allocation as one free block.
    fn add_chunk(&mut self, addr: u64, size: u64, stream: u64) {
        self.blocks.insert(
            addr,
            Blk {
                size,
                chunk: addr,
                free: true,
                stream,
            },
        );
        self.free.insert((stream, size, addr));
    }

    /// Best fit on `stream`: the smallest free block of at least `size`; the front is used,
    /// the rest stays free.
    fn take(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        let &(s, bsize, addr) = self.free.range((stream, size, 0)..).next()?;
        if s != stream {
            return None;
        }
        self.free.remove(&(s, bsize, addr));
        let b = self.blocks.get_mut(&addr).expect("free block");
        b.free = false;
        if bsize > size {
            b.size = size;
            let rest = Blk {
                size: bsize - size,
                chunk: b.chunk,
                free: true,
                stream,
            };
            self.blocks.insert(addr + size, rest);
            self.free.insert((stream, bsize - size, addr + size));
        }
        self.by_id.insert(id, addr);
        Some(addr)
    }

    /// Frees and merges with free neighbours of the same device allocation.
    fn give(&mut self, id: u32) {
        let Some(mut addr) = self.by_id.remove(&id) else {
            return;
        };
        let mut b = self.blocks[&addr];
        let next = addr + b.size;
        if let Some(n) = self.blocks.get(&next).copied() {
            if n.free && n.chunk == b.chunk {
                self.free.remove(&(n.stream, n.size, next));
                self.blocks.remove(&next);
                b.size += n.size;
            }
        }
        if let Some((&paddr, &p)) = self.blocks.range(..addr).next_back() {
            if p.free && p.chunk == b.chunk && paddr + p.size == addr {
                self.free.remove(&(p.stream, p.size, paddr));
                self.blocks.remove(&addr);
                addr = paddr;
                b.size += p.size;
            }
        }
        b.free = true;
        self.blocks.insert(addr, b);
        self.free.insert((b.stream, b.size, addr));
    }

    /// Removes device allocations that are one whole free block; returns (addr, size) of each.
    fn release_free_chunks(&mut self, chunk_size: &FxHashMap<u64, u64>) -> Vec<(u64, u64)> {
        let whole: Vec<(u64, u64, u64)> = self
            .free
            .iter()
            .copied()
            .filter(|&(_, size, addr)| chunk_size.get(&addr) == Some(&size))
            .collect();
        for &(s, size, addr) in &whole {
            self.free.remove(&(s, size, addr));
            self.blocks.remove(&addr);
        }
        whole
            .into_iter()
            .map(|(_, size, addr)| (addr, size))
            .collect()
    }

    fn largest_free(&self) -> u64 {
        self.free.iter().map(|f| f.1).max().unwrap_or(0)
    }

    fn layout(&self) -> Vec<(u64, u64, bool)> {
        self.blocks
            .iter()
            .map(|(&a, b)| (a, b.size, !b.free))
            .collect()
    }

    fn free_bytes(&self) -> u64 {
        self.free.iter().map(|f| f.1).sum()
    }
}

/// The `Model` methods of a model made of a device allocation counter `dev` and a coalescing
/// free list `c` (rmm-pool and cupy differ only in how they allocate).
macro_rules! coalescing_model {
    () => {
        fn free(&mut self, id: u32) {
            self.c.give(id);
        }
        fn reserved(&self) -> u64 {
            self.dev.reserved
        }
        fn largest_free(&self) -> u64 {
            self.c.largest_free()
        }
        fn free_bytes(&self) -> u64 {
            self.c.free_bytes()
        }
        fn layout(&self) -> Vec<(u64, u64, bool)> {
            self.c.layout()
        }
    };
}

// ------------------------------------------------------------------------------------------
// rmm-pool

/// RMM's `pool_memory_resource`: requests aligned to 256 B; a coalescing best fit over the
/// pool's free blocks (one list: the model treats streams as synchronized); on a miss the pool
/// grows by a device allocation of max(request, current pool size) (it doubles), or of the
/// request alone when that does not fit; it never gives memory back.
pub struct RmmPool {
    dev: DeviceMem,
    c: Coalescing,
}

impl RmmPool {
    pub fn new(capacity: u64) -> Self {
        RmmPool {
            dev: DeviceMem::new(capacity),
            c: Coalescing::default(),
        }
    }
}

impl Model for RmmPool {
    fn alloc(&mut self, id: u32, size: u64, _stream: u64) -> Option<u64> {
        let r = round_up(size.max(1), 256);
        if let Some(a) = self.c.take(id, r, 0) {
            return Some(a);
        }
        let grow = r.max(self.dev.reserved);
        let (addr, n) = match self.dev.take(grow) {
            Some(a) => (a, grow),
            None => (self.dev.take(r)?, r),
        };
        self.c.add_chunk(addr, n, 0);
        self.c.take(id, r, 0)
    }
    coalescing_model!();
}

// ------------------------------------------------------------------------------------------
// cupy

/// CuPy's `MemoryPool`: requests rounded to 512 B; one arena per stream, best fit with the
/// remainder split off and merges with free neighbours on free; a miss allocates exactly the
/// rounded size from the device; when that fails, `free_all_blocks` (every wholly free device
/// allocation goes back) and one retry.
pub struct CuPy {
    dev: DeviceMem,
    c: Coalescing,
    chunk_size: FxHashMap<u64, u64>,
}

impl CuPy {
    pub fn new(capacity: u64) -> Self {
        CuPy {
            dev: DeviceMem::new(capacity),
            c: Coalescing::default(),
            chunk_size: FxHashMap::default(),
        }
    }
}

impl Model for CuPy {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        let r = round_up(size.max(1), 512);
        if let Some(a) = self.c.take(id, r, stream) {
            return Some(a);
        }
        if !self.dev.fits(r) {
            for (addr, n) in self.c.release_free_chunks(&self.chunk_size) {
                self.chunk_size.remove(&addr);
                self.dev.give(n);
            }
        }
        let addr = self.dev.take(r)?;
        self.chunk_size.insert(addr, r);
        self.c.add_chunk(addr, r, stream);
        self.c.take(id, r, stream)
    }
    coalescing_model!();
}

// ------------------------------------------------------------------------------------------
// caching: PyTorch's CUDA caching allocator

const K_MIN_BLOCK: u64 = 512;
const K_SMALL_SIZE: u64 = MIB;
const K_SMALL_BUFFER: u64 = 2 * MIB;
const K_LARGE_BUFFER: u64 = 20 * MIB;
const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
const K_ROUND_LARGE: u64 = 2 * MIB;

#[derive(Copy, Clone, Debug)]
struct CBlock {
    seg: u64,
    size: u64,
    allocated: bool,
    stream: u64,
    small: bool,
}

#[derive(Copy, Clone, Debug)]
struct Segment {
    size: u64,
    small: bool,
}

/// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, 2.x): see
/// docs/replay.md for the rules. With `expandable_segments`, each (stream, pool) has one
/// segment that grows by mapping pages (2 MiB small, 20 MiB large) at its end, and on a miss
/// that cannot grow, free pages at segment ends are unmapped and the request retried.
pub struct Caching {
    opts: CachingOptions,
    dev: DeviceMem,
    blocks: BTreeMap<u64, CBlock>,
    free_small: BTreeSet<(u64, u64, u64)>,
    free_large: BTreeSet<(u64, u64, u64)>,
    segments: BTreeMap<u64, Segment>,
    by_id: FxHashMap<u32, u64>,
    /// segment_alloc events of the trace not yet matched: (addr, size)
    hints: VecDeque<(u64, u64)>,
    /// expandable: (stream, small) -> segment address
    expandable: FxHashMap<(u64, bool), u64>,
}

impl Caching {
    pub fn new(capacity: u64, opts: CachingOptions) -> Self {
        Caching {
            opts,
            dev: DeviceMem::new(capacity),
            blocks: BTreeMap::new(),
            free_small: BTreeSet::new(),
            free_large: BTreeSet::new(),
            segments: BTreeMap::new(),
            by_id: FxHashMap::default(),
            hints: VecDeque::new(),
            expandable: FxHashMap::default(),
        }
    }

    /// `round_size`: 512 B steps, or `roundup_power2_divisions` steps between powers of two.
    /// Example: 1200 B with 4 divisions → 1280 B.
    pub fn round_size(&self, size: u64) -> u64 {
        if size <= K_MIN_BLOCK {
            return K_MIN_BLOCK;
        }
        let div = self.opts.roundup_power2_divisions;
        if div > 1 && size > K_MIN_BLOCK * div {
            if size.is_power_of_two() {
                return size;
            }
            let floor = 1u64 << (63 - size.leading_zeros());
            let step = floor >> (63 - div.leading_zeros());
            if step == 0 {
                return floor << 1;
            }
            let r = size & !(step - 1);
            return if r == size { size } else { r + step };
        }
        round_up(size, K_MIN_BLOCK)
    }

    fn allocation_size(size: u64) -> u64 {
        if size <= K_SMALL_SIZE {
            K_SMALL_BUFFER
        } else if size < K_MIN_LARGE_ALLOC {
            K_LARGE_BUFFER
        } else {
            round_up(size, K_ROUND_LARGE)
        }
    }

    fn set(&mut self, small: bool) -> &mut BTreeSet<(u64, u64, u64)> {
        if small {
            &mut self.free_small
        } else {
            &mut self.free_large
        }
    }

    fn insert_free(&mut self, addr: u64) {
        let b = self.blocks[&addr];
        self.set(b.small).insert((b.stream, b.size, addr));
    }

    fn remove_free(&mut self, addr: u64) {
        let b = self.blocks[&addr];
        self.set(b.small).remove(&(b.stream, b.size, addr));
    }

    /// `get_free_block`: the first free block of the pool by (stream, size, address) at or
    /// after (stream, size); none if on another stream or against the max_split_size rules.
    fn find_free(&self, stream: u64, size: u64, small: bool) -> Option<u64> {
        let set = if small {
            &self.free_small
        } else {
            &self.free_large
        };
        let &(s, bsize, addr) = set.range((stream, size, 0)..).next()?;
        if s != stream {
            return None;
        }
        let max_split = self.opts.max_split_size;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size + K_LARGE_BUFFER {
            return None;
        }
        Some(addr)
    }

    fn should_split(&self, b: &CBlock, size: u64) -> bool {
        let remaining = b.size - size;
        if b.small {
            remaining >= K_MIN_BLOCK
        } else {
            size < self.opts.max_split_size && remaining > K_SMALL_SIZE
        }
    }

    /// A new segment from the device: at the address the trace's next matching segment_alloc
    /// gives, else a fresh one.
    fn new_segment(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
        if !self.dev.fits(size) {
            return None;
        }
        let fresh = self.dev.take(size)?;
        let addr = match self.hints.iter().position(|&(_, s)| s == size) {
            Some(i) => self.hints.remove(i).expect("hint").0,
            None => fresh,
        };
        self.segments.insert(addr, Segment { size, small });
        self.blocks.insert(
            addr,
            CBlock {
                seg: addr,
                size,
                allocated: false,
                stream,
                small,
            },
        );
        Some(addr)
    }

    /// `release_cached_blocks`: every segment that is one free block goes back to the device.
    fn release_cached(&mut self) {
        let whole: Vec<u64> = self
            .segments
            .iter()
            .filter(|(a, s)| {
                self.blocks
                    .get(a)
                    .is_some_and(|b| !b.allocated && b.size == s.size)
            })
            .map(|(a, _)| *a)
            .collect();
        for a in whole {
            self.drop_segment(a);
        }
    }

    fn drop_segment(&mut self, a: u64) {
        self.remove_free(a);
        self.blocks.remove(&a);
        let s = self.segments.remove(&a).expect("segment");
        self.dev.give(s.size);
        self.expandable.retain(|_, v| *v != a);
    }

    /// Expandable segments: grow the (stream, pool) segment at its end until a free block at
    /// its end holds `size`; returns that block.
    fn grow_expandable(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
        let page = if small {
            K_SMALL_BUFFER
        } else {
            K_LARGE_BUFFER
        };
        let seg = match self.expandable.get(&(stream, small)) {
            Some(&s) => s,
            None => {
                let a = self.new_segment(page, stream, small)?;
                self.insert_free(a);
                self.expandable.insert((stream, small), a);
                return self
                    .find_free(stream, size, small)
                    .or_else(|| self.grow_expandable(size, stream, small));
            }
        };
        let seg_size = self.segments[&seg].size;
        let end = seg + seg_size;
        let (last_addr, last) = self
            .blocks
            .range(seg..end)
            .next_back()
            .map(|(a, b)| (*a, *b))
            .expect("a segment has blocks");
        let tail_free = if last.allocated { 0 } else { last.size };
        let pages = (size - tail_free.min(size)).div_ceil(page).max(1);
        let add = pages * page;
        if !self.dev.fits(add) {
            return None;
        }
        self.dev.reserved += add;
        self.segments.get_mut(&seg).expect("segment").size += add;
        if last.allocated {
            self.blocks.insert(
                end,
                CBlock {
                    seg,
                    size: add,
                    allocated: false,
                    stream,
                    small,
                },
            );
            self.insert_free(end);
            Some(end)
        } else {
            self.remove_free(last_addr);
            self.blocks.get_mut(&last_addr).expect("block").size += add;
            self.insert_free(last_addr);
            Some(last_addr)
        }
    }

    /// Expandable segments under pressure: unmap the whole free pages at each segment's end.
    fn unmap_free_tails(&mut self) {
        let segs: Vec<u64> = self.expandable.values().copied().collect();
        for seg in segs {
            let s = self.segments[&seg];
            let page = if s.small {
                K_SMALL_BUFFER
            } else {
                K_LARGE_BUFFER
            };
            let end = seg + s.size;
            let Some((&a, &b)) = self.blocks.range(seg..end).next_back() else {
                continue;
            };
            if b.allocated {
                continue;
            }
            let cut = (b.size / page) * page;
            if cut == 0 || cut == s.size {
                if cut == s.size {
                    self.drop_segment(seg);
                }
                continue;
            }
            self.remove_free(a);
            let nb = self.blocks.get_mut(&a).expect("block");
            nb.size -= cut;
            if nb.size == 0 {
                self.blocks.remove(&a);
            } else {
                self.insert_free(a);
            }
            self.segments.get_mut(&seg).expect("segment").size -= cut;
            self.dev.give(cut);
        }
    }
}

impl Model for Caching {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        let r = self.round_size(size);
        let small = r <= K_SMALL_SIZE;
        let found = self.find_free(stream, r, small).or_else(|| {
            if self.opts.expandable_segments {
                self.grow_expandable(r, stream, small).or_else(|| {
                    self.unmap_free_tails();
                    self.grow_expandable(r, stream, small)
                })
            } else {
                let seg_size = Self::allocation_size(r);
                let a = self.new_segment(seg_size, stream, small).or_else(|| {
                    // OOM: release cached segments (free, synchronize), then retry
                    self.release_cached();
                    self.new_segment(seg_size, stream, small)
                })?;
                self.insert_free(a);
                Some(a)
            }
        });
        self.hints.clear();
        let addr = found?;
        self.remove_free(addr);
        let mut b = self.blocks[&addr];
        if self.should_split(&b, r) {
            let rest = CBlock {
                size: b.size - r,
                allocated: false,
                ..b
            };
            self.blocks.insert(addr + r, rest);
            self.insert_free(addr + r);
            b.size = r;
        }
        b.allocated = true;
        self.blocks.insert(addr, b);
        self.by_id.insert(id, addr);
        Some(addr)
    }

    fn free(&mut self, id: u32) {
        let Some(mut addr) = self.by_id.remove(&id) else {
            return;
        };
        let mut b = self.blocks[&addr];
        b.allocated = false;
        let next = addr + b.size;
        if let Some(n) = self.blocks.get(&next).copied() {
            if !n.allocated && n.seg == b.seg {
                self.remove_free(next);
                self.blocks.remove(&next);
                b.size += n.size;
            }
        }
        if let Some((&pa, &p)) = self.blocks.range(..addr).next_back() {
            if !p.allocated && p.seg == b.seg && pa + p.size == addr {
                self.remove_free(pa);
                self.blocks.remove(&addr);
                addr = pa;
                b.size += p.size;
            }
        }
        self.blocks.insert(addr, b);
        self.insert_free(addr);
    }

    fn reserved(&self) -> u64 {
        self.dev.reserved
    }

    fn largest_free(&self) -> u64 {
        self.free_small
            .iter()
            .chain(self.free_large.iter())
            .map(|f| f.1)
            .max()
            .unwrap_or(0)
    }

    fn free_bytes(&self) -> u64 {
        self.free_small
            .iter()
            .chain(self.free_large.iter())
            .map(|f| f.1)
            .sum()
    }

    fn layout(&self) -> Vec<(u64, u64, bool)> {
        self.blocks
            .iter()
            .map(|(&a, b)| (a, b.size, b.allocated))
            .collect()
    }

    fn segment_hint(&mut self, addr: u64, size: u64) {
        self.hints.push_back((addr, size));
    }

    fn segment_released(&mut self, addr: u64) {
        let whole = self.segments.get(&addr).is_some_and(|s| {
            self.blocks
                .get(&addr)
                .is_some_and(|b| !b.allocated && b.size == s.size)
        });
        if whole {
            self.drop_segment(addr);
        }
    }

    /// The snapshot's segments at the trace's start, with its live blocks; the gaps between
    /// them are free blocks (the real allocator merges free neighbours, so gaps are maximal).
    fn preload(&mut self, start: &StartState) -> bool {
        let mut live: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        for &(id, addr, _req, bsize, _) in &start.blocks {
            live.insert(addr, (id, bsize));
        }
        for &(seg, size, stream) in &start.segments {
            let small = size == K_SMALL_BUFFER;
            if !self.dev.fits(size) {
                return false;
            }
            self.dev.reserved += size;
            self.segments.insert(seg, Segment { size, small });
            let mut at = seg;
            let end = seg + size;
            let inside: Vec<(u64, (u32, u64))> =
                live.range(seg..end).map(|(a, v)| (*a, *v)).collect();
            for (a, (id, bsize)) in inside {
                if a > at {
                    self.blocks.insert(
                        at,
                        CBlock {
                            seg,
                            size: a - at,
                            allocated: false,
                            stream,
                            small,
                        },
                    );
                    self.insert_free(at);
                }
                self.blocks.insert(
                    a,
                    CBlock {
                        seg,
                        size: bsize,
                        allocated: true,
                        stream,
                        small,
                    },
                );
                self.by_id.insert(id, a);
                at = a + bsize;
            }
            if at < end {
                self.blocks.insert(
                    at,
                    CBlock {
                        seg,
                        size: end - at,
                        allocated: false,
                        stream,
                        small,
                    },
                );
                self.insert_free(at);
            }
        }
        // live blocks outside every segment (a malformed start) are allocated anew
        let placed: Vec<u32> = self.by_id.keys().copied().collect();
        let placed: rustc_hash::FxHashSet<u32> = placed.into_iter().collect();
        start
            .blocks
            .iter()
            .filter(|b| !placed.contains(&b.0))
            .all(|&(id, _, req, _, stream)| self.alloc(id, req, stream).is_some())
    }
}

// ------------------------------------------------------------------------------------------
// gpumm

/// gpumm's pool (rust/alloc) on a simulated device of the capacity, 2 MiB pages, defaults.
pub struct Gpumm {
    pool: Pool,
    ids: FxHashMap<u32, AllocId>,
}

impl Gpumm {
    pub fn new(capacity: u64) -> Result<Self> {
        let vidmem = (capacity / (2 * MIB)).max(1) * 2 * MIB;
        let mut cfg = PmmConfig::new(
            vidmem,
            SizeMask::from_sizes(&[4 * KIB, 64 * KIB, 2 * MIB])?,
            SizeMask::from_sizes(&[256, 4 * KIB, 64 * KIB, 2 * MIB])?,
        );
        cfg.check = false;
        let dev = Arc::new(Device {
            pmm: Arc::new(Mutex::new(Pmm::new(cfg)?)),
            backend: Arc::new(Simulated::new(vidmem, 2 * MIB)?),
        });
        Ok(Gpumm {
            pool: Pool::new(dev, PoolConfig::new(2 * MIB))?,
            ids: FxHashMap::default(),
        })
    }
}

impl Model for Gpumm {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        let req = Request {
            size: size.max(1),
            stream,
            ..Request::default()
        };
        let (aid, ptr) = self.pool.alloc(req).ok()?;
        self.ids.insert(id, aid);
        Some(ptr)
    }
    fn free(&mut self, id: u32) {
        if let Some(aid) = self.ids.remove(&id) {
            let _ = self.pool.free(aid);
        }
    }
    fn reserved(&self) -> u64 {
        self.pool.reserved_bytes()
    }
    fn largest_free(&self) -> u64 {
        self.pool.stats().largest_free_run
    }
    fn free_bytes(&self) -> u64 {
        self.pool.stats().free_bytes
    }
    fn layout(&self) -> Vec<(u64, u64, bool)> {
        let mut v = Vec::new();
        for page in self.pool.page_snapshot() {
            for (off, size, owner) in page.blocks {
                v.push((page.addr + off, size, owner.is_some()));
            }
        }
        v
    }
}
