//! What the criterion benches share: a Hopper-like PMM and a simulated device over it, the
//! churn stream (log-uniform sizes, a live set of which half churns) and its timed loop over
//! any allocator (`Peer`). Each bench includes this
//! file as a module (`#[path = "common/mod.rs"] mod common;`); not every bench uses all of it.

#![allow(dead_code)]

use std::sync::Arc;

use parking_lot::Mutex;
use rand::{rngs::StdRng, Rng, SeedableRng};

use std::hint::black_box;

use criterion::{measurement::WallTime, BenchmarkGroup};

use _core::alloc::{AllocId, Device, Pool, PoolConfig, Request};
use _core::backend::Simulated;
use _core::pmm::{Pmm, PmmConfig, SizeMask};

pub const K: u64 = 1024;
pub const M: u64 = 1024 * K;
pub const G: u64 = 1024 * M;

/// A PMM of `vidmem` bytes with Hopper's chunk sizes (user 4K/64K/2M, kernel from 256 B),
/// its own checks off.
pub fn hopper(vidmem: u64) -> Pmm {
    let mut c = PmmConfig::new(
        vidmem,
        SizeMask::from_sizes(&[4 * K, 64 * K, 2 * M]).unwrap(),
        SizeMask::from_sizes(&[256, 4 * K, 64 * K, 2 * M]).unwrap(),
    );
    c.check = false;
    Pmm::new(c).unwrap()
}

/// A pool of `page`-byte pages on a simulated device of `vidmem` bytes, reserving `initial`
/// bytes when made.
pub fn pool(vidmem: u64, page: u64, initial: u64) -> Pool {
    let mut cfg = PoolConfig::new(page);
    cfg.initial_size = initial;
    // SIZE_CACHE=0: the pool without the size cache (the same layout, `cache.rs`)
    cfg.size_cache = std::env::var("SIZE_CACHE").map_or(true, |v| v != "0");
    pool_with(vidmem, cfg)
}

/// A pool configured by `cfg` on a simulated device of `vidmem` bytes.
pub fn pool_with(vidmem: u64, cfg: PoolConfig) -> Pool {
    let dev = Arc::new(Device {
        pmm: Arc::new(Mutex::new(hopper(vidmem))),
        backend: Arc::new(Simulated::new(vidmem, cfg.page_size).unwrap()),
    });
    Pool::new(dev, cfg).unwrap()
}

/// `n` sizes, `2^x` bytes for `x` uniform in `[lo, hi)`.
pub fn log_uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| 2f64.powf(rng.gen_range(lo..hi)) as u64)
        .collect()
}

/// The churn stream: `live_n` first sizes, then 65,536 steps, each a slot of the churning
/// half (the first `live_n / 2`) to free and a size to allocate in its place.
pub fn churn_stream(live_n: usize, lo: f64, hi: f64) -> (Vec<u64>, Vec<u64>, Vec<usize>) {
    let mut rng = StdRng::seed_from_u64(3);
    let slots = (0..1 << 16).map(|_| rng.gen_range(0..live_n / 2)).collect();
    (
        log_uniform(live_n, 1, lo, hi),
        log_uniform(1 << 16, 2, lo, hi),
        slots,
    )
}

/// An allocator under benchmark: sizes in bytes, handles back.
pub trait Peer {
    type H: Copy;
    fn alloc(&mut self, size: u64) -> Option<Self::H>;
    fn free(&mut self, h: Self::H);
}

impl Peer for Pool {
    type H = AllocId;
    fn alloc(&mut self, size: u64) -> Option<AllocId> {
        Pool::alloc(
            self,
            Request {
                size,
                ..Request::default()
            },
        )
        .ok()
        .map(|r| r.0)
    }
    fn free(&mut self, h: AllocId) {
        Pool::free(self, h).unwrap();
    }
}

/// The churn loop, as benchmark `name` of `g`: `live_n` allocations of sizes `2^[lo, hi)`,
/// then each iteration frees one of the churning half and allocates a new size in its place
/// (one alloc + free pair).
pub fn churn<P: Peer>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    p: &mut P,
    live_n: usize,
    (lo, hi): (f64, f64),
) {
    let (first, sizes, slots) = churn_stream(live_n, lo, hi);
    let mut live: Vec<P::H> = first
        .into_iter()
        .map(|s| p.alloc(s).expect("the live set fits"))
        .collect();
    let mut i = 0usize;
    g.bench_function(name, |b| {
        b.iter(|| {
            let k = i & 0xffff;
            i += 1;
            let slot = slots[k];
            p.free(live[slot]);
            live[slot] = p.alloc(black_box(sizes[k])).expect("fits");
        })
    });
}
