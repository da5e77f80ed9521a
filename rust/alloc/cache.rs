//! The size cache: a freed heap block kept whole for the request that comes next, taken back
//! by it when it is of the block's size and the pool without the cache would place it at the
//! block's own address. The free's merge and the request's search and split are then
//! skipped, and the layout after the request is the one the pool without the cache leaves:
//! the cache never changes where memory goes, so it never makes the pool hold more
//! (`cache_props.rs` checks every address on random streams, also on the way to out of
//! memory).
//!
//! The pool without the cache, freeing heap block B, merges it with its free neighbours into
//! a block R and files R at the head of its bin; a request of B's size then takes the head
//! of the lowest non-empty heap bin whose blocks all hold it (`Bins::find_fit`, with no scan
//! of the request's own bin) and is cut from its start (from its end where the pool
//! `carves_at_block_end`). That is B itself when:
//! - the block before B is not free (R starts where B does);
//! - R is not its whole page (which would go back to the free pages instead);
//! - in a pool below `SMALL_POOL`, R does not end its segment before a heap page whose first
//!   block is free (R would join it: `Pool::join_next_heap`);
//! - R's bin is one whose blocks all hold the request;
//! - R ends where B does, where the request is cut from R's end;
//! - no other free heap block is in a bin from the request's up to below R's (a free block
//!   just after B, merged into R, is not counted when it is alone in its bin);
//!
//! and when nothing happened to the pool's blocks since the free. In a pool of at least
//! `SMALL_POOL` the heap takes the best of a few candidates instead (`Bins::find_best` with
//! `HEAP_BEST_SCAN`): there the check runs that search over the bins as the pool without the
//! cache would hold them (R at the head of its bin, the free block it absorbs gone) and
//! passes when it picks R (`Pool::best_takes`). The request checks the
//! first four (`Pool::holds_in_place`, so that a free followed by a request of another size,
//! most of them, pays for no check); every other placement or free, and every operation that
//! moves memory, gives the block back first (`flush_cache`: merged and binned, as the free
//! would have done), and so does a request of another size, one the checks refuse, and one
//! while stream events wait (which it would poll first). On a hit, the free block after B
//! goes to the head of its bin, where the split would have filed it.
//!
//! A cache whose last `MAX_MISSES` blocks all went back without a hit rests: frees merge at
//! once until a request follows a free of its own size (`SizeCache::note_request`). What it
//! holds never decides where memory goes, so resting moves no placement either.
//!
//! Kept out: holding freed blocks across other requests (deferred coalescing, as dlmalloc's
//! fast bins do). It serves more requests (63–85 % of those of the RMM traces, against
//! 17 % that follow a free of their size), but the layout it leaves parts from the pool's:
//! on 1,000 random streams it peaked higher on 236, and on the corpus's held-out copies it
//! took 26 over issue 27's bound against 14 (docs/reserve.md, "The size cache").

#![deny(unsafe_code)]

use super::bins::{bin_of, bin_up, fold_best, NIL, NUM_BINS};
use super::config::{HEAP, HEAP_BEST_SCAN, HEAP_SCAN};
use super::{Block, BlockLinksRef, Layout, Pool};

// `holds_in_place` mirrors the heap's good fit with no scan of the request's own bin.
const _: () = assert!(HEAP_SCAN == 0);

/// Blocks given back in a row without a hit after which the cache rests: frees merge at
/// once, as with no cache, until a request follows a free of its own size again. The cache
/// never changes where memory goes, so resting changes no placement, only the cost: on a
/// stream of random sizes, where no request takes the block back, holding and giving back
/// each freed heap block costs about 26 instructions a pair (`churn_for_profiler` with and
/// without the cache); resting, 2 (842.9 against 841.0). 4 or 2 save under one more.
pub const MAX_MISSES: u8 = 8;

/// `misses` of a cache that is off (`SizeCache::off`): above `MAX_MISSES`, so that it rests
/// for good (no request wakes it).
const OFF: u8 = u8::MAX;

/// The one freed allocation held (its slot and size in granules), or none; the misses in a
/// row (`OFF`: the cache is off), and the size of the block just freed without being held
/// (0: none since the last request).
#[derive(Clone, Copy, Debug)]
pub struct SizeCache {
    slot: u32,
    units: u32,
    misses: u8,
    ghost: u32,
}

impl Default for SizeCache {
    fn default() -> Self {
        SizeCache {
            slot: NIL,
            units: 0,
            misses: 0,
            ghost: 0,
        }
    }
}

impl SizeCache {
    /// An empty cache, on or off for good.
    pub fn new(on: bool) -> Self {
        let mut c = SizeCache::default();
        if !on {
            c.off();
        }
        c
    }

    /// Allocations held (0 or 1).
    #[inline]
    pub fn len(&self) -> usize {
        (self.slot != NIL) as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.slot == NIL
    }

