//! Two tiers of pool statistics: counters kept current by every operation, and on demand a
//! walk (`stats`: fragmentation, page kinds, live sizes) and a page picture (`page_snapshot`);
//! the full check is in `validate.rs`.

use super::bins::{bin_lower, bin_of, NUM_BINS};
use super::*;

/// An HDR-style latency histogram: the bins of [`bin_of`] over nanoseconds, so every
/// recorded value is known to within 6.25 %.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; NUM_BINS],
            n: 0,
            sum: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, ns: u64) {
        self.counts[bin_of(ns.min(u32::MAX as u64) as u32)] += 1;
        self.n += 1;
        self.sum += ns;
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bin that holds it.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let lo = bin_lower(b) as f64;
                let hi = if b + 1 < NUM_BINS {
                    bin_lower(b + 1) as f64
                } else {
                    lo
                };
                return (lo + hi) / 2.0;
            }
        }
        unreachable!("rank within count")
    }
}

/// A picture of a pool. Bytes unless named otherwise.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolStats {
    pub page_size: u64,
    /// Sum of requested sizes of live allocations.
    pub live_bytes: u64,
    /// Rounded sizes of live and freeing allocations.
    pub used_bytes: u64,
    /// Rounded sizes of allocations freed on a stream whose fence has not completed.
    pub freeing_bytes: u64,
    /// Pages the pool holds from the device.
    pub reserved_bytes: u64,
    /// `reserved - used`.
    pub free_bytes: u64,
    pub peak_live: u64,
    pub peak_used: u64,
    pub peak_reserved: u64,
    /// The longest physically contiguous free range in the pool.
    pub largest_free_run: u64,
    /// `1 - largest_free_run / free_bytes` (0 when nothing is free).
    pub fragmentation: f64,
    /// The largest request the pool can serve from the pages it holds, without growing:
    /// every free page stitched, plus the largest free page end and start as head and tail
    /// (or the largest free block, if larger). Free space inside partly used pages beyond
    /// that is what a smaller page size (or `defrag`) would recover.
    pub largest_request: u64,
    pub allocs: u64,
    pub frees: u64,
    pub failures: u64,
    /// `allocs / (allocs + failures)` (1 when nothing was asked).
    pub success_rate: f64,
    pub reused: u64,
    /// Requests served by a block of exactly their size kept from a recent free (see
    /// `cache.rs`), and the freed allocations kept there now (their memory counts as free).
    pub cache_hits: u64,
    pub cached_allocs: u64,
    pub stitched: u64,
    pub live_allocs: u64,
    pub pending_frees: u64,
    /// Pages in the free runs (whole free pages inside large segments are not counted here:
    /// they are in `large_free_bytes`, and in `largest_request`, since a request that needs
    /// them reclaims them).
    pub pages_free: u64,
    pub pages_heap: u64,
    /// Pages of large segments.
    pub pages_large: u64,
    pub pages_full: u64,
    /// Free bytes inside heap pages and inside large segments.
    pub heap_free_bytes: u64,
    pub large_free_bytes: u64,
    pub pages_taken: u64,
    pub pages_released: u64,
    pub latency_samples: u64,
    pub latency_mean_ns: f64,
    pub latency_p50_ns: f64,
    pub latency_p99_ns: f64,
    /// Live allocations by size class: (largest size in the class, count, requested bytes),
    /// classes are powers of two from 256 B.
    pub live_by_size: Vec<(u64, u64, u64)>,
    /// Requests of steps served from a plan (`step.rs`); requests of served steps that took
    /// the normal path instead (a departure from the plan, or a planned slot not yet safe);
    /// plans dropped for missing; the bytes of the plan's arena now (counted in `used_bytes`).
    pub plan_hits: u64,
    pub plan_misses: u64,
    pub plan_rebuilds: u64,
    pub plan_arena_bytes: u64,
    /// The planner's lower bound for that arena (the peak of its entries' live bytes).
    pub plan_bound_bytes: u64,
}

impl Pool {
    /// Whether a block holds memory of an allocation (not free, not kept in the size
    /// cache, whose memory counts as free).
    pub(super) fn holds(&self, blk: &Block) -> bool {
        !blk.free && self.allocs[blk.owner() as usize].state != State::Cached
    }

    /// For each page, the slot of the stitched allocation it is a middle page of (NIL if none).
    pub(super) fn full_owners(&self) -> Vec<u32> {
        let mut owner = vec![NIL; self.pages.len()];
        for (a, x) in self.allocs.iter().enumerate() {
            if let Layout::Stitched(i) = x.layout {
                for &(s, l) in &self.stitches[i as usize].runs {
                    for p in s..s + l {
                        owner[p as usize] = a as u32;
                    }
                }
            }
        }
        owner
    }

