//! The offline planner: every allocation of a trace placed at an offset, knowing every
//! lifetime in advance, so that the highest address in use is as low as possible (the
//! dynamic storage allocation problem, NP-hard; `docs/plan.md` has the algorithm, the bound
//! and the figures on the corpus).
//!
//! Two items may share addresses only if their lifetimes `[start, end)` do not overlap. No
//! placement can end below the peak of live (aligned) bytes, [`Plan::bound`]; the plan
//! reports it beside its own peak, so that `peak / bound` says how far from optimal the plan
//! can at most be.
//!
//! How a plan is found (`search.rs`):
//! 1. items live over the whole span of a group go at its bottom, one above the other (no
//!    plan of the group does better than that), and what is left splits into groups that
//!    share no instant (`split.rs`); each group is planned apart from the others;
//! 2. each group is placed once in time order by a best-fit free list that costs O(n log n)
//!    whatever the overlaps (`sweep.rs`); then the group that sets the plan's peak is placed
//!    greedily in several orders (size classes in time order or longest lived first, size,
//!    lifetime length, size × lifetime) with first fit and best fit (`place.rs`), then the
//!    group that sets it next, while the budget lasts (`search.rs`);
//! 3. while a budget of work lasts and rounds lower the peak, the items that set the group's
//!    peak move to the front of the best order and the group is placed again (a bounded
//!    search on the items at the peak);
//! 4. while the plan is above the bound, a search over positions under a target height: each
//!    big item at the lowest or the highest offset where it fits below the target, going back
//!    to the item in the way when one fits nowhere (`stack.rs`), the target bisected between
//!    the bound and the best peak; kept only for a lower peak.
//!
//! Files: `bound` (normalised items and the bound), `split` (the groups), `place` (the greedy
//! placement of one order and its interval index), `sweep` (the time-order plan), `search`
//! (orders, budget, the search at the peak), `stack` (the search under a target), `trace` (a trace's events as items).

#![deny(unsafe_code)]

mod bound;
mod place;
mod search;
mod split;
mod stack;
mod sweep;
mod trace;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use trace::{items_from_events, TraceItems};

use crate::error::{Error, Result};

/// One allocation to place: its size in bytes and its lifetime [start, end) in request order
/// (any monotonic clock: event index). Two items may share an address range only if their
/// lifetimes do not overlap.
///
/// An item with `end <= start` lives for one tick, `[start, start + 1)`, so that it still
/// holds its bytes somewhere and counts in the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub size: u64,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// offsets[i] is items[i]'s offset from the base, a multiple of `align`
    pub offsets: Vec<u64>,
    /// highest address in use = max(offsets[i] + round_up(size_i, align))
    pub peak: u64,
    /// lower bound: the peak of live (aligned) bytes; no placement can beat it
    pub bound: u64,
    /// the budget of work ran out before the group that sets the peak was placed greedily
    /// (it has the time-order plan only): a lower plan may exist
    pub exhausted: bool,
}

/// How much work the planner may do. The default plans 10^6 allocations in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Units of work (one unit: one placed item looked at while placing another) shared by
    /// every greedy placement and the search; a placement that would overrun it is not
    /// started. The time-order plan runs whatever the budget (it costs O(n log n)).
    pub budget: u64,
    /// Rounds of the search at the peak, per group.
    pub rounds: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            budget: 300_000_000,
            rounds: 24,
        }
    }
}

/// Place every item; `align` a power of two >= 1. Deterministic. Never panics (empty input:
/// an empty plan with peak 0). An `align` that is not a power of two is taken as the next one
/// (0 as 1); a plan that would reach past `u64::MAX` saturates there ([`try_plan`] says so
/// as an error instead).
pub fn plan(items: &[Item], align: u64) -> Plan {
    let align = align.max(1).checked_next_power_of_two().unwrap_or(1 << 63);
    let p = search::plan_items(items, align, &Options::default());
    Plan {
        offsets: p.offsets.iter().map(|&o| sat(o)).collect(),
        peak: sat(p.peak),
        bound: sat(p.bound),
        exhausted: p.exhausted,
    }
}

/// [`plan`] with a budget of work, and a clear error for an `align` that is not a power of
/// two or a plan whose addresses would not fit in 64 bits.
pub fn try_plan(items: &[Item], align: u64, opts: &Options) -> Result<Plan> {
    if align == 0 || !align.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "plan alignment must be a power of two, not {align}"
        )));
    }
    let p = search::plan_items(items, align, opts);
    if p.peak > u64::MAX as u128 {
        return Err(Error::InvalidSize(format!(
            "the plan of {} items reaches {} bytes, past 2^64",
            items.len(),
            p.peak
        )));
    }
    Ok(Plan {
        offsets: p.offsets.iter().map(|&o| o as u64).collect(),
        peak: p.peak as u64,
        bound: sat(p.bound),
        exhausted: p.exhausted,
    })
}

/// The bound alone (O(n log n)): the peak of live bytes, each item's size rounded up to
/// `align` (a power of two; others are taken as the next one), saturating at `u64::MAX`.
pub fn bound(items: &[Item], align: u64) -> u64 {
    let align = align.max(1).checked_next_power_of_two().unwrap_or(1 << 63);
    sat(bound::Norm::new(items, align).bound)
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}
