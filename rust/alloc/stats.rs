//! Two tiers of pool statistics: counters kept current by every operation, and on demand a
//! walk (`stats`: fragmentation, page kinds, live sizes) and a full check (`validate`).

use super::bins::{bin_lower, bin_of, NUM_BINS};
use super::*;

/// An HDR-style latency histogram: the bins of [`bin_of`] over nanoseconds, so every
/// recorded value is known to within 6.25 %.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; NUM_BINS],
            n: 0,
            sum: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, ns: u64) {
        self.counts[bin_of(ns.min(u32::MAX as u64) as u32)] += 1;
        self.n += 1;
        self.sum += ns;
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bin that holds it.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = bin_lower(b) as f64;
                let hi = if b + 1 < NUM_BINS {
                    bin_lower(b + 1) as f64
                } else {
                    lo
                };
                return (lo + hi) / 2.0;
            }
        }
        unreachable!("rank within count")
    }
}

/// A picture of a pool. Bytes unless named otherwise.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolStats {
    pub page_size: u64,
    /// Sum of requested sizes of live allocations.
    pub live_bytes: u64,
    /// Rounded sizes of live and freeing allocations.
    pub used_bytes: u64,
    /// Rounded sizes of allocations freed on a stream whose fence has not completed.
    pub freeing_bytes: u64,
    /// Pages the pool holds from the device.
    pub reserved_bytes: u64,
    /// `reserved - used`.
    pub free_bytes: u64,
    pub peak_live: u64,
    pub peak_used: u64,
    pub peak_reserved: u64,
    /// The longest physically contiguous free range in the pool.
    pub largest_free_run: u64,
    /// `1 - largest_free_run / free_bytes` (0 when nothing is free).
    pub fragmentation: f64,
    /// The largest request the pool can serve from the pages it holds, without growing:
    /// every free page stitched, plus the largest free page end and start as head and tail
    /// (or the largest free block, if larger). Free space inside partly used pages beyond
    /// that is what a smaller page size (or `defrag`) would recover.
    pub largest_request: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failures: u64,
    /// `allocs / (allocs + failures)` (1 when nothing was asked).
    pub success_rate: f64,
    pub reused: u64,
    /// Requests served by a block of exactly their size kept from a recent free (see
    /// `cache.rs`), and the freed allocations kept there now (their memory counts as free).
    pub cache_hits: u64,
    pub cached_allocs: u64,
    pub stitched: u64,
    pub live_allocs: u64,
    pub pending_frees: u64,
    /// Pages in the free runs (whole free pages inside large segments are not counted here:
    /// they are in `large_free_bytes`, and in `largest_request`, since a request that needs
    /// them reclaims them).
    pub pages_free: u64,
    pub pages_heap: u64,
    /// Pages of large segments.
    pub pages_large: u64,
    pub pages_full: u64,
    /// Free bytes inside heap pages and inside large segments.
    pub heap_free_bytes: u64,
    pub large_free_bytes: u64,
    pub pages_taken: u64,
    pub pages_released: u64,
    pub latency_samples: u64,
    pub latency_mean_ns: f64,
    pub latency_p50_ns: f64,
    pub latency_p99_ns: f64,
    /// Live allocations by size class: (largest size in the class, count, requested bytes),
    /// classes are powers of two from 256 B.
    pub live_by_size: Vec<(u64, u64, u64)>,
}

impl Pool {
    /// Whether a block holds memory of an allocation (not free, not kept in the exact-size
    /// cache, whose memory counts as free).
    pub(super) fn holds(&self, blk: &Block) -> bool {
        !blk.free && self.allocs[blk.owner() as usize].state != State::Cached
    }

    /// For each page, the slot of the stitched allocation it is a middle page of (NIL if none).
    fn full_owners(&self) -> Vec<u32> {
        let mut owner = vec![NIL; self.pages.len()];
        for (a, x) in self.allocs.iter().enumerate() {
            if let Layout::Stitched(i) = x.layout {
                for &(s, l) in &self.stitches[i as usize].runs {
                    for p in s..s + l {
                        owner[p as usize] = a as u32;
                    }
                }
            }
        }
        owner
    }

