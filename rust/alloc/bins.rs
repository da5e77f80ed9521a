//! Size classes and binned free lists: the O(1) "good fit" index under the block allocator,
//! the page-run allocator and the virtual-range allocator, and the latency histogram.
//!
//! A size is a count of units (256 B granules for blocks, pages for runs). Bins are laid out
//! like a small float with a 4-bit mantissa: counts 0..16 have a bin each; above that every
//! power of two is cut in 16 equal steps. So a bin's lower bound is within 6.25 % of every
//! size in it, and `u32::MAX` units fall in bin 463. (16 steps rather than 8: the head of the
//! first bin whose items all fit is then close enough that the heap's good fit need not walk
//! its own bin, and the fill to failure and the traces' reserve are better; benches/RESULTS.md.)
//!
//! Items are linked through caller-owned [`Link`]s (one per item and index, reached through
//! [`LinkRead`] / [`LinkWrite`]), so the lists need no memory of their own, an item can sit in
//! two indexes, and the links can live inside the item (one cache line per item).

#![deny(unsafe_code)]

/// "No item": the end of a list, an absent link.
pub const NIL: u32 = u32::MAX;

const MANTISSA_BITS: u32 = 4;
const MANTISSA: u32 = 1 << MANTISSA_BITS;

/// Bins 0..=463; `bin_of(u32::MAX)` is 463.
pub const NUM_BINS: usize = ((32 - MANTISSA_BITS + 1) * MANTISSA) as usize;
const NUM_WORDS: usize = NUM_BINS.div_ceil(64);
/// The heads' and the bitmap's length: a power of two above `NUM_BINS`, so that a bin masked
/// by `SLOTS - 1` indexes them without a bounds check (the mask costs one instruction, the
/// check two, on each of the five bin accesses of a push or remove).
const SLOTS: usize = NUM_WORDS * 64;

/// `bin` as an index of the heads and the bitmap (see `SLOTS`).
#[inline(always)]
fn slot(bin: usize) -> usize {
    debug_assert!(bin < NUM_BINS);
    bin & (SLOTS - 1)
}

/// The bin of `n` units, rounding down: the highest bin whose lower bound is at most `n`.
///
/// Below 16 a count is its own bin. Otherwise, with `e = floor(log2 n)`, the bin is
/// `(e - 3) * 16` plus the 4 bits under the leading one. Worked example: `n = 37 = 0b100101`,
/// `e = 5`, the bits under the leading one are `0010`, so the bin is `2 * 16 + 2 = 34`, whose
/// lower bound is `0b10010 << 1 = 36`.
#[inline]
pub fn bin_of(n: u32) -> usize {
    // Without a branch on `n < MANTISSA` (sizes are random: it mispredicted): with `e` at
    // least `MANTISSA_BITS`, `n >> (e - MANTISSA_BITS)` is the leading one and the bits under
    // it (`MANTISSA + m`) for a large `n`, and `n` itself for a small one.
    let e = (31 - (n | 1).leading_zeros()).max(MANTISSA_BITS);
    ((e - MANTISSA_BITS) * MANTISSA + (n >> (e - MANTISSA_BITS))) as usize
}

/// The smallest count in bin `b` (inverse of [`bin_of`] on lower bounds).
#[inline]
pub fn bin_lower(b: usize) -> u32 {
    // (as `bin_of`, without a branch on small bins: bin `b < MANTISSA` is `b << 0`)
    let b = b as u32;
    let shift = (b / MANTISSA).max(1) - 1;
    let m = if b < MANTISSA {
        b
    } else {
        MANTISSA + b % MANTISSA
    };
    m << shift
}

/// The lowest bin all of whose items hold at least `n` units.
#[inline]
pub fn bin_up(n: u32) -> usize {
    let b = bin_of(n);
    if bin_lower(b) == n {
        b
    } else {
        b + 1
    }
}

/// Links of one item in one index. `prev`/`next` are `NIL` at the ends of a list.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub prev: u32,
    pub next: u32,
}

impl Link {
    pub const UNLINKED: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

/// Read access to the links of items, by item index.
pub trait LinkRead {
    fn link(&self, i: u32) -> Link;
}

/// Write access to the links of items.
pub trait LinkWrite: LinkRead {
    fn link_mut(&mut self, i: u32) -> &mut Link;
}

impl LinkRead for [Link] {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self[i as usize]
    }
}

