//! Stitched layouts: their pages mapped back to back into the stitching window, and the
//! window's range cache.

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
        let w = self
            .window_take(total)
            .ok_or_else(|| Error::OutOfMemory("the pool's stitching window is exhausted".into()))?;
        let ps = self.cfg.page_size;
        let base = self.window_base + ((w as u64) << self.page_shift);
        if self.maps {
            let mut segs: SmallVec<[(u32, u32); 8]> = SmallVec::new();
            self.for_segments(&self.stitches[i as usize], |p, n| segs.push((p, n)));
            let mut va = base;
            for &(p, n) in &segs {
                let len = n as u64 * ps;
                if let Err(e) = self.dev.backend.map(va, (p as u64) << self.page_shift, len) {
                    let _ = self.dev.backend.unmap(base, va - base);
                    self.window_give(w, total);
                    return Err(e);
                }
                va += len;
            }
        }
        let st = &mut self.stitches[i as usize];
        st.window = w;
        st.window_len = total;
        self.counters.stitched += 1;
        Ok(base + head_off as u64 * GRANULE)
    }

    /// Window pages for a stitched allocation: a cached range of that length, else from the
    /// runs, else (the runs being short) after giving every cached range back.
    #[inline]
    pub(super) fn window_take(&mut self, n: u32) -> Option<u32> {
        if let Some(w) = self.window_cache.get_mut(n as usize).and_then(|v| v.pop()) {
            return Some(w);
        }
        self.window.alloc(n).or_else(|| {
            self.window_flush();
            self.window.alloc(n)
        })
    }

    #[inline]
    pub(super) fn window_give(&mut self, w: u32, n: u32) {
        match self.window_cache.get_mut(n as usize) {
            Some(v) => v.push(w),
            None => self.window.free(w, n),
        }
    }

    pub(super) fn window_flush(&mut self) {
        for n in 0..self.window_cache.len() {
            for w in std::mem::take(&mut self.window_cache[n]) {
                self.window.free(w, n as u32);
            }
        }
    }

    /// Returns a layout's memory: blocks, pages and window.
    #[inline(always)]
    pub(super) fn unplace(&mut self, layout: Layout) {
        match layout {
            Layout::None => {}
            Layout::Member(g) => {
                let x = &mut self.allocs[g as usize];
                x.members -= 1;
                if x.members == 0 {
                    // the last member: the group's memory goes back
                    self.release_group_memory(g);
                }
            }
            Layout::Block(b) => self.release_block(b),
            Layout::Stitched(i) => {
                let st = std::mem::take(&mut self.stitches[i as usize]);
                self.vacant_stitches.push(i);
                if st.window != NIL {
                    if self.maps {
                        let va = self.window_base + ((st.window as u64) << self.page_shift);
                        let len = (st.window_len as u64) << self.page_shift;
                        let r = self.dev.backend.unmap(va, len);
                        debug_assert!(r.is_ok(), "unmap failed: {r:?}");
                    }
                    self.window_give(st.window, st.window_len);
                }
                if st.head != NIL {
                    self.release_block(st.head);
                }
                for (s, l) in st.runs {
                    self.free_pages.free(s, l);
                }
                if st.tail != NIL {
                    self.release_block(st.tail);
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

    /// Pages of the stitching window held in `window_cache` (free, not in `window`).
    pub(super) fn window_cached_pages(&self) -> u64 {
        self.window_cache
            .iter()
            .enumerate()
            .map(|(n, v)| n as u64 * v.len() as u64)
            .sum()
    }
}
