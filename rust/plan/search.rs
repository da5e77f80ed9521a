//! The orders each group is placed in, the budget they share, and the search at the peak.
//!
//! The greedy orders are those the literature on static memory planning finds best (sizes
//! descending, lifetimes longest first, size × lifetime: TFLite's and MLIR's "greedy by
//! size", the orders TelaMalloc starts from), each with first fit, sizes also with best fit,
//! and size classes (of 2x and 4x) each in time order or longest-lived first,
//! which is what packs a decode trace's many small allocations (`docs/plan.md`). The search
//! then repeats the best order with the items that reach its peak moved
//! halfway to the front (so they are placed before the items that pushed them up), keeping
//! the best placement seen: a "squeaky wheel" search, bounded by `Options::rounds` and the
//! budget, that stops at the bound or after [`PATIENCE`] rounds without a lower peak.

use std::cmp::Reverse;

use super::bound::{live_peak, overlapping_pairs, It, Norm};
use super::place::{fits_u64, Fit, Placement, Placer};
use super::split::{split, Group};
use super::stack;
use super::sweep::sweep;
use super::{Item, Options};

/// A group this large gets the time-order plan only (the placer's arena counts in `u32`).
const MAX_GREEDY: usize = 50_000_000;

/// The search at the peak stops after this many rounds in a row find no lower peak. On the
/// corpus no round lowers the best order's peak at all (`benches/plan.py`), and on the decode
/// traces each round costs what a whole greedy placement of 80,000 items does.
const PATIENCE: u32 = 2;

/// The search under a target (`stack.rs`) may do this fraction of the budget's work, over
/// and above it, shared by the groups (on the decode traces, hundreds of groups above their
/// bound where it finds nothing lower, it costs at most a quarter of a second).
const SEARCH_SHARE: u64 = 16;

/// A plan in 128 bits (`peak` may exceed `u64::MAX` for hostile sizes).
pub struct Raw {
    pub offsets: Vec<u128>,
    pub peak: u128,
    pub bound: u128,
}

pub fn plan_items(items: &[Item], align: u64, opts: &Options) -> Raw {
    let norm = Norm::new(items, align);
    let its = &norm.items;
    let mut offsets = vec![0u128; its.len()];
    let root: Vec<u32> = (0..its.len() as u32)
        .filter(|&i| its[i as usize].size > 0)
        .collect();
    let mut groups: Vec<(u64, Group)> = split(its, &mut offsets, root)
        .into_iter()
        .map(|g| (overlapping_pairs(its, &g.idx), g))
        .collect();
    // the cheapest groups first, so that one huge group cannot starve the others of budget
    groups.sort_by_key(|(pairs, g)| (*pairs, g.idx.first().copied()));
    let mut budget = opts.budget;
    let mut search = opts.budget / SEARCH_SHARE;
    for (pairs, g) in &groups {
        let local = localise(its, &g.idx);
        let p = solve(
            &local,
            pairs.saturating_add(local.len() as u64),
            &mut budget,
            &mut search,
            opts.rounds,
        );
        for (k, &i) in g.idx.iter().enumerate() {
            offsets[i as usize] = g.base + p.offsets[k];
        }
    }
    let peak = its
        .iter()
        .zip(&offsets)
        .map(|(it, &o)| if it.size > 0 { o + it.size } else { 0 })
        .max();
    Raw {
        offsets,
        peak: peak.unwrap_or(0),
        bound: norm.bound,
    }
}

/// The items of a group with their instants ranked again from 0 (a small tree per group).
fn localise(its: &[It], idx: &[u32]) -> Vec<It> {
    let mut t: Vec<u32> = idx
        .iter()
        .flat_map(|&i| [its[i as usize].s, its[i as usize].e])
        .collect();
    t.sort_unstable();
    t.dedup();
    let rank = |x: u32| t.partition_point(|&y| y < x) as u32;
    idx.iter()
        .map(|&i| {
            let it = its[i as usize];
            It {
                size: it.size,
                s: rank(it.s),
                e: rank(it.e),
            }
        })
        .collect()
}

