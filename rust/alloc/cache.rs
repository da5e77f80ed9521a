//! The exact-size cache (deferred coalescing, as in dlmalloc's fast bins or a thread cache):
//! a freed one-block allocation whose rounded size was just asked for again keeps its block,
//! unmerged, and the next request of that size takes it back whole, with no bin search, no
//! split and no merge. Training loops ask for the same sizes step after step: on the RMM
//! traces in `../shared/traces/`, 63–85 % of requests find a block of their size here.
//!
//! Sizes are hashed into `WAYS` ways. A way remembers the size last asked of it while it
//! holds nothing, and whether that size was asked again since (`seen`); a free is admitted
//! only into a way that remembers its size as seen twice and holds fewer than `DEPTH` blocks.
//! A way that holds blocks no request has wanted for `MAX_MISSES` requests of other sizes in
//! a row is stale: the pool gives its blocks back and the way follows the new size. So a
//! stream of sizes that never repeat (the mixed churn's large sizes) caches almost nothing
//! and nothing for long, and at most `WAYS * DEPTH` allocations wait here. (Measured on the
//! streams with a model of this cache before it was built: admitting any size the way
//! remembered kept 750 MiB of the churn's large blocks out of use on average, and its pool
//! stitched half as often again; with `seen` and staleness, under 7 MiB.) The pool also
//! gives every cached block back before it would grow, fail, defragment, trim or close,
//! before a batch, and when nothing is left live: the cache never makes it hold more memory.
//!
//! Entries are allocation slots (in `State::Cached`, still holding their block), so that
//! taking one back is filling in its slot. A way's tag is 8 bytes and its slots live apart:
//! every request and free reads a tag, only hits and admissions touch the slots (with the
//! slots inline, the tag's load missed the L1 on an eighth of the large churn's allocation
//! time).

#![deny(unsafe_code)]

/// Ways of the cache (a power of two).
pub const WAYS: usize = 256;
/// Blocks a way holds at most.
pub const DEPTH: usize = 4;
/// Requests of other sizes in a row after which a way's blocks are stale.
const MAX_MISSES: u8 = 8;

#[derive(Clone, Copy, Debug, Default)]
struct Way {
    /// The size (granules) of what the way holds, or was last asked of it.
    units: u32,
    len: u8,
    /// `units` was asked for again since the way took it up.
    seen: bool,
    misses: u8,
}

/// What the cache has for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The slot of a cached allocation of exactly the request's size.
    Hit(u32),
    Miss,
    /// Nothing, and the way of the request's size is stale: give it back with `evict`.
    Stale(usize),
}

#[derive(Clone, Debug)]
pub struct SizeCache {
    ways: [Way; WAYS],
    slots: [[u32; DEPTH]; WAYS],
    len: usize,
    /// The next `take` asks again for a request already counted (see `retry_next`).
    retry: bool,
}

impl Default for SizeCache {
    fn default() -> Self {
        SizeCache {
            ways: [Way::default(); WAYS],
            slots: [[0; DEPTH]; WAYS],
            len: 0,
            retry: false,
        }
    }
}

/// The way of a size (Fibonacci hashing: neighbouring sizes land in different ways).
#[inline]
pub(super) fn way(units: u32) -> usize {
    (units.wrapping_mul(0x9E37_79B1) >> (32 - WAYS.trailing_zeros())) as usize
}

impl SizeCache {
    /// Allocations held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A request of `units` granules.
    #[inline]
    pub fn take(&mut self, units: u64) -> Lookup {
        let Ok(u) = u32::try_from(units) else {
            return Lookup::Miss;
        };
        let retry = std::mem::replace(&mut self.retry, false);
        let i = way(u);
        let w = &mut self.ways[i];
        let (same, empty) = (w.units == u, w.len == 0);
        if same & !empty {
            w.misses = 0;
            w.len -= 1;
            self.len -= 1;
            return Lookup::Hit(self.slots[i][w.len as usize]);
        }
        // A miss, without branches on the way's state (whether it held this size, or was
        // empty, is as random as the sizes asked for; a branch on each mispredicted about
        // once a request on the mixed churn): the way asked of its own size again is `seen`;
        // an empty way takes up the size; a way holding another size counts a miss, and is
        // stale after `MAX_MISSES` in a row.
        let other = !same & !empty;
        w.seen = (same & (w.seen | !retry)) | (other & w.seen);
        w.units = if same | other { w.units } else { u };
        let counted = w.misses + (!retry) as u8;
        w.misses = if other { counted } else { 0 };
        if other & (w.misses >= MAX_MISSES) {
            return Lookup::Stale(i);
        }
        Lookup::Miss
    }

