//! A step's plan: its entries (the recorded sequence), their offsets in the arena from the
//! offline planner, each planned entry's overlap predecessors, and which entries hold memory
//! now. Made by `step_make_plan` at the end of the last recorded step; checked by
//! `validate_step`.

use super::step::Rec;
use super::*;
use crate::plan::{plan, Item};

/// `StepEntry::off` of an entry that is not planned (it outlived its step, or may move).
pub(super) const UNPLANNED: u64 = u64::MAX;

/// `StepPlan::quick` when the next request may not take the served path.
pub(super) const NO_QUICK: usize = usize::MAX;

/// One request of the planned step.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepEntry {
    pub(super) size: u64,
    pub(super) stream: u64,
    /// Offset in the arena (`UNPLANNED`: served by the normal path).
    pub(super) off: u64,
    /// The first entry the plan makes after this one is freed (its *due* position): from
    /// there on the plan may put later entries over its memory.
    pub(super) due: u32,
    /// The slot prepared for its offset (NIL: not planned): every entry the plan puts at one
    /// offset is served in the same slot (two held entries never share an offset).
    pub(super) slot: u32,
}

const _: () = assert!(std::mem::size_of::<StepEntry>() == 32);

impl StepEntry {
    #[inline(always)]
    pub(super) fn planned(&self) -> bool {
        self.off != UNPLANNED
    }

    /// Its address range in the arena, rounded to granules.
    #[inline]
    pub(super) fn range(&self) -> (u64, u64) {
        (self.off, self.off + self.size.div_ceil(GRANULE) * GRANULE)
    }
}

#[derive(Clone, Debug)]
pub(super) struct StepPlan {
    /// The arena's group slot (NIL: nothing planned) and its memory.
    pub(super) group: u32,
    pub(super) base: u64,
    pub(super) bytes: u64,
    /// The planner's lower bound (peak of live planned bytes).
    pub(super) bound: u64,
    /// (Tables: built once, never shrunk, indexed by the cursor and by entries of their own.)
    pub(super) entries: Table<StepEntry>,
    /// The planned entries due at each position: `due_list[due_at[p]..due_at[p + 1]]`.
    due_at: Table<u32>,
    due_list: Table<u32>,
    /// Positions before `due_pos` have been looked at in this step.
    pub(super) due_pos: usize,
    /// How many entries hold memory now (served, not yet given back: `is_held`).
    pub(super) n_held: u32,
    /// How many held entries are due at each position (`StepEntry::due`): the served path
    /// serves `k` only when none due at `k` is held (`due_given_back`).
    due_held: Table<u32>,
    /// Held entries that may overlap what is served next: those held when the step began,
    /// and those still held at their due position (a departure: freed later than planned, or
    /// freed on a stream and waiting for its fence).
    pub(super) late: Vec<u32>,
    /// The slots prepared for the plan's offsets (`StepEntry::slot`), each a member of the
    /// arena's group whether it holds an entry now or not; in address order.
    pub(super) slots: Vec<u32>,
    /// The prepared slot at each pointer: served allocations are found by pointer here, not
    /// in the pool's pointer index.
    pub(super) slot_at: PtrMap,
    /// The entry the served path may serve next, if below the number of entries
    /// (`NO_QUICK`: none; `Steps::requick`). While it is not `NO_QUICK`, it is the cursor and
    /// the due position too: the served path moves it alone (`Steps::unquick`).
    pub(super) quick: usize,
    /// The group of the arena whose members `free` gives straight back to the plan
    /// (`step_free`): `group`, or NIL (no slot's group) while the step has a self-check,
    /// scrub or page release to tell.
    pub(super) quick_group: u32,
}