/// The best placement of one group found within the budget; `cost` is what one greedy
/// placement of it costs at most, `search` what is left for the search under a target.
fn solve(items: &[It], cost: u64, budget: &mut u64, search: &mut u64, rounds: u32) -> Placement {
    let all: Vec<u32> = (0..items.len() as u32).collect();
    let bound = live_peak(items, &all);
    let mut best = sweep(items);
    if best.peak == bound || items.len() > MAX_GREEDY || *budget < cost || !fits_u64(items) {
        return best;
    }
    let mut placer = Placer::new(items);
    let mut greedy: Option<(Vec<u32>, Fit, Placement)> = None;
    for (order, fit) in orders(items) {
        if *budget < cost {
            break;
        }
        let limit = greedy.as_ref().map_or(u128::MAX, |g| g.2.peak);
        let mut work = 0;
        let got = placer.place(&order, fit, limit, &mut work);
        *budget = budget.saturating_sub(work);
        if let Some(p) = got {
            let done = p.peak == bound;
            greedy = Some((order, fit, p));
            if done {
                break;
            }
        }
    }
    let Some((mut order, fit, mut cur)) = greedy else {
        return best;
    };
    if cur.peak < best.peak {
        best = Placement {
            offsets: cur.offsets.clone(),
            peak: cur.peak,
        };
    }
    let mut stale = 0;
    for _ in 0..rounds {
        if best.peak == bound || *budget < cost || stale >= PATIENCE {
            break;
        }
        order = promote(items, &order, &cur);
        let mut work = 0;
        let got = placer.place(&order, fit, u128::MAX, &mut work);
        *budget = budget.saturating_sub(work);
        let Some(p) = got else { break };
        if p.peak < best.peak {
            best = Placement {
                offsets: p.offsets.clone(),
                peak: p.peak,
            };
            stale = 0;
        } else {
            stale += 1;
        }
        cur = p;
    }
    stack::improve(items, bound, &mut best, search);
    best
}

/// `order` with each item that reaches `p`'s peak moved to half its position (ahead of the
/// item it lands on there), the others keeping their order.
fn promote(items: &[It], order: &[u32], p: &Placement) -> Vec<u32> {
    let mut keyed: Vec<(usize, u32)> = order
        .iter()
        .enumerate()
        .map(|(pos, &x)| {
            let at_peak = p.offsets[x as usize] + items[x as usize].size == p.peak;
            (if at_peak { 2 * (pos / 2) } else { 2 * pos + 1 }, x)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, x)| x).collect()
}

/// The greedy orders, each with its fit, best first on the corpus.
fn orders(items: &[It]) -> Vec<(Vec<u32>, Fit)> {
    fn by<K: Ord>(items: &[It], key: impl Fn(&It) -> K) -> Vec<u32> {
        let mut o: Vec<u32> = (0..items.len() as u32).collect();
        o.sort_by_key(|&i| (key(&items[i as usize]), i));
        o
    }
    let len = |it: &It| (it.e - it.s) as u128;
    let size = by(items, |it| (Reverse(it.size), Reverse(len(it)), it.s));
    let life = by(items, |it| (Reverse(len(it)), Reverse(it.size), it.s));
    let area = by(items, |it| {
        (Reverse(it.size * len(it)), Reverse(it.size), it.s)
    });
    // size classes, largest first: within a class in time order (classes of 2x, 4x and 64x)
    // or longest-lived first (2x); what packs the decode traces' many small allocations
    let octave = |it: &It| 128 - it.size.leading_zeros();
    let class = by(items, |it| (Reverse(octave(it)), it.s));
    let class4 = by(items, |it| (Reverse(octave(it) / 2), it.s));
    let class64 = by(items, |it| (Reverse(octave(it) / 6), it.s));
    let class_life = by(items, |it| (Reverse(octave(it)), Reverse(len(it)), it.s));
    // the orders best on the corpus first, so that a placement of a later order stops as
    // soon as it is worse than the best yet
    vec![
        (class4, Fit::First),
        (class, Fit::First),
        (class_life, Fit::First),
        (class64, Fit::First),
        (size.clone(), Fit::First),
        (size, Fit::Best),
        (life, Fit::First),
        (area, Fit::First),
    ]
}
