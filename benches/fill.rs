//! Fragmentation as performance (issue 7): fill an 80 GiB device with log-uniform sizes from
//! 256 B to 64 MiB, freeing a random live allocation with probability 0.45 at each step, and
//! report the bytes in use at the first failure (higher is better), for gpumm and its peers,
//! on the same random stream. Then the memory each needs for the churn stream of the peer
//! bench (benches/peers.rs): the smallest device on which it serves the whole stream (lower
//! is better). Run: `cargo bench --no-default-features --bench fill`.
//!
//! `FILL_SEEDS=1-40` fills over other seeds (default 1-3) and `FILL_ONLY=gpumm` keeps the rows
//! whose name holds the text (and skips the smallest devices): three seeds tell a change
//! that moves the fill from one that moves where a seed's first failure falls.

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use rand::{rngs::StdRng, Rng, SeedableRng};

use _core::alloc::{Pool, PoolConfig, Request};
use _core::replay::{model_by_name, CachingOptions};
use common::{G, K, M};

const CAP: u64 = 80 * G;

trait Filler {
    /// Returns a handle, or None at the first failure.
    fn alloc(&mut self, size: u64) -> Option<u64>;
    fn free(&mut self, h: u64);
}

/// gpumm's pool, its allocations made movable or not.
struct Gpumm(Pool, Vec<_core::alloc::AllocId>, bool);
impl Filler for Gpumm {
    fn alloc(&mut self, size: u64) -> Option<u64> {
        let (id, _) = self
            .0
            .alloc(Request {
                size,
                movable: self.2,
                ..Request::default()
            })
            .ok()?;
        self.1.push(id);
        Some(self.1.len() as u64 - 1)
    }
    fn free(&mut self, h: u64) {
        self.0.free(self.1[h as usize]).unwrap();
    }
}

struct Offset(
    offset_allocator::Allocator,
    Vec<offset_allocator::Allocation>,
);
impl Filler for Offset {
    fn alloc(&mut self, size: u64) -> Option<u64> {
        let a = self.0.allocate(size.div_ceil(256) as u32)?;
        self.1.push(a);
        Some(self.1.len() as u64 - 1)
    }
    fn free(&mut self, h: u64) {
        self.0.free(self.1[h as usize]);
    }
}

/// A plain coalescing best fit over one contiguous range (a sorted free map).
struct BestFit {
    by_addr: BTreeMap<u64, u64>,
    by_size: std::collections::BTreeSet<(u64, u64)>,
    live: Vec<(u64, u64)>,
}
impl BestFit {
    fn new(cap: u64) -> Self {
        let mut b = BestFit {
            by_addr: BTreeMap::new(),
            by_size: Default::default(),
            live: vec![],
        };
        b.by_addr.insert(0, cap);
        b.by_size.insert((cap, 0));
        b
    }
}
impl Filler for BestFit {
    fn alloc(&mut self, size: u64) -> Option<u64> {
        let size = size.div_ceil(256) * 256;
        let &(len, addr) = self.by_size.range((size, 0)..).next()?;
        self.by_size.remove(&(len, addr));
        self.by_addr.remove(&addr);
        if len > size {
            self.by_addr.insert(addr + size, len - size);
            self.by_size.insert((len - size, addr + size));
        }
        self.live.push((addr, size));
        Some(self.live.len() as u64 - 1)
    }
    fn free(&mut self, h: u64) {
        let (mut addr, mut len) = self.live[h as usize];
        if let Some((&na, &nl)) = self.by_addr.range(addr + len..).next() {
            if na == addr + len {
                self.by_addr.remove(&na);
                self.by_size.remove(&(nl, na));
                len += nl;
            }
        }
        if let Some((&pa, &pl)) = self.by_addr.range(..addr).next_back() {
            if pa + pl == addr {
                self.by_addr.remove(&pa);
                self.by_size.remove(&(pl, pa));
                addr = pa;
                len += pl;
            }
        }
        self.by_addr.insert(addr, len);
        self.by_size.insert((len, addr));
    }
}

struct Model(Box<dyn _core::replay::Model>, u32);
impl Filler for Model {
    fn alloc(&mut self, size: u64) -> Option<u64> {
        self.1 += 1;
        self.0.alloc(self.1, size, 0).map(|_| self.1 as u64)
    }
    fn free(&mut self, h: u64) {
        self.0.free(h as u32);
    }
}

fn fill(f: &mut dyn Filler, seed: u64) -> (f64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live: Vec<(u64, u64)> = vec![];
    let mut in_use = 0u64;
    let mut steps = 0u64;
    loop {
        steps += 1;
        if !live.is_empty() && rng.gen_bool(0.45) {
            let (h, s) = live.swap_remove(rng.gen_range(0..live.len()));
            f.free(h);
            in_use -= s;
            continue;
        }
        let size = 2f64.powf(rng.gen_range(8.0..26.0)) as u64;
        match f.alloc(size) {
            Some(h) => {
                live.push((h, size));
                in_use += size;
            }
            None => return (in_use as f64 / CAP as f64, steps),
        }
    }
}

fn gpumm(page: u64, small_threshold: Option<u64>, movable: bool) -> Gpumm {
    let mut cfg = PoolConfig::new(page);
    if let Some(s) = small_threshold {
        cfg.small_threshold = s;
    }
    Gpumm(common::pool_with(CAP, cfg), vec![], movable)
}

/// Passes over the churn stream's 65,536 steps after its live set is made.
const CHURN_PASSES: usize = 8;

