//! Batches and arenas: all-or-nothing batches, batch records, and freeing a batch whole.

use super::*;

impl Pool {
    /// The sizes of a batch, checked (the first bad one's error, as `validate_size` gives it),
    /// rounded and summed in granules (saturating: a sum too large is refused later).
    pub(super) fn batch_units(&self, sizes: &[u64]) -> Result<u64> {
        let mut total = 0u64;
        for &size in sizes {
            total = total.saturating_add(self.validate_size(size)?);
        }
        Ok(total)
    }

    /// Allocates every size in `sizes` (all or none) and appends the pointers to `out`.
    pub fn alloc_batch(&mut self, sizes: &[u64], stream: u64, out: &mut Vec<u64>) -> Result<()> {
        self.open()?;
        let total = self.batch_units(sizes)?;
        self.ptr_index(); // the caller will free by pointer
                          // (a refused batch is undone exactly: nothing cached may merge or grow in between)
        self.flush_cache();
        if self.batch_in_one_block(sizes, total, stream, out) {
            self.check();
            return Ok(());
        }
        if !self.events.is_empty() {
            self.poll();
        }
        let start = out.len();
        // (a refused batch undoes its requests and their page changes, newest first, so each
        // merges back as it was split, and its counters: `journal.rs`)
        let mark = self.journal.len();
        self.journal.push(Change::Begin {
            counters: Box::new(self.counters.clone()),
        });
        let mut result = Ok(());
        for &size in sizes {
            let req = Request {
                size,
                stream,
                ..Request::default()
            };
            // (never a pending free's memory: undoing the batch could not give it back as
            // pending)
            match self.alloc_req(req, Ask::MEMBER) {
                Ok((_, ptr)) => out.push(ptr),
                Err(r) => {
                    result = Err(self.refusal_error(r, size));
                    break;
                }
            }
        }
        if result.is_err() {
            self.undo_to(mark);
            out.truncate(start);
        }
        self.journal.clear();
        self.check();
        result
    }

    /// `alloc_batch` with one placement: when the whole batch lands in one block (a free
    /// block that holds it, a heap page, a segment extended or opened for it), the sizes lie
    /// back to back in it, each an allocation freed and reused on its own (the block is cut
    /// into one per size when a member is first named alone: `cut_uncut`). False,
    /// with nothing changed, when it would not (it would be stitched, or the pool would have
    /// to compact or fail): the batch is then placed size by size.
    pub(super) fn batch_in_one_block(
        &mut self,
        sizes: &[u64],
        total: u64,
        stream: u64,
        out: &mut Vec<u64>,
    ) -> bool {
        if sizes.len() < 2 || total > MAX_BLOCK {
            return false;
        }
        self.note_stream(stream);
        if !self.events.is_empty() {
            self.poll();
        }
        let mark = self.journal.len();
        let a0 = self.new_slot();
        // Not by growing while the pool holds enough free memory for the batch: the sizes
        // one by one may fit in what it holds, and a pool grows only when nothing fits.
        let c = &self.counters;
        let held_free = c.reserved_bytes - c.used_bytes;
        let reach = if held_free >= total * GRANULE {
            Reach::Held
        } else {
            Reach::Grow
        };
        let placed = self.place_batch(total, a0, reach);
        let b = match placed {
            Some(Layout::Block(b)) => b,
            placed => {
                self.abandon(placed, a0, mark);
                return false;
            }
        };
        self.journal.truncate(mark);
        // The members lie back to back in block `b`, which stays whole (its owner is the
        // first member) until the record goes into the pointer index (`cut_uncut`).
        let blk = &self.blocks[b as usize];
        let mut ptr = self.direct_addr(blk.page, blk.off);
        let mut live = 0;
        out.reserve(sizes.len());
        self.open_batch_record(sizes.len(), Record::Uncut(b));
        for (i, &size) in sizes.iter().enumerate() {
            let a = if i == 0 { a0 } else { self.new_slot() };
            self.batch_member(a, size, ptr, stream, Layout::Block(b));
            live += size;
            out.push(ptr);
            ptr += size.div_ceil(GRANULE) * GRANULE;
        }
        self.count_batch(sizes.len(), live, total * GRANULE);
        true
    }