    pub fn stats(&self) -> PoolStats {
        let c = &self.counters;
        let ps = self.cfg.page_size;
        let mut s = PoolStats {
            page_size: ps,
            live_bytes: c.live_bytes,
            used_bytes: c.used_bytes,
            freeing_bytes: c.freeing_bytes,
            reserved_bytes: c.reserved_bytes,
            free_bytes: c.reserved_bytes - c.used_bytes,
            peak_live: c.peak_live,
            peak_used: c.peak_used,
            peak_reserved: c.peak_reserved,
            allocs: c.allocs,
            frees: c.frees,
            failures: c.failures,
            success_rate: if c.allocs + c.failures == 0 {
                1.0
            } else {
                c.allocs as f64 / (c.allocs + c.failures) as f64
            },
            reused: c.reused,
            cache_hits: c.cache_hits,
            cached_allocs: self.cache.len() as u64,
            stitched: c.stitched,
            pages_taken: c.pages_taken,
            pages_released: c.pages_released,
            latency_samples: self.latency.len(),
            latency_mean_ns: self.latency.mean(),
            latency_p50_ns: self.latency.quantile(0.5),
            latency_p99_ns: self.latency.quantile(0.99),
            plan_hits: self.steps.hits,
            plan_misses: self.steps.misses,
            plan_rebuilds: self.steps.rebuilds,
            plan_arena_bytes: self.steps.plan.as_ref().map_or(0, |p| p.bytes),
            plan_bound_bytes: self.steps.plan.as_ref().map_or(0, |p| p.bound),
            ..PoolStats::default()
        };
        s.pages_free = self.free_pages.free_units();
        // (the covered pages of the heap segment last seen that are still to come)
        let mut heap_covered = 0u32;
        for (p, &kind) in self.pages.iter().enumerate() {
            match kind {
                PageKind::Absent => {}
                PageKind::Owned => s.pages_full += 1,
                PageKind::Heap => {
                    let (n, used) = self.segment_usage(p as u32);
                    s.pages_heap += 1;
                    heap_covered = n - 1;
                    let free = (n << self.gshift) - used;
                    s.heap_free_bytes += free as u64 * GRANULE;
                }
                PageKind::Covered if heap_covered > 0 => {
                    heap_covered -= 1;
                    s.pages_heap += 1;
                }
                PageKind::Large | PageKind::Covered => s.pages_large += 1,
            }
        }
        s.pages_full -= s.pages_free;
        // Free ranges in physical order, merged where they touch.
        let mut free: Vec<(u64, u64)> = self
            .free_pages
            .runs()
            .into_iter()
            .map(|(p, n)| ((p as u64) * ps, n as u64 * ps))
            .collect();
        // What a stitched request could use once the whole free pages inside segments are
        // reclaimed: those pages, the largest head (a free block ending at a page boundary
        // that ends its segment, or would once reclaimed), the largest tail likewise.
        let (mut head, mut tail, mut block, mut inner) = (0u64, 0u64, 0u64, 0u64);
        let pg = self.pg as u64;
        for blk in &self.blocks {
            if blk.page != NIL && !self.holds(blk) {
                let len = blk.len as u64 * GRANULE;
                block = block.max(len);
                let g0 = self.start_of(blk);
                let g1 = g0 + blk.len as u64;
                let (p0, p1) = (g0.div_ceil(pg), g1 / pg);
                if blk.heap {
                    // whole free pages of a heap segment go back as a large segment's do
                    inner += p1.saturating_sub(p0);
                } else {
                    s.large_free_bytes += len;
                    if p1 > p0 {
                        inner += p1 - p0;
                        head = head.max((p0 * pg - g0) * GRANULE);
                        tail = tail.max((g1 - p1 * pg) * GRANULE);
                    } else if blk.next == NIL {
                        head = head.max(len);
                    } else if blk.prev == NIL {
                        tail = tail.max(len);
                    }
                }
                free.push((
                    blk.page as u64 * ps + blk.off as u64 * GRANULE,
                    blk.len as u64 * GRANULE,
                ));
            }
        }
        free.sort_unstable();
        let (mut best, mut cur_start, mut cur_len) = (0u64, 0u64, 0u64);
        for (start, len) in free {
            if cur_len > 0 && cur_start + cur_len == start {
                cur_len += len;
            } else {
                cur_start = start;
                cur_len = len;
            }
            best = best.max(cur_len);
        }
        s.largest_free_run = best;
        s.largest_request = ((s.pages_free + inner) * ps + head + tail)
            .max(block)
            .max(best);
        s.fragmentation = if s.free_bytes == 0 {
            0.0
        } else {
            1.0 - best as f64 / s.free_bytes as f64
        };
        let mut classes: Vec<(u64, u64, u64)> = Vec::new();
        for x in &self.allocs {
            match x.state {
                State::Live => s.live_allocs += 1,
                State::Freeing => {
                    s.pending_frees += 1;
                    continue;
                }
                State::Vacant | State::Group | State::Cached => continue,
            }
            let upper = x.size.next_power_of_two().max(GRANULE);
            match classes.iter_mut().find(|c| c.0 == upper) {
                Some(c) => {
                    c.1 += 1;
                    c.2 += x.size;
                }
                None => classes.push((upper, 1, x.size)),
            }
        }
        classes.sort_unstable();
        s.live_by_size = classes;
        s
    }