pub(super) fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl StepPlan {
    /// Whether entry `k` holds memory now: its prepared slot is live or freeing and serves
    /// it (`Alloc::members`). (A prepared slot serves no other request while the plan
    /// holds it.)
    #[inline]
    pub(super) fn is_held(&self, k: usize, allocs: &[Alloc]) -> bool {
        let a = self.entries[k].slot;
        a != NIL && {
            let x = &allocs[a as usize];
            matches!(x.state, State::Live | State::Freeing) && x.members as usize == k
        }
    }

    /// A new step starts: every entry still held is late. `extras`: the step has a
    /// self-check, scrub or page release to tell on each free.
    pub(super) fn begin_step(&mut self, extras: bool, allocs: &[Alloc]) {
        self.late.clear();
        self.due_pos = 0;
        if self.n_held > 0 {
            for &a in &self.slots {
                let x = &allocs[a as usize];
                if matches!(x.state, State::Live | State::Freeing) {
                    self.late.push(x.members);
                }
            }
            self.late.sort_unstable();
        }
        self.quick_group = if extras { NIL } else { self.group };
    }

    /// Looks at the due positions up to `k`: an entry still held at its due position is
    /// late (the plan may put what comes next over it). Each position is looked at once a
    /// step, so this is O(1) amortised.
    #[inline(always)]
    pub(super) fn advance_due(&mut self, k: usize, allocs: &[Alloc]) {
        while self.due_pos <= k {
            let p = self.due_pos;
            for i in self.due_at[p]..self.due_at[p + 1] {
                let j = self.due_list[i as usize];
                if self.is_held(j as usize, allocs) {
                    self.late.push(j);
                }
            }
            self.due_pos += 1;
        }
    }

    /// Whether the entries due at position `k` (those the plan frees before `k` is made)
    /// are all given back. With nothing late and the due position at `k`, that is all the
    /// served path needs to know: every entry held then is, by the plan, somewhere else.
    /// (Then `k` is not held either: an entry held when the step began is late.) O(1): the
    /// held entries due at each position are counted as they are held and given back.
    #[inline(always)]
    pub(super) fn due_given_back(&self, k: usize) -> bool {
        self.due_held[k] == 0
    }

    /// `due_given_back` by a look at each entry due at `k` (for the debug assertion that the
    /// count is right).
    pub(super) fn due_all_given_back(&self, k: usize, allocs: &[Alloc]) -> bool {
        (self.due_at[k]..self.due_at[k + 1])
            .all(|i| !self.is_held(self.due_list[i as usize] as usize, allocs))
    }

    /// Planned entry `k` holds its memory now (its slot is made live next).
    #[inline(always)]
    pub(super) fn hold(&mut self, k: usize) {
        self.n_held += 1;
        self.due_held[self.entries[k].due as usize] += 1;
    }

    /// Held entry `k` gives its memory back (its slot is made vacant next).
    #[inline(always)]
    pub(super) fn release(&mut self, k: usize) {
        self.n_held -= 1;
        self.due_held[self.entries[k].due as usize] -= 1;
    }

    /// The plan of a recorded step (no arena yet: `group` NIL, `base` 0).
    pub(super) fn of(rec: &[Rec]) -> StepPlan {
        let mut planned = Vec::new();
        let mut items = Vec::new();
        for (i, r) in rec.iter().enumerate() {
            if r.end != u64::MAX && !r.movable {
                planned.push(i);
                items.push(Item {
                    size: r.size.div_ceil(GRANULE) * GRANULE,
                    start: r.start,
                    end: r.end,
                });
            }
        }
        let p = plan(&items, GRANULE);
        let mut entries: Vec<StepEntry> = rec
            .iter()
            .map(|r| StepEntry {
                size: r.size,
                stream: r.stream,
                off: UNPLANNED,
                due: u32::MAX,
                slot: NIL,
            })
            .collect();
        // (entries start in clock order)
        let n = entries.len();
        let mut due_count = vec![0u32; n + 2];
        for (&i, &off) in planned.iter().zip(&p.offsets) {
            let end = rec[i].end;
            let due = rec.partition_point(|r| r.start < end) as u32;
            entries[i].off = off;
            entries[i].due = due;
            due_count[due as usize + 1] += 1;
        }
        let mut due_at = due_count;
        for p in 1..due_at.len() {
            due_at[p] += due_at[p - 1];
        }
        let mut fill = due_at.clone();
        let mut due_list = vec![0u32; planned.len()];
        for &i in &planned {
            let d = entries[i].due as usize;
            due_list[fill[d] as usize] = i as u32;
            fill[d] += 1;
        }
        StepPlan {
            group: NIL,
            base: 0,
            bytes: p.peak.div_ceil(GRANULE) * GRANULE,
            bound: p.bound,
            entries: entries.into(),
            due_at: due_at.into(),
            due_list: due_list.into(),
            due_pos: 0,
            n_held: 0,
            due_held: vec![0; n + 1].into(),
            late: Vec::new(),
            slots: Vec::new(),
            slot_at: PtrMap::default(),
            quick: NO_QUICK,
            quick_group: NIL,
        }
    }

    /// The plan is sound: two planned entries whose address ranges overlap never overlap in
    /// time (the earlier is due at or before the later starts). A sweep in address order.
    pub(super) fn check_plan(&self) -> std::result::Result<(), String> {
        let mut by_addr: Vec<usize> = (0..self.entries.len())
            .filter(|&i| self.entries[i].planned())
            .collect();
        by_addr.sort_unstable_by_key(|&i| (self.entries[i].off, i));
        for (x, &i) in by_addr.iter().enumerate() {
            let ri = self.entries[i].range();
            if ri.1 > self.bytes {
                return Err(format!("plan entry {i} ends past the arena"));
            }
            for &j in &by_addr[x + 1..] {
                if self.entries[j].range().0 >= ri.1 {
                    break;
                }
                let (lo, hi) = if i < j { (i, j) } else { (j, i) };
                if self.entries[lo].due as usize > hi {
                    return Err(format!(
                        "plan entries {lo} and {hi} overlap while both live"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Pool {
    /// Plans the recorded step `rec` and takes its arena through the pool's normal path (a
    /// group, as `alloc_arena` makes, held by the plan). An arena the pool cannot give in one
    /// block (none, or only stitched) leaves no plan: the next step is recorded again.
    pub(super) fn step_make_plan(&mut self, rec: &[Rec]) {
        let mut p = StepPlan::of(rec);
        if self.cfg.check {
            if let Err(e) = p.check_plan() {
                panic!("unsound plan: {e}");
            }
        }
        if p.bytes > 0 {
            let stream = rec
                .iter()
                .zip(&p.entries)
                .find(|(_, e)| e.planned())
                .map_or(0, |(r, _)| r.stream);
            let (peak_live, peak_used) = (self.counters.peak_live, self.counters.peak_used);
            let req = Request {
                size: p.bytes,
                stream,
                ..Request::default()
            };
            let Ok((id, base)) = self.alloc_req(req, Ask::FRESH) else {
                self.steps.need = 1;
                return;
            };
            if matches!(self.allocs[id.index as usize].layout, Layout::Stitched(_)) {
                // only an arena in one block can give back, when the plan is dropped, what
                // its live allocations do not hold (`step_dissolve`)
                let freed = self.free_unwatched(id);
                debug_assert!(freed.is_ok());
                let c = &mut self.counters;
                (c.allocs, c.frees) = (c.allocs - 1, c.frees - 1);
                (c.peak_live, c.peak_used) = (peak_live, peak_used);
                self.steps.need = 1;
                return;
            }
            // the arena is memory the plan uses, not an allocation: counted as used only
            let c = &mut self.counters;
            c.allocs -= 1;
            c.live_bytes -= p.bytes;
            c.peak_live = peak_live;
            c.peak_used = peak_used.max(c.used_bytes);
            if let Some(m) = &mut self.by_ptr {
                m.remove(base);
            }
            p.group = id.index;
            p.base = base;
            self.step_prepare_slots(&mut p);
            let x = &mut self.allocs[id.index as usize];
            x.state = State::Group;
            // the plan's hold, and one member a prepared slot (held or not)
            x.members = 1 + p.slots.len() as u32;
        }
        self.steps.plan = Some(p);
    }

    /// One vacant slot for each offset of the plan, its pointer and layout set (a member of
    /// the arena's group): serving an entry only makes its slot live.
    fn step_prepare_slots(&mut self, p: &mut StepPlan) {
        let mut offs: Vec<(u64, usize)> = (0..p.entries.len())
            .filter(|&i| p.entries[i].planned())
            .map(|i| (p.entries[i].off, i))
            .collect();
        offs.sort_unstable();
        let mut last = (u64::MAX, NIL);
        for (off, i) in offs {
            if off != last.0 {
                let a = self.new_slot();
                let x = &mut self.allocs[a as usize];
                x.ptr = p.base + off;
                x.layout = Layout::Member(p.group);
                p.slots.push(a);
                p.slot_at.insert(p.base + off, a);
                last = (off, a);
            }
            p.entries[i].slot = last.1;
        }
    }

    /// The arena of a dropped plan, group `g` with its prepared `slots`, that served
    /// allocations still hold: when it is one block, it is cut into a block for each of them
    /// and free blocks between them, so that the memory they do not hold goes back at once
    /// (a plan dropped for a request the pool cannot serve must leave the pool as the pool
    /// without steps would be). (An arena is one block: `step_make_plan`.)
    pub(super) fn step_dissolve(&mut self, g: u32, slots: &[u32]) {
        let Layout::Block(b) = self.allocs[g as usize].layout else {
            return;
        };
        let base = self.allocs[g as usize].ptr;
        let end = base + self.blocks[b as usize].len as u64 * GRANULE;
        let mut held: Vec<(u64, u32)> = slots
            .iter()
            .map(|&a| (self.allocs[a as usize].ptr, a))
            .filter(|&(_, a)| matches!(self.allocs[a as usize].state, State::Live | State::Freeing))
            .collect();
        held.sort_unstable();
        // the block's pieces in address order: the held allocations, and a vacant slot for
        // each gap (its size the gap's), given back once cut
        let (mut pieces, mut gaps) = (Vec::with_capacity(2 * held.len() + 1), Vec::new());
        let mut at = base;
        for (ptr, a) in held.into_iter().chain(std::iter::once((end, NIL))) {
            if ptr > at {
                let d = self.new_slot();
                let x = &mut self.allocs[d as usize];
                (x.ptr, x.size) = (at, ptr - at);
                pieces.push((at, d));
                gaps.push(d);
            }
            if a != NIL {
                pieces.push((ptr, a));
                at = ptr + self.allocs[a as usize].units() * GRANULE;
            }
        }
        self.allocs[pieces[0].1 as usize].layout = Layout::Block(b);
        self.cut_uncut(b, &pieces);
        let x = &mut self.allocs[g as usize];
        x.layout = Layout::None;
        x.state = State::Vacant;
        x.members = 0;
        x.generation = x.generation.wrapping_add(1);
        self.vacant_allocs.push(g);
        for d in gaps {
            let x = &mut self.allocs[d as usize];
            let layout = std::mem::replace(&mut x.layout, Layout::None);
            self.counters.used_bytes -= x.units() * GRANULE;
            self.unplace(layout, Settle::Policy);
            self.vacant_allocs.push(d);
        }
    }

    /// The plan's invariants (see `step.rs`).
    pub(super) fn validate_step(&self) -> std::result::Result<(), String> {
        let Some(p) = &self.steps.plan else {
            return Ok(());
        };
        if p.group == NIL {
            return if p.n_held == 0 && p.bytes == 0 {
                Ok(())
            } else {
                Err("a plan without an arena holds entries".into())
            };
        }
        let g = &self.allocs[p.group as usize];
        if g.state != State::Group || g.members == 0 || g.ptr != p.base {
            return Err(format!("the plan's arena {} is not its group", p.group));
        }
        if g.units() * GRANULE < p.bytes {
            return Err("the plan's arena is smaller than its plan".into());
        }
        let mut seen = vec![false; p.entries.len()];
        let mut prepared = vec![false; self.allocs.len()];
        let mut ranges = Vec::new();
        for &a in &p.slots {
            prepared[a as usize] = true;
            let ptr = self.allocs[a as usize].ptr;
            if p.slot_at.get(ptr) != Some(a) {
                return Err(format!("prepared slot {a} is not found at its pointer"));
            }
            if self.by_ptr.as_ref().is_some_and(|m| m.get(ptr).is_some()) {
                return Err(format!(
                    "prepared slot {a}'s pointer is in the pointer index"
                ));
            }
        }
        if p.slot_at.len() != p.slots.len() {
            return Err("the plan finds slots by pointer that it did not prepare".into());
        }
        for &a in &self.vacant_allocs {
            if prepared[a as usize] {
                return Err(format!("prepared slot {a} is vacant for any request"));
            }
        }
        for k in 0..p.entries.len() {
            let e = &p.entries[k];
            if e.planned() != (e.slot != NIL)
                || e.planned() && !prepared.get(e.slot as usize).copied().unwrap_or(false)
                || e.planned() && self.allocs[e.slot as usize].ptr != p.base + e.off
            {
                return Err(format!("plan entry {k} has no prepared slot at its offset"));
            }
        }
        for (a, x) in self.allocs.iter().enumerate() {
            let member = x.layout == Layout::Member(p.group);
            if prepared[a] != member || prepared[a] && x.state == State::Cached {
                return Err(format!(
                    "slot {a} is a member of the plan's arena, not prepared"
                ));
            }
            if !member || x.state == State::Vacant {
                continue;
            }
            let k = x.members as usize;
            let Some(e) = p.entries.get(k) else {
                return Err(format!("served allocation {a} names no plan entry"));
            };
            if e.slot != a as u32 || x.size != e.size {
                return Err(format!("served allocation {a} is not where entry {k} is"));
            }
            if std::mem::replace(&mut seen[k], true) {
                return Err(format!("plan entry {k} held by {a}, not once"));
            }
            if x.state == State::Freeing
                && self.streams.get(&x.stream).is_some_and(|st| {
                    st.reuse
                        .values()
                        .flatten()
                        .any(|&(b, g)| b == a as u32 && g == x.generation)
                })
            {
                return Err(format!(
                    "served allocation {a}, freed on a stream, is reusable"
                ));
            }
            ranges.push(e.range());
        }
        let held = (0..p.entries.len())
            .filter(|&k| p.is_held(k, &self.allocs))
            .count();
        if held != ranges.len() || held != p.n_held as usize {
            return Err(format!(
                "{held} plan entries held, {} counted, {} served allocations",
                p.n_held,
                ranges.len()
            ));
        }
        let mut due_held = vec![0u32; p.entries.len() + 1];
        for k in (0..p.entries.len()).filter(|&k| p.is_held(k, &self.allocs)) {
            due_held[p.entries[k].due as usize] += 1;
        }
        if due_held[..] != *p.due_held {
            return Err("the held entries due at a position are miscounted".into());
        }
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err("two held plan entries overlap".into());
        }
        Ok(())
    }
}
