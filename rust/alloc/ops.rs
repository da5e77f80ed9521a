//! The pool's public operations on single allocations: alloc, free, pins, queries, scopes,
//! trim, close and the out-of-memory report.

use std::num::NonZeroU64;

use super::*;

impl Pool {
    /// A request's size in granules; a size of 0 or above `max_size()` is refused.
    #[inline(always)]
    pub(super) fn validate_size(&self, size: u64) -> Result<u64> {
        if size.wrapping_sub(1) >= self.max_bytes {
            return Err(self.size_error(size));
        }
        Ok(size.div_ceil(GRANULE))
    }

    #[cold]
    #[inline(never)]
    pub(super) fn size_error(&self, size: u64) -> Error {
        if size == 0 {
            return invalid_size("allocation size must be at least 1 byte".into());
        }
        invalid_size(format!(
            "cannot allocate {}: larger than the pool can ever hold ({})",
            format_size(size),
            format_size(self.max_bytes)
        ))
    }

    /// Allocates `req.size` bytes. On failure nothing is allocated; the error says why.
    #[inline]
    pub fn alloc(&mut self, req: Request) -> Result<(AllocId, u64)> {
        if self.in_step() {
            return self.step_alloc_api(req);
        }
        self.alloc_plain(req)
    }

    /// `alloc` outside a step. (Apart from `alloc`, so that a request served from a plan
    /// pays none of its prologue.)
    #[inline(never)]
    fn alloc_plain(&mut self, req: Request) -> Result<(AllocId, u64)> {
        self.alloc_req(req, Ask::ALLOC)
            .map_err(|r| self.refusal_error(r, req.size))
    }

    /// `alloc` as `ask` says (inside an open step: the step's). (`alloc_as` and `alloc_req`
    /// are inlined into their callers, so that `alloc` is one call and `alloc_inner`'s
    /// result goes from registers to the caller's `Result` once.)
    #[inline(always)]
    pub(super) fn alloc_as(
        &mut self,
        req: Request,
        ask: Ask,
    ) -> std::result::Result<(AllocId, u64), Refusal> {
        if self.in_step() {
            return self.step_alloc(req, ask);
        }
        self.alloc_req(req, ask)
    }

    /// The error a refusal of a request of `size` bytes stands for, with its message (built
    /// here, off the hot path, from the pool's state, which the refusal left as it was).
    #[cold]
    #[inline(never)]
    pub(super) fn refusal_error(&self, r: Refusal, size: u64) -> Error {
        match r {
            Refusal::NoRoom => self.oom_error(size),
            Refusal::Error(e) => *e,
        }
    }

    /// `alloc` outside a step.
    #[inline(always)]
    pub(super) fn alloc_req(
        &mut self,
        req: Request,
        ask: Ask,
    ) -> std::result::Result<(AllocId, u64), Refusal> {
        self.open()?;
        let units = self.validate_size(req.size)?;
        self.note_stream(req.stream);
        self.counters.calls += 1;
        let timed = self.counters.calls % LATENCY_SAMPLE == 0;
        let t0 = timed.then(Instant::now);
        let r = self.alloc_inner(req, units, ask);
        if let Some(t0) = t0 {
            self.latency.record(t0.elapsed().as_nanos() as u64);
        }
        if !ask.batch {
            self.check();
        }
        let (id, ptr) = r?;
        Ok((AllocId::from_bits(id), ptr.get()))
    }

    /// `alloc_req`'s work: (handle bits, pointer), or why not (see `Refusal`: the pair and
    /// the refusal come back in two registers).
    pub(super) fn alloc_inner(
        &mut self,
        req: Request,
        units: u64,
        ask: Ask,
    ) -> std::result::Result<(u64, NonZeroU64), Refusal> {
        if ask.reuse {
            if let Some((id, ptr)) = self.reuse(req, units) {
                return Self::served((id.to_bits(), ptr));
            }
        }
        // The block the cache holds is this request's when it is of its size and no stream
        // events wait (which the pool would poll first); otherwise it goes back first.
        if !self.cache.is_empty() {
            if self.events.is_empty() {
                if let Some(a) = self.cache.held(units) {
                    if self.holds_in_place(a, units) {
                        return Self::served(self.take_cached(a, req, units));
                    }
                }
            }
            self.flush_cache();
        } else {
            // (a resting cache holds nothing: it wakes on a request of the size just freed)
            self.cache.note_request(units);
        }
        // Memory freed on streams whose work has finished (CUDA events) comes back before the
        // pool would grow for it, and every 64 calls otherwise. (Not between the requests of
        // a batch, which polls before its first: a refused batch undoes its page changes by
        // the block they made, which frees in between could merge away.)
        if !self.events.is_empty()
            && !ask.batch
            && (self.free_pages.free_units() == 0 || self.counters.calls % 64 == 0)
        {
            self.poll();
            self.flush_cache(); // (what the poll freed may wait in it)
        }
        let mark = self.journal.len();
        let a = self.new_slot();
        let reach = if ask.quick { Reach::Held } else { Reach::Grow };
        let placed = self.place_flushed(units, a, reach);
        let layout = match placed {
            Some(l) => l,
            None if ask.quick => {
                self.vacant_allocs.push(a);
                self.undo_to(mark);
                return Err(Refusal::NoRoom);
            }
            None => self.place_or_refuse(units, a, ask, mark)?,
        };
        let ptr = match self.address(layout) {
            Ok(p) => p,
            Err(e) => {
                // The backend refused the mapping: undo the placement, give back any page
                // taken for it, and leave the counters as they were (one failure counted).
                self.abandon(Some(layout), a, mark);
                self.counters.failures += 1;
                return Err(e.into());
            }
        };
        if ask.batch {
            self.journal.push(Change::Made { a });
        } else {
            self.journal.clear();
        }
        let x = &mut self.allocs[a as usize];
        x.ptr = ptr;
        x.layout = layout;
        Self::served(self.go_live(a, req, units))
    }