    pub fn stats(&self) -> PoolStats {
        let c = &self.counters;
        let ps = self.cfg.page_size;
        let mut s = PoolStats {
            page_size: ps,
            live_bytes: c.live_bytes,
            used_bytes: c.used_bytes,
            freeing_bytes: c.freeing_bytes,
            reserved_bytes: c.reserved_bytes,
            free_bytes: c.reserved_bytes - c.used_bytes,
            peak_live: c.peak_live,
            peak_used: c.peak_used,
            peak_reserved: c.peak_reserved,
            allocs: c.allocs,
            frees: c.frees,
            failures: c.failures,
            success_rate: if c.allocs + c.failures == 0 {
                1.0
            } else {
                c.allocs as f64 / (c.allocs + c.failures) as f64
            },
            reused: c.reused,
            cache_hits: c.cache_hits,
            cached_allocs: self.cache.len() as u64,
            stitched: c.stitched,
            pages_taken: c.pages_taken,
            pages_released: c.pages_released,
            latency_samples: self.latency.len(),
            latency_mean_ns: self.latency.mean(),
            latency_p50_ns: self.latency.quantile(0.5),
            latency_p99_ns: self.latency.quantile(0.99),
            ..PoolStats::default()
        };
        s.pages_free = self.free_pages.free_units();
        for (p, &kind) in self.pages.iter().enumerate() {
            match kind {
                PageKind::Absent => {}
                PageKind::Owned => s.pages_full += 1,
                PageKind::Heap => {
                    s.pages_heap += 1;
                    s.heap_free_bytes += (self.pg - self.page_used(p as u32)) as u64 * GRANULE;
                }
                PageKind::Large | PageKind::Covered => s.pages_large += 1,
            }
        }
        s.pages_full -= s.pages_free;
        // Free ranges in physical order, merged where they touch.
        let mut free: Vec<(u64, u64)> = self
            .free_pages
            .runs()
            .into_iter()
            .map(|(p, n)| ((p as u64) * ps, n as u64 * ps))
            .collect();
        // What a stitched request could use once the whole free pages inside segments are
        // reclaimed: those pages, the largest head (a free block ending at a page boundary
        // that ends its segment, or would once reclaimed), the largest tail likewise.
        let (mut head, mut tail, mut block, mut inner) = (0u64, 0u64, 0u64, 0u64);
        let pg = self.pg as u64;
        for blk in &self.blocks {
            if blk.page != NIL && !self.holds(blk) {
                let len = blk.len as u64 * GRANULE;
                block = block.max(len);
                if !blk.heap {
                    s.large_free_bytes += len;
                    let g0 = self.start_of(blk);
                    let g1 = g0 + blk.len as u64;
                    let (p0, p1) = (g0.div_ceil(pg), g1 / pg);
                    if p1 > p0 {
                        inner += p1 - p0;
                        head = head.max((p0 * pg - g0) * GRANULE);
                        tail = tail.max((g1 - p1 * pg) * GRANULE);
                    } else if blk.next == NIL {
                        head = head.max(len);
                    } else if blk.prev == NIL {
                        tail = tail.max(len);
                    }
                }
                free.push((
                    blk.page as u64 * ps + blk.off as u64 * GRANULE,
                    blk.len as u64 * GRANULE,
                ));
            }
        }
        free.sort_unstable();
        let (mut best, mut cur_start, mut cur_len) = (0u64, 0u64, 0u64);
        for (start, len) in free {
            if cur_len > 0 && cur_start + cur_len == start {
                cur_len += len;
            } else {
                cur_start = start;
                cur_len = len;
            }
            best = best.max(cur_len);
        }
        s.largest_free_run = best;
        s.largest_request = ((s.pages_free + inner) * ps + head + tail)
            .max(block)
            .max(best);
        s.fragmentation = if s.free_bytes == 0 {
            0.0
        } else {
            1.0 - best as f64 / s.free_bytes as f64
        };
        let mut classes: Vec<(u64, u64, u64)> = Vec::new();
        for x in &self.allocs {
            match x.state {
                State::Live => s.live_allocs += 1,
                State::Freeing => {
                    s.pending_frees += 1;
                    continue;
                }
                State::Vacant | State::Group | State::Cached => continue,
            }
            let upper = x.size.next_power_of_two().max(GRANULE);
            match classes.iter_mut().find(|c| c.0 == upper) {
                Some(c) => {
                    c.1 += 1;
                    c.2 += x.size;
                }
                None => classes.push((upper, 1, x.size)),
            }
        }
        classes.sort_unstable();
        s.live_by_size = classes;
        s
    }

