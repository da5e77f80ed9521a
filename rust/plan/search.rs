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
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

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
    /// the group that sets the peak got no greedy placement: the budget ran out first
    pub exhausted: bool,
}

pub fn plan_items(items: &[Item], align: u64, opts: &Options) -> Raw {
    let norm = Norm::new(items, align);
    let its = &norm.items;
    let mut offsets = vec![0u128; its.len()];
    let root: Vec<u32> = (0..its.len() as u32)
        .filter(|&i| its[i as usize].size > 0)
        .collect();
    // every group gets the time-order plan first (O(n log n) each); a group the same as one
    // before it (a training step repeated with the same tensors: the same sizes and
    // lifetimes, ranked from its start, over the same base) is planned once, as that one
    let mut groups: Vec<Planned> = Vec::new();
    let mut twins: Vec<(Group, usize)> = Vec::new();
    let mut seen: HashMap<u64, Vec<usize>> = HashMap::new();
    for g in split(its, &mut offsets, root) {
        let local = localise(its, &g.idx);
        let key = {
            let mut h = DefaultHasher::new();
            (g.base, &local).hash(&mut h);
            h.finish()
        };
        let same = seen.entry(key).or_default();
        if let Some(&k) = same
            .iter()
            .find(|&&k| groups[k].g.base == g.base && groups[k].local == local)
        {
            twins.push((g, k));
            continue;
        }
        same.push(groups.len());
        let all: Vec<u32> = (0..local.len() as u32).collect();
        let bound = live_peak(&local, &all);
        let best = sweep(&local);
        let cost = overlapping_pairs(its, &g.idx).saturating_add(local.len() as u64);
        groups.push(Planned {
            g,
            local,
            bound,
            best,
            cost,
            stage: Stage::Sweep,
            greedy: None,
            starved: false,
        });
    }
    // the plan's peak is the highest group's, so the budget goes to the group that sets it:
    // its first greedy order (the best on the corpus), then, if it still sets the peak, the
    // other orders and the searches; then to the group that sets it next. It stops at a
    // searched group (it cannot go lower) or at the highest of the groups' bounds (no
    // group's plan takes the peak below that). A group that never sets the peak keeps its
    // time-order plan.
    let floor = groups.iter().map(|p| p.g.base + p.bound).max().unwrap_or(0);
    let mut budget = opts.budget;
    let mut search = opts.budget / SEARCH_SHARE;
    while let Some(top) = groups
        .iter_mut()
        .max_by_key(|p| (p.g.base + p.best.peak, Reverse(p.cost)))
    {
        if top.g.base + top.best.peak <= floor {
            break;
        }
        match top.stage {
            Stage::Sweep => {
                top.stage = Stage::First;
                top.starved = budget < top.cost;
                top.greedy = first_greedy(&top.local, top.cost, &mut budget);
                if let Some((_, _, p)) = &top.greedy {
                    if p.peak < top.best.peak {
                        top.best = Placement {
                            offsets: p.offsets.clone(),
                            peak: p.peak,
                        };
                    }
                }
            }
            Stage::First => {
                top.stage = Stage::Searched;
                let best = std::mem::take(&mut top.best);
                let ctx = Group1 {
                    items: &top.local,
                    bound: top.bound,
                    cost: top.cost,
                };
                top.best = solve(
                    ctx,
                    best,
                    top.greedy.take(),
                    &mut budget,
                    &mut search,
                    opts.rounds,
                );
            }
            Stage::Searched => break,
        }
    }
    let placed = groups
        .iter()
        .map(|p| (&p.g, &p.best))
        .chain(twins.iter().map(|(g, k)| (g, &groups[*k].best)));
    for (g, best) in placed {
        for (k, &i) in g.idx.iter().enumerate() {
            offsets[i as usize] = g.base + best.offsets[k];
        }
    }
    let peak = its
        .iter()
        .zip(&offsets)
        .map(|(it, &o)| if it.size > 0 { o + it.size } else { 0 })
        .max()
        .unwrap_or(0);
    let exhausted = groups
        .iter()
        .any(|p| p.starved && p.g.base + p.best.peak == peak);
    Raw {
        offsets,
        peak,
        bound: norm.bound,
        exhausted,
    }
}

