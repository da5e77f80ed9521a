//! Steps served from a plan (`step_begin` / `step_end`): the first steps are recorded, the
//! next is planned offline (`step_plan.rs`), and later steps are served in request order from
//! the plan's arena in O(1). See docs/plan.md, "Serving steps from a plan".
//!
//! ## Model
//! - *Recording.* Inside a step every `alloc` is an entry of the step's sequence (size,
//!   stream, and its alloc and free as event indices); a request still live at the step's end
//!   outlives it and is not planned, but keeps its place in the sequence.
//! - *Serving.* Request `r` of a step is matched against the entry at the cursor (same size
//!   and stream), or the first match among the next `LOOKAHEAD` entries (the cursor then
//!   jumps past it: a request dropped from the sequence costs one miss, not the rest of the
//!   step). A matched planned entry is served at `arena base + offset` when it is *safe*: no
//!   entry whose address range overlaps it holds memory now. Its overlap predecessors are
//!   the entries the plan frees before it and puts over its addresses; each planned entry's
//!   due position (the first entry made after its planned free) is precomputed, and an entry
//!   still held at its due position (freed late: a departure) or when the step began is
//!   *late*, checked against each request by address; one held and not yet due is, by the
//!   plan, somewhere else. O(1) while the step follows the plan. Anything else takes
//!   the pool's normal path: a request that matches nothing (another size, stream or order),
//!   an entry that is not safe, a movable request.
//! - *Dropping.* A plan whose two last served steps hit under half of their requests is
//!   dropped and one step is recorded again for a new plan (`plan_rebuilds`); so is a plan
//!   held when the normal path runs out of memory (the request is then tried again).
//!
//! ## Invariants (checked by `validate_step`)
//! - Served entries are slots of the arena's group (`Layout::Member`), live or freeing; an
//!   entry is `held` iff exactly one such slot names it (`Alloc::members`), at its offset, and no
//!   two held entries overlap in address: the plan never hands out memory twice.
//! - The arena's group counts one member more than it has (the plan's hold), so it stays
//!   while the plan does; dropping the plan takes the hold away.
//! - A prepared slot's pointer is never in the pool's pointer index: a lookup by pointer
//!   finds a served allocation by the plan's `slot_at` (`step_slot_at`), so serving and
//!   freeing one never touch the index. Dropping the plan puts those still held in it.

use super::step_plan::{overlaps, StepPlan, NO_QUICK};
use super::*;

/// How many entries past the cursor a request may match (re-synchronising after requests
/// were dropped from, or inserted into, the sequence).
pub(super) const LOOKAHEAD: usize = 8;
/// Steps recorded before the first plan: the first step of a training loop often makes its
/// long-lived state (optimizer moments, caches), the second is the steady state.
pub const DEFAULT_RECORD_STEPS: u32 = 2;
/// A plan is dropped when fewer than 1/`DROP_DIV` of the matched or missed requests of its
/// two last served steps were hits.
const DROP_DIV: u64 = 2;

/// One request of a recorded step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rec {
    pub(super) size: u64,
    pub(super) stream: u64,
    pub(super) movable: bool,
    pub(super) start: u64,
    /// `u64::MAX`: still live at the step's end.
    pub(super) end: u64,
}

/// The step state of a pool.
#[derive(Clone, Debug, Default)]
pub(super) struct Steps {
    /// A step is recording, or a plan is held: `release_slot_into` tells `step_released`.
    pub(super) watch: bool,
    pub(super) open: bool,
    /// The plan was dropped inside the open step: the rest of it is not recorded (a part of
    /// a step would make a plan of a part).
    pub(super) partial: bool,
    record_steps: Option<u32>,
    /// Steps still to record before the next plan (0: the next step end makes one).
    recorded: u32,
    pub(super) need: u32,
    rec: Vec<Rec>,
    /// Slot -> (generation, entry) of the requests recorded in the open step.
    rec_slot: FxHashMap<u32, (u32, u32)>,
    clock: u64,
    pub(super) plan: Option<StepPlan>,
    pub(super) cursor: usize,
    /// `hits` and `misses` when the open step began.
    step_start: (u64, u64),
    /// Set when the open step began: the pool checks itself, scrubs or gives pages back as
    /// they free up, so a served request takes `step_serve_full` and `step_free_full`.
    pub(super) extras: bool,
    last: Option<(u64, u64)>,
    pub(super) hits: u64,
    pub(super) misses: u64,
    pub(super) rebuilds: u64,
    pub(super) served_steps: u64,
}

