//! The caching model's block bookkeeping: every block of every segment in address order, the
//! free (mapped) blocks by (stream, size, address) per pool, the unmapped ones by (stream,
//! address) per pool. Blocks enter and leave only through `insert` and `remove`, which keep
//! the sets in step, so no lookup can miss.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct CBlock {
    pub seg: u64,
    pub size: u64,
    pub allocated: bool,
    pub mapped: bool,
    pub stream: u64,
    pub small: bool,
    /// The model's count of large-pool requests when the block last became free (its age
    /// for the garbage collection is the count now less this)
    pub since: u64,
}

#[derive(Copy, Clone, Debug)]
pub(super) struct Segment {
    /// Its address range: the mapped bytes of a plain segment, the reserved address space of
    /// an expandable one.
    pub size: u64,
    pub small: bool,
    pub stream: u64,
    pub expandable: bool,
}

impl Segment {
    pub fn end(&self, at: u64) -> u64 {
        at + self.size
    }
}

#[derive(Default)]
pub(super) struct Blocks {
    pub all: BTreeMap<u64, CBlock>,
    pub segments: BTreeMap<u64, Segment>,
    free_small: BTreeSet<(u64, u64, u64)>,
    free_large: BTreeSet<(u64, u64, u64)>,
    unmapped_small: BTreeSet<(u64, u64)>,
    unmapped_large: BTreeSet<(u64, u64)>,
}

impl Blocks {
    pub fn free_set(&self, small: bool) -> &BTreeSet<(u64, u64, u64)> {
        if small {
            &self.free_small
        } else {
            &self.free_large
        }
    }

    pub fn unmapped_set(&self, small: bool) -> &BTreeSet<(u64, u64)> {
        if small {
            &self.unmapped_small
        } else {
            &self.unmapped_large
        }
    }

    pub fn free_blocks(&self) -> impl Iterator<Item = &(u64, u64, u64)> {
        self.free_small.iter().chain(self.free_large.iter())
    }

    pub fn get(&self, addr: u64) -> Option<CBlock> {
        self.all.get(&addr).copied()
    }

    pub fn insert(&mut self, addr: u64, b: CBlock) {
        if let Some(old) = self.all.insert(addr, b) {
            self.unlist(addr, old);
        }
        if !b.allocated {
            if b.mapped {
                let set = if b.small {
                    &mut self.free_small
                } else {
                    &mut self.free_large
                };
                set.insert((b.stream, b.size, addr));
            } else {
                let set = if b.small {
                    &mut self.unmapped_small
                } else {
                    &mut self.unmapped_large
                };
                set.insert((b.stream, addr));
            }
        }
    }

    /// Inserts `size` bytes at `addr` as `b` is (a part of it).
    pub fn insert_part(&mut self, addr: u64, b: &CBlock, size: u64) {
        self.insert(addr, CBlock { size, ..*b });
    }

    pub fn remove(&mut self, addr: u64) -> Option<CBlock> {
        let b = self.all.remove(&addr)?;
        self.unlist(addr, b);
        Some(b)
    }

    fn unlist(&mut self, addr: u64, b: CBlock) {
        match (b.allocated, b.mapped, b.small) {
            (true, ..) => {}
            (false, true, true) => {
                self.free_small.remove(&(b.stream, b.size, addr));
            }
            (false, true, false) => {
                self.free_large.remove(&(b.stream, b.size, addr));
            }
            (false, false, true) => {
                self.unmapped_small.remove(&(b.stream, addr));
            }
            (false, false, false) => {
                self.unmapped_large.remove(&(b.stream, addr));
            }
        }
    }

    /// The block after `addr`'s in its segment.
    pub fn next(&self, addr: u64, b: &CBlock) -> Option<(u64, CBlock)> {
        let at = addr.checked_add(b.size)?;
        self.get(at).filter(|n| n.seg == b.seg).map(|n| (at, n))
    }

    /// The block before `addr`'s in its segment.
    pub fn prev(&self, addr: u64, b: &CBlock) -> Option<(u64, CBlock)> {
        let (&pa, &p) = self.all.range(..addr).next_back()?;
        (p.seg == b.seg && pa + p.size == addr).then_some((pa, p))
    }