    /// Holds freed slot `slot` of `units` granules (the cache is empty). The size of an
    /// earlier free is forgotten: a noted size means an empty cache, so that a request
    /// compares its size with it only where a request that found the cache holding a block
    /// (and gave it back without comparing) could not have (the quick path retried on the
    /// full one counts as the full one alone).
    #[inline]
    pub fn hold(&mut self, slot: u32, units: u32) {
        debug_assert!(self.is_empty() && slot != NIL);
        (self.slot, self.units, self.ghost) = (slot, units, 0);
    }

    /// The slot held, if it is of `units` granules (the cache is unchanged: `hit` takes it,
    /// `drain` gives it back).
    #[inline]
    pub fn held(&self, units: u64) -> Option<u32> {
        (self.slot != NIL && self.units as u64 == units).then_some(self.slot)
    }

    /// Empties the cache; returns the slot it held, given back without a hit (a miss).
    #[inline]
    pub fn drain(&mut self) -> Option<u32> {
        if self.slot == NIL {
            return None;
        }
        self.missed();
        Some(self.empty())
    }

    fn empty(&mut self) -> u32 {
        self.units = 0;
        std::mem::replace(&mut self.slot, NIL)
    }

    /// The held block is taken back by the request after its free: the cache is empty and
    /// the count of misses in a row starts again.
    #[inline]
    pub fn hit(&mut self) {
        self.empty();
        self.misses = 0;
    }

    /// A held block was given back without a hit (`drain`, the one place that counts misses).
    #[inline]
    fn missed(&mut self) {
        if self.misses < MAX_MISSES {
            self.misses += 1; // (an `OFF` cache stays off)
        }
    }

    /// Turns the cache off for good (it holds nothing from now on; what it holds is to be
    /// given back by the caller).
    pub fn off(&mut self) {
        self.misses = OFF;
    }

    /// Whether a freed block is to be held (if it is a heap block): not while resting or off.
    /// One compare, read first on a free's path, so that a resting cache costs a free little.
    #[inline(always)]
    pub fn holding(&self) -> bool {
        self.misses < MAX_MISSES
    }

    /// A block of `units` granules was freed and not held: its size, for the next request to
    /// compare with its own (`note_request`).
    #[inline(always)]
    pub fn note_free(&mut self, units: u64) {
        self.ghost = units as u32;
    }

    /// A request of `units` granules: right after a free of that size, a resting cache holds
    /// again from the next free.
    #[inline(always)]
    pub fn note_request(&mut self, units: u64) {
        if self.ghost as u64 == units && self.misses != OFF {
            self.misses = 0;
        }
        self.ghost = 0;
    }

    /// (size in granules, slot) of what is held (for checks).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u32)> {
        (!self.is_empty())
            .then_some((self.units as u64, self.slot))
            .into_iter()
    }
}

impl Pool {
    /// Whether the heap block of cached slot `a`, had it been freed, would hold a request of
    /// `units` granules where it is: the checks of the module's comment.
    ///
    /// What the checks read changes only with the heap bins (a heap block is freed or taken
    /// only through them; a block held or in use keeps its neighbours while nothing is
    /// filed or taken out), so a block that passed passes again until the bins change: a
    /// loop that frees and asks for one size pays for the checks once.
    #[inline]
    pub(super) fn holds_in_place(&mut self, a: u32, units: u64) -> bool {
        let Layout::Block(b) = self.allocs[a as usize].layout else {
            return false;
        };
        let blk = self.blocks[b as usize];
        if !blk.heap || units >= self.small_units || blk.len as u64 != units {
            return false;
        }
        // (the pool's size picks the heap's fit: a pass holds for that fit only)
        let stamp = (b, self.heap_changes << 1 | self.small_pool() as u64);
        if self.cache_ok == stamp {
            return true;
        }
        let ok = self.would_place_at(blk);
        if ok {
            self.cache_ok = stamp;
        }
        ok
    }

    /// `holds_in_place`'s checks of a heap block `blk`, of the request's size. Kept out of
    /// line: a hit passes on the stamp alone, and inlined this cost the fixed pair 319.1
    /// instructions against 313.1 (callgrind, `cache_props::fixed_pair_for_profiler`).
    #[inline(never)]
    fn would_place_at(&self, blk: Block) -> bool {
        if blk.prev != NIL && self.binned_free(blk.prev) {
            return false; // merged, it would start before `b`
        }
        let nx = blk.next;
        let next_free = nx != NIL && self.binned_free(nx);
        let (len, after) = if next_free {
            let n = &self.blocks[nx as usize];
            (blk.len + n.len, n.next)
        } else {
            (blk.len, nx)
        };
        if after == NIL {
            if blk.prev == NIL {
                return false; // its whole page: the page would go back
            }
            let end = if next_free {
                &self.blocks[nx as usize]
            } else {
                &blk
            };
            if self.small_pool() && self.free_heap_start_after(end).is_some() {
                return false; // it would join the next page's free start (`join_next_heap`)
            }
        }
        if !self.small_pool() {
            if next_free && self.carves_at_block_end(blk.len) {
                return false; // cut from R's end (`take_free`), past `b`
            }
            return self.best_takes(blk.len, len, if next_free { nx } else { NIL });
        }
        let (want, own) = (bin_up(blk.len), bin_of(len));
        if own < want {
            return false; // the good fit does not look in its bin
        }
        // below the merged block's bin, no free heap block but the one it absorbs, alone in
        // its bin
        let heap = &self.primary[HEAP];
        if !next_free {
            return heap.only_in(want, own, NUM_BINS);
        }
        let n = &self.blocks[nx as usize];
        let tb = n.bin();
        heap.only_in(want, own, tb)
            && (tb < want || tb >= own || (heap.head(tb) == nx && n.links.next == NIL))
    }

