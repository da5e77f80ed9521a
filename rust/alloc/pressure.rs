//! The last resort: a request that no placement of `Reach::Any` holds, on its way to out of
//! memory, is laid out again with what the placements before it pass over (see
//! `Pool::place_last_resort`). Nothing here runs for a request that any other placement
//! serves, so a replay with no refusal places exactly as without it, at any capacity: it can
//! only turn a refusal into an allocation, which is why it changes no peak reserve at 80 GiB
//! and can only lower a smallest capacity (docs/reserve.md, "Reserve on every trace").

use super::*;

/// Bits of `Pool::last_resort_rules`: a large request laid out again with the last resort's
/// rules (`LAST_LAYOUT`), and heap segments' free ends and starts as heads and tails
/// (`LAST_HEAP_ENDS`). Both on in every pool; tests turn one off to see what it does.
pub(super) const LAST_LAYOUT: u8 = 1;
pub(super) const LAST_HEAP_ENDS: u8 = 2;

impl Pool {
    /// A request that `place` with `Reach::Any` refused:
    /// - a large one is laid out again with `last_resort` set: the head paired with its tail
    ///   for the fewest pages (`pair_fewest_pages`), a tail in any free page start that holds
    ///   it (not only within `tail_slack`), a free block across a page boundary cut in a small
    ///   pool too (`cut_for`);
    /// - then any request (not within a batch) over heap segments' free ends and starts
    ///   (`place_over_heap_ends`).
    ///
    /// Measured (`python scripts/reserve_table.py`; the smallest capacity summed over each
    /// class's seed and seeds 10-17): the KV cache class 26 -> 24 MiB (sum 234 -> 226), small
    /// trace 326 -> 322, 1-10 MiB 2,632 -> 2,628, interleaved 1,708 -> 1,696, three streams
    /// 1,664 -> 1,660, no seed higher (docs/reserve.md, "Reserve on every trace").
    #[cold]
    #[inline(never)]
    pub(super) fn place_last_resort(&mut self, units: u64, a: u32, batch: bool) -> Option<Layout> {
        let rules = self.last_resort_rules;
        let mut l = None;
        if rules & LAST_LAYOUT != 0 && units >= self.small_units {
            self.last_resort = true;
            l = self.place_large(units, a, Reach::Any);
        }
        if l.is_none() && rules & LAST_HEAP_ENDS != 0 && !batch {
            l = self.place_over_heap_ends(units, a);
        }
        self.last_resort = false;
        #[cfg(test)]
        stress::LAST_RESORTS.with(|c| {
            let (ran, placed) = c.get();
            c.set((ran + 1, placed + l.is_some() as u64));
        });
        l
    }

    /// A request no other placement holds. A heap block cannot cross its page's end, so a
    /// heap page's free end and free start are no head or tail of a layout: every heap
    /// segment whose first or last block is free becomes a large segment (its blocks binned
    /// as large blocks, so that `pick_head_tail` sees those ends and starts; journaled as
    /// `Change::Retype`), the request is laid out as a large one (a small one too: its head
    /// and tail stitched over two pages), and the segments its layout does not use are heap
    /// segments again. A refusal undoes the change with the rest of the journal. (At 178 MiB
    /// the three streams' 3.79 MiB request failed beside a heap page's free 1,946 KiB end and
    /// a large page's free 1,976 KiB start; the interleaved class fails with every page a
    /// heap page, in 190 holes.) The growth path's `heap_ends_for` takes heap page ends and
    /// starts too, without retyping, but only for large requests, only of the
    /// `HEAP_END_SCAN` largest heap blocks and, in a pool of at least `SMALL_POOL`, not the
    /// heap page opened last; here every heap segment's ends are candidates, paired for the
    /// fewest pages (`pair_fewest_pages`).
    fn place_over_heap_ends(&mut self, units: u64, a: u32) -> Option<Layout> {
        let mut segs: SmallVec<[u32; 16]> = SmallVec::new();
        for p in 0..self.pages.len() as u32 {
            if self.pages[p as usize] != PageKind::Heap {
                continue;
            }
            let first = self.page_first[p as usize];
            let last = self.page_blocks(p).last().expect("a block");
            if self.binned_free(first) || self.binned_free(last) {
                segs.push(p);
            }
        }
        if segs.is_empty() {
            return None;
        }
        let mark = self.journal.len();
        for &p in &segs {
            self.retype(p, false);
            self.journal.push(Change::Retype { p });
        }
        let l = self.place_large(units, a, Reach::Any)?;
        if self.journal[mark..]
            .iter()
            .any(|c| !matches!(c, Change::Retype { .. }))
        {
            // (an undo of what the placement changed wants the segments as they were then)
            return Some(l);
        }
        let ends: [u32; 2] = match l {
            Layout::Block(b) => [b, NIL],
            Layout::Stitched(i) => {
                let st = &self.stitches[i as usize];
                [st.head, st.tail]
            }
            _ => [NIL, NIL],
        };
        let used: SmallVec<[u32; 2]> = ends
            .into_iter()
            .filter(|&b| b != NIL)
            .map(|b| self.segment_start(b))
            .collect();
        self.journal.truncate(mark);
        for p in segs {
            if used.contains(&p) {
                self.journal.push(Change::Retype { p });
            } else {
                self.retype(p, true);
            }
        }
        Some(l)
    }

    /// `pick_head_tail` at the last resort (`Pool::last_resort`): of the head found and the
    /// next `PAIR_SCAN` free page ends that the request can use whole, the one whose layout
    /// takes the fewest free pages, then leaves the least of its tail's page start unused
    /// (the least unused alone picked a head whose tail needed a page the pool no longer had
    /// over one whose tail fitted: the three streams at 178 MiB, docs/reserve.md).
    #[cold]
    #[inline(never)]
    pub(super) fn pair_fewest_pages(
        &self,
        units: u64,
        head: u32,
        tail: u32,
        waste: u64,
    ) -> (u32, u32) {
        let mut best = (self.pages_for(units, head, tail), waste, head, tail);
        self.walk_heads(units, head, |c, w, tl| {
            let k = (self.pages_for(units, c, tl), w, c, tl);
            if (k.0, k.1) < (best.0, best.1) {
                best = k;
            }
            false
        });
        (best.2, best.3)
    }

    /// The first page of the segment block `b` is in.
    fn segment_start(&self, mut b: u32) -> u32 {
        while self.blocks[b as usize].prev != NIL {
            b = self.blocks[b as usize].prev;
        }
        self.blocks[b as usize].page
    }

    /// The segment whose first page is `p` becomes a heap segment (`heap`) or a large one:
    /// its blocks' kind and bins follow.
    pub(super) fn retype(&mut self, p: u32, heap: bool) {
        let blocks: SmallVec<[u32; 32]> = self.page_blocks(p).collect();
        for b in blocks {
            let binned = self.binned_free(b);
            if binned {
                self.remove_free(b);
            }
            self.blocks[b as usize].heap = heap;
            if binned {
                self.insert_free(b);
            }
        }
        let kind = if heap {
            PageKind::Heap
        } else {
            PageKind::Large
        };
        let first = self.page_first[p as usize];
        self.page_to(p, kind, first);
    }
}

#[cfg(test)]
mod stress;
#[cfg(test)]
mod tests;
