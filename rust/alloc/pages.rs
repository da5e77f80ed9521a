//! Page ownership: growing from the device, giving pages back, what kind each page is, and
//! reclaiming whole free pages from large segments.

use super::*;

impl Block {
    /// A free block of `len` granules that starts a large segment at page `p`, before `next`
    /// (what `split_out` and `cut_at_page` leave after the pages or boundary they cut at).
    pub(super) fn free_segment_start(p: u32, len: u32, next: u32) -> Block {
        Block {
            page: p,
            off: 0,
            len,
            prev: NIL,
            next,
            free: true,
            heap: false,
            binsec: 0,
            links: Link::UNLINKED,
        }
    }
}

impl Pool {
    /// Takes `n` pages from the device into the free pages: all of them, or none at the
    /// pool's maximum or when the device has fewer (the PMM's batch is all or nothing).
    pub(super) fn grow(&mut self, n: u32) -> bool {
        // (nothing is held in the size cache while anything is placed)
        debug_assert!(self.cache.is_empty());
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
        let peak = self.counters.peak_reserved;
        for info in infos {
            let p = (info.addr >> self.page_shift) as u32;
            self.pages[p as usize] = PageKind::Owned;
            self.page_chunk[p as usize] = info.id.to_bits();
            self.free_pages.free(p, 1);
            self.journal.push(Change::Grow { p, peak });
        }
        self.counters.reserved_bytes += n as u64 * ps;
        self.counters.peak_reserved = self
            .counters
            .peak_reserved
            .max(self.counters.reserved_bytes);
        self.counters.pages_taken += n as u64;
        true
    }

    /// At least `n` free pages, growing from the device as needed (all or nothing) unless
    /// `reach` is `Held`.
    pub(super) fn ensure_pages(&mut self, n: u32, reach: Reach) -> bool {
        let have = self.free_pages.free_units();
        have >= n as u64 || (reach != Reach::Held && self.grow((n as u64 - have) as u32))
    }