    /// `alloc_inner` when the first placement found no room (out of line: rare, and the hot
    /// path then saves fewer registers): the way to out of memory. Compacts what may move,
    /// then uses anything; a refusal gives the slot back and undoes the page changes.
    #[cold]
    #[inline(never)]
    fn place_or_refuse(
        &mut self,
        units: u64,
        a: u32,
        ask: Ask,
        mark: usize,
    ) -> std::result::Result<Layout, Refusal> {
        // (Not inside a batch: a refused batch is undone exactly, which a move into pages
        // taken for the batch would prevent.)
        if !ask.batch && self.has_movable() {
            // (the first attempt's page changes are undone first: compaction moves the blocks
            // they name)
            self.undo_to(mark);
            self.defrag_inner(Copying::Bytes);
        }
        let placed = self
            .place(units, a, Reach::Any)
            .or_else(|| self.place_last_resort(units, a, ask.batch));
        placed.ok_or_else(|| {
            self.vacant_allocs.push(a);
            self.undo_to(mark);
            self.counters.failures += 1;
            Refusal::NoRoom
        })
    }

    /// A request served at (handle bits, pointer); a pool address is never 0.
    #[inline(always)]
    fn served((id, ptr): (u64, u64)) -> std::result::Result<(u64, NonZeroU64), Refusal> {
        NonZeroU64::new(ptr).map(|p| (id, p)).ok_or(Refusal::NoRoom)
    }

    /// `alloc` when it is quick: served from the pages the pool holds, without growing it or
    /// compacting. `None` when it is not (nothing changed but the size cache's block given back,
    /// which any other request would give; call `alloc`). The bindings run
    /// this under the GIL, since releasing and taking back the GIL costs more than the call.
    #[inline]
    pub fn try_alloc_quick(&mut self, req: Request) -> Option<Result<(AllocId, u64)>> {
        let calls = self.counters.calls;
        match self.alloc_as(req, Ask::QUICK) {
            Err(Refusal::NoRoom) => {
                self.counters.calls = calls;
                None
            }
            r => Some(r.map_err(|r| self.refusal_error(r, req.size))),
        }
    }

    /// Whether a free is quick (no scrub, no pages to give back): see `try_alloc_quick`.
    pub fn frees_are_quick(&self) -> bool {
        !self.cfg.scrub && self.cfg.release_threshold.is_none()
    }

    /// Frees an allocation now.
    #[inline]
    pub fn free(&mut self, id: AllocId) -> Result<()> {
        if self.steps.watch {
            return self.step_free(id);
        }
        self.free_unwatched(id)
    }

    /// `free` in a pool no step watches, or of an allocation the step was told of.
    pub(super) fn free_unwatched(&mut self, id: AllocId) -> Result<()> {
        self.open()?;
        let a = self.resolve(id)?;
        self.check_unpinned(a)?;
        let x = &self.allocs[a as usize];
        self.counters.live_bytes -= x.size;
        self.counters.frees += 1;
        self.finish_free_unwatched(a);
        self.after_free();
        self.check();
        Ok(())
    }

    /// A view of the allocation is exported (buffer, DLPack): it may not be freed or moved
    /// until `unpin`.
    pub fn pin(&mut self, id: AllocId) -> Result<()> {
        self.open()?;
        let a = self.resolve(id)?;
        self.allocs[a as usize].pins += 1;
        Ok(())
    }

    pub fn unpin(&mut self, id: AllocId) -> Result<()> {
        let a = self.resolve(id)?;
        let x = &mut self.allocs[a as usize];
        if x.pins == 0 {
            return Err(Error::InvalidState(format!("{:#x} is not pinned", x.ptr)));
        }
        x.pins -= 1;
        Ok(())
    }

