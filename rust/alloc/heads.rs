//! Heads and tails of stitched layouts: which free page end a large request starts in, which
//! free page start its last partial page goes to, how many whole pages lie between, and
//! where a free block that crosses a page boundary is cut to serve as either.

use super::*;

/// In a pool of at least `SMALL_POOL`, the free end of the heap page opened last is a head
/// (`heap_ends_for`) only while another free heap block of at least 1/`FRONTIER_ROOM_DIV` of
/// a page (512 KiB at 2 MiB pages) is there for the small requests that come next, and only
/// where no other end takes as few pages. 4: clip_train 196 -> 194 MiB, gru_packed_varlen_train
/// 124 -> 122, the three streams 14,802 -> 14,776 over 81 seeds, no row higher; 8 (256 KiB)
/// also efficientnet_multiscale_train 698 -> 696 and roberta_bf16_train 276 -> 274, but
/// swin_train 266 -> 268 and its copy at 4 KiB over its bound; 2 (1 MiB) clip_train and
/// gru_packed_varlen_train only (docs/reserve.md, "Heap page ends as heads and tails").
const FRONTIER_ROOM_DIV: u32 = 4;

impl Pool {
    /// The free page start that a tail of a request of `units` after a head of `h` granules
    /// would take, with the granules it would leave unused: `(0, NIL)` when there is no tail,
    /// `(u64::MAX, NIL)` when none is close enough (the tail takes a fresh page).
    pub(super) fn tail_for(&self, units: u64, h: u64, best: bool) -> (u64, u32) {
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
            // (at the last resort any free page start that holds the tail will do)
            Some(b) if self.blocks[b as usize].len - t <= self.slack_units || self.last_resort => {
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
    pub(super) fn pick_head_tail(&self, units: u64) -> (u32, u32) {
        let head = self.pick_head(units);
        let pressure = self.under_pressure();
        let (waste, tail) = self.tail_for(units, self.len_or_0(head), pressure);
        if units & (self.pg as u64 - 1) == 0 && tail == NIL && self.whole_pages_first(units, head) {
            return (NIL, NIL);
        }
        if waste == 0 || !pressure {
            return (head, tail);
        }
        if self.last_resort {
            return self.pair_fewest_pages(units, head, tail, waste);
        }
        let mut best = (waste, tail, head);
        self.walk_heads(units, head, |c, w, tl| {
            if w < best.0 {
                best = (w, tl, c);
            }
            best.0 == 0
        });
        (best.2, best.1)
    }

    /// Whether a request of whole pages in a pool below `SMALL_POOL`, whose layout over free
    /// page end `head` would end in a fresh page, is laid over whole free pages instead: the
    /// head saves it no page (the fresh page's end is left free, as large as the head), and
    /// laid over the head it cuts two more pages at the head's length, where the next
    /// request of whole pages (power-of-two tensors: 1, 2, 4 MiB) finds page ends and starts
    /// that do not fit it. Not in larger pools: there a fresh page's free end next to the
    /// free pages is what contiguous heads and run-on take (`contiguous_head`, `run_on`).
    /// Measured (docs/reserve.md, "Whole pages first in small pools"): dcgan_train 54 → 52
    /// MiB (its bound met, as much as `buddy`), no other corpus trace, held-out copy or class
    /// seed moved; the page-multiples class over 81 seeds (`python scripts/class_seeds.py
    /// page_multiples --seeds 10-89`) 3,386 → 3,360 MiB, over the bound on 8 → 5 of its 79
    /// unseen seeds. In larger pools that hold the pages too: llama_train_512 716 → 720,
    /// unet_train 400 → 404, mamba_train 302 → 304 and wav2vec2_ctc_train 220 → 222.
    /// (Out of line: the caller checks that the request is whole pages.)
    #[inline(never)]
    fn whole_pages_first(&self, units: u64, head: u32) -> bool {
        let pg = self.pg as u64;
        head != NIL
            && self.small_pool()
            && self.len_or_0(head) < pg
            && self.free_pages.free_units() >= units / pg
    }

    /// The free page ends other than `head` that a request of `units` can use whole, from
    /// the largest down, at most `PAIR_SCAN` of them: `visit(end, waste, tail)` with the tail
    /// that fits after each and what it leaves unused of its page start; the walk stops when
    /// `visit` says so.
    pub(super) fn walk_heads(
        &self,
        units: u64,
        head: u32,
        mut visit: impl FnMut(u32, u64, u32) -> bool,
    ) {
        self.walk_page_ends(units, head, PAIR_SCAN, |c| {
            let (w, tl) = self.tail_for(units, self.len_or_0(c), true);
            visit(c, w, tl)
        });
    }

    /// The free page ends other than `head` that a request of `units` can use whole, from
    /// the largest down, at most `limit` of them, each given to `visit` until it says stop.
    pub(super) fn walk_page_ends(
        &self,
        units: u64,
        head: u32,
        limit: usize,
        mut visit: impl FnMut(u32) -> bool,
    ) {
        let n = units.min(u32::MAX as u64) as u32;
        let suffix = &self.secondary[SUFFIX];
        let mut left = limit;
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
                if visit(c) {
                    break 'bins;
                }
            }
            if bin == 0 {
                break;
            }
            top = bin - 1;
        }
    }