    /// The members of the uncut batch record whose block is `b`, if there is one.
    pub(super) fn uncut_members(&self, b: u32) -> Option<&[(u64, u32)]> {
        self.batches
            .iter()
            .find(|r| r.shape == Record::Uncut(b))
            .map(|r| &r.members[..])
    }
}

/// One page of a pool snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageSnapshot {
    /// Physical address of the page.
    pub addr: u64,
    /// "free", "heap", "large" or "full".
    pub kind: &'static str,
    /// Heap and large pages: (offset in the page, bytes, owning allocation's pointer or None
    /// when free). Full pages: one entry covering the page.
    pub blocks: Vec<(u64, u64, Option<u64>)>,
}

impl Pool {
    /// Every page the pool holds, in address order, with what is in it (a fragmentation
    /// picture; the replay tools turn it into PyTorch's snapshot layout).
    pub fn page_snapshot(&self) -> Vec<PageSnapshot> {
        let ps = self.cfg.page_size;
        let pg = self.pg as u64;
        let owners = self.full_owners();
        let mut out = Vec::new();
        for (p, &kind) in self.pages.iter().enumerate() {
            let addr = p as u64 * ps;
            let (kind, blocks) = match kind {
                // listed with the first page of their segment
                PageKind::Absent | PageKind::Covered => continue,
                PageKind::Owned if owners[p] == NIL => ("free", vec![(0, ps, None)]),
                PageKind::Owned => (
                    "full",
                    vec![(0, ps, Some(self.allocs[owners[p] as usize].ptr))],
                ),
                PageKind::Heap | PageKind::Large => {
                    let kind = if kind == PageKind::Heap {
                        "heap"
                    } else {
                        "large"
                    };
                    // A segment is listed page by page, its blocks cut at page boundaries.
                    let mut pages: Vec<PageSnapshot> = Vec::new();
                    for b in self.page_blocks(p as u32) {
                        let blk = &self.blocks[b as usize];
                        let start = self.start_of(blk);
                        // an uncut batch block: its members' ranges, each its own owner
                        let parts: Vec<(u64, u64, Option<u64>)> =
                            match (!blk.free).then(|| self.uncut_members(b)).flatten() {
                                Some(members) => members
                                    .iter()
                                    .map(|&(ptr, a)| (self.allocs[a as usize].units(), Some(ptr)))
                                    .scan(start, |g, (units, owner)| {
                                        *g += units;
                                        Some((*g - units, *g, owner))
                                    })
                                    .collect(),
                                None => vec![(
                                    start,
                                    start + blk.len as u64,
                                    self.holds(blk)
                                        .then(|| self.allocs[blk.owner() as usize].ptr),
                                )],
                            };
                        for (mut g, end, owner) in parts {
                            while g < end {
                                let q = g / pg;
                                let cut = end.min((q + 1) * pg);
                                if pages.last().is_none_or(|l| l.addr != q * ps) {
                                    pages.push(PageSnapshot {
                                        addr: q * ps,
                                        kind,
                                        blocks: Vec::new(),
                                    });
                                }
                                let entry = pages.last_mut().expect("just pushed");
                                let (off, len) = ((g - q * pg) * GRANULE, (cut - g) * GRANULE);
                                match entry.blocks.last_mut() {
                                    // free memory is listed as free ranges: a cached block and the
                                    // free block beside it are one range (as once merged)
                                    Some((o, l, None)) if owner.is_none() && *o + *l == off => {
                                        *l += len
                                    }
                                    _ => entry.blocks.push((off, len, owner)),
                                }
                                g = cut;
                            }
                        }
                    }
                    out.extend(pages);
                    continue;
                }
            };
            out.push(PageSnapshot { addr, kind, blocks });
        }
        out
    }
}