    /// The next `take` is the same request again (one that gave up before it was placed:
    /// the quick path under the GIL, which will not grow the pool, retried in full): it may
    /// take a cached block but does not count as the size asked for again, nor as a miss.
    pub fn retry_next(&mut self) {
        self.retry = true;
    }

    /// Empties stale way `i` (returns its slots); it now remembers `units`.
    pub fn evict(&mut self, i: usize, units: u64) -> ([u32; DEPTH], usize) {
        let w = &mut self.ways[i];
        let out = (self.slots[i], w.len as usize);
        self.len -= w.len as usize;
        *w = Way {
            units: units as u32,
            ..Way::default()
        };
        out
    }

    /// A free of `units` granules in slot `slot`: whether the cache keeps it.
    #[inline]
    pub fn admit(&mut self, units: u64, slot: u32) -> bool {
        let Ok(u) = u32::try_from(units) else {
            return false;
        };
        let i = way(u);
        let w = &mut self.ways[i];
        // one branch, not three (`|`, not `||`: each condition alone is unpredictable)
        if (w.units != u) | !w.seen | (w.len as usize == DEPTH) {
            return false;
        }
        self.slots[i][w.len as usize] = slot;
        w.len += 1;
        self.len += 1;
        true
    }

    /// Empties the cache; returns the slots it held.
    pub fn drain(&mut self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        for (w, slots) in self.ways.iter_mut().zip(&self.slots) {
            out.extend_from_slice(&slots[..w.len as usize]);
            w.len = 0;
        }
        self.len = 0;
        out
    }

