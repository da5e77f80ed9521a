//! A step's plan: its entries (the recorded sequence), their offsets in the arena from the
//! offline planner, each planned entry's overlap predecessors, and which entries hold memory
//! now. Made by `step_make_plan` at the end of the last recorded step; checked by
//! `validate_step`.

use super::step::Rec;
// STAND-IN: becomes `use crate::plan::{plan, Item};` when branch `plan` is merged.
use super::step_standin::{plan, Item};
use super::*;

/// `StepEntry::off` of an entry that is not planned (it outlived its step, or may move).
pub(super) const UNPLANNED: u64 = u64::MAX;

/// One request of the planned step.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepEntry {
    pub(super) size: u64,
    pub(super) stream: u64,
    /// Offset in the arena (`UNPLANNED`: served by the normal path).
    pub(super) off: u64,
    /// Its overlap predecessors: `preds[pred_lo..pred_hi]`.
    pub(super) pred_lo: u32,
    pub(super) pred_hi: u32,
}

impl StepEntry {
    #[inline(always)]
    pub(super) fn planned(&self) -> bool {
        self.off != UNPLANNED
    }

    /// Its address range in the arena, rounded to granules.
    fn range(&self) -> (u64, u64) {
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
    pub(super) entries: Vec<StepEntry>,
    /// Per planned entry, the earlier entries of the step whose address ranges overlap it
    /// (the plan gives them lifetimes that end before it starts).
    pub(super) preds: Vec<u32>,
    /// Entries whose memory is held now (served, not yet given back).
    pub(super) held: Vec<bool>,
    pub(super) n_held: u32,
    /// Entries held when the step began (they may overlap any entry of this step).
    pub(super) carry: Vec<u32>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl StepPlan {
    /// A new step starts: the entries still held are listed in `carry`.
    pub(super) fn begin_step(&mut self) {
        self.carry.clear();
        if self.n_held > 0 {
            self.carry
                .extend((0..self.held.len() as u32).filter(|&k| self.held[k as usize]));
        }
    }

    /// Whether planned entry `k` may be served: it, its overlap predecessors and the carried
    /// entries overlapping it hold no memory. O(predecessors + carried).
    #[inline]
    pub(super) fn free_to_serve(&self, k: usize) -> bool {
        let e = &self.entries[k];
        if self.held[k] {
            return false;
        }
        let preds = &self.preds[e.pred_lo as usize..e.pred_hi as usize];
        if preds.iter().any(|&j| self.held[j as usize]) {
            return false;
        }
        self.carry.is_empty()
            || !self.carry.iter().any(|&c| {
                self.held[c as usize] && overlaps(self.entries[c as usize].range(), e.range())
            })
    }

    #[inline]
    pub(super) fn hold(&mut self, k: usize) {
        debug_assert!(!self.held[k]);
        self.held[k] = true;
        self.n_held += 1;
    }

    #[inline]
    pub(super) fn release(&mut self, k: usize) {
        debug_assert!(self.held[k]);
        self.held[k] = false;
        self.n_held -= 1;
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
                pred_lo: 0,
                pred_hi: 0,
            })
            .collect();
        for (&i, &off) in planned.iter().zip(&p.offsets) {
            entries[i].off = off;
        }
        // overlap pairs, by a sweep over the planned entries in address order
        let mut by_addr = planned.clone();
        by_addr.sort_unstable_by_key(|&i| (entries[i].off, i));
        let mut pred_of: Vec<Vec<u32>> = vec![Vec::new(); entries.len()];
        for (x, &i) in by_addr.iter().enumerate() {
            let ri = entries[i].range();
            for &j in &by_addr[x + 1..] {
                let rj = entries[j].range();
                if rj.0 >= ri.1 {
                    break;
                }
                let (lo, hi) = if i < j { (i, j) } else { (j, i) };
                pred_of[hi].push(lo as u32);
            }
        }
        let mut preds = Vec::new();
        for (k, v) in pred_of.into_iter().enumerate() {
            entries[k].pred_lo = preds.len() as u32;
            preds.extend(v);
            entries[k].pred_hi = preds.len() as u32;
        }
        let n = entries.len();
        StepPlan {
            group: NIL,
            base: 0,
            bytes: p.peak.div_ceil(GRANULE) * GRANULE,
            bound: p.bound,
            entries,
            preds,
            held: vec![false; n],
            n_held: 0,
            carry: Vec::new(),
        }
    }
}

impl Pool {
    /// Plans the recorded step `rec` and takes its arena through the pool's normal path (a
    /// group, as `alloc_arena` makes, held by the plan). An arena the pool cannot give leaves
    /// no plan: the next step is recorded again.
    pub(super) fn step_make_plan(&mut self, rec: &[Rec]) {
        let mut p = StepPlan::of(rec);
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
            let Ok((id, base)) = self.alloc_req(req, false) else {
                self.steps.need = 1;
                return;
            };
            // the arena is memory the plan uses, not an allocation: counted as used only
            let c = &mut self.counters;
            c.allocs -= 1;
            c.live_bytes -= p.bytes;
            c.peak_live = peak_live;
            c.peak_used = peak_used.max(c.used_bytes);
            if let Some(m) = &mut self.by_ptr {
                m.remove(base);
            }
            let x = &mut self.allocs[id.index as usize];
            x.state = State::Group;
            x.members = 1; // the plan's hold
            p.group = id.index;
            p.base = base;
        }
        self.steps.plan = Some(p);
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
        let mut ranges = Vec::new();
        for (a, x) in self.allocs.iter().enumerate() {
            if x.layout != Layout::Member(p.group)
                || !matches!(x.state, State::Live | State::Freeing)
            {
                continue;
            }
            let k = self.steps.entry_of.get(a).copied().unwrap_or(NIL) as usize;
            let Some(e) = p.entries.get(k) else {
                return Err(format!("served allocation {a} names no plan entry"));
            };
            if !e.planned() || x.ptr != p.base + e.off || x.size != e.size {
                return Err(format!("served allocation {a} is not where entry {k} is"));
            }
            if std::mem::replace(&mut seen[k], true) || !p.held[k] {
                return Err(format!("plan entry {k} held by {a}, not once"));
            }
            ranges.push(e.range());
        }
        let held = p.held.iter().filter(|&&h| h).count();
        if held != ranges.len() || held != p.n_held as usize {
            return Err(format!(
                "{held} plan entries held, {} counted, {} served allocations",
                p.n_held,
                ranges.len()
            ));
        }
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err("two held plan entries overlap".into());
        }
        Ok(())
    }
}
