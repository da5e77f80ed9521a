//! Placement: where a request's memory goes (a heap block, a large block, or a head, whole
//! pages and a tail), or a miss.

use super::*;

/// See `keeps_head`. 4 (a quarter page, 512 KiB): vit_train 480 → 470 MiB, unet_train 408
/// → 404; at 1/8 or 3/16 of a page unet_train 410 (over its 409.9 bound), at 5/16 or more
/// vit_train stays at 480 (its passed-over heads are 552 KiB); docs/reserve.md.
const RUN_FIRST_HEAD_DIV: u32 = 4;
/// See `keeps_head`. 4 (the page saved is a quarter of the run or more): with no cap the
/// mixed churn's windowed allocations 2,369 → 4,280 in 40,000 pairs (117 → 1,758 with the
/// device reserved) and resnet50_train a page more; at 4 and 6 the churn's as without the
/// rule, every gain kept; at 3 wav2vec2_ctc_train's is lost, at 8 resnet50_train's page
/// comes back. (Under pressure too: resnet50_train's smallest capacity 1,358 → 1,372 MiB and
/// the 1–10 MiB class's 288 → 292.)
const RUN_FIRST_HEAD_PAGES: u32 = 4;
/// See `contiguous_head`: how many free page ends besides the one `pick_head` chose it
/// looks at. 1 (measured with `scripts/reserve_table.py`, `scripts/robustness.py` and
/// `scripts/class_seeds.py CLASS --seeds 10-89`; docs/reserve.md, "Contiguous heads"):
/// bloom_train 288 → 280 MiB (its bound met), mobilenet_train 644 → 642, wav2vec2_ctc_train
/// 222 → 220, resnet50_train 1,366 → 1,358, convnext_train 300 → 298, the held-out copies
/// 57,590 → 57,524 MiB (over their bound 14 → 11), but swin_train 264 → 266 and the streams
/// class's seed 182 → 184. 3: the 1–10 MiB class 23,510 → 23,572 MiB; 7: that class 23,492
/// but each search about 590 instructions against 200, the mixed churn pair +13 against +3.
const CONTIGUOUS_HEAD_SCAN: usize = 1;

impl Pool {
    /// A small request: a free block of the heap pages (the good fit in a pool below
    /// `SMALL_POOL`, the best of `HEAP_BEST_SCAN` candidates of two bins above it), else a
    /// new heap page (or the heap segment before the page the pool grew by, run on over it:
    /// `extend_heap`). With `Reach::Any` (on the way to out of memory): a free block of a
    /// large page will do too.
    #[inline]
    pub(super) fn place_small(&mut self, units: u32, a: u32, reach: Reach) -> Option<Layout> {
        let links = BlockLinksRef(&self.blocks);
        let heap = &self.primary[HEAP];
        let fit = if self.small_pool() {
            heap.find_fit(&links, units, HEAP_SCAN, self.block_len())
        } else {
            heap.find_best(&links, units, HEAP_BEST_SCAN, self.block_len())
        };
        if let Some(b) = fit {
            return Some(self.take_free(b, units, a));
        }
        self.place_small_miss(units, a, reach)
    }

    /// `place_small` when no heap block holds the request (out of line: the hit, nearly every
    /// small request, then saves fewer registers).
    #[inline(never)]
    fn place_small_miss(&mut self, units: u32, a: u32, reach: Reach) -> Option<Layout> {
        if self.quick_short_of(1, reach) {
            return None;
        }
        if self.lossy(units) {
            return self.place_large(units as u64, a, reach);
        }
        // A small pool about to take a page: any free block that holds the request first,
        // the best of its own heap bin (which `HEAP_SCAN` skips), else one of a large segment
        // (the good fit even under pressure: the best fit there held llama_decode's smallest
        // capacity at 16 MiB, the good fit 14; docs/reserve.md). A page the pool holds free
        // is one that the next large request need not grow for, so while it holds one a free
        // block of a large segment still goes first (docs/reserve.md, "Held pages in small
        // pools": gnn_sampled_train 20 → 18 MiB, its bound met; the small traces over 81
        // seeds 2,766 → 2,746, the page multiples 3,314 → 3,304, the pressure tally 664 →
        // 654; but swin_train 264 → 266 and the KV cache class 1,936 → 1,948; the own heap
        // bin's best too: llama_decode 14 → 16, over its bound).
        if self.small_pool() {
            if self.free_pages.free_units() == 0 {
                let links = BlockLinksRef(&self.blocks);
                let own = self.primary[HEAP].find_best(&links, units, GROW_SCAN, self.block_len());
                if let Some(l) = own.map(|b| self.take_free(b, units, a)) {
                    return Some(l);
                }
            }
            if let Some(l) = self.take_large_block(units, a, false) {
                return Some(l);
            }
        }
        self.reclaim(1);
        let held = self.free_pages.free_units();
        if self.ensure_pages(1, reach) {
            let p = self.free_pages.alloc(1).expect("a free page");
            if held == 0 {
                if let Some(l) = self.extend_heap(p, units, a) {
                    return Some(l);
                }
            }
            self.heap_opened(p);
            let b = self.open_segment(p, 1, PageKind::Heap);
            return Some(Layout::Block(self.carve(b, 0, units, a)));
        }
        if reach == Reach::Any {
            return self.place_in_large_block(units, a);
        }
        None
    }