    /// See `place_large`: the largest free page end of at most `units`, near enough (looks
    /// at most at `SCAN` candidates). (Looking further for one whose next pages are free, so
    /// that the allocation is contiguous, found one for 0.25 stitched requests in 80 on the
    /// mixed churn: dropped.)
    pub(super) fn pick_head(&self, units: u64) -> u32 {
        let n = units.min(u32::MAX as u64) as u32;
        self.secondary[SUFFIX]
            .find_at_most(&self.sec_links, n, SCAN, self.block_len())
            .filter(|&b| self.blocks[b as usize].len <= n)
            .unwrap_or(NIL)
    }

    /// The pages a layout of `units` over head `head` and tail `tail` (NIL: a fresh page
    /// when there is a remainder) takes from the free pages.
    #[inline]
    pub(super) fn pages_for(&self, units: u64, head: u32, tail: u32) -> u32 {
        // (the page size is a power of two: `Pool::new` refuses any other)
        let rest = units - self.len_or_0(head);
        (rest >> self.gshift) as u32 + (rest & (self.pg as u64 - 1) > 0 && tail == NIL) as u32
    }

    /// A large request about to grow the pool, laid out over `head` and `tail`: a free block
    /// of a large segment that crosses a page boundary but holds no whole page
    /// (`straddles`) is neither a free page end nor a free page start, so no head or tail
    /// can use it. The one whose part before the boundary as the head (its tail in any free
    /// page start that holds it, its own part after the boundary included) or whose part
    /// after it as the tail needs the fewest pages is cut at the boundary (`cut_at_page`),
    /// when that is fewer than the layout found: the new (head, tail). Measured in
    /// docs/reserve.md ("Reserve on every trace"): vit_train's smallest capacity 486 → 480
    /// MiB, unet_train 410 → 408. In pools below `SMALL_POOL` too: a KV buffer grown token
    /// by token runs its segment on over the next page (`grow.rs`), so the free space its
    /// predecessors leave lies inside segments, across page boundaries (cut for requests
    /// below a page, the KV cache class over 81 seeds 2,024 → 1,988 MiB); and a CNN's freed
    /// 4 MiB activation leaves such a block for the next 3 MiB one (for requests of any
    /// size, the page-multiples class's 79 unseen seeds 3,316 → 3,276 MiB with the lossy
    /// rule in small pools, neox_accum_train 332 → 334: docs/reserve.md, "Small pools as
    /// large ones").
    #[cold]
    #[inline(never)]
    pub(super) fn cut_for(&mut self, units: u64, head: u32, tail: u32) -> Option<(u32, u32)> {
        /// (the tail of a cut head: the cut block's own part after the boundary)
        const OWN: u32 = NIL - 1;
        let pg = self.pg as u64;
        let need = self.pages_for(units, head, tail);
        let t = ((units - self.len_or_0(head)) % pg) as u32;
        let fresh = t > 0 && tail == NIL;
        // (pages, block, cut as the head, the head's tail: NIL a fresh page or none, or OWN)
        let mut best: Option<(u32, u32, bool, u32)> = None;
        for (b, left, right) in self.straddles(STRADDLE_SCAN) {
            let fewest = best.map_or(need, |x| x.0);
            if left as u64 > self.len_or_0(head) && left as u64 <= units {
                let rest = units - left as u64;
                let t2 = (rest % pg) as u32;
                let tl = if t2 == 0 {
                    NIL
                } else if right >= t2 {
                    OWN
                } else {
                    self.secondary[PREFIX]
                        .find_fit(&self.sec_links, t2, SCAN, self.block_len())
                        .unwrap_or(NIL)
                };
                let n = (rest / pg) as u32 + (t2 > 0 && tl == NIL) as u32;
                if n < fewest {
                    best = Some((n, b, true, tl));
                    continue;
                }
            }
            if fresh && right >= t && need - 1 < fewest {
                best = Some((need - 1, b, false, NIL));
            }
        }
        let (_, b, as_head, tl) = best?;
        let r = self.cut_at_page(b);
        Some(match (as_head, tl) {
            (true, OWN) => (b, r),
            (true, tl) => (b, tl),
            (false, _) => (head, r),
        })
    }