    /// Whether the heap's best fit for `n` granules (`Bins::find_best`, `HEAP_BEST_SCAN`)
    /// picks the merged block R of `r` granules in the bins the pool without the cache
    /// would have: R at the head of its bin, and `nx` (the free block R absorbs, or NIL)
    /// out of its own.
    fn best_takes(&self, n: u32, r: u32, nx: u32) -> bool {
        let heap = &self.primary[HEAP];
        let links = BlockLinksRef(&self.blocks);
        let rb = bin_of(r);
        // the first candidates of bin `k` in that view: (size, whether it is R)
        let seen = |k: usize| {
            (k == rb)
                .then_some((r, true))
                .into_iter()
                .chain(
                    heap.iter(&links, k)
                        .filter(move |&i| i != nx)
                        .map(|i| (self.blocks[i as usize].len, false)),
                )
                .take(HEAP_BEST_SCAN)
        };
        let own = bin_of(n);
        let mut best = None;
        fold_best(n, seen(own), &mut best);
        if best.is_none_or(|(s, _)| s > n) {
            // the lowest bin above `own` that holds a block in that view
            let mut above = heap.first_at_or_above(own + 1);
            if nx != NIL && above == Some(self.blocks[nx as usize].bin()) {
                let alone =
                    heap.head(above.unwrap()) == nx && self.blocks[nx as usize].links.next == NIL;
                if alone {
                    above = heap.first_at_or_above(above.unwrap() + 1);
                }
            }
            if rb > own {
                above = Some(above.map_or(rb, |k| k.min(rb)));
            }
            if let Some(k) = above {
                fold_best(n, seen(k), &mut best);
            }
        }
        best.is_some_and(|(_, is_r)| is_r)
    }

    /// A held block `b` is taken back by a request of its size: the free block after it
    /// goes to the head of its bin, where the merge and split it skipped would have put it.
    #[inline]
    pub(super) fn refile_after(&mut self, b: u32) {
        let nx = self.blocks[b as usize].next;
        if nx != NIL && self.binned_free(nx) {
            let bin = self.blocks[nx as usize].bin();
            if self.primary[HEAP].head(bin) != nx {
                self.remove_free(nx);
                self.insert_free(nx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_holds_one_slot_for_its_size() {
        let mut c = SizeCache::default();
        assert!(c.is_empty() && c.held(40).is_none() && c.drain().is_none());
        c.hold(7, 40);
        assert_eq!(c.len(), 1);
        assert_eq!(c.entries().collect::<Vec<_>>(), vec![(40, 7)]);
        assert_eq!(c.held(41), None, "another size");
        assert_eq!(c.held(40), Some(7));
        assert_eq!(c.len(), 1, "still held");
        c.hit();
        assert!(c.is_empty());
        c.hold(9, 40);
        assert_eq!(c.drain(), Some(9));
        assert!(c.is_empty() && c.entries().next().is_none());
        assert_eq!(c.held(u64::MAX), None);
    }

    /// The cache rests after `MAX_MISSES` misses in a row (a hit starts the count again), a
    /// request right after a free of its size wakes it, and nothing wakes one that is off.
    #[test]
    fn the_cache_rests_after_misses_in_a_row_and_wakes_on_a_request_of_the_size_freed() {
        let mut c = SizeCache::new(true);
        let miss = |c: &mut SizeCache| {
            c.hold(1, 40);
            assert_eq!(c.drain(), Some(1), "given back without a hit");
        };
        for _ in 1..MAX_MISSES {
            miss(&mut c);
        }
        assert!(c.holding());
        c.hold(1, 40);
        assert_eq!(c.held(40), Some(1));
        c.hit();
        assert!(c.is_empty());
        for _ in 1..MAX_MISSES {
            miss(&mut c);
        }
        assert!(c.holding(), "misses in a row count, not misses in all");
        miss(&mut c);
        assert!(!c.holding(), "resting after MAX_MISSES in a row");
        c.note_free(40);
        c.note_request(41);
        c.note_request(40);
        assert!(
            !c.holding(),
            "another size came between the free and the request"
        );
        c.note_free(40);
        c.note_request(40);
        assert!(
            c.holding(),
            "woken by a request right after a free of its size"
        );
        c.off();
        c.note_free(40);
        c.note_request(40);
        assert!(!c.holding(), "off for good");
        assert!(!SizeCache::new(false).holding());
    }
}