    /// Empties the ways that hold sizes below `units` granules; returns their slots.
    pub fn drain_below(&mut self, units: u64) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, slots) in self.ways.iter_mut().zip(&self.slots) {
            if w.len > 0 && (w.units as u64) < units {
                out.extend_from_slice(&slots[..w.len as usize]);
                self.len -= w.len as usize;
                w.len = 0;
            }
        }
        out
    }

    /// (size in granules, slot) of everything held (for checks).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.ways
            .iter()
            .zip(&self.slots)
            .flat_map(|(w, slots)| slots[..w.len as usize].iter().map(|&s| (w.units as u64, s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A size of the same way as `u`, other than `u`.
    fn sibling(u: u32) -> u64 {
        (1..u32::MAX).find(|&v| v != u && way(v) == way(u)).unwrap() as u64
    }

    #[test]
    fn a_size_is_cached_only_once_asked_for_twice() {
        let mut c = SizeCache::default();
        assert!(!c.admit(40, 7), "a size never asked for is not kept");
        assert_eq!(c.take(40), Lookup::Miss); // the way takes up 40
        assert!(!c.admit(40, 7), "asked for once: not kept");
        assert_eq!(c.take(40), Lookup::Miss); // 40 again: seen
        assert!(c.admit(40, 7));
        assert!(!c.admit(41, 8), "a size no way took up is not kept");
        assert_eq!(c.len(), 1);
        assert_eq!(c.take(40), Lookup::Hit(7));
        assert_eq!(c.take(40), Lookup::Miss);
        assert!(c.is_empty());
        assert_eq!(
            c.take(u64::MAX),
            Lookup::Miss,
            "sizes beyond u32 are never cached"
        );
        assert!(!c.admit(u64::MAX, 1));
    }

    #[test]
    fn a_way_holds_at_most_depth_and_drains_whole() {
        let mut c = SizeCache::default();
        c.take(1000);
        c.take(1000);
        for s in 0..DEPTH as u32 {
            assert!(c.admit(1000, s));
        }
        assert!(!c.admit(1000, 99), "the way is full");
        // a way that holds a size does not take up another one asked of it
        let other = sibling(1000);
        assert_eq!(c.take(other), Lookup::Miss);
        assert!(!c.admit(other, 5));
        assert_eq!(c.entries().count(), DEPTH);
        assert!(c.entries().all(|(u, _)| u == 1000));
        c.take(7);
        c.take(7);
        assert!(c.admit(7, 50));
        assert_eq!(c.drain_below(8), vec![50], "only the sizes below");
        assert_eq!(c.len(), DEPTH);
        let mut got = c.drain();
        got.sort_unstable();
        assert_eq!(got, (0..DEPTH as u32).collect::<Vec<_>>());
        assert!(c.is_empty());
    }

    #[test]
    fn a_retried_request_is_not_a_second_request() {
        let mut c = SizeCache::default();
        assert_eq!(c.take(40), Lookup::Miss);
        c.retry_next();
        assert_eq!(c.take(40), Lookup::Miss);
        assert!(!c.admit(40, 7), "asked for once, though looked up twice");
        assert_eq!(c.take(40), Lookup::Miss);
        assert!(c.admit(40, 7));
        c.retry_next();
        assert_eq!(
            c.take(40),
            Lookup::Hit(7),
            "a retry may still take a cached block"
        );
        // nor is a retry a miss of the way's size
        c.take(40);
        assert!(c.admit(40, 8));
        let other = sibling(40);
        for _ in 0..2 * MAX_MISSES {
            c.retry_next();
            assert_eq!(c.take(other), Lookup::Miss);
        }
    }

    #[test]
    fn a_way_nobody_wants_goes_stale_and_follows_the_new_size() {
        let mut c = SizeCache::default();
        c.take(1000);
        c.take(1000);
        assert!(c.admit(1000, 3));
        let other = sibling(1000);
        for _ in 1..MAX_MISSES {
            assert_eq!(c.take(other), Lookup::Miss);
        }
        // a hit in between starts the count again
        assert!(c.admit(1000, 4) && c.take(1000) == Lookup::Hit(4));
        for _ in 1..MAX_MISSES {
            assert_eq!(c.take(other), Lookup::Miss);
        }
        let Lookup::Stale(i) = c.take(other) else {
            panic!("stale after {MAX_MISSES} misses in a row")
        };
        let (slots, n) = c.evict(i, other);
        assert_eq!(&slots[..n], &[3]);
        assert!(c.is_empty());
        assert_eq!(c.take(other), Lookup::Miss); // asked again: seen
        assert!(c.admit(other, 9));
        assert!(!c.admit(1000, 10));
    }
}

impl SizeCache {
    /// The cache's own invariants: every way holds at most `DEPTH` slots, and only of a size
    /// that hashes to it and was seen twice; no slot is held twice; `len` is what the ways
    /// hold. Only for checks: it reads every way.
    pub fn validate(&self) -> Result<(), String> {
        let mut held = 0usize;
        let mut slots: Vec<u32> = Vec::new();
        for (i, (w, s)) in self.ways.iter().zip(&self.slots).enumerate() {
            let n = w.len as usize;
            if n > DEPTH || (n > 0 && (way(w.units) != i || !w.seen)) {
                return Err(format!("way {i} holds {w:?}"));
            }
            held += n;
            slots.extend_from_slice(&s[..n]);
        }
        if held != self.len {
            return Err(format!("the ways hold {held} slots, {} counted", self.len));
        }
        slots.sort_unstable();
        if let Some(d) = slots.windows(2).find(|d| d[0] == d[1]) {
            return Err(format!("slot {} is held twice", d[0]));
        }
        Ok(())
    }
}

#[cfg(test)]
mod validate_tests {
    use super::*;

    #[test]
    fn validate_sees_a_corrupted_cache() {
        let fresh = || {
            let mut c = SizeCache::default();
            c.take(40);
            c.take(40);
            assert!(c.admit(40, 7) && c.admit(40, 8));
            c
        };
        fresh().validate().unwrap();
        let i = way(40);
        let mut c = fresh();
        c.len += 1;
        assert!(c.validate().unwrap_err().contains("counted"));
        let mut c = fresh();
        c.slots[i][1] = 7;
        assert!(c.validate().unwrap_err().contains("twice"));
        let mut c = fresh();
        c.ways[i].units = 41;
        assert!(c.validate().unwrap_err().contains("way"));
    }
}