/// What the step counters say (in `PoolStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// Requests served from a plan.
    pub hits: u64,
    /// Requests of served steps that took the normal path (departures, slots not yet safe).
    pub misses: u64,
    /// Plans dropped for missing.
    pub rebuilds: u64,
    /// The arena of the plan held now (0: none).
    pub arena_bytes: u64,
    /// The planner's lower bound for the arena: the peak of the planned entries' live bytes.
    pub bound: u64,
    /// Requests in the plan's sequence, planned or not.
    pub entries: u64,
    /// Steps served from a plan so far.
    pub served_steps: u64,
}

impl Steps {
    /// Whether the next request may take the served path (`step_serve_quick`), and at which
    /// entry: inside a step, with nothing to tell but stores (`extras`), the cursor at the
    /// due position and nothing late. Looked at again wherever the cursor, the due position
    /// or the late list change off the served path (`step_begin`, `step_alloc_slow`,
    /// `step_end`); the served path keeps it itself.
    pub(super) fn requick(&mut self) {
        let (open, extras, k) = (self.open, self.extras, self.cursor);
        if let Some(p) = &mut self.plan {
            p.quick = if open && !extras && p.due_pos == k && p.late.is_empty() {
                k
            } else {
                NO_QUICK
            };
        }
    }

    /// The served path stops: the cursor and the due position, which it keeps in
    /// `StepPlan::quick` alone, are written back.
    pub(super) fn unquick(&mut self) {
        if let Some(p) = &mut self.plan {
            if p.quick != NO_QUICK {
                (self.cursor, p.due_pos) = (p.quick, p.quick);
                p.quick = NO_QUICK;
            }
        }
    }
}

impl Pool {
    /// Sets how many steps are recorded before the first plan (default 2; at least 1).
    pub fn set_step_recording(&mut self, steps: u32) -> Result<()> {
        if steps == 0 {
            return Err(Error::InvalidArgument(
                "at least one step must be recorded before a plan".into(),
            ));
        }
        if self.steps.open || self.steps.plan.is_some() || self.steps.recorded > 0 {
            return Err(Error::InvalidState(
                "the number of recorded steps is set before the first step".into(),
            ));
        }
        self.steps.record_steps = Some(steps);
        Ok(())
    }

    /// Opens a step: requests until `step_end` are recorded, or served from the plan.
    pub fn step_begin(&mut self) -> Result<()> {
        self.open()?;
        if self.steps.open {
            return Err(Error::InvalidState("a step is already open".into()));
        }
        if self.steps.plan.is_some() {
            // frees whose fences completed give their entries back before the step (served
            // requests never reach the polls of the normal path)
            self.poll();
        }
        let s = &mut self.steps;
        if s.need == 0 {
            s.need = s.record_steps.unwrap_or(DEFAULT_RECORD_STEPS);
        }
        s.open = true;
        s.cursor = 0;
        s.step_start = (s.hits, s.misses);
        let c = &self.cfg;
        s.extras = c.check || c.scrub || c.release_threshold.is_some();
        match &mut s.plan {
            Some(p) => p.begin_step(s.extras, &self.allocs),
            None => {
                s.rec.clear();
                s.rec_slot.clear();
                s.clock = 0;
            }
        }
        s.watch = true;
        s.requick();
        Ok(())
    }

