//! The replay engine: a trace's events through a model of an allocator at a given device
//! capacity, recording live and reserved bytes over time, out-of-memory failures with the state
//! at that moment, fragmentation at the peak of live memory, and the time each operation took.
//!
//! Events name allocations by id (the readers turn pointers into ids), so a model never needs
//! the trace's addresses, except the `caching` model, which takes the addresses of new segments
//! from the trace's `segment_alloc` events (`SegmentHint`) so that it can be checked against what
//! PyTorch really did.

#![deny(unsafe_code)]

mod models;
#[cfg(test)]
mod tests;

use std::time::Instant;

pub use models::{model_by_name, CachingOptions, MODEL_NAMES};

/// What happened, in trace order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Allocation `id` of `size` bytes on `stream`; `addr` is where the real allocator put it
    /// (0 if unknown).
    Alloc,
    /// Allocation `id` is freed (a free of an id that is not live is ignored).
    Free,
    /// The real allocator took a segment of `size` at `addr` from the device.
    SegmentAlloc,
    /// The real allocator gave the segment at `addr` back to the device.
    SegmentFree,
    /// The real allocator mapped `size` bytes of pages at `addr` into an expandable segment.
    SegmentMap,
    /// The real allocator unmapped `size` bytes of pages at `addr` from an expandable segment.
    SegmentUnmap,
}

impl Action {
    pub fn from_code(c: u64) -> Option<Action> {
        Some(match c {
            0 => Action::Alloc,
            1 => Action::Free,
            2 => Action::SegmentAlloc,
            3 => Action::SegmentFree,
            4 => Action::SegmentMap,
            5 => Action::SegmentUnmap,
            _ => return None,
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub action: Action,
    pub id: u32,
    pub size: u64,
    pub stream: u64,
    pub addr: u64,
}

/// The state a trace starts from (a snapshot's ring buffer begins mid-run): segments the real
/// allocator held, and allocations live in them.
#[derive(Clone, Debug, Default)]
pub struct StartState {
    /// (address, size, stream)
    pub segments: Vec<(u64, u64, u64)>,
    /// (id, address, requested size, block size, stream)
    pub blocks: Vec<(u32, u64, u64, u64, u64)>,
}

/// An allocator as the engine drives it. Sizes are the requested bytes; `alloc` returns the
/// address the model chose, or None when it cannot serve the request after everything it
/// does on a miss (release caches, retry).
pub trait Model: Send {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64>;
    fn free(&mut self, id: u32);
    /// Bytes held from the device.
    fn reserved(&self) -> u64;
    /// The largest contiguous free range inside what it holds (may walk its state).
    fn largest_free(&self) -> u64;
    /// Bytes it holds that no allocation uses (may walk its state).
    fn free_bytes(&self) -> u64;
    /// Its memory as (address, size, used) ranges in address order, for maps (may walk its
    /// state; empty if the model has no such picture).
    fn layout(&self) -> Vec<(u64, u64, bool)> {
        Vec::new()
    }
    /// The real allocator took a segment here (only the `caching` models use it).
    fn segment_hint(&mut self, _addr: u64, _size: u64) {}
    /// The real allocator released this segment (only the `caching` models use it).
    fn segment_released(&mut self, _addr: u64) {}
    /// Sets up the start state. The default allocates each live block anew.
    fn preload(&mut self, start: &StartState) -> bool {
        start
            .blocks
            .iter()
            .all(|&(id, _, req, _, stream)| self.alloc(id, req, stream).is_some())
    }
}

/// One out-of-memory failure and the state at that moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Oom {
    pub event: usize,
    pub size: u64,
    pub live: u64,
    pub reserved: u64,
    pub largest_free: u64,
}

/// What a replay measured. Bytes, nanoseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub capacity: u64,
    pub events: u64,
    pub allocs: u64,
    pub peak_live: u64,
    pub peak_reserved: u64,
    pub final_reserved: u64,
    pub ooms: Vec<Oom>,
    /// Allocation events whose trace address the model reproduced, of those with one.
    pub address_matches: u64,
    pub addressed_allocs: u64,
    /// Free bytes held and the largest free range at the first peak of live memory.
    pub free_at_peak: u64,
    pub largest_free_at_peak: u64,
    /// The model's layout at the peak of live memory.
    pub layout_at_peak: Vec<(u64, u64, bool)>,
    /// (event index, live, reserved), at most `timeline_points` of them, plus every peak.
    pub timeline: Vec<(u64, u64, u64)>,
    pub op_ns_total: u64,
    pub ops_timed: u64,
    pub preload_failed: bool,
}

impl Replay {
    /// `1 - largest free / free` at the peak of live memory (0 when nothing was free).
    pub fn fragmentation_at_peak(&self) -> f64 {
        if self.free_at_peak == 0 {
            0.0
        } else {
            1.0 - self.largest_free_at_peak as f64 / self.free_at_peak as f64
        }
    }
}

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
    // size of each live id (0: not live)
    let mut live_size = vec![0u64; max_id];
    let mut live = 0u64;
    r.preload_failed = !model.preload(start);
    if !r.preload_failed {
        for &(id, _, req, _, _) in &start.blocks {
            live_size[id as usize] = req;
            live += req;
        }
    }
    let stride = (events.len() / timeline_points.max(1)).max(1);
    let mut last_reserved = model.reserved();
    r.peak_live = live;
    r.peak_reserved = last_reserved;
    r.timeline.push((0, live, last_reserved));
    let mut clock = 0u32;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                r.allocs += 1;
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
                        live_size[e.id as usize] = e.size;
                        live += e.size;
                    }
                    None => r.ooms.push(Oom {
                        event: i,
                        size: e.size,
                        live,
                        reserved: model.reserved(),
                        largest_free: model.largest_free(),
                    }),
                }
            }
            Action::Free => {
                let s = live_size.get(e.id as usize).copied().unwrap_or(0);
                if s > 0 {
                    live_size[e.id as usize] = 0;
                    live -= s;
                    model.free(e.id);
                }
            }
            Action::SegmentAlloc => model.segment_hint(e.addr, e.size),
            Action::SegmentFree => model.segment_released(e.addr),
            Action::SegmentMap | Action::SegmentUnmap => {}
        }
        let reserved = model.reserved();
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
        .push((events.len() as u64, live, r.final_reserved));
    r
}

/// The smallest capacity, a multiple of `step`, at which `make`'s model replays the trace
/// with no out-of-memory failure, by bisection between the peak of live memory and `hi`.
pub fn min_capacity(
    make: &dyn Fn(u64) -> Box<dyn Model>,
    start: &StartState,
    events: &[Event],
    peak_live: u64,
    hi: u64,
    step: u64,
) -> Option<u64> {
    let fits = |cap: u64| {
        let mut m = make(cap);
        let r = run(m.as_mut(), cap, start, events, usize::MAX, 1);
        r.ooms.is_empty() && !r.preload_failed
    };
    let mut lo = peak_live.div_ceil(step).max(1);
    let mut hi = hi.div_ceil(step).max(lo);
    if !fits(hi * step) {
        return None;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(mid * step) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo * step)
}
