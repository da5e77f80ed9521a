//! A trace's engine events (`crate::replay::Event`, as `gpumm.traces.prepare` makes them) as
//! items to plan.
//!
//! The clock is the engine's event index plus one; the start state's blocks start at 0 and
//! allocations never freed end one past the last event. An allocation's lifetime ends at its
//! free event, which is where an allocator could really take its memory back:
//! - in a PyTorch snapshot the engine's free is `free_completed`, not `free_requested`: a
//!   block used on other streams (`record_stream`) is freed only once the events recorded on
//!   those streams have completed, and the snapshot says when;
//! - within one stream, stream order makes the memory safe for the next allocation at once;
//! - an allocation on another stream that the plan puts over memory freed on stream A must be
//!   ordered after A's work up to that free: an allocator serving the plan waits on an event
//!   recorded on A at the free, as CUDA's stream-ordered pools do for cross-stream reuse
//!   (`cudaMemPoolReuseAllowInternalDependencies`). The plan itself stays exact in bytes.
//!
//! Segment events are the real allocator's, not the program's: they are left out.

use rustc_hash::FxHashMap;

use super::Item;
use crate::replay::{Action, Event};

/// A trace as items: `items[k]` is the k-th allocation (the start state's blocks first),
/// `streams[k]` its stream, `events[k]` the engine event that allocated it (`u64::MAX` for a
/// start-state block).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceItems {
    pub items: Vec<Item>,
    pub streams: Vec<u64>,
    pub events: Vec<u64>,
}

/// The items of `events` after `start` (the start state's (id, address, requested size,
/// block size, stream) blocks). An id allocated again while live ends the old allocation
/// there, and a free of an id not live is ignored, as the replay engine does.
pub fn items_from_events(events: &[Event], start: &[(u32, u64, u64, u64, u64)]) -> TraceItems {
    let end_of_trace = events.len() as u64 + 1;
    let mut out = TraceItems::default();
    let mut live: FxHashMap<u32, usize> = FxHashMap::default();
    let open =
        |out: &mut TraceItems, live: &mut FxHashMap<u32, usize>, id, size, stream, at, ev| {
            if let Some(k) = live.insert(id, out.items.len()) {
                out.items[k].end = at;
            }
            out.items.push(Item {
                size,
                start: at,
                end: end_of_trace,
            });
            out.streams.push(stream);
            out.events.push(ev);
        };
    for &(id, _, req, _, stream) in start {
        open(&mut out, &mut live, id, req, stream, 0, u64::MAX);
    }
    for (i, e) in events.iter().enumerate() {
        let at = i as u64 + 1;
        match e.action {
            Action::Alloc => open(&mut out, &mut live, e.id, e.size, e.stream, at, i as u64),
            Action::Free => {
                if let Some(k) = live.remove(&e.id) {
                    out.items[k].end = at;
                }
            }
            _ => {}
        }
    }
    out
}