    /// Granules a placed layout holds (None for none); adds its window pages to `mapped`.
    fn held_granules(&self, layout: Layout, mapped: &mut u64) -> Option<u64> {
        match layout {
            Layout::Block(b) => Some(self.blocks[b as usize].len as u64),
            Layout::Stitched(i) => {
                let st = &self.stitches[i as usize];
                if st.window != NIL {
                    *mapped += st.window_len as u64;
                }
                let part = |b: u32| {
                    if b == NIL {
                        0
                    } else {
                        self.blocks[b as usize].len as u64
                    }
                };
                Some(
                    part(st.head)
                        + part(st.tail)
                        + st.runs.iter().map(|r| r.1 as u64).sum::<u64>() * self.pg as u64,
                )
            }
            Layout::None | Layout::Member(_) => None,
        }
    }

    /// The members of the uncut batch record whose block is `b`, if there is one.
    pub(super) fn uncut_members(&self, b: u32) -> Option<&[(u64, u32)]> {
        self.batches
            .iter()
            .find(|r| r.shape == Record::Uncut(b))
            .map(|r| &r.members[..])
    }

    /// A batch record's members lie as its shape says: back to back in one used block, in
    /// their order, the block the first member's (`Uncut`), or every member of one group
    /// (`Group`).
    fn validate_record_shape(&self, rec: &BatchRecord) -> std::result::Result<(), String> {
        let mut at = match rec.shape {
            Record::Uncut(b) => {
                let blk = &self.blocks[b as usize];
                let first = rec.members.first().map(|e| e.1);
                if blk.free || first != Some(blk.owner()) {
                    return Err(format!(
                        "block {b} of an uncut batch record is not its first member's"
                    ));
                }
                self.direct_addr(blk.page, blk.off)
            }
            Record::Group(_) => 0,
        };
        for &(p, a) in &rec.members {
            let x = &self.allocs[a as usize];
            let ok = match (rec.shape, x.layout) {
                (Record::Uncut(b), Layout::Block(c)) => {
                    let next = b == c && p == at;
                    at += x.units() * GRANULE;
                    next
                }
                (Record::Group(g), Layout::Member(h)) => g == h,
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "batch record member {p:#x} does not lie as {:?}",
                    rec.shape
                ));
            }
        }
        if let Record::Uncut(b) = rec.shape {
            let blk = &self.blocks[b as usize];
            if at != self.direct_addr(blk.page, blk.off) + blk.len as u64 * GRANULE {
                return Err(format!("the members of uncut block {b} do not fill it"));
            }
        }
        if let Record::Group(g) = rec.shape {
            if self.allocs[g as usize].members as usize != rec.members.len() {
                return Err(format!(
                    "batch record of group {g} is not all of its members"
                ));
            }
        }
        Ok(())
    }

    /// Checks every invariant of the module comment and recomputes every counter; returns a
    /// description of the first broken one.
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.free_pages
            .validate()
            .map_err(|e| format!("free pages: {e}"))?;
        self.window.validate().map_err(|e| format!("window: {e}"))?;
        let ps = self.cfg.page_size;
        let mut free_runs = vec![false; self.pages.len()];
        for (s, l) in self.free_pages.runs() {
            for p in s..s + l {
                free_runs[p as usize] = true;
            }
        }
        let owners = self.full_owners();
        let mut owned = 0u64;
        let (mut nheap, mut nlarge, mut nsuffix, mut nprefix) = (0usize, 0usize, 0usize, 0usize);
        let mut block_seen = 0usize;
        let mut covered = vec![false; self.pages.len()];
        for (p, &kind) in self.pages.iter().enumerate() {
            let p = p as u32;
            let full = owners[p as usize] != NIL;
            if free_runs[p as usize] && (kind != PageKind::Owned || full) {
                return Err(format!(
                    "free page {p} is {:?} (owner {})",
                    kind, owners[p as usize]
                ));
            }
            if full && kind != PageKind::Owned {
                return Err(format!(
                    "middle page {p} of a stitched allocation is {:?}",
                    kind
                ));
            }
            if kind == PageKind::Owned && !full && !free_runs[p as usize] {
                return Err(format!("page {p} is held but neither free nor used"));
            }
            if kind != PageKind::Absent {
                owned += 1;
            }
            match kind {
                PageKind::Heap | PageKind::Large => {
                    // the blocks of the page (heap) or segment (large), from its start
                    let pg = self.pg as u64;
                    let base = p as u64 * pg;
                    let (mut g, mut prev, mut prev_free) = (base, NIL, false);
                    for b in self.page_blocks(p) {
                        block_seen += 1;
                        let blk = &self.blocks[b as usize];
                        if self.start_of(blk) != g
                            || blk.off as u64 >= pg
                            || blk.prev != prev
                            || blk.len == 0
                            || blk.heap != (kind == PageKind::Heap)
                        {
                            return Err(format!(
                                "block {b} of page {p} misplaced: {blk:?} at granule {g}"
                            ));
                        }
                        if blk.free {
                            if prev_free {
                                return Err(format!("free blocks touch in page {p} at {g}"));
                            }
                            if blk.prev == NIL && blk.next == NIL {
                                return Err(format!("page {p} is one free block"));
                            }
                            if kind == PageKind::Heap {
                                nheap += 1;
                            } else {
                                nlarge += 1;
                                if blk.next == NIL {
                                    nsuffix += 1;
                                } else if blk.prev == NIL {
                                    nprefix += 1;
                                }
                            }
                        } else {
                            let x = &self.allocs[blk.owner() as usize];
                            let owns = match &x.layout {
                                Layout::Block(ob) => *ob == b,
                                Layout::Stitched(i) => {
                                    let st = &self.stitches[*i as usize];
                                    st.head == b || st.tail == b
                                }
                                Layout::None | Layout::Member(_) => false,
                            };
                            if x.state == State::Vacant || !owns {
                                return Err(format!("used block {b} of page {p} has no owner"));
                            }
                        }
                        prev_free = blk.free;
                        prev = b;
                        g += blk.len as u64;
                    }
                    let n = (g - base) / pg;
                    if (g - base) % pg != 0
                        || n == 0
                        || (kind == PageKind::Heap && n != 1)
                        || p as u64 + n > self.pages.len() as u64
                    {
                        return Err(format!(
                            "blocks of page {p} cover {} granules (pages of {pg})",
                            g - base
                        ));
                    }
                    for q in p + 1..p + n as u32 {
                        if self.pages[q as usize] != PageKind::Covered {
                            return Err(format!(
                                "page {q} inside the segment at page {p} is {:?}",
                                self.pages[q as usize]
                            ));
                        }
                        covered[q as usize] = true;
                    }
                }
                PageKind::Covered => {
                    // checked with its segment's first page, which comes before it
                    if !covered[p as usize] {
                        return Err(format!("page {p} is covered by no segment"));
                    }
                }
                PageKind::Owned | PageKind::Absent => {}
            }
        }
        if block_seen + self.vacant_blocks.len() != self.blocks.len() {
            return Err(format!(
                "{} blocks in pages and {} vacant, of {}",
                block_seen,
                self.vacant_blocks.len(),
                self.blocks.len()
            ));
        }
        let binned = |bins: &Bins,
                      links: &dyn LinkRead,
                      want_heap: Option<bool>,
                      sec: Option<usize>|
         -> std::result::Result<(), String> {
            for b in 0..NUM_BINS {
                for i in bins.iter(links, b) {
                    let blk = &self.blocks[i as usize];
                    if blk.page == NIL
                        || !blk.free
                        || bin_of(blk.len) != b
                        || blk.bin() != b
                        || sec.is_some_and(|s| blk.sec() != s)
                        || blk.sec() != Self::secondary_of(blk)
                    {
                        return Err(format!("block {i} wrongly binned: {blk:?}"));
                    }
                    let heap = self.pages[blk.page as usize] == PageKind::Heap;
                    if want_heap.is_some_and(|w| w != heap) {
                        return Err(format!("block {i} in the bins of the other page kind"));
                    }
                }
            }
            Ok(())
        };
        let (l0, l1) = (BlockLinksRef(&self.blocks), &self.sec_links);
        binned(&self.primary[HEAP], &l0, Some(true), None)?;
        binned(&self.primary[LARGE], &l0, Some(false), None)?;
        binned(&self.secondary[SUFFIX], &l1, Some(false), Some(SUFFIX))?;
        binned(&self.secondary[PREFIX], &l1, Some(false), Some(PREFIX))?;
        let evac = if self.evacuating == NIL { 0 } else { 1 };
        if self.primary[HEAP].len() != nheap && evac == 0
            || self.primary[LARGE].len() != nlarge
            || self.secondary[SUFFIX].len() != nsuffix
            || self.secondary[PREFIX].len() != nprefix
        {
            return Err(format!(
                "bins hold {}/{}/{}/{} free blocks, pages {nheap}/{nlarge}/{nsuffix}/{nprefix}",
                self.primary[HEAP].len(),
                self.primary[LARGE].len(),
                self.secondary[SUFFIX].len(),
                self.secondary[PREFIX].len()
            ));
        }
        if owned * ps != self.counters.reserved_bytes {
            return Err(format!(
                "{owned} pages held but reserved_bytes is {}",
                self.counters.reserved_bytes
            ));
        }
        let (mut live, mut used, mut freeing, mut mapped) = (0u64, 0u64, 0u64, 0u64);
        let mut n = 0usize;
        // batch members not yet in the pointer index: the valid entries of batch records that
        // the index does not hold
        let mut pending: FxHashMap<u64, u32> = FxHashMap::default();
        let mut uncut: rustc_hash::FxHashSet<u32> = Default::default();
        if let Some(m) = &self.by_ptr {
            for rec in &self.batches {
                if let Record::Uncut(_) = rec.shape {
                    uncut.extend(rec.members.iter().map(|e| e.1));
                }
                for &(p, a) in &rec.members {
                    if !self.batch_entry_valid((p, a)) || m.get(p).is_some() {
                        return Err(format!(
                            "batch record entry {p:#x} (slot {a}) is stale or indexed"
                        ));
                    }
                    if pending.insert(p, a).is_some() {
                        return Err(format!("{p:#x} is in two batch records"));
                    }
                }
                self.validate_record_shape(rec)?;
            }
        } else if !self.batches.is_empty() {
            return Err("batch records without a pointer index".into());
        }
        // groups (arena batches): units not held by an unfreed member count as used
        let mut group_left: FxHashMap<u32, (u64, u32)> = FxHashMap::default();
        for (a, x) in self.allocs.iter().enumerate() {
            if x.state == State::Group {
                group_left.insert(a as u32, (x.units(), x.members));
            }
        }
        let mut cached_slots = 0;
        for (a, x) in self.allocs.iter().enumerate() {
            if x.state == State::Cached {
                cached_slots += 1;
                if !matches!(x.layout, Layout::Block(b) if self.blocks[b as usize].len as u64 == x.units())
                {
                    return Err(format!(
                        "cached allocation {a} does not hold one block of its size"
                    ));
                }
                continue;
            }
            if matches!(x.state, State::Vacant | State::Group) {
                continue;
            }
            n += 1;
            if let Layout::Member(g) = x.layout {
                let grp = &self.allocs[g as usize];
                let Some(left) = group_left.get_mut(&g) else {
                    return Err(format!("member {a} of {g}, which is not a group"));
                };
                if x.ptr < grp.ptr || x.ptr + x.units() * GRANULE > grp.ptr + grp.units() * GRANULE
                {
                    return Err(format!("member {a} lies outside its group {g}"));
                }
                if left.0 < x.units() || left.1 == 0 {
                    return Err(format!("group {g} has more members than it counts"));
                }
                left.0 -= x.units();
                left.1 -= 1;
            }
            if self.by_ptr.as_ref().is_some_and(|m| {
                m.get(x.ptr) != Some(a as u32) && pending.get(&x.ptr) != Some(&(a as u32))
            }) {
                return Err(format!(
                    "allocation {a} at {:#x} not found by pointer",
                    x.ptr
                ));
            }
            used += x.units() * GRANULE;
            match x.state {
                State::Live => live += x.size,
                State::Freeing => freeing += x.units() * GRANULE,
                State::Vacant | State::Group | State::Cached => {}
            }
            let held = match x.layout {
                Layout::Member(_) => x.units(),
                // a member of an uncut batch record: its share of the block, checked with
                // the record's shape
                Layout::Block(_) if uncut.contains(&(a as u32)) => x.units(),
                l => self
                    .held_granules(l, &mut mapped)
                    .ok_or_else(|| format!("allocation {a} has no memory"))?,
            };
            if held != x.units() {
                return Err(format!(
                    "allocation {a} holds {held} granules of {}",
                    x.units()
                ));
            }
        }
        for (a, x) in self.allocs.iter().enumerate() {
            if x.state != State::Group {
                continue;
            }
            let (dead, members) = group_left[&(a as u32)];
            if members != 0 {
                return Err(format!(
                    "group {a} counts {members} members it does not have"
                ));
            }
            used += dead * GRANULE;
            let held = match x.layout {
                Layout::Member(_) => None,
                l => self.held_granules(l, &mut mapped),
            }
            .ok_or_else(|| format!("group {a} has no memory"))?;
            if held != x.units() {
                return Err(format!("group {a} holds {held} granules of {}", x.units()));
            }
        }
        // the exact-size cache: every cached slot once, under its own size
        let mut in_cache = 0;
        for (units, a) in self.cache.entries() {
            in_cache += 1;
            let x = self.allocs.get(a as usize);
            if !x.is_some_and(|x| x.state == State::Cached && x.units() == units) {
                return Err(format!(
                    "cache entry {a} of {units} granules is not a cached slot of that size"
                ));
            }
        }
        if in_cache != cached_slots || in_cache != self.cache.len() {
            return Err(format!(
                "{cached_slots} cached slots, {in_cache} in the cache, which counts {}",
                self.cache.len()
            ));
        }
        if let Some(m) = &self.by_ptr {
            if n != m.len() + pending.len() || m.iter().count() != m.len() {
                return Err(format!(
                    "{} pointers mapped and {} pending for {n} allocations",
                    m.len(),
                    pending.len()
                ));
            }
        }
        let cached = self.window_cached_pages();
        let window_used = self.window.capacity() as u64 - self.window.free_units() - cached;
        if mapped != window_used {
            return Err(format!("{mapped} window pages owned, {window_used} used"));
        }
        let c = &self.counters;
        if (live, used, freeing) != (c.live_bytes, c.used_bytes, c.freeing_bytes) {
            return Err(format!(
                "counters live/used/freeing {}/{}/{} but allocations sum to {live}/{used}/{freeing}",
                c.live_bytes, c.used_bytes, c.freeing_bytes
            ));
        }
        Ok(())
    }
}

