//! Criterion benchmarks of steps served from a plan (rust/alloc/step.rs), per request (one
//! alloc + free pair), all on an 80 GiB simulated device:
//!
//! - `step/served`: a step of 512 requests of log-uniform sizes (256 B – 8 MiB), request `i`
//!   freed after request `i + 8` is made (eight live at a time), served from its plan; the
//!   step's `step_begin` and `step_end` are in the time.
//! - `step/normal`: the same requests on a pool without steps (the normal path, its size
//!   cache warm).
//! - `step/departing-10pct`: the served step with every tenth request 256 B larger (a
//!   departure: the normal path), the rest served.
//! - `step/loop`: the same loop with an identity in place of alloc and free (what "net of
//!   the loop" takes away: benches/RESULTS.md).

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::collections::VecDeque;
use std::hint::black_box;

use _core::alloc::{AllocId, Pool, Request};
use common::{log_uniform, G, M};

const N: usize = 512;
const LIVE: usize = 8;

fn req(size: u64) -> Request {
    Request {
        size,
        ..Request::default()
    }
}

/// One step of `sizes` through `alloc` and `free` on `cx`: request `i` freed once `LIVE`
/// more are made.
#[inline(always)]
fn each<C, T>(
    cx: &mut C,
    sizes: &[u64],
    live: &mut VecDeque<T>,
    alloc: impl Fn(&mut C, u64) -> T,
    free: impl Fn(&mut C, T),
) {
    for &s in sizes {
        live.push_back(alloc(cx, black_box(s)));
        if live.len() > LIVE {
            free(cx, live.pop_front().unwrap());
        }
    }
    while let Some(id) = live.pop_front() {
        free(cx, id);
    }
}

/// One step of `sizes` on pool `p`.
fn run(p: &mut Pool, sizes: &[u64], live: &mut VecDeque<AllocId>) {
    each(
        p,
        sizes,
        live,
        |p, s| p.alloc(req(s)).unwrap().0,
        |p, id| p.free(id).unwrap(),
    );
}

fn stepped(p: &mut Pool, sizes: &[u64], live: &mut VecDeque<AllocId>) {
    p.step_begin().unwrap();
    run(p, sizes, live);
    p.step_end().unwrap();
}

fn steps(c: &mut Criterion) {
    let sizes = log_uniform(N, 7, 8.0, 23.0);
    let departing: Vec<u64> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| if i % 10 == 9 { s + 256 } else { s })
        .collect();
    let mut g = c.benchmark_group("step");
    g.throughput(Throughput::Elements(N as u64));
    let mut live = VecDeque::with_capacity(LIVE + 1);

    let mut p = common::pool(80 * G, 2 * M, 0);
    p.set_step_recording(1).unwrap();
    for _ in 0..3 {
        stepped(&mut p, &sizes, &mut live);
    }
    let before = p.step_counts();
    stepped(&mut p, &sizes, &mut live);
    assert_eq!(
        p.step_counts().hits - before.hits,
        N as u64,
        "every request served"
    );
    g.bench_function("served", |b| b.iter(|| stepped(&mut p, &sizes, &mut live)));
    let before = p.step_counts();
    stepped(&mut p, &departing, &mut live);
    let after = p.step_counts();
    assert_eq!(after.misses - before.misses, (N / 10) as u64);
    g.bench_function("departing-10pct", |b| {
        b.iter(|| stepped(&mut p, &departing, &mut live))
    });
    assert_eq!(p.step_counts().rebuilds, 0);

    let mut q = common::pool(80 * G, 2 * M, 0);
    for _ in 0..3 {
        run(&mut q, &sizes, &mut live);
    }
    g.bench_function("normal", |b| b.iter(|| run(&mut q, &sizes, &mut live)));

    let mut ids = VecDeque::with_capacity(LIVE + 1);
    g.bench_function("loop", |b| {
        b.iter(|| {
            each(
                &mut (),
                &sizes,
                &mut ids,
                |_, s| black_box(s),
                |_, x| {
                    black_box(x);
                },
            )
        })
    });
    g.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);
