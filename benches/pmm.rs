//! Criterion benchmarks of the PMM core, mirrored by benches/test_pmm_bench.py through Python.
//!
//! - `pair/64K`, `pair/4K`: one chunk alloc + free on a warm PMM (the root is already split and
//!   other chunks stay live in it, so the pair measures the free-list path, not a root split).
//! - `exhaust/80GiB`: allocate every 64 KiB chunk of an 80 GiB device, then free them all.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::hint::black_box;

#[path = "common/mod.rs"]
mod common;

use _core::pmm::ChunkType;
use common::{hopper, G, K};

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    for (name, size, t) in [
        ("64K", 64 * K, ChunkType::User),
        ("4K", 4 * K, ChunkType::User),
        ("256B-kernel", 256, ChunkType::Kernel),
    ] {
        let mut p = hopper(80 * G);
        // Warm: keep neighbours live so the pair never empties its parent (70 is no multiple
        // of 16 or 32, so the last parent is partly used and its free chunk is the one reused).
        let _keep: Vec<_> = (0..70)
            .map(|_| p.alloc_chunk(size, t, false).unwrap())
            .collect();
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| {
                let id = p.alloc_chunk(black_box(size), t, false).unwrap();
                p.free(black_box(id)).unwrap();
            })
        });
    }
    // The same pair when it empties its parent: every alloc splits a root into 32 x 64 KiB
    // and every free merges them back (the driver's eager merge at its most expensive).
    let mut p = hopper(80 * G);
    let _full: Vec<_> = (0..64)
        .map(|_| p.alloc_chunk(64 * K, ChunkType::User, false).unwrap())
        .collect();
    g.bench_function("64K-split+merge", |b| {
        b.iter(|| {
            let id = p
                .alloc_chunk(black_box(64 * K), ChunkType::User, false)
                .unwrap();
            p.free(black_box(id)).unwrap();
        })
    });
    g.finish();
}

fn exhaust(c: &mut Criterion) {
    let mut g = c.benchmark_group("exhaust");
    g.sample_size(10);
    let n = (80 * G / (64 * K)) as usize;
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("80GiB-64K-alloc+free", |b| {
        b.iter_batched(
            || hopper(80 * G),
            |mut p| {
                let ids = p.alloc_chunks(n, 64 * K, ChunkType::User, false).unwrap();
                for id in ids {
                    p.free(id).unwrap();
                }
                p
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("80GiB-64K-one-by-one", |b| {
        b.iter_batched(
            || hopper(80 * G),
            |mut p| {
                let mut ids = Vec::with_capacity(n);
                while let Ok(id) = p.alloc_chunk(64 * K, ChunkType::User, false) {
                    ids.push(id);
                }
                assert_eq!(ids.len(), n);
                (p, ids)
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, pairs, exhaust);
criterion_main!(benches);