impl<T: LinkRead + ?Sized> LinkRead for &T {
    #[inline]
    fn link(&self, i: u32) -> Link {
        (**self).link(i)
    }
}

impl LinkWrite for [Link] {
    #[inline]
    fn link_mut(&mut self, i: u32) -> &mut Link {
        &mut self[i as usize]
    }
}

/// One list head per bin and a bitmap of the non-empty bins. Invariant: bit `b` is set iff
/// `heads[b] != NIL`.
///
/// `SELECT`: `push` and `remove` choose the link they store to instead of branching on the
/// item's neighbours (see `push`). Right for the pool's blocks, whose bins follow the random
/// sizes asked for; the page runs and the window keep the branches (`Bins<false>`): their
/// neighbours repeat from request to request, the branches predict well, and with selects
/// the always-stitched pair took 174 ns instead of 162.
#[derive(Clone, Debug)]
pub struct Bins<const SELECT: bool = true> {
    heads: [u32; SLOTS],
    bitmap: [u64; NUM_WORDS],
    len: usize,
    /// Where `push` and `remove` store a link that has no item to go to.
    spare: u32,
}

impl<const SELECT: bool> Default for Bins<SELECT> {
    fn default() -> Self {
        Bins {
            heads: [NIL; SLOTS],
            bitmap: [0; NUM_WORDS],
            len: 0,
            spare: NIL,
        }
    }
}

