//! The replay engine: a trace's events through a model of an allocator at a given device
//! capacity, recording live and reserved bytes over time, out-of-memory failures with the state
//! at that moment, fragmentation at the peak of live memory, and the time each operation took.
//!
//! Events name allocations by id (the readers turn pointers into ids), so a model never needs
//! the trace's addresses, except the `caching` models, which take the addresses of new segments
//! from the trace's `segment_alloc` and `segment_map` events so that they can be checked against
//! what PyTorch really did.
//!
//! No event sequence makes a model panic or lose track of its memory (`proptests.rs` drives
//! random ones through every model and checks each model's bookkeeping after every event).

#![deny(unsafe_code)]

mod engine;
mod models;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use engine::{auto_step, current_event, min_capacity, run, run_checked, EventCheck};
pub use models::{model_by_name, CachingOptions, DIVISION_INTERVALS, MODEL_NAMES};

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
/// does on a miss (release caches, retry). Every method keeps the model whole whatever the
/// trace holds: an id allocated again while live is freed first, a free of an id not live
/// does nothing, hints that meet the model's own state are not taken.
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
    /// (address, size) of each live allocation as the model placed it, for checks.
    fn live_blocks(&self) -> Vec<(u64, u64)>;
    /// The model's own bookkeeping checked whole (for tests; may walk its state).
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
    /// The real allocator took a segment here (only the `caching` models use it).
    fn segment_hint(&mut self, _addr: u64, _size: u64) {}
    /// The real allocator released this segment (only the `caching` models use it).
    fn segment_released(&mut self, _addr: u64, _size: u64) {}
    /// The real allocator mapped pages into an expandable segment (only the `caching` models
    /// use it).
    fn segment_mapped(&mut self, _addr: u64, _size: u64) {}
    /// The real allocator unmapped pages of an expandable segment (only the `caching` models
    /// use it).
    fn segment_unmapped(&mut self, _addr: u64, _size: u64) {}
    /// Sets up the start state, all or nothing: on false the model holds nothing of it. The
    /// default allocates each live block anew.
    fn preload(&mut self, start: &StartState) -> bool {
        for (i, &(id, _, req, _, stream)) in start.blocks.iter().enumerate() {
            if self.alloc(id, req, stream).is_none() {
                for b in &start.blocks[..i] {
                    self.free(b.0);
                }
                return false;
            }
        }
        true
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
