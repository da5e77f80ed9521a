//! Expandable segments (`expandable_segments:True`): an address range per (stream, pool)
//! whose pages are mapped where a request fits and unmapped when the device refuses
//! (`ExpandableSegment`, `find_expandable_block`, `map_block`, `unmap_block` in
//! CUDACachingAllocator.cpp).

use super::blocks::{CBlock, Segment};
use super::{page, round_up, Caching};

impl Caching {
    /// The address space an expandable segment reserves: 1 1/8 of the device, in pages.
    pub(super) fn va_len(&self, small: bool) -> u64 {
        let p = page(small);
        let want = self.capacity.saturating_add(self.capacity / 8).min(1 << 58);
        round_up(want, p).max(p)
    }

    /// `try_allocate_expandable_block`: maps pages for `r` bytes at the lowest address of
    /// the stream's segments where free and unmapped space holds it (a new segment when none
    /// does); returns the free block that holds `r`, or None when the device refuses (pages
    /// mapped before the refusal stay mapped, as in PyTorch).
    pub(super) fn try_allocate_expandable(
        &mut self,
        r: u64,
        stream: u64,
        small: bool,
    ) -> Option<u64> {
        let mut cand = self.find_expandable(r, stream, small)?;
        let b = self.b.get(cand)?;
        if !b.mapped {
            cand = self.map_block(cand, b.size.min(r))?;
        }
        loop {
            let b = self.b.get(cand)?;
            if b.size >= r {
                return Some(cand);
            }
            let (na, n) = self.b.next(cand, &b)?;
            if n.mapped || n.allocated {
                return None;
            }
            cand = self.map_block(na, (r - b.size).min(n.size))?;
        }
    }

    fn allocatable(b: &CBlock) -> bool {
        !b.allocated
    }

    /// Whether the blocks from `addr` on, while not allocated, add up to `r`.
    fn has_space(&self, mut addr: u64, r: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < r {
            let Some(b) = self.b.get(addr).filter(Self::allocatable) else {
                return false;
            };
            bytes = bytes.saturating_add(b.size);
            match self.b.next(addr, &b) {
                Some((na, _)) => addr = na,
                None => break,
            }
        }
        bytes >= r
    }

    /// `find_expandable_block`: the lowest unmapped block of the stream's segments (or the
    /// free block before it) from which `r` bytes are free or unmapped; else a new segment.
    fn find_expandable(&mut self, r: u64, stream: u64, small: bool) -> Option<u64> {
        let unmapped: Vec<u64> = self
            .b
            .unmapped_set(small)
            .range((stream, 0)..)
            .take_while(|&&(s, _)| s == stream)
            .map(|&(_, a)| a)
            .collect();
        for a in unmapped {
            let Some(b) = self.b.get(a) else { continue };
            let c = match self.b.prev(a, &b) {
                Some((pa, p)) if Self::allocatable(&p) => pa,
                _ => a,
            };
            if self.has_space(c, r) {
                return Some(c);
            }
        }
        let len = self.va_len(small);
        if len < r {
            return None;
        }
        let base = self
            .va_base(len, r, small)
            .or_else(|| self.fresh_range(len).map(|a| (a, len)))?;
        let seg = Segment {
            size: base.1,
            small,
            stream,
            expandable: true,
        };
        self.b.add_segment(base.0, seg, false);
        Some(base.0)
    }

    /// Where the trace put the new segment: the address of a segment_map since the last
    /// allocation of the size this request maps first, where no segment of the model holds
    /// it, or where only another segment's unmapped tail does (the real segment ended there,
    /// so the model's is cut to end there too). The range runs to the next segment at most.
    fn va_base(&mut self, len: u64, r: u64, small: bool) -> Option<(u64, u64)> {
        let first = round_up(r, page(small));
        let hints: Vec<(u64, u64)> = self.map_hints.iter().copied().collect();
        for (i, (a, size)) in hints.into_iter().enumerate() {
            if size != first {
                continue;
            }
            let room = self
                .b
                .next_segment_start(a)
                .map_or(len, |n| (n - a).min(len));
            let room = room - room % page(small);
            if room >= first && self.clear_for(a) {
                self.map_hints.remove(i);
                return Some((a, room));
            }
        }
        None
    }