    pub fn info(&self, id: AllocId) -> Result<AllocInfo> {
        self.open()?;
        Ok(self.info_of(self.resolve(id)?))
    }

    /// Every live and freeing allocation.
    pub fn allocations(&self) -> Vec<AllocInfo> {
        (0..self.allocs.len() as u32)
            .filter(|&a| matches!(self.allocs[a as usize].state, State::Live | State::Freeing))
            .map(|a| self.info_of(a))
            .collect()
    }

    /// Writes zeros over an allocation (its rounded size).
    pub fn zero(&mut self, id: AllocId) -> Result<()> {
        self.open()?;
        let a = self.resolve(id)?;
        let x = &self.allocs[a as usize];
        self.dev.backend.zero(x.ptr, x.units() * GRANULE)
    }

    /// The live allocations made in an open scope.
    pub fn scope_allocations(&self, scope: u32) -> Result<Vec<AllocInfo>> {
        let list = self
            .scopes
            .get(&scope)
            .ok_or_else(|| Error::InvalidArgument(format!("no open scope {scope}")))?;
        Ok(list
            .iter()
            .filter(|&&(a, g)| {
                let x = &self.allocs[a as usize];
                x.generation == g && x.state == State::Live
            })
            .map(|&(a, _)| self.info_of(a))
            .collect())
    }

    pub fn open_scope(&mut self) -> Result<u32> {
        self.open()?;
        let s = self.next_scope;
        self.next_scope += 1;
        self.scopes.insert(s, Vec::new());
        Ok(s)
    }

    /// Closes a scope: frees what was allocated inside it and is still live, and says what.
    pub fn close_scope(&mut self, scope: u32) -> Result<ScopeReport> {
        let list = self
            .scopes
            .remove(&scope)
            .ok_or_else(|| Error::InvalidArgument(format!("no open scope {scope}")))?;
        let mut report = ScopeReport {
            allocs: list.len() as u64,
            ..ScopeReport::default()
        };
        if self.closed {
            return Ok(report);
        }
        for (a, g) in list {
            let x = &self.allocs[a as usize];
            if x.generation == g && x.state == State::Live && x.pins == 0 {
                report.leaked.push(self.info_of(a));
                self.counters.live_bytes -= x.size;
                self.counters.frees += 1;
                self.finish_free(a);
                report.freed += 1;
            }
        }
        self.after_free();
        self.check();
        Ok(report)
    }

    /// Gives free pages back to the device until at most `keep` bytes of them stay.
    pub fn trim(&mut self, keep: u64) -> Result<u64> {
        self.open()?;
        self.flush_cache();
        self.reclaim_all();
        let n = self.release_pages(keep);
        self.check();
        Ok(n)
    }

    /// Frees everything (pending frees included), gives all pages back and refuses every
    /// later call. Refused while any allocation has a live view. Returns how many allocations
    /// were still live.
    pub fn close(&mut self) -> Result<u64> {
        if self.closed {
            return Ok(0);
        }
        if let Some(x) = self
            .allocs
            .iter()
            .find(|x| x.state != State::Vacant && x.pins > 0)
        {
            return Err(Error::InvalidState(format!(
                "cannot close the pool: the allocation at {:#x} has {} live views",
                x.ptr, x.pins
            )));
        }
        self.step_close();
        self.cache.off();
        self.flush_cache();
        let mut live = 0;
        for a in 0..self.allocs.len() as u32 {
            let st = self.allocs[a as usize].state;
            // a group goes back with its last member
            if matches!(st, State::Live | State::Freeing) {
                if st == State::Live {
                    live += 1;
                    self.counters.live_bytes -= self.allocs[a as usize].size;
                }
                self.finish_free(a);
            }
        }
        self.streams.clear();
        self.fence_stream.clear();
        for (_, ev) in self.events.drain() {
            self.dev.backend.fence_drop(ev);
        }
        self.release_pages(0);
        self.va.release(&*self.dev.backend);
        self.closed = true;
        self.check();
        Ok(live)
    }

    pub(super) fn oom_error(&self, size: u64) -> Error {
        let s = self.stats();
        let device_free = {
            let pmm = self.dev.pmm.lock();
            let st = pmm.stats();
            st.vidmem - st.allocated_bytes
        };
        Error::OutOfMemory(format!(
            "out of memory: cannot allocate {} ({} rounded); pool: live {}, reserved {}, free {} \
             (largest free run {}, fragmentation {:.1} %, largest request it can serve {}), \
             limit {}; device: {} free",
            format_size(size),
            format_size(size.div_ceil(GRANULE) * GRANULE),
            format_size(s.live_bytes),
            format_size(s.reserved_bytes),
            format_size(s.free_bytes),
            format_size(s.largest_free_run),
            s.fragmentation * 100.0,
            format_size(s.largest_request),
            format_size(self.max_size()),
            format_size(device_free),
        ))
    }
}
