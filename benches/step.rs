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
//!
//! With `STEP_MIN=n` (`STEP_MIN=4000 cargo bench --bench step`), no criterion: the four
//! steps run in turn `n` times each and the fastest of each is printed, per pair. On a
//! machine that other jobs share, the fastest of many short runs is the one no other job
//! interrupted, where criterion's mean and median take the interruptions in.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, Criterion, Throughput};
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

/// The bench's sizes, and the same with every tenth request 256 B larger.
fn requests() -> (Vec<u64>, Vec<u64>) {
    let sizes = log_uniform(N, 7, 8.0, 23.0);
    let departing: Vec<u64> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| if i % 10 == 9 { s + 256 } else { s })
        .collect();
    (sizes, departing)
}

/// A pool that recorded and planned `sizes` and served it twice.
fn planned(sizes: &[u64], live: &mut VecDeque<AllocId>) -> Pool {
    let mut p = common::pool(80 * G, 2 * M, 0);
    p.set_step_recording(1).unwrap();
    for _ in 0..3 {
        stepped(&mut p, sizes, live);
    }
    p
}

/// One step of `sizes` through the identity.
fn identity(sizes: &[u64], ids: &mut VecDeque<u64>) {
    each(
        &mut (),
        sizes,
        ids,
        |_, s| black_box(s),
        |_, x| {
            black_box(x);
        },
    )
}

fn steps(c: &mut Criterion) {
    let (sizes, departing) = requests();
    let mut g = c.benchmark_group("step");
    g.throughput(Throughput::Elements(N as u64));
    let mut live = VecDeque::with_capacity(LIVE + 1);

    let mut p = planned(&sizes, &mut live);
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
    g.bench_function("loop", |b| b.iter(|| identity(&sizes, &mut ids)));
    g.finish();
}

/// `STEP_MIN=n`: the fastest of `n` runs of each step, taken in turn, per pair.
fn fastest(n: usize) {
    let (sizes, departing) = requests();
    let mut live = VecDeque::with_capacity(LIVE + 1);
    let mut ids = VecDeque::with_capacity(LIVE + 1);
    let mut p = planned(&sizes, &mut live);
    let mut d = planned(&sizes, &mut live);
    let mut q = common::pool(80 * G, 2 * M, 0);
    for _ in 0..3 {
        run(&mut q, &sizes, &mut live);
    }
    let (h0, m0) = (p.step_counts().hits, d.step_counts().misses);
    let mut best = [f64::INFINITY; 4];
    for _ in 0..n {
        let mut time = |k: usize, f: &mut dyn FnMut()| {
            let t = std::time::Instant::now();
            f();
            let ns = t.elapsed().as_nanos() as f64 / N as f64;
            best[k] = best[k].min(ns);
        };
        time(0, &mut || stepped(&mut p, &sizes, &mut live));
        time(1, &mut || stepped(&mut d, &departing, &mut live));
        time(2, &mut || run(&mut q, &sizes, &mut live));
        time(3, &mut || identity(&sizes, &mut ids));
    }
    assert_eq!(
        p.step_counts().hits - h0,
        (n * N) as u64,
        "every request served"
    );
    assert_eq!(d.step_counts().misses - m0, (n * (N / 10)) as u64);
    let [served, dep, normal, lp] = best;
    println!("fastest of {n}, ns a pair (net of the loop):");
    println!("  step/served          {served:7.1} ({:.1})", served - lp);
    println!("  step/departing-10pct {dep:7.1} ({:.1})", dep - lp);
    println!("  step/normal          {normal:7.1} ({:.1})", normal - lp);
    println!("  step/loop            {lp:7.1}");
    println!(
        "  served / normal {:.3}, departing / normal {:.3} (net)",
        (served - lp) / (normal - lp),
        (dep - lp) / (normal - lp)
    );
}

criterion_group!(benches, steps);

fn main() {
    if let Some(n) = std::env::var("STEP_MIN").ok().and_then(|v| v.parse().ok()) {
        fastest(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
