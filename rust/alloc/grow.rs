//! Grown buffers: a large request below a page that replaces a buffer one step shorter
//! (a KV cache extended token by token: the new buffer is made while the old is live, then
//! the old is freed) goes where the last such request ended, the *frontier*.
//!
//! A grown buffer never fits the hole of the one it replaces, and a hole elsewhere holds it
//! beside buffers that die a token before it, so each page keeps one buffer and a hole of
//! about its size. Placed at the frontier instead (in the free end of the page the last one
//! ended in, and over into the start of a fresh page as a stitched tail), the buffers lie
//! back to back in allocation order, which is the order they are freed in: the live ones are
//! a sliding window, the pages behind it come wholly free (and are reclaimed for the next
//! tails), and what is left free is the two partly used pages at the window's ends.
//! docs/reserve.md ("Reserve on every trace", "Grown buffers") has the measurements behind
//! `GROWN_DIV` and the free-side threshold (`last_freed`).

use super::*;

/// A request is a grown buffer when the last large allocation freed (of at least half the
/// heap threshold, `last_freed`) was shorter than it by at most 1/`GROWN_DIV` of its
/// length. A decode step grows a KV buffer by one position: 0.2–3 % on the recorded and
/// generated decodes. 16 (6.25 %): the KV cache class 28 → 24 MiB; 8: 26; 32: 26 (its
/// smallest capacity 24).
pub(super) const GROWN_DIV: u64 = 16;

impl Pool {
    /// Whether a large request of `units` granules is a grown buffer below a page (see the
    /// module's notes).
    #[inline(always)]
    pub(super) fn grown(&self, units: u64) -> bool {
        let f = self.last_freed;
        units < self.pg as u64 && f < units && f >= units - units / GROWN_DIV
    }

    /// A grown buffer: at the frontier (`place_at_frontier`), else as any large request, whose
    /// placement becomes the frontier when there was none (a frontier that could not take
    /// this request stays for the next one). On the quick path a frontier that needs a page
    /// leaves the request to the full path, which places it as a pool without the quick path
    /// does (`cache_props::the_quick_path_places_as_the_full_one`).
    pub(super) fn place_grown(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        if let Some(l) = self.place_at_frontier(units, a, reach) {
            self.note_frontier(l);
            return Some(l);
        }
        let keep = self.frontier_block().is_some();
        if keep && reach == Reach::Held {
            return None;
        }
        let l = self.place_large(units, a, reach)?;
        if !keep {
            self.note_frontier(l);
        }
        Some(l)
    }

    /// The frontier block, if it is still a free block that ends a large segment. (The index
    /// is a hint: a block merged away or given back since is no frontier.)
    fn frontier_block(&self) -> Option<u32> {
        let f = self.frontier;
        if f == NIL || f as usize >= self.blocks.len() {
            return None;
        }
        let b = &self.blocks[f as usize];
        (b.page != NIL && self.binned_free(f) && !b.heap && b.next == NIL).then_some(f)
    }

    /// A request at the frontier: from the frontier block's start when it holds it, else
    /// that block whole as the head and the start of the next page (contiguous, when it is
    /// free) or of a fresh one as the tail. A small pool with no free page does not grow for
    /// the tail: a free page start that holds the tail, else a free block of a heap page that
    /// holds the request, else `None` (and `place_large`'s small-pool rules).
    fn place_at_frontier(&mut self, units: u64, a: u32, reach: Reach) -> Option<Layout> {
        let f = self.frontier_block()?;
        let len = self.blocks[f as usize].len as u64;
        if len >= units {
            self.remove_free(f);
            return Some(Layout::Block(self.carve(f, 0, units as u32, a)));
        }
        if self.quick_short_of(2, reach) {
            return None;
        }
        self.reclaim(2);
        if self.free_pages.free_units() == 0 && self.small_pool() {
            let t = (units - len) as u32;
            let prefix = &self.secondary[PREFIX];
            if let Some(tb) = prefix.find_fit(&self.sec_links, t, SCAN, self.block_len()) {
                self.remove_free(f);
                self.take_whole(f, a);
                self.remove_free(tb);
                let tail = self.carve(tb, 0, t, a);
                return Some(self.head_and_tail(f, tail));
            }
            let links = BlockLinksRef(&self.blocks);
            let b = self.primary[HEAP].find_fit(&links, units as u32, SCAN, self.block_len())?;
            self.remove_free(b);
            return Some(Layout::Block(self.carve(b, 0, units as u32, a)));
        }
        if !self.ensure_pages(1, reach) {
            return None;
        }
        let after = self.page_after(&self.blocks[f as usize]);
        self.remove_free(f);
        if self.free_pages.alloc_at(after, 1) {
            // the head's segment runs on over the next page: one block
            self.page_to(after, PageKind::Covered, NIL);
            self.blocks[f as usize].len += self.pg;
            self.journal.push(Change::Extend {
                b: f,
                p: after,
                n: 1,
            });
            return Some(Layout::Block(self.carve(f, 0, units as u32, a)));
        }
        let p = self.free_pages.alloc(1).expect("a free page");
        self.take_whole(f, a);
        let b = self.open_segment(p, 1, PageKind::Large);
        let tail = self.carve(b, 0, (units - len) as u32, a);
        Some(self.head_and_tail(f, tail))
    }

    /// A stitched allocation of used blocks `head` (ending its page) and `tail` (starting
    /// another).
    fn head_and_tail(&mut self, head: u32, tail: u32) -> Layout {
        self.new_stitch(Stitch {
            head,
            runs: SmallVec::new(),
            tail,
            window: NIL,
            window_len: 0,
        })
    }