    /// Whether small request `units` that finds no heap block takes the large path instead
    /// of a heap page: in a pool that has been asked for a large request (of any size: in a
    /// pool below `SMALL_POOL` too, docs/reserve.md, "Small pools as large ones"), when it
    /// is at least 1/`LOSSY_DIV` of a page and the heap pages it would fill leave a tail of
    /// over 1/`LOSSY_TAIL_DIV` of a page each (three 588 KiB
    /// activations leave 284 KiB of a 2 MiB page). In a large segment such requests lie back
    /// to back across page ends, as large ones do, and the layouts they free up are usable
    /// by large requests. A pool of small requests only has no large allocations for them to
    /// lie beside: there the rule would open large segments for them alone, and the small
    /// requests' free space would be split over two kinds of page, each with holes the other
    /// cannot use (the interleaved class over 80 seeds, 15,370 → 15,196 MiB; no corpus
    /// trace moves: docs/reserve.md, "Heap fit in large pools").
    #[inline]
    fn lossy(&self, units: u32) -> bool {
        // (the division last: most requests that reach here are below a quarter page)
        units * LOSSY_DIV >= self.pg
            && self.served_large
            && self.pg % units > self.pg / LOSSY_TAIL_DIV
    }

    /// Whether heap request `units`, placed in a free block the heap holds (`take_free`), is
    /// carved from the block's end rather than its start: in a pool of at least `SMALL_POOL`
    /// that has been asked for a large request, for requests of at least 1/`HEAP_END_DIV` of
    /// a page. Such requests (activations of 256 KiB-1 MiB at 2 MiB pages) and the smaller
    /// ones then fill a free block from opposite ends, so a freed one's space joins the
    /// block's free middle instead of lying fenced between small blocks that live on
    /// (docs/reserve.md, "Heap blocks from both ends"). A page opened for a request still
    /// holds it at its start: from the end there, whisper_train 156 -> 158 MiB and
    /// regnet_train 452 -> 456, both over their bound. Off once the pool is nearly full
    /// (`HEAP_END_ROOM_DIV`).
    #[inline]
    pub(super) fn carves_at_block_end(&self, units: u32) -> bool {
        units >= self.heap_end_units
            && self.served_large
            && !self.small_pool()
            && !self.room_under(HEAP_END_ROOM_DIV)
    }

    /// A small request for which the pool grew by page `p` (it held no free page): when the
    /// heap segment just before `p` ends in a free block (in a pool below `SMALL_POOL`, one
    /// of at least `1 / HEAP_EXTEND_DIV` of the request), the segment runs on over `p` and
    /// the request starts in that block, across the page end (a fresh heap page would leave
    /// the block a sliver that no later request may fit). Its whole free pages go back as a
    /// large segment's do (`reclaim`). convnext_train 308 → 304 MiB; in pools of at least
    /// `SMALL_POOL` from any free end, the interleaved class over 80 seeds 15,082 → 15,032
    /// MiB and behind `caching-expandable` on 22 seeds instead of 40 (docs/reserve.md, "The
    /// classes on seeds they were not tuned on"); below it the eighth keeps the KV cache
    /// class's seed at 24 MiB. Extending while the pool holds free pages cost the three
    /// streams a page (docs/reserve.md, "Heap pages").
    fn extend_heap(&mut self, p: u32, units: u32, a: u32) -> Option<Layout> {
        let mut q = p.checked_sub(1)?;
        while self.pages[q as usize] == PageKind::Covered {
            q -= 1; // a segment's first page comes before its covered pages
        }
        if self.pages[q as usize] != PageKind::Heap {
            return None;
        }
        let last = self.page_blocks(q).last()?;
        let short = self.blocks[last as usize].len * HEAP_EXTEND_DIV < units && self.small_pool();
        if !self.binned_free(last) || short {
            return None;
        }
        self.heap_opened(p);
        Some(self.run_on(last, p, 1, units, a))
    }