/// Whether an allocator serves the peer bench's churn stream (2,048 live allocations of
/// log-uniform sizes from 256 B to 64 MiB; each step frees one of the first half and
/// allocates the next size in its place) through `CHURN_PASSES` passes.
fn serves_churn(f: &mut dyn Filler) -> bool {
    let (first, sizes, slots) = common::churn_stream(2048, 8.0, 26.0);
    let mut live = Vec::with_capacity(first.len());
    for &s in &first {
        match f.alloc(s) {
            Some(h) => live.push(h),
            None => return false,
        }
    }
    for _ in 0..CHURN_PASSES {
        for (&slot, &size) in slots.iter().zip(&sizes) {
            f.free(live[slot]);
            match f.alloc(size) {
                Some(h) => live[slot] = h,
                None => return false,
            }
        }
    }
    true
}

/// The most bytes the churn stream holds live at once, over its `CHURN_PASSES` passes.
fn churn_peak_live() -> u64 {
    let (mut live, sizes, slots) = common::churn_stream(2048, 8.0, 26.0);
    let mut now: u64 = live.iter().sum();
    let mut peak = now;
    for _ in 0..CHURN_PASSES {
        for (&slot, &size) in slots.iter().zip(&sizes) {
            now = now - live[slot] + size;
            live[slot] = size;
            peak = peak.max(now);
        }
    }
    peak
}

/// The smallest device, to 1/16 GiB, on which an allocator made for it (`make(bytes)`)
/// serves the churn stream (whose peak live is `peak` bytes); None if 80 GiB is not enough.
fn smallest_device(make: &dyn Fn(u64) -> Box<dyn Filler>, peak: u64) -> Option<u64> {
    let step = G / 16;
    let (mut lo, mut hi) = (peak / step, CAP / step);
    if !serves_churn(make(hi * step).as_mut()) {
        return None;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if serves_churn(make(mid * step).as_mut()) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi * step)
}

/// The seeds of `FILL_SEEDS` ("1-40" or "1,4,9"), else 1-3.
fn seeds() -> Vec<u64> {
    let text = std::env::var("FILL_SEEDS").unwrap_or_else(|_| "1-3".into());
    let mut out = vec![];
    for part in text.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (u64, u64) = (lo.trim().parse().unwrap(), hi.trim().parse().unwrap());
        out.extend(lo..=hi);
    }
    out
}

fn main() {
    let seeds = seeds();
    let only = std::env::var("FILL_ONLY").ok();
    type Make = Box<dyn Fn() -> Box<dyn Filler>>;
    let rows: Vec<(&str, Make)> = vec![
        (
            "gpumm (2 MiB pages)",
            Box::new(|| Box::new(gpumm(2 * M, None, false))),
        ),
        (
            "gpumm (2 MiB pages, movable allocations)",
            Box::new(|| Box::new(gpumm(2 * M, None, true))),
        ),
        (
            "gpumm (2 MiB pages, small_threshold 128 KiB)",
            Box::new(|| Box::new(gpumm(2 * M, Some(128 * K), false))),
        ),
        (
            "gpumm (64 KiB pages)",
            Box::new(|| Box::new(gpumm(64 * K, None, false))),
        ),
        (
            "offset-allocator",
            Box::new(|| {
                Box::new(Offset(
                    offset_allocator::Allocator::new((CAP / 256) as u32),
                    vec![],
                ))
            }),
        ),
        ("best fit", Box::new(|| Box::new(BestFit::new(CAP)))),
        (
            "buddy",
            Box::new(|| {
                Box::new(Model(
                    model_by_name("buddy", CAP, CachingOptions::default()).unwrap(),
                    0,
                ))
            }),
        ),
    ];
    println!("| allocator | in use at the first failure (seeds {seeds:?}) | mean |");
    println!("|---|---|---|");
    for (name, make) in rows {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let r: Vec<f64> = seeds.iter().map(|&s| fill(make().as_mut(), s).0).collect();
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let each: Vec<String> = r.iter().map(|x| format!("{:.2} %", x * 100.0)).collect();
        println!("| {name} | {} | {:.3} % |", each.join(", "), mean * 100.0);
    }
    if only.is_some() {
        return;
    }
    type MakeFor = Box<dyn Fn(u64) -> Box<dyn Filler>>;
    let rows: Vec<(&str, MakeFor)> = vec![
        (
            "gpumm (2 MiB pages)",
            Box::new(|cap| {
                Box::new(Gpumm(
                    common::pool_with(cap, PoolConfig::new(2 * M)),
                    vec![],
                    false,
                ))
            }),
        ),
        (
            "offset-allocator",
            Box::new(|cap| {
                Box::new(Offset(
                    offset_allocator::Allocator::new((cap / 256) as u32),
                    vec![],
                ))
            }),
        ),
        ("best fit", Box::new(|cap| Box::new(BestFit::new(cap)))),
        (
            "buddy",
            Box::new(|cap| {
                Box::new(Model(
                    model_by_name("buddy", cap, CachingOptions::default()).unwrap(),
                    0,
                ))
            }),
        ),
    ];
    let peak = churn_peak_live();
    println!();
    println!(
        "| allocator | smallest device for the churn stream ({CHURN_PASSES} passes; peak live {:.2} GiB) |",
        peak as f64 / G as f64
    );
    println!("|---|---|");
    for (name, make) in rows {
        match smallest_device(make.as_ref(), peak) {
            Some(b) => println!("| {name} | {:.4} GiB |", b as f64 / G as f64),
            None => println!("| {name} | over 80 GiB |"),
        }
    }
}