    /// Closes the step: a recording step may make the plan; a served step may drop it.
    pub fn step_end(&mut self) -> Result<()> {
        self.open()?;
        if !self.steps.open {
            return Err(Error::InvalidState("no step is open".into()));
        }
        self.steps.open = false;
        self.steps.requick();
        if self.steps.plan.is_some() {
            let s = &mut self.steps;
            s.served_steps += 1;
            let now = (s.hits - s.step_start.0, s.misses - s.step_start.1);
            if let Some((h0, m0)) = s.last.replace(now) {
                let (h, n) = (h0 + now.0, h0 + m0 + now.0 + now.1);
                if n > 0 && h * DROP_DIV < n {
                    self.step_rebuild();
                }
            }
        } else if std::mem::take(&mut self.steps.partial) {
            // (the plan was dropped inside this step: the next one is recorded)
        } else {
            let s = &mut self.steps;
            s.rec_slot.clear();
            s.recorded += 1;
            if s.recorded >= s.need {
                s.recorded = 0;
                let rec = std::mem::take(&mut s.rec);
                self.step_make_plan(&rec);
            }
        }
        self.steps.watch = self.steps.plan.is_some();
        self.check();
        Ok(())
    }

    /// The step counters.
    pub fn step_counts(&self) -> StepCounts {
        let s = &self.steps;
        StepCounts {
            hits: s.hits,
            misses: s.misses,
            rebuilds: s.rebuilds,
            arena_bytes: s.plan.as_ref().map_or(0, |p| p.bytes),
            bound: s.plan.as_ref().map_or(0, |p| p.bound),
            entries: s.plan.as_ref().map_or(0, |p| p.entries.len() as u64),
            served_steps: s.served_steps,
        }
    }

    /// Whether `alloc` goes through the step (an open step).
    #[inline(always)]
    pub(super) fn in_step(&self) -> bool {
        self.steps.open
    }

    /// Drops the plan for a new one: the next step is recorded.
    pub(super) fn step_rebuild(&mut self) {
        let s = &mut self.steps;
        s.rebuilds += 1;
        s.need = 1;
        s.recorded = 0;
        s.partial = s.open;
        s.rec.clear();
        s.rec_slot.clear();
        self.step_drop_plan();
    }

    /// The recorded request `id` made.
    pub(super) fn step_record(&mut self, id: AllocId, req: Request) {
        let s = &mut self.steps;
        let i = s.rec.len() as u32;
        if let Some((_, j)) = s.rec_slot.insert(id.index, (id.generation, i)) {
            // the slot was a freeing allocation reused on its stream: that one ended here
            let r = &mut s.rec[j as usize];
            if r.end == u64::MAX {
                r.end = s.clock;
                s.clock += 1;
            }
        }
        s.rec.push(Rec {
            size: req.size,
            stream: req.stream,
            movable: req.movable,
            start: s.clock,
            end: u64::MAX,
        });
        s.clock += 1;
    }

    /// The plan entry request `req` matches: `Some(k)` for a planned entry (the cursor is
    /// past it); `None` for no match, or a match with an unplanned entry (the cursor moves
    /// past that one).
    #[inline]
    pub(super) fn step_match(&mut self, req: Request) -> Option<usize> {
        let s = &mut self.steps;
        let p = s.plan.as_ref()?;
        let end = (s.cursor + LOOKAHEAD).min(p.entries.len());
        let mut k = s.cursor;
        while k < end {
            let e = &p.entries[k];
            if e.size == req.size && e.stream == req.stream {
                s.cursor = k + 1;
                return e.planned().then_some(k);
            }
            k += 1;
        }
        None
    }