    /// Inserts the free (or unmapped) block `b` at `addr`, merged with its neighbours in the
    /// segment that are not allocated and mapped alike; returns the merged block's address.
    pub fn insert_merged(&mut self, addr: u64, mut b: CBlock) -> u64 {
        let mut at = addr;
        if !b.allocated {
            if let Some((na, n)) = self.next(addr, &b) {
                if !n.allocated && n.mapped == b.mapped {
                    self.remove(na);
                    b.size += n.size;
                }
            }
            if let Some((pa, p)) = self.prev(addr, &b) {
                if !p.allocated && p.mapped == b.mapped {
                    self.remove(pa);
                    at = pa;
                    b.size += p.size;
                }
            }
        }
        self.insert(at, b);
        at
    }

    /// Whether `[addr, addr + size)` meets any segment (or wraps the address space).
    pub fn overlaps(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size.max(1)) else {
            return true;
        };
        self.segments
            .range(..end)
            .next_back()
            .is_some_and(|(&a, s)| s.end(a) > addr)
    }

    /// The start of the first segment at or above `addr`.
    pub fn next_segment_start(&self, addr: u64) -> Option<u64> {
        self.segments.range(addr..).next().map(|(&a, _)| a)
    }

    /// The segment holding `addr`.
    pub fn segment_at(&self, addr: u64) -> Option<(u64, Segment)> {
        let (&a, &s) = self.segments.range(..=addr).next_back()?;
        (s.end(a) > addr).then_some((a, s))
    }

    /// Adds a segment as one block (free and mapped, or unmapped).
    pub fn add_segment(&mut self, addr: u64, seg: Segment, mapped: bool) {
        self.segments.insert(addr, seg);
        self.insert(
            addr,
            CBlock {
                seg: addr,
                size: seg.size,
                allocated: false,
                mapped,
                stream: seg.stream,
                small: seg.small,
                since: 0,
            },
        );
    }

    /// Removes a segment and its blocks.
    pub fn drop_segment(&mut self, addr: u64) -> Option<Segment> {
        let s = self.segments.remove(&addr)?;
        let inside: Vec<u64> = self
            .all
            .range(addr..s.end(addr))
            .filter(|(_, b)| b.seg == addr)
            .map(|(&a, _)| a)
            .collect();
        for a in inside {
            self.remove(a);
        }
        Some(s)
    }

    /// The mapped bytes held (what the device has given).
    pub fn mapped_bytes(&self) -> u64 {
        self.all.values().filter(|b| b.mapped).map(|b| b.size).sum()
    }

    /// Segments do not overlap, blocks tile them, the sets hold exactly the free and the
    /// unmapped blocks, plain segments are wholly mapped, and `ids` name allocated blocks.
    pub fn validate(&self, ids: &FxHashMap<u32, u64>) -> Result<(), String> {
        let mut end = 0u64;
        for (&a, s) in &self.segments {
            if a < end || s.size == 0 {
                return Err(format!(
                    "segment {a:#x} overlaps the one before or is empty"
                ));
            }
            end = s.end(a);
            let mut at = a;
            for (&ba, b) in self.all.range(a..end) {
                if ba != at || b.seg != a || b.stream != s.stream || b.small != s.small {
                    return Err(format!(
                        "block {ba:#x} does not follow on in segment {a:#x}"
                    ));
                }
                if !s.expandable && !b.mapped {
                    return Err(format!("unmapped block {ba:#x} in a plain segment"));
                }
                at += b.size;
            }
            if at != end {
                return Err(format!(
                    "blocks of segment {a:#x} end at {at:#x}, not {end:#x}"
                ));
            }
        }
        let inside: usize = self
            .segments
            .iter()
            .map(|(&a, s)| self.all.range(a..s.end(a)).count())
            .sum();
        if inside != self.all.len() {
            return Err("a block lies outside every segment".into());
        }
        let free = self
            .all
            .values()
            .filter(|b| !b.allocated && b.mapped)
            .count();
        let unmapped = self.all.values().filter(|b| !b.mapped).count();
        if free != self.free_small.len() + self.free_large.len()
            || unmapped != self.unmapped_small.len() + self.unmapped_large.len()
        {
            return Err("free or unmapped sets out of step".into());
        }
        for &(st, size, a) in self.free_blocks() {
            let ok = self
                .get(a)
                .is_some_and(|b| !b.allocated && b.mapped && b.stream == st && b.size == size);
            if !ok {
                return Err(format!("free set names {a:#x} wrongly"));
            }
        }
        for (id, a) in ids {
            if !self.get(*a).is_some_and(|b| b.allocated) {
                return Err(format!("id {id} names no allocated block"));
            }
        }
        if ids.len() != self.all.values().filter(|b| b.allocated).count() {
            return Err("allocated blocks and ids differ in number".into());
        }
        Ok(())
    }
}
