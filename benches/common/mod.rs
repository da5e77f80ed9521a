//! What the criterion benches share: a Hopper-like PMM and a simulated device over it, and the
//! churn stream (log-uniform sizes, a live set of which half churns). Each bench includes this
//! file as a module (`#[path = "common/mod.rs"] mod common;`); not every bench uses all of it.

#![allow(dead_code)]

use std::sync::Arc;

use parking_lot::Mutex;
use rand::{rngs::StdRng, Rng, SeedableRng};

use _core::alloc::{Device, Pool, PoolConfig};
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
    let dev = Arc::new(Device {
        pmm: Arc::new(Mutex::new(hopper(vidmem))),
        backend: Arc::new(Simulated::new(vidmem, page).unwrap()),
    });
    let mut cfg = PoolConfig::new(page);
    cfg.initial_size = initial;
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