    /// Whether planned entry `k` may be served now to a request on `stream`: no late entry
    /// overlaps it, but entries freed on `stream` that it covers whole, which it takes over
    /// (as the normal pool lets a block freed on a stream serve that stream's next request
    /// at once: its work runs in order). An entry served in this step and not yet due has
    /// a lifetime that overlaps `k`'s in the plan, so the plan put it elsewhere. O(late),
    /// late entries leaving the list as they go back.
    pub(super) fn step_safe(&mut self, k: usize, stream: u64) -> bool {
        let mut taken: SmallVec<[u32; 4]> = SmallVec::new();
        {
            let p = self.steps.plan.as_mut().expect("serving");
            let allocs = &self.allocs;
            p.advance_due(k, allocs);
            let mut late = std::mem::take(&mut p.late);
            late.retain(|&c| p.is_held(c as usize, allocs));
            p.late = late;
            let r = p.entries[k].range();
            for &c in &p.late {
                let e = &p.entries[c as usize];
                let cr = e.range();
                if !overlaps(cr, r) {
                    continue;
                }
                let x = &self.allocs[e.slot as usize];
                if x.state == State::Freeing && x.stream == stream && r.0 <= cr.0 && cr.1 <= r.1 {
                    taken.push(c);
                } else {
                    return false;
                }
            }
        }
        for c in taken {
            self.step_take_over(c as usize);
        }
        true
    }

    /// Held entry `c`, freed on a stream, is taken over by a request of that stream: its
    /// slot goes back at once (its pending free is then stale, as a reused one's).
    fn step_take_over(&mut self, c: usize) {
        let a = self.steps.plan.as_ref().expect("serving").entries[c].slot;
        let x = &mut self.allocs[a as usize];
        debug_assert!(x.state == State::Freeing);
        x.generation = x.generation.wrapping_add(1);
        x.state = State::Vacant;
        self.counters.freeing_bytes -= x.units() * GRANULE;
        self.counters.reused += 1;
        self.steps.plan.as_mut().expect("serving").release(c);
    }

    /// Serves planned entry `k` (safe) to `req` in its prepared slot `a`: with no scope or
    /// self-check to tell (see `step_serve_full`), nothing but stores. (A served allocation
    /// is never in the pointer index: a lookup by pointer finds it by the plan's
    /// `slot_at`.)
    #[inline(always)]
    pub(super) fn step_serve(&mut self, k: usize, a: u32, req: Request) -> (AllocId, u64) {
        let s = &mut self.steps;
        s.plan.as_mut().expect("serving").hold(k);
        s.hits += 1;
        let x = &mut self.allocs[a as usize];
        x.make_live(req.size, req.stream, false, req.scope);
        x.members = k as u32; // (the entry a prepared slot serves: `Alloc::members`)
        let (ptr, generation) = (x.ptr, x.generation);
        // (no `note_stream`: the recorded request of this entry was on `req.stream`)
        let c = &mut self.counters;
        c.calls += 1;
        c.allocs += 1;
        c.live_bytes += req.size;
        c.peak_live = c.peak_live.max(c.live_bytes);
        (
            AllocId {
                index: a,
                generation,
            },
            ptr,
        )
    }

    /// `step_serve`, then the scope and the self-check told.
    #[inline(never)]
    pub(super) fn step_serve_full(&mut self, k: usize, a: u32, req: Request) -> (AllocId, u64) {
        let (id, ptr) = self.step_serve(k, a, req);
        if req.scope != 0 {
            self.join_scope(a, req.scope);
        }
        self.check();
        (id, ptr)
    }