impl<const SELECT: bool> Bins<SELECT> {
    /// Number of items in all bins.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn head(&self, bin: usize) -> u32 {
        self.heads[slot(bin)]
    }

    /// Pushes `item` at the head of `bin` (LIFO: the most recently freed is reused first).
    ///
    /// Push and remove have no branch on their neighbours (whether the bin was empty, whether
    /// the item was its head or tail): the store that would be skipped goes to `spare`
    /// instead. Those branches followed the sizes asked for and mispredicted about 1.8 times
    /// a mixed churn pair (cachegrind's branch simulation).
    #[inline]
    pub fn push<L: LinkWrite + ?Sized>(&mut self, links: &mut L, item: u32, bin: usize) {
        let head = self.heads[slot(bin)];
        *links.link_mut(item) = Link {
            prev: NIL,
            next: head,
        };
        if SELECT {
            let back = if head != NIL {
                &mut links.link_mut(head).prev
            } else {
                &mut self.spare
            };
            *back = item;
        } else if head != NIL {
            links.link_mut(head).prev = item;
        }
        self.bitmap[slot(bin) / 64] |= 1 << (bin % 64);
        self.heads[slot(bin)] = item;
        self.len += 1;
    }

    /// Unlinks `item`, which must be in `bin`.
    #[inline]
    pub fn remove<L: LinkWrite + ?Sized>(&mut self, links: &mut L, item: u32, bin: usize) {
        let Link { prev, next } = links.link(item);
        debug_assert!(prev != NIL || self.heads[bin] == item);
        if SELECT {
            let head = &mut self.heads[slot(bin)];
            let fwd = if prev != NIL {
                &mut links.link_mut(prev).next
            } else {
                head
            };
            *fwd = next;
            let back = if next != NIL {
                &mut links.link_mut(next).prev
            } else {
                &mut self.spare
            };
            *back = prev;
        } else {
            if prev != NIL {
                links.link_mut(prev).next = next;
            } else {
                self.heads[slot(bin)] = next;
            }
            if next != NIL {
                links.link_mut(next).prev = prev;
            }
        }
        let emptied = (prev == NIL) & (next == NIL);
        self.bitmap[slot(bin) / 64] &= !((emptied as u64) << (bin % 64));
        *links.link_mut(item) = Link::UNLINKED;
        self.len -= 1;
    }

    /// The lowest non-empty bin at or above `bin`.
    #[inline]
    pub fn first_at_or_above(&self, bin: usize) -> Option<usize> {
        if bin >= NUM_BINS {
            return None;
        }
        let mut w = bin / 64;
        let mut bits = self.bitmap[w] & (!0u64 << (bin % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            if w == NUM_WORDS {
                return None;
            }
            bits = self.bitmap[w];
        }
    }

    /// Whether every non-empty bin in `[lo, hi)` is `allowed` (pass `NUM_BINS` to allow none):
    /// one masked word per 64 bins of the range, no search.
    #[inline]
    pub fn only_in(&self, lo: usize, hi: usize, allowed: usize) -> bool {
        let hi = hi.min(NUM_BINS);
        if lo >= hi {
            return true;
        }
        let (w0, w1) = (lo / 64, (hi - 1) / 64);
        let mut w = w0;
        loop {
            let mut bits = self.bitmap[w];
            if w == w0 {
                bits &= !0u64 << (lo % 64);
            }
            if w == w1 {
                bits &= !0u64 >> (63 - (hi - 1) % 64);
            }
            if allowed / 64 == w {
                bits &= !(1u64 << (allowed % 64));
            }
            if bits != 0 {
                return false;
            }
            if w == w1 {
                return true;
            }
            w += 1;
        }
    }

    /// The highest non-empty bin at or below `bin`.
    #[inline]
    pub fn last_at_or_below(&self, bin: usize) -> Option<usize> {
        let bin = bin.min(NUM_BINS - 1);
        let mut w = bin / 64;
        let shift = 63 - bin % 64;
        let mut bits = (self.bitmap[w] << shift) >> shift;
        loop {
            if bits != 0 {
                return Some(w * 64 + 63 - bits.leading_zeros() as usize);
            }
            if w == 0 {
                return None;
            }
            w -= 1;
            bits = self.bitmap[w];
        }
    }

    /// Items of `bin`, head first (for checks and bounded scans).
    pub fn iter<'a, L: LinkRead + ?Sized>(
        &self,
        links: &'a L,
        bin: usize,
    ) -> impl Iterator<Item = u32> + 'a {
        let mut cur = self.heads[slot(bin)];
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let item = cur;
                cur = links.link(item).next;
                item
            })
        })
    }

    /// Good fit for `n` units: an item of the request's own bin that holds `n` (the first
    /// of at most `scan` looked at), else the head of the lowest bin whose items all hold `n`.
    /// `size` gives an item's size. O(1): at most `scan` items are looked at.
    #[inline(always)]
    pub fn find_fit<L: LinkRead + ?Sized>(
        &self,
        links: &L,
        n: u32,
        scan: usize,
        size: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        let own = bin_of(n);
        if scan > 0 && bin_lower(own) != n {
            let fit = self.iter(links, own).take(scan).find(|&i| size(i) >= n);
            if fit.is_some() {
                return fit;
            }
        }
        self.first_at_or_above(bin_up(n))
            .map(|b| self.heads[slot(b)])
    }

    /// Best fit for `n` units among a bounded number of candidates: the smallest item that
    /// holds `n` among the first `scan` of the request's own bin and the first `scan` of the
    /// lowest non-empty bin above it (an exact fit ends the search). Slower than `find_fit`
    /// (up to `2 × scan` items looked at instead of one).
    #[inline(always)]
    pub fn find_best<L: LinkRead + ?Sized>(
        &self,
        links: &L,
        n: u32,
        scan: usize,
        size: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        let own = bin_of(n);
        let mut best: Option<(u32, u32)> = None;
        let items = |bin| self.iter(links, bin).take(scan).map(|i| (size(i), i));
        fold_best(n, items(own), &mut best);
        if best.is_none_or(|(s, _)| s > n) {
            if let Some(bin) = self.first_at_or_above(own + 1) {
                fold_best(n, items(bin), &mut best);
            }
        }
        best.map(|(_, i)| i)
    }

    /// The largest item of at most `n` units, near enough: an item of `n`'s own bin that is at
    /// most `n` (among the first `scan`), else the head of the highest bin below it.
    #[inline]
    pub fn find_at_most<L: LinkRead + ?Sized>(
        &self,
        links: &L,
        n: u32,
        scan: usize,
        size: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        let own = bin_of(n);
        let fit = self.iter(links, own).take(scan).find(|&i| size(i) <= n);
        if fit.is_some() {
            return fit;
        }
        if own == 0 {
            return None;
        }
        self.last_at_or_below(own - 1).map(|b| self.heads[slot(b)])
    }

    /// The bins' own invariants: bit `b` of the bitmap is set iff bin `b` has a head; every
    /// list runs head to end with each item's `prev` the item before it (`NIL` at the head);
    /// every item lies in the bin of its size (`size`); the lists hold `len` items in all (so
    /// none is a cycle). Only for checks: it walks every list.
    pub fn validate<L: LinkRead + ?Sized>(
        &self,
        links: &L,
        size: impl Fn(u32) -> u32,
    ) -> Result<(), String> {
        let mut total = 0usize;
        for b in 0..NUM_BINS {
            let bit = self.bitmap[b / 64] >> (b % 64) & 1 == 1;
            if bit != (self.heads[b] != NIL) {
                return Err(format!(
                    "bin {b}: bitmap bit {bit} but head {}",
                    self.heads[b]
                ));
            }
            let mut prev = NIL;
            for i in self.iter(links, b) {
                total += 1;
                if total > self.len {
                    return Err(format!(
                        "the lists hold more than the {} items counted (a cycle?)",
                        self.len
                    ));
                }
                if links.link(i).prev != prev {
                    return Err(format!(
                        "item {i} of bin {b}: prev {} but follows {prev}",
                        links.link(i).prev
                    ));
                }
                if bin_of(size(i)) != b {
                    return Err(format!(
                        "item {i} of {} units is in bin {b}, not {}",
                        size(i),
                        bin_of(size(i))
                    ));
                }
                prev = i;
            }
        }
        if total != self.len {
            return Err(format!(
                "the lists hold {total} items, {} counted",
                self.len
            ));
        }
        Ok(())
    }
}

