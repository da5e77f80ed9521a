//! The served path of steps (`step.rs`): `alloc` and `free` inside an open step, a request
//! served from the plan in O(1) stores (`step_serve_quick`), and the rest (the lookahead,
//! the check against late entries, the normal path).

use super::*;

impl Pool {
    /// `Pool::alloc` inside an open step: the served path (`step_serve_quick`, its own
    /// function, so that a served request pays no prologue of the others', its answer in
    /// two registers), else the rest (`step_alloc_cold`).
    #[inline(always)]
    pub(super) fn step_alloc_api(&mut self, req: Request) -> Result<(AllocId, u64)> {
        match self.step_serve_quick(req.size, req.stream, req.scope | req.movable as u32) {
            (bits, ptr) if ptr != 0 => Ok((AllocId::from_bits(bits), ptr)),
            _ => self.step_alloc_cold(req),
        }
    }

    #[cold]
    #[inline(never)]
    fn step_alloc_cold(&mut self, req: Request) -> Result<(AllocId, u64)> {
        self.step_alloc_slow(req, Ask::ALLOC)
            .map_err(|r| self.refusal_error(r, req.size))
    }

    /// `alloc_as` inside an open step (any `Ask`).
    #[inline(never)]
    pub(super) fn step_alloc(
        &mut self,
        req: Request,
        ask: Ask,
    ) -> std::result::Result<(AllocId, u64), Refusal> {
        match self.step_serve_quick(req.size, req.stream, req.scope | req.movable as u32) {
            (bits, ptr) if ptr != 0 => Ok((AllocId::from_bits(bits), ptr)),
            _ => self.step_alloc_slow(req, ask),
        }
    }

    /// The served path: the plan is in step (`StepPlan::quick`: the cursor is at the due
    /// position, nothing is late, no self-check, scrub or page release to tell), the entry
    /// at the cursor is the request's (same size and stream, planned), the request is
    /// neither movable nor scoped, and the entries the plan frees before it have been given
    /// back. Then the entry is served in its prepared slot with nothing but stores. The
    /// request comes in registers (`scoped`: its scope, or 1 if movable, else 0); returns
    /// (handle bits, pointer), pointer 0: not served, nothing changed.
    #[inline(never)]
    fn step_serve_quick(&mut self, size: u64, stream: u64, scoped: u32) -> (u64, u64) {
        const NOT: (u64, u64) = (0, 0);
        let s = &mut self.steps;
        let Some(p) = s.plan.as_mut() else {
            return NOT;
        };
        let k = p.quick;
        if k >= p.entries.len() {
            return NOT; // (NO_QUICK, or past the last entry)
        }
        debug_assert_eq!(p.due_given_back(k), p.due_all_given_back(k, &self.allocs));
        let e = &p.entries[k];
        let a = e.slot;
        if e.size != size || e.stream != stream || a == NIL || scoped != 0 || !p.due_given_back(k) {
            return NOT;
        }
        p.quick = k + 1; // (and so are the cursor and the due position: `Steps::unquick`)
        let req = Request {
            size,
            stream,
            ..Request::default()
        };
        let (id, ptr) = self.step_serve(k, a, req);
        (id.to_bits(), ptr)
    }

    /// `step_alloc` when the served path does not apply: the lookahead, the check against
    /// late entries, the normal path. The served path is then looked at again
    /// (`Steps::requick`).
    #[inline(never)]
    fn step_alloc_slow(
        &mut self,
        req: Request,
        ask: Ask,
    ) -> std::result::Result<(AllocId, u64), Refusal> {
        self.steps.unquick();
        let r = self.step_alloc_other(req, ask);
        self.steps.requick();
        r
    }

    fn step_alloc_other(
        &mut self,
        req: Request,
        ask: Ask,
    ) -> std::result::Result<(AllocId, u64), Refusal> {
        if self.steps.plan.is_none() {
            let r = self.alloc_req(req, ask)?;
            if !self.steps.partial {
                self.step_record(r.0, req);
            }
            return Ok(r);
        }
        let saved = (self.steps.cursor, self.steps.misses);
        let planned = self.step_match(req);
        if let Some(k) = planned {
            if !req.movable && self.step_safe(k, req.stream) {
                let a = self.steps.plan.as_ref().expect("serving").entries[k].slot;
                return Ok(self.step_serve_full(k, a, req));
            }
        }
        if planned.is_some() || self.steps.cursor == saved.0 {
            // a planned entry that is not safe, or a request the plan does not have
            self.steps.misses += 1;
        }
        let mut r = self.alloc_req(req, ask);
        if r.as_ref().is_err_and(Refusal::is_out_of_memory)
            && !ask.quick
            && self.steps.plan.is_some()
        {
            // The plan must never make a request fail that the pool without it would serve:
            // it is dropped (its arena goes back unless served blocks still hold it) and the
            // request tried again; the next step is recorded for a new plan.
            self.step_rebuild();
            r = self.alloc_req(req, ask);
        }
        if r.is_err() {
            // (refused or not quick: it did not happen, and the caller may ask again)
            (self.steps.cursor, self.steps.misses) = saved;
        }
        r
    }

    /// `free(id)` while a step watches: a served entry goes back to the plan here; anything
    /// else is freed by the normal path, a recorded request's end noted first.
    #[inline(never)]
    pub(super) fn step_free(&mut self, id: AllocId) -> Result<()> {
        let a = id.index;
        let s = &mut self.steps;
        if let (true, Some(p)) = ((a as usize) < self.allocs.len(), &mut s.plan) {
            let x = &mut self.allocs[a as usize];
            if x.generation == id.generation
                && x.state == State::Live
                && x.pins == 0
                && matches!(x.layout, Layout::Member(g) if g == p.quick_group)
            {
                // served, with nothing else to tell: the slot goes back to the plan
                p.release(x.members as usize);
                x.generation = x.generation.wrapping_add(1);
                x.state = State::Vacant;
                self.counters.live_bytes -= x.size;
                self.counters.frees += 1;
                return Ok(());
            }
        }
        self.step_free_full(id)
    }

    /// `step_free` of anything but a served entry with nothing else to tell.
    #[inline(never)]
    fn step_free_full(&mut self, id: AllocId) -> Result<()> {
        let a = id.index;
        if let Some(x) = self.allocs.get(a as usize) {
            if x.generation == id.generation && x.state == State::Live && x.pins == 0 {
                let size = x.size;
                if self.step_released(a) {
                    // (a served allocation is not in the pointer index)
                    self.counters.live_bytes -= size;
                    self.counters.frees += 1;
                    self.after_free();
                    self.check();
                    return Ok(());
                }
                // (not served: the end of a recorded request is noted)
            }
        }
        // the normal path, which says why a handle is refused
        self.free_unwatched(id)
    }
}
