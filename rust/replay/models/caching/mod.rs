//! caching: PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, 2.x), with
//! and without expandable segments. docs/replay.md states the rules.

mod blocks;
mod expandable;
mod gc;
mod preload;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use self::blocks::{Blocks, CBlock, Segment};
use super::{round_up, CachingOptions, DeviceMem, Model, FRESH_BASE, MIB};
use crate::replay::StartState;

const K_MIN_BLOCK: u64 = 512;
const K_SMALL_SIZE: u64 = MIB;
const K_SMALL_BUFFER: u64 = 2 * MIB;
const K_LARGE_BUFFER: u64 = 20 * MIB;
const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
const K_ROUND_LARGE: u64 = 2 * MIB;

/// The page an expandable segment of the pool maps at a time.
fn page(small: bool) -> u64 {
    if small {
        K_SMALL_BUFFER
    } else {
        K_LARGE_BUFFER
    }
}

/// PyTorch's CUDA caching allocator: see docs/replay.md for the rules. With
/// `expandable_segments`, each (stream, pool) has a segment of reserved address space that
/// maps pages (2 MiB small, 20 MiB large) at the lowest address where a request fits, and
/// unmaps the free pages when the device refuses.
pub struct Caching {
    opts: CachingOptions,
    capacity: u64,
    dev: DeviceMem,
    b: Blocks,
    by_id: FxHashMap<u32, u64>,
    /// segment_alloc events of the trace since the last allocation: (addr, size)
    hints: VecDeque<(u64, u64)>,
    /// segment_map events of the trace since the last allocation: (addr, size)
    map_hints: VecDeque<(u64, u64)>,
    /// where the next segment of the model's own choosing goes
    next_fresh: u64,
    /// requests served from the large pool so far: the clock of the garbage collection's
    /// block ages (PyTorch's `get_free_blocks_call_count`)
    large_requests: u64,
}

impl Caching {
    /// The model at `capacity` bytes of device memory; it may hold the allowed maximum of
    /// them (`opts.memory_fraction` of the capacity, all of it by default).
    pub fn new(capacity: u64, opts: CachingOptions) -> Self {
        Caching {
            opts,
            capacity,
            dev: DeviceMem::new(opts.allowed_maximum(capacity)),
            b: Blocks::default(),
            by_id: FxHashMap::default(),
            hints: VecDeque::new(),
            map_hints: VecDeque::new(),
            next_fresh: FRESH_BASE,
            large_requests: 0,
        }
    }

    /// Back to an empty allocator (a start state that does not fit).
    fn reset(&mut self) {
        *self = Caching::new(self.capacity, self.opts);
    }

