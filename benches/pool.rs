//! Criterion benchmarks of the pool (rust/alloc), mirrored by benches/test_pool_bench.py.
//!
//! - `churn/mixed`: an 80 GiB simulated device holding 2048 allocations of log-uniform sizes
//!   from 256 B to 64 MiB; each iteration frees one allocation of the churning half (chosen at
//!   random) and allocates a new random size in its place: one alloc + free pair.
//! - `pair/1KiB`, `pair/3MiB`: a fixed-size pair on a warm pool.
//! - `pair/stitched-5.5MiB`: a pair that is always stitched: a 256 MiB pool whose free pages
//!   are every other one, so 5.5 MiB takes two scattered free pages and a fresh tail page
//!   (mapped through the window; the tail's page is shared with later requests).
//! - `batch/mixed`: 1024 mixed sizes through `alloc_batch` then `free_batch`; reported per pair.
//! - `batch/arena`: the same through `alloc_arena` (one placement for the 1024) and `free_batch`.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

use _core::alloc::{Pool, Request};
use common::{log_uniform, G, K, M};

fn pool(vidmem: u64) -> Pool {
    common::pool(vidmem, 2 * M, 0)
}

/// Log-uniform sizes from 256 B to 64 MiB.
pub fn mixed_sizes(n: usize, seed: u64) -> Vec<u64> {
    log_uniform(n, seed, 8.0, 26.0)
}

fn req(size: u64) -> Request {
    Request {
        size,
        ..Request::default()
    }
}

fn churn(c: &mut Criterion) {
    let mut g = c.benchmark_group("churn");
    g.throughput(Throughput::Elements(1));
    // mixed: the whole range; small and large: its two halves, to see where the time goes
    for (name, lo, hi) in [
        ("mixed", 8.0, 26.0),
        ("small", 8.0, 20.0),
        ("large", 20.0, 26.0),
    ] {
        let mut p = pool(80 * G);
        let live_n = std::env::var("LIVE")
            .map(|v| v.parse().unwrap())
            .unwrap_or(2048);
        common::churn(&mut g, name, &mut p, live_n, (lo, hi));
        if std::env::var("NOVALIDATE").is_err() {
            p.validate().unwrap();
        }
    }
    g.finish();
}

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    g.throughput(Throughput::Elements(1));
    for (name, size) in [("1KiB", K), ("3MiB", 3 * M)] {
        let mut p = pool(80 * G);
        let _keep: Vec<_> = (0..70).map(|_| p.alloc(req(size)).unwrap()).collect();
        g.bench_function(name, |b| {
            b.iter(|| {
                let (id, _) = p.alloc(req(black_box(size))).unwrap();
                p.free(id).unwrap();
            })
        });
    }
    let mut p = pool(256 * M);
    let every: Vec<_> = (0..128).map(|_| p.alloc(req(2 * M)).unwrap().0).collect();
    for id in every.iter().step_by(2) {
        p.free(*id).unwrap();
    }
    // checked on one pair before timing (the bench may be filtered out)
    let stitched = p.stats().stitched;
    let (id, _) = p.alloc(req(5 * M + M / 2)).unwrap();
    p.free(id).unwrap();
    assert!(p.stats().stitched > stitched, "the pair is stitched");
    g.bench_function("stitched-5.5MiB", |b| {
        b.iter(|| {
            let (id, _) = p.alloc(req(black_box(5 * M + M / 2))).unwrap();
            p.free(id).unwrap();
        })
    });
    g.finish();
}

fn batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch");
    let n = 1024;
    g.throughput(Throughput::Elements(n as u64));
    let mut p = pool(80 * G);
    let _keep: Vec<_> = mixed_sizes(1024, 4)
        .into_iter()
        .map(|s| p.alloc(req(s)).unwrap())
        .collect();
    let sizes = mixed_sizes(n, 5);
    let mut out = Vec::with_capacity(n);
    g.bench_function("mixed", |b| {
        b.iter(|| {
            out.clear();
            p.alloc_batch(black_box(&sizes), 0, &mut out).unwrap();
            p.free_batch(&out).unwrap();
        })
    });
    g.bench_function("arena", |b| {
        b.iter(|| {
            out.clear();
            p.alloc_arena(black_box(&sizes), 0, &mut out).unwrap();
            p.free_batch(&out).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, churn, pairs, batch);
criterion_main!(benches);