    /// After a grown buffer's placement: the free block right after it, if it ends its large
    /// segment, is the new frontier (else the frontier stays).
    fn note_frontier(&mut self, l: Layout) {
        let last = match l {
            Layout::Block(b) => b,
            Layout::Stitched(s) => self.stitches[s as usize].tail,
            Layout::None | Layout::Member(_) => NIL,
        };
        if last == NIL {
            return;
        }
        let n = self.blocks[last as usize].next;
        if n != NIL {
            let b = &self.blocks[n as usize];
            if b.free && !b.heap && b.next == NIL {
                self.frontier = n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{device, MIB};
    use super::*;

    const KIB: u64 = 1 << 10;

    fn pool(check: bool) -> Pool {
        let mut cfg = PoolConfig::new(2 * MIB);
        cfg.check = check;
        Pool::new(device(1 << 30), cfg).unwrap()
    }

    /// An allocation of `size` bytes as the bindings make it (`quick`: the quick path
    /// first, then the full one where it gives up) or the full path alone; its pointer is
    /// pushed on `ptrs`.
    fn alloc(p: &mut Pool, size: u64, quick: bool, ptrs: &mut Vec<u64>) -> AllocId {
        let req = Request {
            size,
            ..Request::default()
        };
        let r = if quick { p.try_alloc_quick(req) } else { None };
        let (id, ptr) = r.unwrap_or_else(|| p.alloc(req)).unwrap();
        ptrs.push(ptr);
        id
    }

    /// Numbers below `n` from a linear congruential generator seeded with `seed`.
    fn lcg(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |n| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % n
        }
    }

    /// `layers` buffers grown by `step` bytes a token from `first` for `tokens` tokens, each
    /// new one made while the old is live, then the old freed, with `acts(token)` sizes of
    /// short-lived tensors made before the buffers and freed after them: the pool's peak
    /// reserve, its peak of live bytes and every pointer it returned (`quick`: see `alloc`).
    #[allow(clippy::too_many_arguments)]
    fn grow(
        p: &mut Pool,
        quick: bool,
        layers: usize,
        first: u64,
        step: u64,
        tokens: u64,
        mut acts: impl FnMut(u64) -> Vec<u64>,
    ) -> (u64, u64, Vec<u64>) {
        let mut ptrs = vec![];
        let mut kv: Vec<AllocId> = (0..layers)
            .map(|_| alloc(p, first, quick, &mut ptrs))
            .collect();
        for t in 1..=tokens {
            let tmp: Vec<AllocId> = acts(t)
                .into_iter()
                .map(|s| alloc(p, s, quick, &mut ptrs))
                .collect();
            for b in kv.iter_mut() {
                let new = alloc(p, first + t * step, quick, &mut ptrs);
                p.free(*b).unwrap();
                *b = new;
            }
            for a in tmp {
                p.free(a).unwrap();
            }
        }
        let s = p.stats();
        (s.peak_reserved, s.peak_live, ptrs)
    }

    /// Buffers of about a page's half grown a few KiB a token (as a decode's KV cache), with
    /// two small short-lived tensors a token: laid out back to back, the pool holds their
    /// live bytes (to a page) and at most two pages besides. Without the frontier each page
    /// kept one buffer and a hole: 44 MiB for 37.1 live (with it 42). The third stream, in a
    /// small pool with no free page, holds 34 MiB for 27.9 live, three pages besides: its
    /// short-lived tensors take free blocks between buffers (there is no heap page to put
    /// them in) and keep two freed buffers' holes from merging into one that holds the next.
    #[test]
    fn grown_buffers_lie_back_to_back() {
        for (layers, first, step, tokens, besides) in [
            (24, 1040 * KIB, 6 * KIB, 80, 4 * MIB),
            (8, 1100 * KIB, 4 * KIB, 200, 4 * MIB),
            (24, 1050 * KIB, 6 * KIB, 15, 6 * MIB),
        ] {
            let mut p = pool(false);
            let mut next = lcg(1);
            let (reserved, live, _) = grow(&mut p, false, layers, first, step, tokens, |_| {
                vec![next(64) * KIB + 4 * KIB, 6 * KIB]
            });
            assert!(
                reserved <= live.next_multiple_of(2 * MIB) + besides,
                "{layers} buffers: {} MiB reserved for {:.1} MiB live",
                reserved >> 20,
                live as f64 / MIB as f64
            );
        }
    }

    /// KV buffers of 256 KiB–1.8 MiB grown 4 KiB a token among short-lived tensors of four
    /// sizes (the KV cache class of tests/test_reserve_classes.py), through the quick path
    /// then the full one as the bindings call them, and through the full path alone: every
    /// request at the same address, and every invariant checked after each call. (On the
    /// quick path a frontier that needed a page once fell back to a free block the full
    /// path would not take: here 26 MiB reserved against the full path's 28.)
    #[test]
    fn the_quick_path_places_grown_buffers_as_the_full_one() {
        let run = |quick: bool| {
            let mut next = lcg(7);
            let mut p = pool(true);
            let sizes = [8 * KIB, 32 * KIB, 128 * KIB, 1280 * KIB];
            let r = grow(&mut p, quick, 8, 256 * KIB, 4 * KIB, 400, |_| {
                (0..6).map(|_| sizes[next(4) as usize]).collect()
            });
            p.validate().unwrap();
            r
        };
        let (full, quick) = (run(false), run(true));
        assert_eq!(
            (quick.0 >> 20, quick.1),
            (full.0 >> 20, full.1),
            "peak reserved (MiB) and live"
        );
        assert!(quick.2 == full.2, "the two placed requests apart");
    }
}
