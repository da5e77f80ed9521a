//! Allocation slots: making a slot live (fresh, reused on its stream, or from the size cache),
//! and turning it back vacant.

use super::*;

impl Pool {
    #[inline]
    pub(super) fn new_slot(&mut self) -> u32 {
        if let Some(i) = self.vacant_allocs.pop() {
            i
        } else {
            self.allocs.push(Alloc {
                generation: 0,
                state: State::Vacant,
                size: 0,
                ptr: 0,
                stream: 0,
                movable: false,
                pins: 0,
                scope: 0,
                fence: 0,
                layout: Layout::None,
                members: 0,
            });
            (self.allocs.len() - 1) as u32
        }
    }

    pub(super) fn id(&self, a: u32) -> AllocId {
        AllocId {
            index: a,
            generation: self.allocs[a as usize].generation,
        }
    }

    pub(super) fn info_of(&self, a: u32) -> AllocInfo {
        let x = &self.allocs[a as usize];
        AllocInfo {
            id: self.id(a),
            ptr: x.ptr,
            size: x.size,
            rounded: x.units() * GRANULE,
            stream: x.stream,
            freeing: x.state == State::Freeing,
            movable: x.movable,
            stitched: self.is_stitched(x.layout),
            pins: x.pins,
            scope: x.scope,
        }
    }

    /// The slot of a handle naming a live allocation.
    #[inline]
    pub(super) fn resolve(&self, id: AllocId) -> Result<u32> {
        match self.allocs.get(id.index as usize) {
            Some(x) if x.generation == id.generation && x.state == State::Live => Ok(id.index),
            Some(x) if x.generation == id.generation && x.state == State::Freeing => {
                Err(Error::InvalidFree(format!(
                    "allocation {:#x} was already freed on stream {} (fence {})",
                    x.ptr, x.stream, x.fence
                )))
            }
            Some(x) if x.generation > id.generation || x.state == State::Vacant => {
                Err(Error::InvalidFree(
                    "allocation was already freed (double free or stale handle)".into(),
                ))
            }
            _ => Err(Error::InvalidHandle(format!(
                "no allocation {:#x} in this pool",
                id.to_bits()
            ))),
        }
    }

    /// Slot `a` (its pointer and layout set) becomes the live allocation `req` asked for.
    /// Returns (handle bits, pointer). (Inlined into both callers: as a call it cost about
    /// 15 instructions an allocation.)
    #[inline(always)]
    pub(super) fn go_live(&mut self, a: u32, req: Request, units: u64) -> (u64, u64) {
        let x = &mut self.allocs[a as usize];
        x.make_live(req.size, req.stream, req.movable, req.scope);
        let ptr = x.ptr;
        if let Some(m) = &mut self.by_ptr {
            m.insert(ptr, a);
        }
        self.count_alloc(req.size, units);
        if req.scope != 0 {
            self.join_scope(a, req.scope);
        }
        debug_assert!(ptr != 0, "a pool address is never 0");
        (self.id(a).to_bits(), ptr)
    }

    /// Live slot `a` is listed in `scope` (if still open), under its current generation.
    #[cold]
    pub(super) fn join_scope(&mut self, a: u32, scope: u32) {
        let g = self.allocs[a as usize].generation;
        if let Some(v) = self.scopes.get_mut(&scope) {
            v.push((a, g));
        }
    }

    /// A request served by cached slot `a`, whose block has exactly its rounded size.
    #[inline]
    pub(super) fn take_cached(&mut self, a: u32, req: Request, units: u64) -> (u64, u64) {
        debug_assert!(self.allocs[a as usize].state == State::Cached);
        debug_assert_eq!(self.allocs[a as usize].units(), units);
        if let Layout::Block(b) = self.allocs[a as usize].layout {
            self.refile_after(b);
        }
        self.counters.cache_hits += 1;
        self.cache.hit();
        self.go_live(a, req, units)
    }

    /// Gives the cached block back, if any: merged with its free neighbours and binned, as
    /// its free would have done; its slot vacant.
    #[inline]
    pub(super) fn flush_cache(&mut self) {
        if let Some(a) = self.cache.drain() {
            self.uncache(a);
        }
    }

    /// Cached slot `a` gives its block back; the slot is vacant.
    pub(super) fn uncache(&mut self, a: u32) {
        let x = &mut self.allocs[a as usize];
        debug_assert!(x.state == State::Cached);
        let layout = std::mem::replace(&mut x.layout, Layout::None);
        x.state = State::Vacant;
        self.unplace(layout, Settle::Policy);
        self.vacant_allocs.push(a);
    }

    #[inline]
    pub(super) fn count_alloc(&mut self, size: u64, units: u64) {
        let c = &mut self.counters;
        c.allocs += 1;
        c.live_bytes += size;
        c.used_bytes += units * GRANULE;
        c.peak_live = c.peak_live.max(c.live_bytes);
        c.peak_used = c.peak_used.max(c.used_bytes);
    }

