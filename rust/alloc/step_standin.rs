//! STAND-IN, TO BE DELETED when branch `plan` is merged: a private copy of the interface of
//! `crate::plan` (docs: /work/notes/PLAN_API.md) so that the step pool builds before the
//! offline planner lands. Greedy by size: largest first, each at the lowest offset free of the
//! items already placed whose lifetimes overlap its own.

/// One allocation to place: its size and its lifetime [start, end) in request order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub size: u64,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub offsets: Vec<u64>,
    pub peak: u64,
    pub bound: u64,
}

fn round_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

/// Places every item (see the module comment); `align` a power of two >= 1.
pub fn plan(items: &[Item], align: u64) -> Plan {
    let align = align.max(1);
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].size), items[i].start, i));
    let mut offsets = vec![0u64; items.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(items.len());
    let mut peak = 0;
    for &i in &order {
        let it = items[i];
        let len = round_up(it.size, align);
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| items[j].start < it.end && it.start < items[j].end)
            .map(|&j| (offsets[j], offsets[j] + round_up(items[j].size, align)))
            .collect();
        busy.sort_unstable();
        let mut at = 0;
        for (s, e) in busy {
            if s >= at + len {
                break;
            }
            at = at.max(e);
        }
        offsets[i] = at;
        peak = peak.max(at + len);
        placed.push(i);
    }
    // the bound: the peak of live aligned bytes
    let mut ev: Vec<(u64, i64)> = Vec::with_capacity(2 * items.len());
    for it in items {
        let len = round_up(it.size, align) as i64;
        ev.push((it.start, len));
        ev.push((it.end, -len));
    }
    ev.sort_unstable_by_key(|&(t, d)| (t, d));
    let (mut live, mut bound) = (0i64, 0i64);
    for (_, d) in ev {
        live += d;
        bound = bound.max(live);
    }
    Plan {
        offsets,
        peak,
        bound: bound as u64,
    }
}
