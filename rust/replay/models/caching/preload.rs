//! The caching model's start state: the snapshot's segments with their live blocks, the gaps
//! between live blocks free (the real allocator merges free neighbours, so gaps are maximal).
//! With expandable segments (as the trace was recorded) each segment of the snapshot is a
//! mapped range; ranges of one (stream, pool) in a row form one expandable segment, unmapped
//! between them.
//!
//! Whatever the snapshot holds, the model stays whole: a segment that meets one placed
//! before, an empty one, and one past the end of the address space are left out; a live block
//! that lies outside its segment, meets the block before it, or is smaller than its request
//! is allocated anew after the segments are in place. A start that does not fit the capacity
//! fails as a whole.

use std::collections::BTreeMap;

use super::blocks::{CBlock, Segment};
use super::{page, Caching, K_LARGE_BUFFER, K_SMALL_BUFFER, K_SMALL_SIZE};
use crate::replay::{Model, StartState};

/// A live block of the start: (id, block size, request, stream).
type Live = (u32, u64, u64, u64);

impl Caching {
    pub(super) fn load_start(&mut self, start: &StartState) -> bool {
        let mut live: BTreeMap<u64, Live> = BTreeMap::new();
        for &(id, addr, req, bsize, stream) in &start.blocks {
            live.entry(addr).or_insert((id, bsize, req, stream));
        }
        let mut ranges: Vec<(u64, u64, u64)> = start
            .segments
            .iter()
            .copied()
            .filter(|&(a, size, _)| size > 0 && a.checked_add(size).is_some())
            .collect();
        ranges.sort_unstable();
        let mut kept: Vec<(u64, u64, u64)> = Vec::with_capacity(ranges.len());
        for r in ranges {
            if kept.last().is_none_or(|&(a, s, _)| a + s <= r.0) {
                kept.push(r);
            }
        }
        let mapped: u64 = kept.iter().map(|r| r.1).fold(0, u64::saturating_add);
        if !self.dev.charge(mapped) {
            return false;
        }
        if self.opts.recorded_expandable {
            self.load_expandable(&kept, &live);
        } else {
            for &(seg, size, stream) in &kept {
                let small = match self.range_small(seg, size, &live) {
                    Some(s) => s,
                    None => size == K_SMALL_BUFFER,
                };
                let s = Segment {
                    size,
                    small,
                    stream,
                    expandable: false,
                };
                self.b.segments.insert(seg, s);
                self.fill_range(seg, seg, size, &s, &live);
            }
        }
        let mut rest: Vec<&(u32, u64, u64, u64, u64)> = start
            .blocks
            .iter()
            .filter(|b| !self.by_id.contains_key(&b.0))
            .collect();
        rest.sort_by_key(|b| b.0);
        rest.dedup_by_key(|b| b.0);
        rest.into_iter()
            .all(|&(id, _, req, _, stream)| self.alloc(id, req, stream).is_some())
    }

    /// The pool of a mapped range by the live blocks in it (a live block's request says its
    /// pool); None when it holds none.
    fn range_small(&self, a: u64, size: u64, live: &BTreeMap<u64, Live>) -> Option<bool> {
        live.range(a..a + size)
            .next()
            .map(|(_, &(_, _, req, _))| self.round_size(req) <= K_SMALL_SIZE)
    }

    /// Blocks for the mapped range `[at, at + size)` of segment `seg`: its live blocks, the
    /// gaps between them free.
    fn fill_range(
        &mut self,
        seg: u64,
        at: u64,
        size: u64,
        s: &Segment,
        live: &BTreeMap<u64, Live>,
    ) {
        let end = at + size;
        let free = |size| CBlock {
            seg,
            size,
            allocated: false,
            mapped: true,
            stream: s.stream,
            small: s.small,
            since: 0,
        };
        let mut cur = at;
        let inside: Vec<(u64, Live)> = live.range(at..end).map(|(a, v)| (*a, *v)).collect();
        for (a, (id, bsize, req, _)) in inside {
            let fits = a >= cur
                && bsize > 0
                && bsize >= req
                && a.checked_add(bsize).is_some_and(|e| e <= end);
            if !fits || self.by_id.contains_key(&id) {
                continue;
            }
            if a > cur {
                self.b.insert(cur, free(a - cur));
            }
            self.b.insert(
                a,
                CBlock {
                    allocated: true,
                    size: bsize,
                    ..free(bsize)
                },
            );
            self.by_id.insert(id, a);
            cur = a + bsize;
        }
        if cur < end {
            self.b.insert(cur, free(end - cur));
        }
    }

    /// Mapped ranges (sorted, apart) into expandable segments.
    fn load_expandable(&mut self, ranges: &[(u64, u64, u64)], live: &BTreeMap<u64, Live>) {
        let kinds: Vec<bool> = ranges
            .iter()
            .map(|&(a, size, _)| {
                self.range_small(a, size, live)
                    .unwrap_or(size % K_LARGE_BUFFER != 0)
            })
            .collect();
        let mut i = 0;
        while i < ranges.len() {
            let (base, _, stream) = ranges[i];
            let small = kinds[i];
            let len = self.va_len(small);
            let limit = base.saturating_add(len);
            let mut j = i + 1;
            while j < ranges.len()
                && kinds[j] == small
                && ranges[j].2 == stream
                && ranges[j].0 + ranges[j].1 <= limit
            {
                j += 1;
            }
            let (la, ls, _) = ranges[j - 1];
            let next = ranges.get(j).map_or(u64::MAX, |r| r.0);
            let mut end = limit.min(next).max(la + ls);
            end = base + (end - base) / page(small) * page(small);
            end = end.max(la + ls);
            let seg = Segment {
                size: end - base,
                small,
                stream,
                expandable: true,
            };
            self.b.segments.insert(base, seg);
            let mut cur = base;
            for &(a, size, _) in &ranges[i..j] {
                if a > cur {
                    self.b.insert(cur, unmapped(base, a - cur, &seg));
                }
                self.fill_range(base, a, size, &seg, live);
                cur = a + size;
            }
            if cur < end {
                self.b.insert(cur, unmapped(base, end - cur, &seg));
            }
            i = j;
        }
    }
}

fn unmapped(seg: u64, size: u64, s: &Segment) -> CBlock {
    CBlock {
        seg,
        size,
        allocated: false,
        mapped: false,
        stream: s.stream,
        small: s.small,
        since: 0,
    }
}