    /// Slot `a` (live or freeing, its generation not yet bumped) gives its memory back: the
    /// end of a recorded request, or a plan entry no longer held. True when it was a
    /// prepared slot of the plan, which is then done with (vacant, its pointer and layout
    /// kept for the next entry at its offset; its memory stays the arena's).
    #[inline(always)]
    pub(super) fn step_released(&mut self, a: u32) -> bool {
        let s = &mut self.steps;
        let x = &mut self.allocs[a as usize];
        if let Some(p) = &mut s.plan {
            if x.layout != Layout::Member(p.group) {
                return false;
            }
            p.release(x.members as usize);
            let units = x.units();
            if x.state == State::Freeing {
                self.counters.freeing_bytes -= units * GRANULE;
            }
            x.generation = x.generation.wrapping_add(1);
            x.state = State::Vacant;
            let ptr = x.ptr;
            self.scrub(ptr, units * GRANULE);
            return true;
        }
        if s.open {
            if let Some(&(g, i)) = s.rec_slot.get(&a) {
                if g == x.generation {
                    s.rec_slot.remove(&a);
                    s.rec[i as usize].end = s.clock;
                    s.clock += 1;
                }
            }
        }
        false
    }

    /// Slot `a` is freed on a stream: a recorded request ends here (its memory is reused in
    /// stream order). False for a served entry: it stays held until its fence completes or a
    /// request of that stream takes it over (`step_safe`), and is not reused by the normal
    /// path meanwhile.
    #[cold]
    pub(super) fn step_freeing(&mut self, a: u32) -> bool {
        match &self.steps.plan {
            None => {
                self.step_released(a);
                true
            }
            Some(p) => self.allocs[a as usize].layout != Layout::Member(p.group),
        }
    }

    /// Drops the plan: the prepared slots that hold nothing go back, and so does the arena,
    /// but the parts of it that served allocations still hold (`step_dissolve`); those are
    /// plain allocations from now on.
    pub(super) fn step_drop_plan(&mut self) {
        let Some(p) = self.steps.plan.take() else {
            return;
        };
        self.steps.last = None;
        if p.group != NIL {
            for &a in &p.slots {
                let x = &mut self.allocs[a as usize];
                if x.state == State::Vacant {
                    x.layout = Layout::None;
                    self.vacant_allocs.push(a);
                } else if let Some(m) = &mut self.by_ptr {
                    // a plain allocation from now on, found by pointer as any other
                    m.insert(x.ptr, a);
                }
            }
            let x = &mut self.allocs[p.group as usize];
            x.members -= 1 + p.slots.len() as u32 - p.n_held;
            if x.members == 0 {
                self.release_group_memory(p.group);
            } else {
                self.step_dissolve(p.group, &p.slots);
            }
            self.after_free();
        }
    }

    /// The pool closes: no step, no plan.
    pub(super) fn step_close(&mut self) {
        self.step_drop_plan();
        let rebuilt = (self.steps.hits, self.steps.misses, self.steps.rebuilds);
        self.steps = Steps::default();
        (self.steps.hits, self.steps.misses, self.steps.rebuilds) = rebuilt;
    }

    /// The served allocation (live or freeing) at `ptr`, if any: served allocations are not
    /// in the pointer index, but in the plan's `slot_at`.
    #[inline]
    pub(super) fn step_slot_at(&self, ptr: u64) -> Option<u32> {
        let p = self.steps.plan.as_ref()?;
        if ptr.wrapping_sub(p.base) >= p.bytes {
            return None;
        }
        let a = p.slot_at.get(ptr)?;
        matches!(self.allocs[a as usize].state, State::Live | State::Freeing).then_some(a)
    }

    /// Whether slot `a` is a prepared slot of the plan (served now, or vacant for its next
    /// entry): never in the pointer index.
    pub(super) fn step_prepared(&self, a: u32) -> bool {
        self.steps.plan.as_ref().is_some_and(|p| {
            p.group != NIL && self.allocs[a as usize].layout == Layout::Member(p.group)
        })
    }

    /// The members slot `a` counts that are not live or freeing allocations: for the arena
    /// of the plan, the plan's hold and its prepared slots that hold nothing now; else 0.
    pub(super) fn step_hold(&self, a: u32) -> u32 {
        match &self.steps.plan {
            Some(p) if p.group == a => 1 + p.slots.len() as u32 - p.n_held,
            _ => 0,
        }
    }
}