    /// Gives free pages back to the device until at most `keep` bytes of them stay.
    /// Returns the bytes released.
    pub(super) fn release_pages(&mut self, keep: u64) -> u64 {
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
    pub(super) fn give_back(&mut self, released: &[u32]) -> u64 {
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

    /// After a free: an empty pool gives its cached block back (so that a pool whose
    /// allocations are all freed is all free pages), and pages above the release threshold
    /// go back to the device.
    #[inline]
    pub(super) fn after_free(&mut self) {
        if self.counters.used_bytes == 0 {
            self.flush_cache();
        }
        if let Some(th) = self.cfg.release_threshold {
            self.release_pages(th);
        }
    }

    /// A page leaves the free runs to become `kind`.
    pub(super) fn page_to(&mut self, p: u32, kind: PageKind, first: u32) {
        self.pages[p as usize] = kind;
        if matches!(kind, PageKind::Heap | PageKind::Large) {
            self.page_first[p as usize] = first;
        }
    }

    /// Pages `[p, p + n)` are free again.
    pub(super) fn pages_free(&mut self, p: u32, n: u32) {
        for q in p..p + n {
            self.page_to(q, PageKind::Owned, NIL);
        }
        self.free_pages.free(p, n);
    }

    /// Where granule `g` of the direct map is: (page, offset in granules).
    #[inline]
    pub(super) fn locate(&self, g: u64) -> (u32, u32) {
        ((g >> self.gshift) as u32, (g & (self.pg as u64 - 1)) as u32)
    }

    /// The first granule of a block in the direct map.
    #[inline]
    pub(super) fn start_of(&self, blk: &Block) -> u64 {
        ((blk.page as u64) << self.gshift) + blk.off as u64
    }

    /// The page after the one a block ends in (for a block that ends at a page boundary: the
    /// first page after it).
    #[inline]
    pub(super) fn page_after(&self, blk: &Block) -> u32 {
        ((self.start_of(blk) + blk.len as u64) >> self.gshift) as u32
    }

    /// Gives whole free pages inside large segments, then inside heap segments (which span
    /// pages once `extend_heap` ran one on), back to the free pages, from the largest free
    /// blocks down, until `want` pages are free or none are left. Called before the pool
    /// would grow (or fail) for pages, and before pages are given back to the device.
    pub(super) fn reclaim(&mut self, want: u64) {
        self.reclaim_in(want, LARGE);
        self.reclaim_in(want, HEAP);
    }

    /// `reclaim` from the free blocks of `primary[which]`.
    fn reclaim_in(&mut self, want: u64, which: usize) {
        if self.free_pages.free_units() >= want || self.primary[which].is_empty() {
            return;
        }
        let lowest = bin_of(self.pg);
        let mut top = NUM_BINS - 1;
        while self.free_pages.free_units() < want {
            // the next non-empty bin down (the bitmap skips the empty ones)
            let Some(bin) = self.primary[which]
                .last_at_or_below(top)
                .filter(|&b| b >= lowest)
            else {
                break;
            };
            top = bin - 1; // bin >= lowest >= 1
            let items: SmallVec<[u32; 16]> = self.primary[which]
                .iter(&BlockLinksRef(&self.blocks), bin)
                .collect();
            for b in items {
                if self.free_pages.free_units() >= want {
                    break;
                }
                self.remove_free(b);
                if let Some(c) = self.split_out(b) {
                    self.journal.push(c);
                }
            }
        }
    }

    /// Free blocks of large segments that cross a page boundary but hold no whole page, as
    /// (block, granules before the boundary, granules after it), the longest bins first, at
    /// most `scan` blocks looked at.
    pub(super) fn straddles(&self, scan: usize) -> SmallVec<[(u32, u32, u32); 16]> {
        let pg = self.pg as u64;
        let mut out = SmallVec::new();
        let mut left = scan;
        let mut top = bin_of(2 * self.pg - 1);
        while let Some(bin) = self.primary[LARGE].last_at_or_below(top) {
            for b in self.primary[LARGE].iter(&BlockLinksRef(&self.blocks), bin) {
                if left == 0 {
                    return out;
                }
                left -= 1;
                let blk = &self.blocks[b as usize];
                let (g0, g1) = (self.start_of(blk), self.start_of(blk) + blk.len as u64);
                let p0 = g0.div_ceil(pg);
                if p0 * pg > g0 && p0 * pg < g1 && (p0 + 1) * pg > g1 {
                    out.push((b, (p0 * pg - g0) as u32, (g1 - p0 * pg) as u32));
                }
            }
            if bin == 0 {
                break;
            }
            top = bin - 1;
        }
        out
    }

    /// Cuts free block `b` (one of `straddles`) at its page boundary: its segment ends there
    /// (`b` keeps the part before, a free page end) and a new segment starts (the part after,
    /// returned: a free page start). Journaled as a `Split` of no pages.
    pub(super) fn cut_at_page(&mut self, b: u32) -> u32 {
        self.remove_free(b);
        let blk = self.blocks[b as usize];
        let pg = self.pg as u64;
        let g0 = self.start_of(&blk);
        let p0 = g0.div_ceil(pg);
        let left = (p0 * pg - g0) as u32;
        let p0 = p0 as u32;
        let u = &mut self.blocks[b as usize];
        u.len = left;
        u.next = NIL;
        let r = self.new_block(Block::free_segment_start(p0, blk.len - left, blk.next));
        self.link_to(blk.next, r);
        self.page_to(p0, PageKind::Large, r);
        self.insert_free(b);
        self.insert_free(r);
        self.journal.push(Change::Split {
            b,
            orig: blk,
            right: r,
            p0,
            p1: p0,
        });
        r
    }

    /// Every whole free page inside large segments back to the free pages, for good (not a
    /// request's change: nothing to undo).
    pub(super) fn reclaim_all(&mut self) {
        let mark = self.journal.len();
        self.reclaim(u64::MAX);
        self.journal.truncate(mark);
    }

    /// The virtual address of granule `off` of page `p` in the direct map.
    pub(super) fn direct_addr(&self, p: u32, off: u32) -> u64 {
        self.va.direct(p, off as u64 * GRANULE)
    }

    /// Granules in used blocks of a heap or large page (a walk: for defrag and statistics).
    pub(super) fn page_used(&self, p: u32) -> u32 {
        self.segment_usage(p).1
    }

    /// Pages of the segment (heap or large) whose first page is `p` (a walk of its blocks).
    pub(super) fn segment_pages(&self, p: u32) -> u32 {
        self.segment_usage(p).0
    }

    /// The pages of the segment whose first page is `p` and the granules its used blocks
    /// hold, in one walk of its blocks.
    pub(super) fn segment_usage(&self, p: u32) -> (u32, u32) {
        let (mut len, mut used) = (0u32, 0u32);
        for b in self.page_blocks(p) {
            let blk = &self.blocks[b as usize];
            len += blk.len;
            if self.holds(blk) {
                used += blk.len;
            }
        }
        (len >> self.gshift, used)
    }

    /// The first page of the segment block `b` is in (a walk back over its blocks).
    pub(super) fn segment_first_page(&self, mut b: u32) -> u32 {
        while self.blocks[b as usize].prev != NIL {
            b = self.blocks[b as usize].prev;
        }
        self.blocks[b as usize].page
    }

    pub(super) fn page_blocks(&self, p: u32) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.page_first[p as usize];
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let b = cur;
                cur = self.blocks[b as usize].next;
                b
            })
        })
    }
}