    /// The heap takes page `p` (a new heap page, or a heap segment run on over it): the
    /// heap page opened last (`last_heap_open`), journaled.
    fn heap_opened(&mut self, p: u32) {
        self.journal.push(Change::HeapOpen {
            prev: self.last_heap_open,
        });
        self.last_heap_open = p;
    }

    /// Free block `b`, which ends its segment at page `p`, runs on over the `n` pages from
    /// `p` (taken from the free pages already) and holds the request from its start.
    fn run_on(&mut self, b: u32, p: u32, n: u32, units: u32, a: u32) -> Layout {
        self.remove_free(b);
        for q in p..p + n {
            self.page_to(q, PageKind::Covered, NIL);
        }
        self.blocks[b as usize].len += n << self.gshift;
        if n > 0 {
            self.journal.push(Change::Extend { b, p, n });
        }
        Layout::Block(self.carve(b, 0, units, a))
    }

    /// A request in a free block of a large segment (good fit). A block at a segment's start
    /// is used from its end and any other from its start, so what is left keeps touching the
    /// segment's end or start and stays usable as a head or tail.
    #[inline(always)]
    pub(super) fn place_in_large_block(&mut self, units: u32, a: u32) -> Option<Layout> {
        self.take_large_block(units, a, self.under_pressure())
    }