    /// A large request about to grow the pool, laid out over `head` and `tail`: a free block
    /// that ends a heap segment (a free page end) or starts one (a free page start) serves
    /// as its head or tail, as those of large segments do, when that takes fewer pages. A
    /// heap page fills from its start, so its free space gathers at its end, and the heap
    /// keeps no bins of page ends: without this, a heap page that holds a few small blocks
    /// stays mostly free to the peak beside the page the pool grows by (dcgan_train's 2.25
    /// MiB activations beside heap pages with 0.9–1.5 MiB free ends). In a pool of at least
    /// `SMALL_POOL`, the end of the heap page opened last (`last_heap_open`) only where
    /// another heap block of a quarter page is free (`FRONTIER_ROOM_DIV`) and no other end
    /// does as well: that page is where the next small requests go, and a head there with
    /// nowhere else for them sends them to a fresh heap page, layer after layer
    /// (cs336_ctx128_forward 16,791 → 16,814 MiB, unet_train 400 → 404 with that end always
    /// a head). Looks at the `HEAP_END_SCAN` largest heap blocks. Returns the new (head,
    /// tail).
    /// Measured in docs/reserve.md, "Heap page ends as heads and tails".
    #[cold]
    #[inline(never)]
    pub(super) fn heap_ends_for(&self, units: u64, head: u32, tail: u32) -> Option<(u32, u32)> {
        let pg = self.pg as u64;
        let need = self.pages_for(units, head, tail);
        // (no heap block longer than the head, nor than a fresh tail: nothing to look at)
        let t = ((units - self.len_or_0(head)) % pg) as u32;
        let head_len = self.len_or_0(head) as u32;
        let shortest = if t > 0 && tail == NIL {
            t.min(head_len + 1)
        } else {
            head_len + 1
        };
        if self.primary[HEAP].last_at_or_below(NUM_BINS - 1)? < bin_of(shortest) {
            return None;
        }
        let (ends, starts) = self.heap_page_ends();
        // a tail of `t` granules: a free page start of a large segment, else of a heap one
        let tail_of = |t: u32| -> u32 {
            self.secondary[PREFIX]
                .find_fit(&self.sec_links, t, SCAN, self.block_len())
                .or_else(|| {
                    starts
                        .iter()
                        .copied()
                        .find(|&s| self.blocks[s as usize].len >= t)
                })
                .unwrap_or(NIL)
        };
        let mut best: Option<(u32, u32, u32)> = None;
        for &e in &ends {
            let len = self.blocks[e as usize].len as u64;
            if len <= self.len_or_0(head) || len > units {
                continue;
            }
            let t = ((units - len) % pg) as u32;
            let tl = if t == 0 { NIL } else { tail_of(t) };
            let n = self.pages_for(units, e, tl);
            if n < best.map_or(need, |x| x.0) {
                best = Some((n, e, tl));
            }
        }
        if best.is_none() && t > 0 && tail == NIL {
            let s = starts
                .iter()
                .copied()
                .find(|&s| self.blocks[s as usize].len >= t)?;
            best = Some((need - 1, head, s));
        }
        best.map(|(_, h, tl)| (h, tl))
    }

    /// Of the `HEAP_END_SCAN` largest free heap blocks, those that end their segment and
    /// those that start it. In a pool of at least `SMALL_POOL`, the end in the heap page
    /// opened last comes last, and only when another of them is at least 1/`FRONTIER_ROOM_DIV`
    /// of a page.
    fn heap_page_ends(
        &self,
    ) -> (
        SmallVec<[u32; HEAP_END_SCAN]>,
        SmallVec<[u32; HEAP_END_SCAN]>,
    ) {
        let (mut ends, mut starts) = (SmallVec::new(), SmallVec::new());
        let links = BlockLinksRef(&self.blocks);
        let frontier = if self.small_pool() {
            NIL
        } else {
            self.last_heap_open
        };
        let mut left = HEAP_END_SCAN;
        let mut top = usize::MAX;
        let (mut at_frontier, mut room) = (None, false);
        'bins: while let Some(bin) = self.primary[HEAP].last_at_or_below(top) {
            for b in self.primary[HEAP].iter(&links, bin) {
                if left == 0 {
                    break 'bins;
                }
                left -= 1;
                let blk = &self.blocks[b as usize];
                if blk.next == NIL && self.page_after(blk) - 1 == frontier {
                    at_frontier = Some(b);
                    continue;
                }
                room |= blk.len * FRONTIER_ROOM_DIV >= self.pg;
                if blk.next == NIL {
                    ends.push(b);
                } else if blk.prev == NIL {
                    starts.push(b);
                }
            }
            if bin == 0 {
                break;
            }
            top = bin - 1;
        }
        // (last: another end that takes as few pages goes first)
        if let Some(b) = at_frontier.filter(|_| room) {
            ends.push(b);
        }
        (ends, starts)
    }
}