/// Folds candidates `(size, item)` into `best`: the smallest that holds `n` units (the first
/// of equal sizes), stopping at an exact fit. `Bins::find_best` runs it over each bin it
/// looks at, and the size cache's check over the bins as they would be (`Pool::best_takes`).
#[inline]
pub fn fold_best<T: Copy>(
    n: u32,
    items: impl Iterator<Item = (u32, T)>,
    best: &mut Option<(u32, T)>,
) {
    for (s, i) in items {
        if s >= n && best.is_none_or(|(b, _)| s < b) {
            *best = Some((s, i));
            if s == n {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_round_trip() {
        assert_eq!(bin_of(37), 34);
        assert_eq!(bin_lower(34), 36);
        assert_eq!(bin_of(18), 18);
        assert_eq!(bin_of(u32::MAX), NUM_BINS - 1);
        for b in 0..NUM_BINS {
            assert_eq!(bin_of(bin_lower(b)), b, "bin {b}");
        }
        for n in 1..100_000u32 {
            let b = bin_of(n);
            assert!(bin_lower(b) <= n);
            assert!(b + 1 == NUM_BINS || bin_lower(b + 1) > n);
            assert!(bin_lower(bin_up(n)) >= n);
            // a bin spans at most 1/16 of its lower bound
            if n >= MANTISSA {
                assert!((bin_lower(b + 1) - bin_lower(b)) * MANTISSA <= bin_lower(b));
            }
        }
    }

    fn bitmap_search_with<const SELECT: bool>() {
        let mut bins = Bins::<SELECT>::default();
        let mut v = vec![Link::UNLINKED; 5];
        let links = v.as_mut_slice();
        bins.push(links, 0, 3);
        bins.push(links, 1, 100);
        bins.push(links, 2, 200);
        bins.push(links, 3, 100);
        assert_eq!(bins.first_at_or_above(0), Some(3));
        assert_eq!(bins.first_at_or_above(4), Some(100));
        assert_eq!(bins.first_at_or_above(201), None);
        assert_eq!(bins.last_at_or_below(239), Some(200));
        assert_eq!(bins.last_at_or_below(199), Some(100));
        assert_eq!(bins.last_at_or_below(2), None);
        // ranges holding no non-empty bin but the one allowed, in one word or across words
        assert!(bins.only_in(0, 3, NUM_BINS) && bins.only_in(0, 4, 3) && bins.only_in(5, 5, 0));
        assert!(!bins.only_in(0, 4, NUM_BINS) && !bins.only_in(2, 101, 3));
        assert!(bins.only_in(4, 200, 100) && bins.only_in(101, 200, NUM_BINS));
        assert!(!bins.only_in(101, 201, NUM_BINS) && !bins.only_in(4, NUM_BINS + 9, 200));
        assert!(bins.only_in(201, NUM_BINS + 9, NUM_BINS));
        // the head, the tail and then the last item of a bin
        assert_eq!(bins.iter(&*links, 100).collect::<Vec<_>>(), [3, 1]);
        bins.remove(links, 3, 100);
        assert_eq!(bins.iter(&*links, 100).collect::<Vec<_>>(), [1]);
        bins.push(links, 3, 100);
        bins.remove(links, 1, 100);
        assert_eq!(bins.iter(&*links, 100).collect::<Vec<_>>(), [3]);
        assert_eq!(links[3], Link::UNLINKED);
        bins.remove(links, 3, 100);
        assert_eq!(bins.first_at_or_above(4), Some(200));
        assert_eq!(bins.len(), 2);
        // a middle item
        bins.push(links, 1, 7);
        bins.push(links, 3, 7);
        bins.push(links, 4, 7);
        bins.remove(links, 3, 7);
        assert_eq!(bins.iter(&*links, 7).collect::<Vec<_>>(), [4, 1]);
        assert_eq!(links[1].prev, 4);
    }

    #[test]
    fn validate_sees_a_corrupted_bin() {
        let sizes = [3u32, 100, 100, 200];
        let size = |i: u32| sizes[i as usize];
        let fresh = || {
            let mut bins = Bins::<true>::default();
            let mut v = vec![Link::UNLINKED; sizes.len()];
            for (i, &n) in sizes.iter().enumerate() {
                bins.push(v.as_mut_slice(), i as u32, bin_of(n));
            }
            (bins, v)
        };
        let (bins, v) = fresh();
        bins.validate(v.as_slice(), size).unwrap();
        let fails = |bins: &Bins<true>, v: &Vec<Link>, want: &str| {
            let e = bins.validate(v.as_slice(), size).unwrap_err();
            assert!(e.contains(want), "{e}");
        };
        // a bitmap bit without a list
        let (mut bins, v) = fresh();
        bins.bitmap[0] |= 1 << 5;
        fails(&bins, &v, "bitmap");
        // a broken back link
        let (bins, mut v) = fresh();
        v[1].prev = 3;
        fails(&bins, &v, "prev");
        // an item in the bin of another size
        let (mut bins, v) = fresh();
        bins.heads.swap(3, bin_of(100));
        fails(&bins, &v, "not");
        // a count that is not the lists'
        let (mut bins, v) = fresh();
        bins.len += 1;
        fails(&bins, &v, "counted");
        // a cycle (back to the list's head, whose prev is NIL)
        let (bins, mut v) = fresh();
        v[1].next = 2;
        fails(&bins, &v, "prev 4294967295 but follows 1");
    }

    #[test]
    fn bitmap_search() {
        bitmap_search_with::<true>();
        bitmap_search_with::<false>();
    }

    #[test]
    fn best_fit_takes_the_smallest_item_that_holds_the_request() {
        let n = 1000u32;
        let own = bin_of(n);
        assert_eq!((bin_lower(own), bin_lower(own + 1)), (992, 1024));
        // 992 is too small; 1020 and 1003 share the request's bin; 1030 and 1100 are above it
        let sizes = [992u32, 1020, 1003, 1030, 1100, 1000];
        let size = |i: u32| sizes[i as usize];
        let mut bins = Bins::<true>::default();
        let mut v = vec![Link::UNLINKED; sizes.len()];
        let links = v.as_mut_slice();
        for i in [2u32, 1, 0, 3, 4] {
            bins.push(links, i, bin_of(sizes[i as usize]));
        }
        assert_eq!(bins.iter(&*links, own).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(bins.find_best(&*links, n, 8, size), Some(2));
        // the good fit takes the head of the first bin whose items all hold it
        assert_eq!(bins.find_fit(&*links, n, 0, size), Some(3));
        // at most `scan` items of a bin are looked at
        assert_eq!(bins.find_best(&*links, n, 1, size), Some(3));
        assert_eq!(bins.find_best(&*links, n, 2, size), Some(1));
        // an exact fit
        bins.push(links, 5, own);
        assert_eq!(bins.find_best(&*links, n, 8, size), Some(5));
        // nothing holds it
        for (i, b) in [
            (5, own),
            (1, own),
            (2, own),
            (3, bin_of(1030)),
            (4, bin_of(1100)),
        ] {
            bins.remove(links, i, b);
        }
        assert_eq!(bins.find_best(&*links, n, 8, size), None);
    }
}
