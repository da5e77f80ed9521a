//! `validate`: every invariant of the pool (the module comment of `mod.rs`) checked, and every
//! counter recomputed from a walk of the structures.

use super::bins::NUM_BINS;
use super::*;

impl Pool {
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

    /// What crosses the tables: the tables kept side by side (per page, per block) are as
    /// long as each other, and every index a structure holds into a table names an entry
    /// (`Table::validate`), so the walks below read only entries that exist.
    fn validate_tables(&self) -> std::result::Result<(), String> {
        let n = self.pages.len();
        if self.page_first.len() != n || self.page_chunk.len() != n {
            return Err(format!(
                "page tables of {n}, {} and {} entries",
                self.page_first.len(),
                self.page_chunk.len()
            ));
        }
        if self.sec_links.len() != self.blocks.len() {
            return Err(format!(
                "{} blocks but {} secondary links",
                self.blocks.len(),
                self.sec_links.len()
            ));
        }
        let firsts = (0..n as u32)
            .filter(|&p| matches!(self.pages[p as usize], PageKind::Heap | PageKind::Large))
            .map(|p| self.page_first[p as usize]);
        let placed = || self.blocks.iter().filter(|b| b.page != NIL);
        let neighbours = placed()
            .flat_map(|b| [b.prev, b.next])
            .filter(|&b| b != NIL);
        self.blocks
            .validate(
                firsts
                    .chain(neighbours)
                    .chain(self.vacant_blocks.iter().copied()),
            )
            .map_err(|e| format!("blocks: {e}"))?;
        self.pages
            .validate(placed().map(|b| b.page))
            .map_err(|e| format!("pages: {e}"))?;
        let owners = placed().filter(|b| !b.free).map(|b| b.owner());
        let groups = self.allocs.iter().filter_map(|x| match x.layout {
            Layout::Member(g) => Some(g),
            _ => None,
        });
        let members = self
            .batches
            .iter()
            .flat_map(|r| r.members.iter().map(|e| e.1));
        self.allocs
            .validate(
                owners
                    .chain(groups)
                    .chain(members)
                    .chain(self.vacant_allocs.iter().copied()),
            )
            .map_err(|e| format!("allocation slots: {e}"))?;
        let blocks = self.allocs.iter().filter_map(|x| match x.layout {
            Layout::Block(b) => Some(b),
            _ => None,
        });
        self.blocks
            .validate(blocks)
            .map_err(|e| format!("allocation blocks: {e}"))
    }

    /// Checks every invariant of the module comment and recomputes every counter; returns a
    /// description of the first broken one.
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.validate_tables()?;
        self.free_pages
            .validate()
            .map_err(|e| format!("free pages: {e}"))?;
        self.va.validate().map_err(|e| format!("window: {e}"))?;
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
                    if (g - base) % pg != 0 || n == 0 || p as u64 + n > self.pages.len() as u64 {
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
            bins.validate(links, |i| self.blocks[i as usize].len)?;
            for b in 0..NUM_BINS {
                for i in bins.iter(links, b) {
                    let blk = &self.blocks[i as usize];
                    if blk.page == NIL
                        || !blk.free
                        || blk.bin() != b
                        || sec.is_some_and(|s| blk.sec() != s)
                        || blk.sec() != Self::secondary_of(blk)
                    {
                        return Err(format!("block {i} wrongly binned: {blk:?}"));
                    }
                    let heap = blk.heap; // checked against its segment's kind above
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
        if self.primary[HEAP].len() != nheap
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
            m.validate().map_err(|e| format!("pointer map: {e}"))?;
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
                group_left.insert(a as u32, (x.units(), x.members - self.step_hold(a as u32)));
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
            if self.step_prepared(a as u32) {
                // served from a plan: not in the pointer index (`validate_step`)
                n -= 1;
            } else if self.by_ptr.as_ref().is_some_and(|m| {
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
        // the size cache: the cached slot, under its own size
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
        if in_cache != cached_slots {
            return Err(format!(
                "{cached_slots} cached slots, {in_cache} in the cache, which counts {}",
                self.cache.len()
            ));
        }
        if let Some(m) = &self.by_ptr {
            if n != m.len() + pending.len() {
                return Err(format!(
                    "{} pointers mapped and {} pending for {n} allocations",
                    m.len(),
                    pending.len()
                ));
            }
        }
        let window_used = self.va.used_pages();
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
        self.validate_step()
    }
}