    /// Slot `a` becomes the live allocation of a batch at `ptr` (indexed by pointer).
    #[inline]
    pub(super) fn batch_member(
        &mut self,
        a: u32,
        size: u64,
        ptr: u64,
        stream: u64,
        layout: Layout,
    ) {
        let x = &mut self.allocs[a as usize];
        x.make_live(size, stream, false, 0);
        x.ptr = ptr;
        x.layout = layout;
        match self.batches.last_mut() {
            Some(rec) => rec.members.push((ptr, a)),
            None => unreachable!("a batch record is open"),
        }
    }

    /// Opens the record of the members of a batch being made (see `batches`). At most
    /// `BATCH_RECORDS` are kept (older ones go into the index), so a `free_batch` looks at a
    /// bounded number of them.
    pub(super) fn open_batch_record(&mut self, n: usize, shape: Record) {
        if self.batches.len() >= BATCH_RECORDS {
            self.ptr_lookup();
        }
        self.batches.push(BatchRecord {
            shape,
            members: Vec::with_capacity(n),
        });
    }

    /// Cuts block `b`, which holds the members of an uncut batch record back to back (owned
    /// by the first), into one block per member, each owned by its member: what an
    /// allocation made alone would have.
    pub(super) fn cut_uncut(&mut self, b: u32, members: &[(u64, u32)]) {
        let whole = self.blocks[b as usize];
        let (mut g, mut prev) = (self.start_of(&whole), whole.prev);
        for (i, &(_, a)) in members.iter().enumerate() {
            let units = self.allocs[a as usize].units();
            let (page, off) = self.locate(g);
            let piece = Block {
                page,
                off,
                len: units as u32,
                prev,
                next: NIL,
                free: false,
                heap: whole.heap,
                binsec: 0,
                links: Link::owned_by(a),
            };
            let id = if i == 0 {
                self.blocks[b as usize] = piece;
                b
            } else {
                let id = self.new_block(piece);
                self.blocks[prev as usize].next = id;
                self.allocs[a as usize].layout = Layout::Block(id);
                id
            };
            prev = id;
            g += units;
        }
        debug_assert_eq!(g, self.start_of(&whole) + whole.len as u64);
        self.blocks[prev as usize].next = whole.next;
        self.link_to(whole.next, prev);
    }

    /// When `ptrs` are exactly the members of a pending batch record, in its order, all live
    /// and unpinned: their slots become vacant (their live bytes and frees counted), the
    /// record is consumed, and what it said of how they lie comes back with their rounded
    /// sizes, summed, in granules. Each member is checked and vacated in one pass (one read of
    /// its slot's line, not two); at the first that does not match, the slots vacated so far
    /// are restored and `None` comes back, nothing changed.
    pub(super) fn vacate_record(&mut self, ptrs: &[u64]) -> Option<(Record, u64)> {
        let i = self.batches.iter().rposition(|r| {
            r.members.len() == ptrs.len() && r.members.first().map(|e| e.0) == ptrs.first().copied()
        })?;
        let rec = &self.batches[i];
        let layout = match rec.shape {
            Record::Uncut(b) => Layout::Block(b),
            Record::Group(g) => Layout::Member(g),
        };
        let (mut live, mut units, mut done) = (0, 0, 0);
        for (&(p, a), &q) in rec.members.iter().zip(ptrs) {
            let x = &mut self.allocs[a as usize];
            if !(p == q && x.ptr == p && x.state == State::Live && x.pins == 0) {
                break;
            }
            debug_assert_eq!(x.layout, layout);
            live += x.size;
            units += x.units();
            x.generation = x.generation.wrapping_add(1);
            x.state = State::Vacant;
            x.layout = Layout::None;
            self.vacant_allocs.push(a);
            done += 1;
        }
        if done < ptrs.len() {
            for &(_, a) in &rec.members[..done] {
                let x = &mut self.allocs[a as usize];
                x.generation = x.generation.wrapping_sub(1);
                x.state = State::Live;
                x.layout = layout;
            }
            self.vacant_allocs.truncate(self.vacant_allocs.len() - done);
            return None;
        }
        let shape = self.batches.swap_remove(i).shape;
        self.counters.live_bytes -= live;
        self.counters.frees += ptrs.len() as u64;
        Some((shape, units))
    }

