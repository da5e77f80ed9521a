//! Items as the planner works on them: sizes rounded up to the alignment in 128 bits (no
//! size can overflow), lifetimes as ranks of the distinct instants (`u32`: two per item), and
//! the bound, the peak of live aligned bytes.

use super::Item;

/// An item, normalised: `size` a multiple of the alignment, lifetime `[s, e)` in ranks with
/// `s < e`. Two items overlap in time iff `a.s < b.e && b.s < a.e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct It {
    pub size: u128,
    pub s: u32,
    pub e: u32,
}

pub struct Norm {
    pub items: Vec<It>,
    pub bound: u128,
}

/// `size` rounded up to `align` (a power of two), in 128 bits. Example: 1000 at 512 is 1024.
pub fn round_up(size: u64, align: u64) -> u128 {
    let a = align as u128;
    (size as u128).div_ceil(a) * a
}

impl Norm {
    pub fn new(items: &[Item], align: u64) -> Norm {
        // An empty lifetime [s, s) becomes [s, s + 1): in 128 bits, so u64::MAX has a next.
        let span = |it: &Item| {
            let s = it.start as u128;
            let e = if it.end > it.start {
                it.end as u128
            } else {
                s + 1
            };
            (s, e)
        };
        let mut instants: Vec<u128> = Vec::with_capacity(items.len() * 2);
        for it in items {
            let (s, e) = span(it);
            instants.push(s);
            instants.push(e);
        }
        instants.sort_unstable();
        instants.dedup();
        let rank = |t: u128| instants.partition_point(|&x| x < t) as u32;
        let norm: Vec<It> = items
            .iter()
            .map(|it| {
                let (s, e) = span(it);
                It {
                    size: round_up(it.size, align),
                    s: rank(s),
                    e: rank(e),
                }
            })
            .collect();
        let idx: Vec<u32> = (0..norm.len() as u32).collect();
        let bound = live_peak(&norm, &idx);
        Norm { items: norm, bound }
    }
}

/// The peak of live bytes of the items `idx` names: a sweep over their starts and ends, the
/// ends of an instant before its starts (lifetimes are half open).
pub fn live_peak(items: &[It], idx: &[u32]) -> u128 {
    let mut ev: Vec<(u32, bool, u32)> = Vec::with_capacity(idx.len() * 2);
    for &i in idx {
        let it = &items[i as usize];
        ev.push((it.s, true, i));
        ev.push((it.e, false, i));
    }
    ev.sort_unstable();
    let (mut cur, mut peak) = (0u128, 0u128);
    for (_, starts, i) in ev {
        let size = items[i as usize].size;
        if starts {
            cur += size;
            peak = peak.max(cur);
        } else {
            cur -= size;
        }
    }
    peak
}

/// How many pairs of the items `idx` overlap in time (what a greedy placement of them looks
/// at in all, whatever the order), saturating.
pub fn overlapping_pairs(items: &[It], idx: &[u32]) -> u64 {
    let mut ev: Vec<(u32, bool)> = Vec::with_capacity(idx.len() * 2);
    for &i in idx {
        let it = &items[i as usize];
        ev.push((it.s, true));
        ev.push((it.e, false));
    }
    ev.sort_unstable();
    let (mut live, mut pairs) = (0u64, 0u64);
    for (_, starts) in ev {
        if starts {
            pairs = pairs.saturating_add(live);
            live += 1;
        } else {
            live -= 1;
        }
    }
    pairs
}