/// One group, its items ranked again from 0, its bound, its best placement yet, what one
/// greedy placement of it costs, and how far its planning has gone.
struct Planned {
    g: Group,
    local: Vec<It>,
    bound: u128,
    best: Placement,
    cost: u64,
    stage: Stage,
    /// the first greedy order's placement, for the search to go on from
    greedy: Option<Greedy>,
    /// its turn came when the budget could not pay for one greedy placement
    starved: bool,
}

/// How far a group's planning has gone: the time-order plan, the first greedy order, the
/// other orders and the searches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Sweep,
    First,
    Searched,
}

/// A greedy placement and the order and fit that made it.
type Greedy = (Vec<u32>, Fit, Placement);

/// What [`solve`] needs of a group besides its placements.
struct Group1<'a> {
    items: &'a [It],
    bound: u128,
    cost: u64,
}

/// The first greedy order of a group (the best on the corpus), if the budget allows it.
fn first_greedy(items: &[It], cost: u64, budget: &mut u64) -> Option<Greedy> {
    if items.len() > MAX_GREEDY || *budget < cost || !fits_u64(items) {
        return None;
    }
    let (order, fit) = order(items, 0)?;
    let mut work = 0;
    let got = Placer::new(items).place(&order, fit, u128::MAX, &mut work);
    *budget = budget.saturating_sub(work);
    got.map(|p| (order, fit, p))
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

/// The best placement of one group found within the budget, from its best placement yet
/// `best` and its first greedy order's `greedy` (the other orders are tried after it);
/// `search` is what is left for the search under a target.
fn solve(
    g: Group1,
    mut best: Placement,
    mut greedy: Option<Greedy>,
    budget: &mut u64,
    search: &mut u64,
    rounds: u32,
) -> Placement {
    let Group1 { items, bound, cost } = g;
    if best.peak == bound || items.len() > MAX_GREEDY || *budget < cost || !fits_u64(items) {
        return best;
    }
    let mut placer = Placer::new(items);
    for k in usize::from(greedy.is_some())..ORDERS {
        if *budget < cost || greedy.as_ref().is_some_and(|g| g.2.peak == bound) {
            break;
        }
        let Some((order, fit)) = order(items, k) else {
            break;
        };
        let limit = greedy.as_ref().map_or(u128::MAX, |g| g.2.peak);
        let mut work = 0;
        let got = placer.place(&order, fit, limit, &mut work);
        *budget = budget.saturating_sub(work);
        if let Some(p) = got {
            greedy = Some((order, fit, p));
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

/// How many greedy orders [`order`] has.
const ORDERS: usize = 8;

/// The `k`-th greedy order with its fit (None past the last), best first on the corpus, so
/// that a placement of a later order stops as soon as it is worse than the best yet; each
/// is sorted only when asked for.
fn order(items: &[It], k: usize) -> Option<(Vec<u32>, Fit)> {
    fn by<K: Ord>(items: &[It], key: impl Fn(&It) -> K) -> Vec<u32> {
        let mut o: Vec<u32> = (0..items.len() as u32).collect();
        o.sort_by_key(|&i| (key(&items[i as usize]), i));
        o
    }
    let len = |it: &It| (it.e - it.s) as u128;
    // size classes, largest first: within a class in time order (classes of 2x, 4x and 64x)
    // or longest-lived first (2x); what packs the decode traces' many small allocations
    let octave = |it: &It| 128 - it.size.leading_zeros();
    let size = |it: &It| (Reverse(it.size), Reverse(len(it)), it.s);
    Some(match k {
        0 => (by(items, |it| (Reverse(octave(it) / 2), it.s)), Fit::First),
        1 => (by(items, |it| (Reverse(octave(it)), it.s)), Fit::First),
        2 => (
            by(items, |it| (Reverse(octave(it)), Reverse(len(it)), it.s)),
            Fit::First,
        ),
        3 => (by(items, |it| (Reverse(octave(it) / 6), it.s)), Fit::First),
        4 => (by(items, size), Fit::First),
        5 => (by(items, size), Fit::Best),
        6 => (
            by(items, |it| (Reverse(len(it)), Reverse(it.size), it.s)),
            Fit::First,
        ),
        7 => (
            by(items, |it| {
                (Reverse(it.size * len(it)), Reverse(it.size), it.s)
            }),
            Fit::First,
        ),
        _ => return None,
    })
}
