//! Block surgery: making and dropping blocks, binning free ones, carving an allocation out of a
//! free block, releasing a block (merged with its free neighbours) and splitting a segment
//! around its free pages.

use super::*;

impl Pool {
    #[inline]
    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        let i = match self.vacant_blocks.pop() {
            Some(i) => i,
            None => self.more_blocks(),
        };
        // (the table's growth out of line: `b` is stored from registers)
        self.blocks[i as usize] = b;
        i
    }

    /// One more block slot (vacant, its contents to be written by the caller).
    #[cold]
    #[inline(never)]
    fn more_blocks(&mut self) -> u32 {
        self.blocks.push(Block::VACANT);
        self.sec_links.push(Link::UNLINKED);
        (self.blocks.len() - 1) as u32
    }

    /// The list link into `x` from before it: `prev`'s `next`, or, when `prev` is NIL, the
    /// first block of the page or segment `x` starts (`page`, its first page).
    #[inline(always)]
    pub(super) fn link_from(&mut self, prev: u32, page: u32, x: u32) {
        if prev != NIL {
            self.blocks[prev as usize].next = x;
        } else {
            self.page_first[page as usize] = x;
        }
    }

    /// The list link into `x` from after it: `next`'s `prev` (none when `next` is NIL).
    #[inline(always)]
    pub(super) fn link_to(&mut self, next: u32, x: u32) {
        if next != NIL {
            self.blocks[next as usize].prev = x;
        }
    }

    /// A new block between its `prev` and `next`, both linked to it.
    #[inline(always)]
    pub(super) fn insert_block(&mut self, b: Block) -> u32 {
        let (prev, next, page) = (b.prev, b.next, b.page);
        let x = self.new_block(b);
        self.link_from(prev, page, x);
        self.link_to(next, x);
        x
    }

    #[inline]
    pub(super) fn drop_block(&mut self, b: u32) {
        self.blocks[b as usize].page = NIL;
        self.vacant_blocks.push(b);
    }

    /// The secondary bins of a free block: `SUFFIX` if it is a large block that ends its
    /// segment, `PREFIX` if one that starts it, else 0 (none). (A free block is never both: a
    /// segment that is one free block goes back to the free pages.)
    #[inline]
    pub(super) fn secondary_of(blk: &Block) -> usize {
        // (arithmetic, not branches: heap or large follows the random sizes)
        let (suffix, prefix) = (blk.next == NIL, blk.prev == NIL);
        let sec = suffix as usize * SUFFIX + (!suffix & prefix) as usize * PREFIX;
        sec * (!blk.heap) as usize
    }

    /// A free block goes into (`insert`) or out of the bins its page kind and position say.
    #[inline(always)]
    pub(super) fn rebin<const INSERT: bool>(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        let (bin, sec, heap) = if INSERT {
            let (bin, sec) = (bin_of(blk.len), Self::secondary_of(blk));
            blk.binsec = (bin | sec << 12) as u16;
            (bin, sec, blk.heap)
        } else {
            (blk.bin(), blk.sec(), blk.heap)
        };
        self.heap_changes += heap as u64;
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
    pub(super) fn insert_free(&mut self, b: u32) {
        self.rebin::<true>(b)
    }

    #[inline]
    pub(super) fn remove_free(&mut self, b: u32) {
        self.rebin::<false>(b)
    }

    /// Makes pages `[p, p + n)` (just taken from the free runs) a heap page (`n` = 1) or a
    /// large segment covered by one free block, which is returned, not in any bin.
    pub(super) fn open_segment(&mut self, p: u32, n: u32, kind: PageKind) -> u32 {
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
    pub(super) fn carve(&mut self, b: u32, at: u32, len: u32, a: u32) -> u32 {
        let blk = self.blocks[b as usize];
        debug_assert!(blk.free && at + len <= blk.len);
        if at > 0 {
            self.insert_block(Block {
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
        }
        let rest = blk.len - at - len;
        let g = self.start_of(&blk) + at as u64;
        if rest > 0 {
            let (page, off) = self.locate(g + len as u64);
            self.insert_block(Block {
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
        }
        {
            let (page, off) = self.locate(g);
            let u = &mut self.blocks[b as usize];
            u.page = page;
            u.off = off;
            u.len = len;
            u.free = false;
            u.links = Link::owned_by(a);
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

    /// The kind of the first page of the segment `blk` is in.
    #[inline]
    pub(super) fn segment_kind(blk: &Block) -> PageKind {
        if blk.heap {
            PageKind::Heap
        } else {
            PageKind::Large
        }
    }

    /// Takes a whole free block (not in any bin) for allocation `a`.
    #[inline]
    pub(super) fn take_whole(&mut self, b: u32, a: u32) {
        let len = self.blocks[b as usize].len;
        self.carve(b, 0, len, a);
    }

    /// A free block in its bins (not one `free_batch` has yet to merge, which it leaves to
    /// `merge_pending`).
    #[inline]
    pub(super) fn binned_free(&self, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        blk.free && !blk.is_pending()
    }

    /// A used block becomes free and merges with free neighbours (in their bins, unless
    /// `settle` is `Unbinned`); a page left empty becomes a free page.
    #[inline(always)]
    pub(super) fn release_block(&mut self, b: u32, settle: Settle) {
        let blk = self.blocks[b as usize];
        debug_assert!(!blk.free);
        {
            let u = &mut self.blocks[b as usize];
            u.free = true;
            u.links = Link::UNLINKED;
        }
        if blk.prev != NIL && self.binned_free(blk.prev) {
            let l = blk.prev;
            if settle != Settle::Unbinned {
                self.remove_free(l);
            }
            let left = self.blocks[l as usize];
            let u = &mut self.blocks[b as usize];
            u.page = left.page;
            u.off = left.off;
            u.len += left.len;
            u.prev = left.prev;
            self.link_from(left.prev, left.page, b);
            self.drop_block(l);
        }
        let next = self.blocks[b as usize].next;
        if next != NIL && self.binned_free(next) {
            if settle != Settle::Unbinned {
                self.remove_free(next);
            }
            self.absorb_next(b);
        }
        self.settle_free(b, settle);
    }

    /// In a pool below `SMALL_POOL`, a free heap block (merged, in no bin) that ends its
    /// segment runs on into the heap segment that starts on the next page when that segment's
    /// first block is free: the two segments become one (the next page covered) and the
    /// merged block crosses the page end, as a freed block of PyTorch's expandable segment
    /// merges with the free start of the next page. A request as long as both free ends
    /// together then fits where each alone was too short. A block that is its whole page
    /// joins too (its page stays in the heap segment, whole and free, until `reclaim` gives
    /// it back for a request that needs a page): the KV cache class 2,030 against 2,024 MiB
    /// when it goes back to the free pages at once. Only forward: a freed first block that
    /// joined the segment before it (found by walking that segment's blocks for its last)
    /// took the KV cache class to 2,044. Measured with `python scripts/class_seeds.py CLASS
    /// --models gpumm --seeds 10-89` (sums over 81 seeds, the own seed included;
    /// docs/reserve.md, "The classes on seeds they were not tuned on"): the KV cache class
    /// 2,034 → 2,024 MiB, the interleaved 15,032 → 15,024 (its seed 182 → 180), the other
    /// classes and every corpus peak as without it. In pools of any size the three streams
    /// rose 14,806 → 14,856 (their seed 182 → 184). Returns whether it joined, and then the
    /// joined block is settled (binned) here.
    #[cold]
    #[inline(never)]
    fn join_next_heap(&mut self, b: u32) -> bool {
        let Some(f) = self.free_heap_start_after(&self.blocks[b as usize]) else {
            return false;
        };
        let p = self.page_after(&self.blocks[b as usize]);
        // (`f` is binned, so blocks follow it: the joined block is not its whole segment)
        debug_assert!(
            self.blocks[f as usize].next != NIL,
            "a heap segment of one free block is binned"
        );
        self.remove_free(f);
        self.page_to(p, PageKind::Covered, NIL);
        self.blocks[b as usize].next = f;
        self.absorb_next(b);
        // (settled here, as `settle_free` would a heap block that is not its whole segment:
        // having `settle_free` read the joined block again cost 11 to 14 instructions a
        // churn pair, callgrind on `alloc::tests::churn_for_profiler`)
        if self.eager && self.blocks[b as usize].len >= self.pg {
            let _ = self.split_out(b);
        } else {
            self.insert_free(b);
        }
        true
    }

    /// The first block of the heap segment that starts on the page after `blk` ends, when
    /// it is free (binned): what `join_next_heap` joins a freed heap end with.
    pub(super) fn free_heap_start_after(&self, blk: &Block) -> Option<u32> {
        let p = self.page_after(blk) as usize;
        if p >= self.pages.len() || self.pages[p] != PageKind::Heap {
            return None;
        }
        let f = self.page_first[p];
        (f != NIL && self.binned_free(f)).then_some(f)
    }

    /// Block `b` takes in the block after it (free, in no bin), which goes.
    #[inline]
    pub(super) fn absorb_next(&mut self, b: u32) {
        let nx = self.blocks[b as usize].next;
        let right = self.blocks[nx as usize];
        let u = &mut self.blocks[b as usize];
        u.len += right.len;
        u.next = right.next;
        self.link_to(right.next, b);
        self.drop_block(nx);
    }

    /// A free block just merged (in no bin) goes where it belongs: back to the free pages if
    /// it is its whole page or segment, else its whole pages out (a pool that releases at
    /// once, unless `settle` is `Exact`) or into its bins (unless `settle` is `Unbinned`).
    #[inline(always)]
    pub(super) fn settle_free(&mut self, b: u32, settle: Settle) {
        let u = self.blocks[b as usize];
        if u.next == NIL
            && u.heap
            && settle == Settle::Policy
            && self.small_pool()
            && self.join_next_heap(b)
        {
            return;
        }
        if u.prev == NIL && u.next == NIL {
            self.drop_block(b);
            self.pages_free(u.page, u.len >> self.gshift);
        } else if self.eager && settle == Settle::Policy && (!u.heap || u.len >= self.pg) {
            let _ = self.split_out(b);
        } else if settle != Settle::Unbinned {
            self.insert_free(b);
        }
    }

    /// A free block (in no bin) gives the whole pages inside it back to the free pages; what
    /// is left before them stays free at the end of its segment, what is left after them
    /// starts a new segment of its kind (heap or large). O(1): blocks hold their page, so nothing else moves.
    pub(super) fn split_out(&mut self, b: u32) -> Option<Change> {
        let blk = self.blocks[b as usize];
        debug_assert!(blk.free);
        let kind = Self::segment_kind(&blk);
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
                heap: blk.heap,
                ..Block::free_segment_start(p1, right, blk.next)
            };
            let r = if spare != NIL {
                self.blocks[spare as usize] = r;
                std::mem::replace(&mut spare, NIL)
            } else {
                self.new_block(r)
            };
            self.link_to(blk.next, r);
            self.page_to(p1, kind, r);
            self.insert_free(r);
            right_block = r;
        } else if blk.next != NIL {
            self.blocks[blk.next as usize].prev = NIL;
            self.page_to(p1, kind, blk.next);
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

    /// Merges blocks marked free by `release_slot_into` with their free neighbours, one pass
    /// per run of free blocks (freeing a batch of neighbours costs one bin insert, not one
    /// merge each), then bins each run or gives its page or segment back.
    pub(super) fn merge_pending(&mut self, pending: &[u32]) {
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
            if links == Link::MERGED {
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
                if !self.blocks[nx as usize].is_pending() {
                    self.remove_free(nx);
                }
                self.absorb_next(s);
            }
            self.blocks[s as usize].links = Link::MERGED;
            starts.push(s);
        }
        for s in starts {
            self.blocks[s as usize].links = Link::UNLINKED;
            self.settle_free(s, Settle::Policy);
        }
    }

    pub(super) fn block_len(&self) -> impl Fn(u32) -> u32 + '_ {
        |i| self.blocks[i as usize].len
    }

    #[inline]
    pub(super) fn len_or_0(&self, b: u32) -> u64 {
        if b == NIL {
            0
        } else {
            self.blocks[b as usize].len as u64
        }
    }
}