    /// `n` allocations of a batch made at once: `live` bytes asked, `used` bytes held.
    pub(super) fn count_batch(&mut self, n: usize, live: u64, used: u64) {
        let c = &mut self.counters;
        c.allocs += n as u64;
        c.live_bytes += live;
        c.used_bytes += used;
        c.peak_live = c.peak_live.max(c.live_bytes);
        c.peak_used = c.peak_used.max(c.used_bytes);
    }

    /// Allocates every size in `sizes` as one arena (all or none): one placement holds them
    /// all, back to back at the pool's 256-byte alignment, and goes back to the pool when the
    /// last of them is freed. Each is an allocation of its own (freed by pointer, alone or in
    /// `free_batch`, listed, tracked), but memory freed early is not reusable until the whole
    /// arena is: for buffers that live and die together (one step's activations, a batch of
    /// staging buffers). It is always one placement (stitched if need be), where
    /// `alloc_batch` places a batch that fits no free range size by size; a batch that fits
    /// one costs about the same either way (benches/RESULTS.md).
    pub fn alloc_arena(&mut self, sizes: &[u64], stream: u64, out: &mut Vec<u64>) -> Result<()> {
        self.open()?;
        let total = self.batch_units(sizes)?;
        if total == 0 {
            return Ok(());
        }
        let bytes = total.saturating_mul(GRANULE);
        if bytes > self.max_size() {
            return Err(invalid_size(format!(
                "cannot allocate an arena of {}: larger than the pool can ever hold ({})",
                format_size(bytes),
                format_size(self.max_size())
            )));
        }
        self.ptr_index(); // the caller will free by pointer
        let (peak_live, peak_used) = (self.counters.peak_live, self.counters.peak_used);
        // (never a pending free's memory: that may be a member of another arena)
        let req = Request {
            size: bytes,
            stream,
            ..Request::default()
        };
        let (id, base) = self
            .alloc_req(req, Ask::FRESH)
            .map_err(|r| self.refusal_error(r, bytes))?;
        // The group holds the memory but is not an allocation a caller sees: undo its
        // counting as one; its members are counted instead.
        let g = id.index;
        let c = &mut self.counters;
        c.allocs -= 1;
        c.live_bytes -= bytes;
        c.used_bytes -= bytes;
        c.peak_live = peak_live;
        c.peak_used = peak_used;
        if let Some(m) = &mut self.by_ptr {
            m.remove(base);
        }
        let x = &mut self.allocs[g as usize];
        x.state = State::Group;
        x.members = sizes.len() as u32;
        out.reserve(sizes.len());
        self.open_batch_record(sizes.len(), Record::Group(g));
        let mut ptr = base;
        let mut live = 0;
        for &size in sizes {
            let a = self.new_slot();
            self.batch_member(a, size, ptr, stream, Layout::Member(g));
            live += size;
            out.push(ptr);
            ptr += size.div_ceil(GRANULE) * GRANULE;
        }
        // counted once for all: the members' sizes, and their rounded sizes (the group's)
        self.count_batch(sizes.len(), live, bytes);
        self.check();
        Ok(())
    }