    /// Whether address `a` can start a new segment: no segment holds it, or it lies in the
    /// unmapped last block of an expandable one, which is then cut to end at `a`.
    fn clear_for(&mut self, a: u64) -> bool {
        let Some((sa, s)) = self.b.segment_at(a) else {
            return true;
        };
        if !s.expandable {
            return false;
        }
        let Some((&la, &last)) = self.b.all.range(sa..s.end(sa)).next_back() else {
            return false;
        };
        if last.mapped || last.allocated || la > a || a == sa {
            return false;
        }
        self.b.remove(la);
        if a > la {
            self.b.insert_part(la, &last, a - la);
        }
        if let Some(seg) = self.b.segments.get_mut(&sa) {
            seg.size = a - sa;
        }
        true
    }

    /// `map_block`: maps the pages holding `want` bytes at the start of the unmapped block
    /// at `addr` and merges them with free neighbours; returns the merged block.
    fn map_block(&mut self, addr: u64, want: u64) -> Option<u64> {
        let b = self.b.get(addr).filter(|b| !b.mapped && !b.allocated)?;
        let n = round_up(want.max(1), page(b.small)).min(b.size);
        if !self.dev.charge(n) {
            return None;
        }
        self.b.remove(addr);
        if n < b.size {
            self.b.insert_part(addr + n, &b, b.size - n);
        }
        let mapped = CBlock {
            size: n,
            mapped: true,
            ..b
        };
        Some(self.b.insert_merged(addr, mapped))
    }

    /// `unmap_block`: unmaps the whole pages of the free block at `addr` that lie inside
    /// `[lo, hi)`, leaving the partial pages around them free.
    pub(super) fn unmap_block(&mut self, addr: u64, lo: u64, hi: u64) {
        let Some(b) = self.b.get(addr).filter(|b| b.mapped && !b.allocated) else {
            return;
        };
        let Some(seg) = self
            .b
            .segments
            .get(&b.seg)
            .copied()
            .filter(|s| s.expandable)
        else {
            return;
        };
        let p = page(b.small);
        let end = addr + b.size;
        let (from, to) = (addr.max(lo), end.min(hi));
        if from >= to {
            return;
        }
        let begin = b.seg + round_up(from - b.seg, p);
        let stop = b.seg + (to - b.seg) / p * p;
        if begin >= stop || stop > seg.end(b.seg) {
            return;
        }
        self.b.remove(addr);
        if begin > addr {
            self.b.insert_part(addr, &b, begin - addr);
        }
        if end > stop {
            self.b.insert_part(stop, &b, end - stop);
        }
        let unmapped = CBlock {
            size: stop - begin,
            mapped: false,
            ..b
        };
        self.b.insert_merged(begin, unmapped);
        self.dev.give(stop - begin);
    }

    /// The trace unmapped `[addr, addr + size)`: the model unmaps the free pages it holds
    /// there, and gives back an expandable segment left wholly unmapped.
    pub(super) fn unmap_range(&mut self, addr: u64, size: u64) {
        let hi = addr.saturating_add(size);
        let start = self
            .b
            .all
            .range(..=addr)
            .next_back()
            .map_or(addr, |(&a, _)| a);
        let free: Vec<u64> = self
            .b
            .all
            .range(start..hi)
            .filter(|(_, b)| b.mapped && !b.allocated)
            .map(|(&a, _)| a)
            .collect();
        for a in free {
            self.unmap_block(a, addr, hi);
        }
        self.release_unmapped_segments();
    }

    /// The whole free pages of every expandable segment are unmapped, and a segment left
    /// wholly unmapped goes (the expandable half of `release_blocks`).
    pub(super) fn unmap_free_pages(&mut self) {
        let free: Vec<u64> = self.b.free_blocks().map(|f| f.2).collect();
        for a in free {
            self.unmap_block(a, 0, u64::MAX);
        }
        self.release_unmapped_segments();
    }

    /// `release_expandable_segment`: a segment that is one unmapped block goes.
    pub(super) fn release_unmapped_segments(&mut self) {
        let empty: Vec<u64> = self
            .b
            .segments
            .iter()
            .filter(|(&a, s)| {
                s.expandable && self.b.get(a).is_some_and(|b| !b.mapped && b.size == s.size)
            })
            .map(|(&a, _)| a)
            .collect();
        for a in empty {
            self.b.drop_segment(a);
        }
    }
}