/// One page of a pool snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageSnapshot {
    /// Physical address of the page.
    pub addr: u64,
    /// "free", "heap", "large" or "full".
    pub kind: &'static str,
    /// Heap and large pages: (offset in the page, bytes, owning allocation's pointer or None
    /// when free). Full pages: one entry covering the page.
    pub blocks: Vec<(u64, u64, Option<u64>)>,
}

impl Pool {
    /// Every page the pool holds, in address order, with what is in it (a fragmentation
    /// picture; the replay tools turn it into PyTorch's snapshot layout).
    pub fn page_snapshot(&self) -> Vec<PageSnapshot> {
        let ps = self.cfg.page_size;
        let pg = self.pg as u64;
        let owners = self.full_owners();
        let mut out = Vec::new();
        for (p, &kind) in self.pages.iter().enumerate() {
            let addr = p as u64 * ps;
            let (kind, blocks) = match kind {
                // listed with the first page of their segment
                PageKind::Absent | PageKind::Covered => continue,
                PageKind::Owned if owners[p] == NIL => ("free", vec![(0, ps, None)]),
                PageKind::Owned => (
                    "full",
                    vec![(0, ps, Some(self.allocs[owners[p] as usize].ptr))],
                ),
                PageKind::Heap | PageKind::Large => {
                    let kind = if kind == PageKind::Heap {
                        "heap"
                    } else {
                        "large"
                    };
                    // A segment is listed page by page, its blocks cut at page boundaries.
                    let mut pages: Vec<PageSnapshot> = Vec::new();
                    for b in self.page_blocks(p as u32) {
                        let blk = &self.blocks[b as usize];
                        let start = self.start_of(blk);
                        // an uncut batch block: its members' ranges, each its own owner
                        let parts: Vec<(u64, u64, Option<u64>)> =
                            match (!blk.free).then(|| self.uncut_members(b)).flatten() {
                                Some(members) => members
                                    .iter()
                                    .map(|&(ptr, a)| (self.allocs[a as usize].units(), Some(ptr)))
                                    .scan(start, |g, (units, owner)| {
                                        *g += units;
                                        Some((*g - units, *g, owner))
                                    })
                                    .collect(),
                                None => vec![(
                                    start,
                                    start + blk.len as u64,
                                    self.holds(blk)
                                        .then(|| self.allocs[blk.owner() as usize].ptr),
                                )],
                            };
                        for (mut g, end, owner) in parts {
                            while g < end {
                                let q = g / pg;
                                let cut = end.min((q + 1) * pg);
                                if pages.last().is_none_or(|l| l.addr != q * ps) {
                                    pages.push(PageSnapshot {
                                        addr: q * ps,
                                        kind,
                                        blocks: Vec::new(),
                                    });
                                }
                                let entry = pages.last_mut().expect("just pushed");
                                let (off, len) = ((g - q * pg) * GRANULE, (cut - g) * GRANULE);
                                match entry.blocks.last_mut() {
                                    // free memory is listed as free ranges: a cached block and the
                                    // free block beside it are one range (as once merged)
                                    Some((o, l, None)) if owner.is_none() && *o + *l == off => {
                                        *l += len
                                    }
                                    _ => entry.blocks.push((off, len, owner)),
                                }
                                g = cut;
                            }
                        }
                    }
                    out.extend(pages);
                    continue;
                }
            };
            out.push(PageSnapshot { addr, kind, blocks });
        }
        out
    }
}