    /// `place_in_large_block` with the best fit (`best`) or the good fit.
    #[inline(always)]
    fn take_large_block(&mut self, units: u32, a: u32, best: bool) -> Option<Layout> {
        let links = BlockLinksRef(&self.blocks);
        let b = if best {
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
    pub(super) fn place_large(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        if units <= MAX_BLOCK {
            if let Some(l) = self.place_in_large_block(units as u32, a) {
                return Some(l);
            }
        }
        self.place_over_pages(units, a, reach)
    }

    /// `place_large` when no free block of a large segment holds the request: a new segment
    /// over free pages, or head + whole pages + tail (out of line: the block hit then saves
    /// fewer registers).
    #[inline(never)]
    fn place_over_pages(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        let pg = self.pg as u64;
        // Stitched: first make the whole free pages inside segments usable.
        if self.quick_short_of(units.div_ceil(pg) + 1, reach) {
            return None;
        }
        self.reclaim(units.div_ceil(pg) + 1);
        // Head: a free page end that the request can use whole, the largest near enough (if the
        // pages after it are free, the allocation is contiguous: no window, nothing to map).
        // Tail: a free page start that fits it closely, else (NIL) the start of a fresh page.
        let (mut head, mut tail) = self.pick_head_tail(units);
        let mut need = self.pages_for(units, head, tail);
        // A pool about to grow: a free block that crosses a page boundary inside a segment
        // is cut there when its part as the head or tail saves pages.
        if reach != Reach::Held && (self.free_pages.free_units() as u32) < need {
            if let Some(ht) = self.cut_for(units, head, tail) {
                (head, tail) = ht;
                need = self.pages_for(units, head, tail);
            }
        }
        // And a free heap page end or start as the head or tail (on the quick path too:
        // nothing changes until the layout is committed).
        if (self.free_pages.free_units() as u32) < need {
            if let Some(ht) = self.heap_ends_for(units, head, tail) {
                (head, tail) = ht;
                need = self.pages_for(units, head, tail);
            }
        }
        let t = ((units - self.len_or_0(head)) & (pg - 1)) as u32;
        let fresh_tail = t > 0 && tail == NIL;
        // A small pool about to grow: a request below a page takes a free block of a heap
        // page that holds it, and a tail any free page start that holds it (not only one
        // within `tail_slack`; not under pressure, where `pick_head_tail` pairs them). A
        // larger pool about to grow: a free page start that the tail leaves at most
        // 1/`GROW_TAIL_DIV` of a page of (docs/reserve.md, "Reserve on every trace").
        let grows = (self.free_pages.free_units() as u32) < need;
        let small = grows && self.small_pool();
        if small && units < pg {
            let links = BlockLinksRef(&self.blocks);
            let heap = self.primary[HEAP].find_fit(&links, units as u32, SCAN, self.block_len());
            if let Some(l) = heap.map(|b| self.take_free(b, units as u32, a)) {
                return Some(l);
            }
        }
        if grows && fresh_tail && !self.under_pressure() {
            if let Some(b) = self.secondary[PREFIX]
                .find_best(&self.sec_links, t, TAIL_SCAN, self.block_len())
                .filter(|&b| small || self.blocks[b as usize].len - t <= self.pg / GROW_TAIL_DIV)
            {
                tail = b;
                need -= 1;
            }
        }
        let fresh_tail = t > 0 && tail == NIL;
        if !self.ensure_pages(need, reach) {
            if reach != Reach::Any {
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
                    ok = self.ensure_pages(need, reach);
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
                    return Some(self.take_free(b, units as u32, a));
                }
                return None;
            }
        }
        // A layout that would need the window (its pages do not follow its head), while the
        // pool holds free pages aplenty: a free run that holds the whole request instead, as a
        // new segment (contiguous: nothing to map). Not when pages are scarce: there the head
        // and tail save pages (fill to failure fell from 99.60 to 98.97 % ungated); nor in a
        // small pool, where a page passed over is a large share (`RUN_FIRST_DIV`).
        if units <= MAX_BLOCK
            && need > 0
            && !self.small_pool()
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
                if let Some((c, p, n)) = self.contiguous_head(units, head) {
                    let taken = self.free_pages.alloc_at(p, n);
                    debug_assert!(taken);
                    return Some(self.run_on(c, p, n, units as u32, a));
                }
                if !self.keeps_head(head, whole, need, units) {
                    if let Some(p) = self.free_pages.alloc(whole) {
                        let b = self.open_segment(p, whole, PageKind::Large);
                        return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
                    }
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
                    return Some(self.run_on(head, p, n, units as u32, a));
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

    /// Whether a request that the run-first rule would lay over `whole` fresh pages goes over
    /// `head` (a free page end) and `need` pages instead: in a pool of at least `SMALL_POOL`,
    /// not under pressure (where `pick_head_tail` pairs heads and tails already), when the
    /// head is at least 1/`RUN_FIRST_HEAD_DIV` of a page and either saves a page of a run of
    /// at most `RUN_FIRST_HEAD_PAGES` or holds at least half the request. A head passed over
    /// stays free until a request fits it; in a training step repeated over the pages the
    /// first one freed, each tensor passed one, and they add up to the pages the step's peak
    /// then grows by (docs/reserve.md, "Reserve on every trace": vit_train). A request below
    /// a page saves no page over the head, but its fresh page's start leaves two free page
    /// ends (the head and the page's end) where the head leaves one, longer by the head
    /// (marian_train's 1,152 KiB activations, one to a page, left 30 ends of 640-896 KiB
    /// that its 105 MiB logits could use one of: "Heads that hold half the request").
    #[inline]
    fn keeps_head(&self, head: u32, whole: u32, need: u32, units: u64) -> bool {
        let h = self.len_or_0(head);
        (whole > need || h * 2 >= units)
            && whole <= RUN_FIRST_HEAD_PAGES
            && !self.small_pool()
            && !self.under_pressure()
            && h * RUN_FIRST_HEAD_DIV as u64 >= self.pg as u64
    }

    /// On the quick path (`Reach::Held`), a request that would reclaim pages from large
    /// segments (fewer than `want` free) gives up before it changes anything: the full path
    /// does the reclaim. A reclaim undone after a quick miss left the free blocks binned in
    /// another order, and the full path then placed later requests elsewhere than a pool
    /// without the quick path (`cache_props::the_quick_path_places_as_the_full_one`).
    #[inline]
    pub(super) fn quick_short_of(&self, want: u64, reach: Reach) -> bool {
        reach == Reach::Held
            && self.free_pages.free_units() < want
            && !self.primary[LARGE].is_empty()
    }

    /// Whether the pool is under pressure (see `PRESSURE_DIV`): the pages it could still get
    /// from the device within its limit, with the free pages it holds, are under an eighth of
    /// that limit. (Other pools of the same device are not counted: the PMM's lock is not
    /// taken on the hot path.)
    #[inline]
    pub(super) fn under_pressure(&self) -> bool {
        self.room_under(PRESSURE_DIV)
    }

    /// Whether the pages the pool could still get within its limit, with the free pages it
    /// holds, are under 1/`div` of that limit.
    #[inline]
    fn room_under(&self, div: u64) -> bool {
        let max = self.max_size();
        let room = max.saturating_sub(self.counters.reserved_bytes)
            + (self.free_pages.free_units() << self.page_shift);
        room * div < max
    }

    /// Free heap block `b` leaves its bin and holds the request from its start (from its end
    /// where the pool `carves_at_block_end`).
    #[inline(always)]
    fn take_free(&mut self, b: u32, units: u32, a: u32) -> Layout {
        self.remove_free(b);
        debug_assert!(
            self.blocks[b as usize].heap,
            "take_free takes heap blocks only"
        );
        // (two calls of `carve`, so that the one the hot path takes is inlined with a start
        // of 0: a start computed at run time cost every heap request, benches/RESULTS.md)
        if self.carves_at_block_end(units) {
            let at = self.blocks[b as usize].len - units;
            return Layout::Block(self.carve(b, at, units, a));
        }
        Layout::Block(self.carve(b, 0, units, a))
    }

    /// For a request that the run-first rule would lay over a fresh run because its head
    /// (`head`, from `pick_head`) is not followed by enough free pages: another free page
    /// end that is, and that holds the request's part past its whole pages (so it saves
    /// the run a page), among the next `CONTIGUOUS_HEAD_SCAN` page ends from the largest
    /// down. The request then runs on from it over the free pages after it, contiguous as
    /// the fresh run would be, one page shorter. Returns the page end, the page after it
    /// and how many pages the request takes from there.
    ///
    /// Where a training step repeats, the first step's tensors lay back to back as the pool
    /// grew under them; the next step starts with most pages free, and the run-first rule
    /// alone lays each tensor over a fresh run beside a free page end that then stays free
    /// to the peak (bloom_train: 276 MiB in its first step, 288 in its second; docs/reserve.md,
    /// "Contiguous heads").
    #[inline(never)]
    fn contiguous_head(&self, units: u64, head: u32) -> Option<(u32, u32, u32)> {
        let pg = self.pg as u64;
        let r = (units & (pg - 1)) as u32;
        if r == 0 {
            return None;
        }
        let mut found = None;
        self.walk_page_ends(units, head, CONTIGUOUS_HEAD_SCAN, |c| {
            let blk = &self.blocks[c as usize];
            let (p, n) = (
                self.page_after(blk),
                (units - blk.len as u64).div_ceil(pg) as u32,
            );
            if blk.len >= r && self.free_pages.run_at(p) >= n {
                found = Some((c, p, n));
            }
            found.is_some()
        });
        found
    }

    /// Whether the pool holds under `SMALL_POOL` bytes (see there).
    #[inline]
    pub(super) fn small_pool(&self) -> bool {
        self.counters.reserved_bytes < SMALL_POOL
    }

    /// Places `units` granules for slot `a` (see `place_small` and `place_large`), after the
    /// size cache's block is given back: nothing is placed while a block is held.
    #[inline]
    pub(super) fn place(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        self.flush_cache();
        self.place_flushed(units, a, reach)
    }

    /// `place` when the size cache holds nothing (a request's own path, which gave it back
    /// before it took a slot). Inlined into `alloc_inner`, whose registers it then shares.
    #[inline(always)]
    pub(super) fn place_flushed(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        debug_assert!(self.cache.is_empty());
        if units < self.small_units {
            return self.place_small(units as u32, a, reach);
        }
        self.served_large = true;
        if self.grown(units) {
            self.place_grown(units, a, reach) // (`grow.rs`)
        } else {
            self.place_large(units, a, reach)
        }
    }

    /// The one placement of `batch_in_one_block`: as `place`, but a large batch takes a run of
    /// free pages that holds it, when no free block does, before trying a head (which would
    /// be stitched unless the pages after it are free): a batch is placed to be one block.
    /// When the pool may grow for it (it does not hold the batch's size free), the pages it
    /// lacks are taken first, so that a batch repeated in a loop finds its run again.
    pub(super) fn place_batch(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        self.flush_cache();
        if units >= self.small_units {
            self.served_large = true;
            if let Some(l) = self.place_in_large_block(units as u32, a) {
                return Some(l);
            }
            let n = units.div_ceil(self.pg as u64) as u32;
            // (growing when the pool may: the batch does not fit in what it holds free)
            if reach != Reach::Held && self.free_pages.free_units() < n as u64 {
                self.ensure_pages(n, reach);
            }
            if let Some(p) = self.free_pages.alloc(n) {
                let b = self.open_segment(p, n, PageKind::Large);
                return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
            }
        }
        self.place(units, a, reach)
    }
}

#[cfg(test)]
mod block_end_tests;
#[cfg(test)]
mod grow_tests;
#[cfg(test)]
mod heap_ends_tests;
#[cfg(test)]
mod heap_fit_tests;
#[cfg(test)]
mod heap_segment_tests;
#[cfg(test)]
mod lossy_tests;
#[cfg(test)]
mod run_first_tests;
#[cfg(test)]
mod small_pool_tests;
#[cfg(test)]
mod whole_pages_tests;
