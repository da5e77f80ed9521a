//! The engine's loop: events through a model, measured; and the bisection for the smallest
//! capacity that runs a trace with no out-of-memory failure.

use std::cell::Cell;
use std::time::Instant;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{Action, Event, Model, Oom, Replay, StartState};
use crate::error::Result;

thread_local! {
    /// The event this thread's replay is at (None: setting up the start state).
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the event a replay on this thread was at when it panicked (None: while it
/// set up the start state): what a caught panic is reported against.
pub fn current_event() -> Option<usize> {
    CURRENT.with(|c| c.get())
}

/// Records the event reached into `CURRENT` if the replay unwinds (a panic), so that the
/// loop itself stores a plain integer per event.
struct Reached(Option<usize>);

impl Drop for Reached {
    fn drop(&mut self) {
        if std::thread::panicking() {
            CURRENT.with(|c| c.set(self.0));
        }
    }
}

/// Called after every event with (event index, the model, live bytes, live allocations).
pub type EventCheck<'a> = &'a mut dyn FnMut(usize, &dyn Model, u64, usize);

/// Runs `events` through `model` from `start`. `peak_event` is the index of the event after
/// which live memory peaks (fragmentation is measured there; `usize::MAX` for none).
pub fn run(
    model: &mut dyn Model,
    capacity: u64,
    start: &StartState,
    events: &[Event],
    peak_event: usize,
    timeline_points: usize,
) -> Replay {
    run_checked(
        model,
        capacity,
        start,
        events,
        peak_event,
        timeline_points,
        None,
    )
}

/// The ids a start state may hold: the first block of each id (a later one is dropped).
fn unique_start(start: &StartState) -> Option<StartState> {
    let mut seen = FxHashSet::default();
    if start.blocks.iter().all(|b| seen.insert(b.0)) {
        return None;
    }
    let mut seen = FxHashSet::default();
    Some(StartState {
        segments: start.segments.clone(),
        blocks: start
            .blocks
            .iter()
            .copied()
            .filter(|b| seen.insert(b.0))
            .collect(),
    })
}

/// The live allocations as the engine counts them.
struct Live {
    /// size and trace address of each live id
    of: Vec<Option<(u64, u64)>>,
    /// trace address -> the live id there
    at_addr: FxHashMap<u64, u32>,
    bytes: u64,
    count: usize,
}

impl Live {
    fn add(&mut self, id: u32, size: u64, addr: u64) {
        self.of[id as usize] = Some((size, addr));
        self.bytes = self.bytes.saturating_add(size);
        self.count += 1;
        if addr != 0 {
            self.at_addr.insert(addr, id);
        }
    }

    fn release(&mut self, id: u32, model: &mut dyn Model) {
        if let Some((s, addr)) = self.of[id as usize].take() {
            self.bytes = self.bytes.saturating_sub(s);
            self.count -= 1;
            if addr != 0 && self.at_addr.get(&addr) == Some(&id) {
                self.at_addr.remove(&addr);
            }
            model.free(id);
        }
    }
}

/// [`run`], calling `check` after every event.
///
/// The engine keeps what the model sees consistent: an allocation of an id that is live, or
/// at a trace address that a live allocation holds (the log missed its free), frees that one
/// first; a free of an id that is not live is dropped.
pub fn run_checked(
    model: &mut dyn Model,
    capacity: u64,
    start: &StartState,
    events: &[Event],
    peak_event: usize,
    timeline_points: usize,
    mut check: Option<EventCheck<'_>>,
) -> Replay {
    CURRENT.with(|c| c.set(None));
    let mut reached = Reached(None);
    let owned = unique_start(start);
    let start = owned.as_ref().unwrap_or(start);
    let mut r = Replay {
        capacity,
        events: events.len() as u64,
        ..Replay::default()
    };
    let max_id = events
        .iter()
        .map(|e| e.id)
        .chain(start.blocks.iter().map(|b| b.0))
        .max()
        .map_or(0, |m| m as usize + 1);
    let mut lv = Live {
        of: vec![None; max_id],
        at_addr: FxHashMap::default(),
        bytes: 0,
        count: 0,
    };
    r.preload_failed = !model.preload(start);
    if !r.preload_failed {
        for &(id, addr, req, _, _) in &start.blocks {
            lv.add(id, req, addr);
        }
    }
    let stride = (events.len() / timeline_points.max(1)).max(1);
    let mut last_reserved = model.reserved();
    r.peak_live = lv.bytes;
    r.peak_reserved = last_reserved;
    r.timeline.push((0, lv.bytes, last_reserved));
    let mut clock = 0u32;
    for (i, e) in events.iter().enumerate() {
        reached.0 = Some(i);
        match e.action {
            Action::Alloc => {
                r.allocs += 1;
                lv.release(e.id, model);
                if e.addr != 0 {
                    if let Some(&old) = lv.at_addr.get(&e.addr) {
                        lv.release(old, model);
                    }
                }
                clock = clock.wrapping_add(1);
                let timed = clock % 8 == 0;
                let t0 = timed.then(Instant::now);
                let got = model.alloc(e.id, e.size, e.stream);
                if let Some(t0) = t0 {
                    r.op_ns_total += t0.elapsed().as_nanos() as u64;
                    r.ops_timed += 1;
                }
                match got {
                    Some(addr) => {
                        if e.addr != 0 {
                            r.addressed_allocs += 1;
                            r.address_matches += (addr == e.addr) as u64;
                        }
                        lv.add(e.id, e.size, e.addr);
                    }
                    None => r.ooms.push(Oom {
                        event: i,
                        size: e.size,
                        live: lv.bytes,
                        reserved: model.reserved(),
                        largest_free: model.largest_free(),
                    }),
                }
            }
            Action::Free => {
                if (e.id as usize) < lv.of.len() {
                    lv.release(e.id, model);
                }
            }
            Action::SegmentAlloc => model.segment_hint(e.addr, e.size),
            Action::SegmentFree => model.segment_released(e.addr, e.size),
            Action::SegmentMap => model.segment_mapped(e.addr, e.size),
            Action::SegmentUnmap => model.segment_unmapped(e.addr, e.size),
        }
        if let Some(check) = check.as_mut() {
            check(i, &*model, lv.bytes, lv.count);
        }
        let reserved = model.reserved();
        let live = lv.bytes;
        let new_peak = live > r.peak_live || reserved > r.peak_reserved;
        r.peak_live = r.peak_live.max(live);
        r.peak_reserved = r.peak_reserved.max(reserved);
        if i == peak_event {
            r.free_at_peak = model.free_bytes();
            r.largest_free_at_peak = model.largest_free();
            r.layout_at_peak = model.layout();
        }
        if i % stride == 0 || (new_peak && reserved != last_reserved) {
            r.timeline.push((i as u64 + 1, live, reserved));
        }
        last_reserved = reserved;
    }
    r.final_reserved = model.reserved();
    r.timeline
        .push((events.len() as u64, lv.bytes, r.final_reserved));
    r
}

/// The smallest capacity, a multiple of `step`, at which `make`'s model replays the trace
/// with no out-of-memory failure, by bisection between the peak of live memory and `hi`
/// (None: not even at `hi`). An error from `make` ends the search with that error.
pub fn min_capacity(
    make: &dyn Fn(u64) -> Result<Box<dyn Model>>,
    start: &StartState,
    events: &[Event],
    peak_live: u64,
    hi: u64,
    step: u64,
) -> Result<Option<u64>> {
    let step = step.max(1);
    let fits = |units: u64| -> Result<bool> {
        let cap = units.saturating_mul(step);
        let mut m = make(cap)?;
        let r = run(m.as_mut(), cap, start, events, usize::MAX, 1);
        Ok(r.ooms.is_empty() && !r.preload_failed)
    };
    let mut lo = peak_live.div_ceil(step).max(1);
    let mut hi = hi.div_ceil(step).max(lo);
    if !fits(hi)? {
        return Ok(None);
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(Some(lo.saturating_mul(step)))
}