    /// Same-stream reuse: memory freed on `req.stream` and still waiting for its fence may
    /// serve a request of the same rounded size on that stream at once (work on one stream
    /// runs in order).
    #[inline]
    pub(super) fn reuse(&mut self, req: Request, units: u64) -> Option<(AllocId, u64)> {
        if self.streams.is_empty() {
            return None;
        }
        let st = self.streams.get_mut(&req.stream)?;
        let v = st.reuse.get_mut(&units)?;
        while let Some((a, g)) = v.pop() {
            let x = &mut self.allocs[a as usize];
            if x.generation == g && x.state == State::Freeing && x.stream == req.stream {
                x.generation += 1;
                // (a freeing allocation is unpinned, and on `req.stream`: checked above)
                x.make_live(req.size, req.stream, req.movable, req.scope);
                let ptr = x.ptr;
                self.counters.freeing_bytes -= units * GRANULE;
                self.counters.used_bytes -= units * GRANULE;
                self.counters.reused += 1;
                self.count_alloc(req.size, units);
                if req.scope != 0 {
                    self.join_scope(a, req.scope);
                }
                return Some((self.id(a), ptr));
            }
        }
        None
    }

    #[inline]
    pub(super) fn check_unpinned(&self, a: u32) -> Result<()> {
        let x = &self.allocs[a as usize];
        if x.pins > 0 {
            return Err(Error::InvalidState(format!(
                "allocation {:#x} has {} live views (buffers or DLPack capsules); release them \
                 before freeing it",
                x.ptr, x.pins
            )));
        }
        Ok(())
    }

    /// The memory of slot `a` (live or freeing) goes back; the slot becomes vacant.
    #[inline]
    pub(super) fn finish_free(&mut self, a: u32) {
        self.unindex(self.allocs[a as usize].ptr);
        self.release_slot(a);
    }

    /// `finish_free` of a slot the step has been told of already (`free` asks `step_free`
    /// first when a step watches).
    #[inline]
    pub(super) fn finish_free_unwatched(&mut self, a: u32) {
        self.unindex(self.allocs[a as usize].ptr);
        self.release_slot_unwatched(a, None, Settle::Policy);
    }

    /// `finish_free` of a slot whose pointer is no longer in the pointer index.
    #[inline]
    pub(super) fn release_slot(&mut self, a: u32) {
        self.release_slot_into(a, None, Settle::Policy)
    }

    /// `release_slot`, settled as `settle` says; with `pending`, a one-block layout is only
    /// marked free (not merged or binned) and its block listed there, for `merge_pending`.
    #[inline(always)]
    pub(super) fn release_slot_into(
        &mut self,
        a: u32,
        pending: Option<&mut Vec<u32>>,
        settle: Settle,
    ) {
        if self.steps.watch && self.step_released(a) {
            return; // a slot prepared by the plan: done with there
        }
        self.release_slot_unwatched(a, pending, settle)
    }

    /// Zeroes `len` bytes at `va` that were just freed (or moved off), when the pool scrubs
    /// (`cfg.scrub`): a later owner never sees an earlier one's data.
    #[inline(always)]
    pub(super) fn scrub(&self, va: u64, len: u64) {
        if self.cfg.scrub {
            let r = self.dev.backend.zero(va, len);
            debug_assert!(r.is_ok(), "scrub failed: {r:?}");
        }
    }

    /// `release_slot_into` without telling the step.
    #[inline(always)]
    fn release_slot_unwatched(&mut self, a: u32, pending: Option<&mut Vec<u32>>, settle: Settle) {
        let x = &mut self.allocs[a as usize];
        let (ptr, units, freeing) = (x.ptr, x.units(), x.state == State::Freeing);
        x.generation = x.generation.wrapping_add(1);
        if units * 2 >= self.small_units {
            self.last_freed = units; // (`grow.rs`)
        }
        self.scrub(ptr, units * GRANULE);
        // (what the cache holds is given back first, as it would have been merged before
        // this free)
        self.flush_cache();
        let layout = self.allocs[a as usize].layout;
        let member = matches!(layout, Layout::Member(_));
        if self.cache.holding()
            && pending.is_none()
            && settle == Settle::Policy
            && matches!(layout, Layout::Block(b) if self.blocks[b as usize].heap)
        {
            // kept whole for the next request, if it is of its size and would go there
            self.allocs[a as usize].state = State::Cached;
            self.cache.hold(a, units as u32);
        } else {
            self.cache.note_free(units);
            let x = &mut self.allocs[a as usize];
            let layout = std::mem::replace(&mut x.layout, Layout::None);
            x.state = State::Vacant;
            match (layout, pending) {
                (Layout::Block(b), Some(pending)) => {
                    let u = &mut self.blocks[b as usize];
                    u.free = true;
                    u.links = Link::PENDING;
                    pending.push(b);
                }
                (layout, _) => self.unplace_flushed(layout, settle),
            }
            self.vacant_allocs.push(a);
        }
        if !member {
            // a member's memory stays used until its group goes back (in `unplace`)
            self.counters.used_bytes -= units * GRANULE;
        }
        if freeing {
            self.counters.freeing_bytes -= units * GRANULE;
        }
    }
}