    /// `round_size`: 512 B steps, or `roundup_power2_divisions` steps between powers of two
    /// (the count of the request's interval, in the per-interval form). Example: 1200 B with
    /// 4 divisions → 1536 B (PyTorch rounds by divisions only above 512 B × divisions).
    pub fn round_size(&self, size: u64) -> u64 {
        if size <= K_MIN_BLOCK {
            return K_MIN_BLOCK;
        }
        let div = self.opts.divisions(size);
        if div > 1 && size > K_MIN_BLOCK.saturating_mul(div) {
            if size.is_power_of_two() {
                return size;
            }
            let floor = 1u64 << (63 - size.leading_zeros());
            let step = floor >> (63 - div.leading_zeros());
            if step == 0 {
                return floor.saturating_mul(2);
            }
            let r = size & !(step - 1);
            return if r == size {
                size
            } else {
                r.saturating_add(step)
            };
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

    /// What an expandable block can grow to: itself and the unmapped block after it.
    fn expandable_size(&self, addr: u64, b: &CBlock) -> u64 {
        let tail = self
            .b
            .next(addr, b)
            .filter(|(_, n)| !n.mapped)
            .map_or(0, |(_, n)| n.size);
        b.size.saturating_add(tail)
    }

    fn is_expandable(&self, b: &CBlock) -> bool {
        self.b.segments.get(&b.seg).is_some_and(|s| s.expandable)
    }

    /// `get_free_block`: the first free block of the pool by (stream, size, address) at or
    /// after (stream, size); with expandable segments, later blocks that can grow less are
    /// preferred; none if on another stream or against the max_split_size rules.
    fn find_free(&self, stream: u64, size: u64, small: bool) -> Option<u64> {
        let mut it = self.b.free_set(small).range((stream, size, 0)..);
        let &(s, mut bsize, mut addr) = it.next()?;
        if s != stream {
            return None;
        }
        if self.opts.expandable_segments {
            let mut cur = self.b.get(addr)?;
            while self.is_expandable(&cur) {
                let Some(&(s2, size2, a2)) = it.next() else {
                    break;
                };
                let Some(next) = self.b.get(a2) else { break };
                if s2 != stream
                    || self.expandable_size(a2, &next) >= self.expandable_size(addr, &cur)
                {
                    break;
                }
                (bsize, addr, cur) = (size2, a2, next);
            }
        }
        let max_split = self.opts.max_split_size;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(K_LARGE_BUFFER) {
            return None;
        }
        Some(addr)
    }

    fn should_split(&self, b: &CBlock, size: u64) -> bool {
        let remaining = b.size - size;
        if b.small || self.opts.expandable_segments {
            remaining >= K_MIN_BLOCK
        } else {
            size < self.opts.max_split_size && remaining > K_SMALL_SIZE
        }
    }

    /// An address range of `size` no segment holds, for a segment of the model's choosing.
    fn fresh_range(&mut self, size: u64) -> Option<u64> {
        loop {
            let a = self.next_fresh;
            let end = a.checked_add(size)?;
            match self.b.segments.range(..end).next_back() {
                Some((&sa, s)) if s.end(sa) > a => {
                    self.next_fresh = s.end(sa).checked_add(2 * MIB)?;
                }
                _ => {
                    self.next_fresh = round_up(end, 2 * MIB).checked_add(2 * MIB)?;
                    return Some(a);
                }
            }
        }
    }

    /// `alloc_block` without expandable segments: a new segment from the device, at the
    /// address of the trace's segment_alloc of that size since the last allocation when no
    /// segment holds it, else at a fresh one. Returns its block.
    fn new_segment(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
        if !self.dev.fits(size) {
            return None;
        }
        let hinted = self
            .hints
            .iter()
            .position(|&(a, s)| s == size && !self.b.overlaps(a, s));
        let addr = match hinted {
            Some(i) => self.hints.remove(i)?.0,
            None => self.fresh_range(size)?,
        };
        self.dev.charge(size);
        let seg = Segment {
            size,
            small,
            stream,
            expandable: false,
        };
        self.b.add_segment(addr, seg, true);
        Some(addr)
    }

    fn alloc_block(&mut self, r: u64, stream: u64, small: bool) -> Option<u64> {
        if self.opts.expandable_segments {
            self.try_allocate_expandable(r, stream, small)
        } else {
            self.new_segment(Self::allocation_size(r), stream, small)
        }
    }

    /// A plain segment that is one free block goes back to the device.
    fn release_if_whole(&mut self, addr: u64) -> bool {
        let whole = self.b.segments.get(&addr).is_some_and(|s| {
            !s.expandable
                && self
                    .b
                    .get(addr)
                    .is_some_and(|b| !b.allocated && b.size == s.size)
        });
        if whole {
            if let Some(s) = self.b.drop_segment(addr) {
                self.dev.give(s.size);
            }
        }
        whole
    }

    /// `release_available_cached_blocks` (only with max_split_size): the oversize free
    /// blocks of the pool go back, the smallest that holds the request, else the largest
    /// until the request's size has gone back.
    fn release_available(&mut self, r: u64, stream: u64, small: bool) -> bool {
        let max_split = self.opts.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = r.max(max_split);
        let set = self.b.free_set(small);
        if let Some(&(s, _, a)) = set.range((stream, key, 0)..).next() {
            if s == stream {
                return self.release_if_whole(a);
            }
        }
        let below: Vec<(u64, u64, u64)> = set
            .range(..(stream, key, 0))
            .rev()
            .take_while(|&&(s, size, _)| s == stream && size >= max_split)
            .copied()
            .collect();
        let mut released = 0u64;
        for (_, size, a) in below {
            if released >= key {
                break;
            }
            if self.release_if_whole(a) {
                released += size;
            }
        }
        released >= key
    }

    /// `release_cached_blocks`: every plain segment that is one free block goes back, and
    /// the free pages of expandable segments are unmapped.
    fn release_cached(&mut self) {
        let free: Vec<u64> = self.b.free_blocks().map(|f| f.2).collect();
        for a in free {
            if self.b.get(a).is_some_and(|b| b.seg == a) {
                self.release_if_whole(a);
            }
        }
        self.unmap_free_pages();
    }
}

impl Model for Caching {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        self.free(id);
        let r = self.round_size(size);
        let small = r <= K_SMALL_SIZE;
        if !small {
            self.large_requests += 1;
        }
        let found = self
            .find_free(stream, r, small)
            .or_else(|| {
                self.garbage_collect();
                self.alloc_block(r, stream, small)
            })
            .or_else(|| {
                self.release_available(r, stream, small)
                    .then(|| self.alloc_block(r, stream, small))
                    .flatten()
            })
            .or_else(|| {
                self.release_cached();
                self.alloc_block(r, stream, small)
            });
        self.hints.clear();
        self.map_hints.clear();
        let addr = found?;
        let mut b = self.b.remove(addr)?;
        if b.size < r || b.allocated || !b.mapped {
            self.b.insert(addr, b); // never: every path above yields a free block that holds r
            return None;
        }
        if b.size > r && self.should_split(&b, r) {
            let rest = CBlock {
                size: b.size - r,
                since: self.large_requests,
                ..b
            };
            self.b.insert(addr + r, rest);
            b.size = r;
        }
        b.allocated = true;
        self.b.insert(addr, b);
        self.by_id.insert(id, addr);
        Some(addr)
    }

    fn free(&mut self, id: u32) {
        let Some(addr) = self.by_id.remove(&id) else {
            return;
        };
        let Some(mut b) = self.b.remove(addr) else {
            return;
        };
        b.allocated = false;
        b.since = self.large_requests;
        self.b.insert_merged(addr, b);
    }

    fn reserved(&self) -> u64 {
        self.dev.reserved
    }

    fn largest_free(&self) -> u64 {
        self.b.free_blocks().map(|f| f.1).max().unwrap_or(0)
    }

    fn free_bytes(&self) -> u64 {
        self.b.free_blocks().map(|f| f.1).sum()
    }

    fn layout(&self) -> Vec<(u64, u64, bool)> {
        self.b
            .all
            .iter()
            .filter(|(_, b)| b.mapped)
            .map(|(&a, b)| (a, b.size, b.allocated))
            .collect()
    }

    fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.by_id
            .values()
            .filter_map(|&a| self.b.get(a).map(|b| (a, b.size)))
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        self.b.validate(&self.by_id)?;
        let mapped = self.b.mapped_bytes();
        if mapped != self.dev.reserved {
            return Err(format!(
                "{mapped} B mapped, {} B reserved",
                self.dev.reserved
            ));
        }
        Ok(())
    }

    fn segment_hint(&mut self, addr: u64, size: u64) {
        self.hints.push_back((addr, size));
    }

    /// A plain segment of the model at `addr` goes if wholly free. Where the model holds no
    /// segment there (the expandable model on a trace recorded without expandable segments),
    /// the release says the real allocator emptied its cache (`empty_cache` or an
    /// out-of-memory retry): the model unmaps its expandable segments' free pages too.
    fn segment_released(&mut self, addr: u64, _size: u64) {
        if self.release_if_whole(addr) || self.b.segments.contains_key(&addr) {
            return;
        }
        if self.opts.expandable_segments && !self.opts.recorded_expandable {
            self.unmap_free_pages();
        }
    }

    fn segment_mapped(&mut self, addr: u64, size: u64) {
        self.map_hints.push_back((addr, size));
    }

    fn segment_unmapped(&mut self, addr: u64, size: u64) {
        self.unmap_range(addr, size);
    }

    fn preload(&mut self, start: &StartState) -> bool {
        let ok = self.load_start(start);
        if !ok {
            self.reset();
        }
        ok
    }
}
