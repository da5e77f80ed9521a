//! Stitched layouts: their pages listed in mapping order and mapped back to back into the
//! stitching window (`crate::va`), and given back.

use super::*;

impl Pool {
    pub(super) fn new_stitch(&mut self, st: Stitch) -> Layout {
        let i = match self.vacant_stitches.pop() {
            Some(i) => {
                self.stitches[i as usize] = st;
                i
            }
            None => {
                self.stitches.push(st);
                (self.stitches.len() - 1) as u32
            }
        };
        Layout::Stitched(i)
    }

    /// The pages of a stitched layout in mapping order, as physically consecutive segments,
    /// each given to `seg(first page, pages)`.
    #[inline]
    pub(super) fn for_segments(&self, st: &Stitch, mut seg: impl FnMut(u32, u32)) {
        let mut cur: Option<(u32, u32)> = None;
        let mut push = |p: u32, n: u32| match &mut cur {
            Some(last) if last.0 + last.1 == p => last.1 += n,
            _ => {
                if let Some((q, m)) = cur.replace((p, n)) {
                    seg(q, m);
                }
            }
        };
        if st.head != NIL {
            // it ends its segment, so at a page boundary
            let blk = &self.blocks[st.head as usize];
            push(blk.page, self.page_after(blk) - blk.page);
        }
        for &(s, l) in &st.runs {
            push(s, l);
        }
        if st.tail != NIL {
            push(self.blocks[st.tail as usize].page, 1);
        }
        if let Some((q, m)) = cur {
            seg(q, m);
        }
    }

    /// Gives a placed layout its address: the direct map when its pages are consecutive,
    /// else pages of the stitching window, mapped.
    #[inline]
    pub(super) fn address(&mut self, layout: Layout) -> Result<u64> {
        match layout {
            Layout::None | Layout::Member(_) => unreachable!("not a placed layout"),
            Layout::Block(b) => {
                let blk = self.blocks[b as usize];
                Ok(self.direct_addr(blk.page, blk.off))
            }
            Layout::Stitched(i) => self.stitch_address(i),
        }
    }

    pub(super) fn stitch_address(&mut self, i: u32) -> Result<u64> {
        let st = &self.stitches[i as usize];
        let head_off = if st.head == NIL {
            0
        } else {
            self.blocks[st.head as usize].off
        };
        // (counted in place: a vector of the segments, built and moved for every stitched
        // request, was a quarter of an always-stitched pair; it is built only to map)
        let (mut count, mut first, mut total) = (0u32, 0u32, 0u32);
        self.for_segments(st, |p, n| {
            if count == 0 {
                first = p;
            }
            count += 1;
            total += n;
        });
        if count == 1 {
            return Ok(self.direct_addr(first, head_off));
        }
        let mut segs: SmallVec<[(u32, u32); 8]> = SmallVec::new();
        if self.va.maps() {
            self.for_segments(&self.stitches[i as usize], |p, n| segs.push((p, n)));
        }
        let w = self.va.map(&*self.dev.backend, total, &segs)?;
        let st = &mut self.stitches[i as usize];
        st.window = w;
        st.window_len = total;
        self.counters.stitched += 1;
        Ok(self.va.translate(w) + head_off as u64 * GRANULE)
    }

    /// Returns a layout's memory: blocks, pages and window, settled as `settle` says.
    #[inline(always)]
    pub(super) fn unplace(&mut self, layout: Layout, settle: Settle) {
        self.flush_cache(); // (it was freed before this)
        self.unplace_flushed(layout, settle)
    }

    /// `unplace` when the size cache holds nothing (a free's own path, which gave it back).
    #[inline(always)]
    pub(super) fn unplace_flushed(&mut self, layout: Layout, settle: Settle) {
        debug_assert!(self.cache.is_empty());
        match layout {
            Layout::None => {}
            Layout::Member(g) => {
                let x = &mut self.allocs[g as usize];
                x.members -= 1;
                if x.members == 0 {
                    // the last member: the group's memory goes back
                    self.release_group_memory_as(g, settle);
                }
            }
            Layout::Block(b) => self.release_block(b, settle),
            Layout::Stitched(i) => {
                let st = std::mem::take(&mut self.stitches[i as usize]);
                self.vacant_stitches.push(i);
                if st.window != NIL {
                    self.va.unmap(&*self.dev.backend, st.window, st.window_len);
                }
                if st.head != NIL {
                    self.release_block(st.head, settle);
                }
                for (s, l) in st.runs {
                    self.free_pages.free(s, l);
                }
                if st.tail != NIL {
                    self.release_block(st.tail, settle);
                }
            }
        }
    }

    /// Whether a layout (a member's: its group's) is mapped through the stitching window.
    pub(super) fn is_stitched(&self, layout: Layout) -> bool {
        match layout {
            Layout::Stitched(i) => self.stitches[i as usize].window != NIL,
            Layout::Member(g) => self.is_stitched(self.allocs[g as usize].layout),
            _ => false,
        }
    }
}