    /// Frees every pointer in `ptrs` (all or none: each must be a live, unpinned allocation,
    /// named once).
    pub fn free_batch(&mut self, ptrs: &[u64]) -> Result<()> {
        self.open()?;
        // (scrubbing zeroes member by member: the general path below)
        if !self.cfg.scrub {
            if let Some((shape, units)) = self.vacate_record(ptrs) {
                match shape {
                    Record::Uncut(b) => self.release_uncut(b, units),
                    Record::Group(g) => self.release_group(g),
                }
                return Ok(());
            }
        }
        self.ptr_lookup();
        // Each pointer leaves the pointer index as it is checked (one probe serves the check
        // and the removal); a pointer named twice is then missing from it. On an error every
        // pointer taken out goes back, and nothing is freed.
        // (Served allocations are not in the index: found by the plan, each listed in
        // `served` to see it named twice; they go back to the plan in `release_batch`.)
        let mut taken: Vec<(u64, u32)> = Vec::with_capacity(ptrs.len());
        let mut served: FxHashSet<u32> = FxHashSet::default();
        let mut result = Ok(());
        for &p in ptrs {
            let index = self.by_ptr.as_mut().expect("the pointer index is built");
            let a = match index.remove(p) {
                Some(a) => a,
                None => match self.step_slot_at(p) {
                    Some(a) if served.insert(a) => a,
                    _ => {
                        result = Err(if taken.iter().any(|&(q, _)| q == p) {
                            Error::InvalidFree(format!("{p:#x} appears twice in one free"))
                        } else {
                            // not in the index: say why (interior, foreign, already freed)
                            self.slot_of_indexed_ptr(p)
                                .expect_err("a pointer missing from the index is refused")
                        });
                        break;
                    }
                },
            };
            taken.push((p, a));
            let x = &self.allocs[a as usize];
            if x.state == State::Freeing {
                result = Err(Error::InvalidFree(format!(
                    "{p:#x} was already freed on stream {}",
                    x.stream
                )));
                break;
            }
            if let Err(e) = self.check_unpinned(a) {
                result = Err(e);
                break;
            }
        }
        if result.is_err() {
            let index = self.by_ptr.as_mut().expect("the pointer index is built");
            for &(p, a) in taken.iter().filter(|(_, a)| !served.contains(a)) {
                index.insert(p, a);
            }
            return result;
        }
        self.release_batch(taken.into_iter().map(|e| e.1));
        Ok(())
    }

    /// The block of an uncut batch record whose slots `vacate_record` freed (`units`
    /// granules) goes back at once: one merge with the blocks around, instead of each
    /// member's block marked, listed and merged in turn (`release_batch`, where a batch pair
    /// spent a third of its time).
    pub(super) fn release_uncut(&mut self, b: u32, units: u64) {
        debug_assert_eq!(units, self.blocks[b as usize].len as u64);
        self.counters.used_bytes -= units * GRANULE;
        self.release_block(b, Settle::Policy);
        self.after_free();
        self.check();
    }

    /// Arena `g`, whose members' slots `vacate_record` freed, gives its memory back once (as
    /// `unplace` does when its last member goes).
    pub(super) fn release_group(&mut self, g: u32) {
        self.allocs[g as usize].members = 0;
        self.release_group_memory(g);
        self.after_free();
        self.check();
    }

    /// Arena `g`, whose members are all freed, gives its memory back; its slot is vacant.
    pub(super) fn release_group_memory(&mut self, g: u32) {
        self.release_group_memory_as(g, Settle::Policy)
    }

    /// `release_group_memory`, settled as `settle` says.
    pub(super) fn release_group_memory_as(&mut self, g: u32, settle: Settle) {
        let x = &mut self.allocs[g as usize];
        debug_assert!(x.state == State::Group && x.members == 0);
        let (units, layout) = (x.units(), std::mem::replace(&mut x.layout, Layout::None));
        x.state = State::Vacant;
        x.generation = x.generation.wrapping_add(1);
        self.unplace(layout, settle);
        self.vacant_allocs.push(g);
        self.counters.used_bytes -= units * GRANULE;
    }

    /// Frees the slots of a checked `free_batch`, merging each run of freed neighbours once.
    pub(super) fn release_batch(&mut self, slots: impl ExactSizeIterator<Item = u32>) {
        let mut pending = Vec::with_capacity(slots.len());
        for a in slots {
            self.counters.live_bytes -= self.allocs[a as usize].size;
            self.counters.frees += 1;
            self.release_slot_into(a, Some(&mut pending), Settle::Policy);
        }
        self.merge_pending(&pending);
        self.after_free();
        self.check();
    }
}
