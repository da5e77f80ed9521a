//! Tests of the pool, a file a topic (below). This file holds what they share: the devices
//! and pools they run on, the request builders, the operation streams that the model test and
//! the golden outputs (`golden.rs`) both drive, and the churn loop for profilers, which stays
//! here so that its path remains `alloc::tests::churn_for_profiler`.

mod batches; // alloc_batch, alloc_arena, free_batch: one block cut into members, their records
mod compaction; // defrag and defrag_plan: heap pages emptied, segments compacted, stitched slides
mod frees; // stream-ordered frees and their fences, synchronize, scopes
#[cfg(target_os = "linux")]
mod host_bytes; // on host memory: stitched, moved and scrubbed bytes hold what they should
mod limits_and_stats; // max_size, the release threshold, sampled latency
mod model; // random operation streams against a shadow map of live ranges
mod placement; // where requests go: heap pages, page ends, blocks of segments, free runs
mod refusals; // refused requests and injected backend failures leave the pool as it was
mod size_cache; // the size cache: what waits in it, and when it gives it back
mod stitching; // layouts through the window: scattered pages, reclaim, head and tail pairing

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::backend::Simulated;
use crate::pmm::{PmmConfig, SizeMask};

pub(super) const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// The handle of a default request of `size` bytes (the request must succeed).
pub(super) fn alloc_id(p: &mut Pool, size: u64) -> AllocId {
    p.alloc(Request {
        size,
        ..Request::default()
    })
    .unwrap()
    .0
}

pub(super) fn device(vidmem: u64) -> Arc<Device> {
    let mut cfg = PmmConfig::new(
        vidmem,
        SizeMask::from_sizes(&[4096, 65536, 2 * MIB]).unwrap(),
        SizeMask::from_sizes(&[256, 4096, 65536, 2 * MIB]).unwrap(),
    );
    cfg.check = false;
    Arc::new(Device {
        pmm: Arc::new(Mutex::new(Pmm::new(cfg).unwrap())),
        backend: Arc::new(Simulated::new(vidmem, 2 * MIB).unwrap()),
    })
}

/// A checked pool of 2 MiB pages that holds `initial` bytes, `full` whole pages in use, then
/// a page whose second half is free (a 1 MiB allocation freed there) and a page in use after
/// it; the rest of its pages free.
pub(super) fn pool_with_a_free_half_page(initial: u64, full: usize) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.initial_size = initial;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    for _ in 0..full {
        alloc_id(&mut p, 2 * MIB);
    }
    alloc_id(&mut p, MIB);
    let half = alloc_id(&mut p, MIB);
    alloc_id(&mut p, 2 * MIB);
    p.free(half).unwrap();
    p.flush_cache();
    p
}

fn pool_on(dev: Arc<Device>) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    Pool::new(dev, cfg).unwrap()
}

fn pool(vidmem: u64) -> Pool {
    pool_on(device(vidmem))
}

fn req(size: u64) -> Request {
    Request {
        size,
        ..Request::default()
    }
}

/// A request for a movable allocation (one `defrag` may move).
fn movable(size: u64) -> Request {
    Request {
        size,
        movable: true,
        ..Request::default()
    }
}

/// The statistics a refused request leaves as they were: all but the failure and latency
/// counts.
fn unchanging(p: &Pool) -> PoolStats {
    let mut s = p.stats();
    s.failures = 0;
    s.success_rate = 0.0;
    s.latency_samples = 0;
    s.latency_mean_ns = 0.0;
    s.latency_p50_ns = 0.0;
    s.latency_p99_ns = 0.0;
    s
}

/// On a 16 MiB device: pages 1, 2, 4, 6 and 7 held by allocations that may not move; `k`
/// (1.5 MiB, may not move) at the start of page 5; `s` (2.75 MiB, movable) stitched from
/// the rest of page 5 (its head), page 3 and the start of page 0 (its tail). Returns `k`
/// and `s`.
fn stitched_after(p: &mut Pool) -> ((AllocId, u64), (AllocId, u64)) {
    let whole: Vec<_> = (0..8).map(|_| p.alloc(req(2 * MIB)).unwrap()).collect();
    for i in [0, 3, 5] {
        p.free(whole[i].0).unwrap();
    }
    let k = p.alloc(req(3 * MIB / 2)).unwrap();
    let s = p.alloc(movable(11 * MIB / 4)).unwrap();
    let Layout::Stitched(i) = p.allocs[s.0.index as usize].layout else {
        panic!("not stitched")
    };
    let st = &p.stitches[i as usize];
    let (h, t) = (p.blocks[st.head as usize], p.blocks[st.tail as usize]);
    assert_eq!(p.allocs[k.0.index as usize].layout, Layout::Block(h.prev));
    assert_eq!((h.page, h.off), (5, 6144));
    assert_eq!(
        (st.runs.as_slice(), t.page, t.off, t.len),
        (&[(3, 1)][..], 0, 0, 1024)
    );
    (k, s)
}

// ------------------------------------------------------------------------------------------
// Random streams of operations: those of `model.rs` and of the golden outputs (`golden.rs`).

#[derive(Clone, Debug)]
pub(super) enum Op {
    Alloc(u64, u64, bool),
    Arena(Vec<u64>, u64),
    Batch(Vec<u64>),
    FreeBatch(usize, usize),
    /// `free_batch` of the pointers of the latest batch still wholly live, in their order.
    FreeLastBatch,
    Free(usize),
    FreePtr(usize),
    FreeAsync(usize, u64),
    Complete(usize),
    Sync,
    Defrag,
    Trim,
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    // (and a few sizes that come back, for the size cache)
    let size = prop_oneof![
        1 => 1u64..4096,
        1 => 4096u64..(1 << 20),
        1 => (1u64 << 20)..(9 << 20),
        1 => (9u64 << 20)..(40 << 20),
        3 => prop::sample::select(vec![1000u64, 64 << 10, (3 << 20) + 5]),
    ];
    prop_oneof![
        6 => (size.clone(), 0u64..3, any::<bool>()).prop_map(|(s, st, m)| Op::Alloc(s, st, m)),
        1 => (proptest::collection::vec(size.clone(), 1..6), 0u64..3).prop_map(|(v, st)| Op::Arena(v, st)),
        1 => proptest::collection::vec(size, 1..6).prop_map(Op::Batch),
        1 => (any::<usize>(), 1usize..6).prop_map(|(i, n)| Op::FreeBatch(i, n)),
        1 => Just(Op::FreeLastBatch),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreePtr),
        2 => (any::<usize>(), 0u64..3).prop_map(|(i, s)| Op::FreeAsync(i, s)),
        1 => any::<usize>().prop_map(Op::Complete),
        1 => Just(Op::Sync),
        1 => Just(Op::Defrag),
        1 => Just(Op::Trim),
    ]
}

/// The pool of `random_streams_keep_every_invariant`: 128 MiB, checked after every mutation;
/// with a release threshold (`threshold`), whole free pages leave large segments at once.
pub(super) fn stream_pool(threshold: bool) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.release_threshold = threshold.then_some(8 * MIB);
    Pool::new(device(128 * MIB), cfg).unwrap()
}

/// The pointers of up to `n` of the `live` allocations from position `i` (modulo their
/// number) on, which leave `live`.
pub(super) fn drain_ptrs(p: &Pool, live: &mut Vec<AllocId>, i: usize, n: usize) -> Vec<u64> {
    let i = i % live.len();
    let n = n.min(live.len() - i);
    live.drain(i..i + n)
        .map(|id| p.info(id).unwrap().ptr)
        .collect()
}

/// The handles of the allocations at pointers `out`.
pub(super) fn ids_of(p: &Pool, out: &[u64]) -> Vec<AllocId> {
    let by_ptr: HashMap<u64, AllocId> = p.allocations().iter().map(|x| (x.ptr, x.id)).collect();
    out.iter().map(|ptr| by_ptr[ptr]).collect()
}

/// A churn loop for profilers (`valgrind --tool=callgrind <test binary> churn_for_profiler
/// --ignored`): log-uniform sizes, 2048 live, half churning. `CHURN=small|large`, `PAIRS=n`,
/// `RESERVE=1`, `SIZE_CACHE=0` (the pool without the size cache), `POOL_ONLY=1` (the pairs
/// drawn before the loop); prints the time a pair, live and reserved memory, and how many allocations
/// needed the stitching window (`cargo test --release --no-default-features --lib
/// churn_for_profiler -- --ignored --nocapture`).
#[test]
#[ignore = "a profiling loop for callgrind and perf, not a check"]
fn churn_for_profiler() {
    use rand::{Rng, SeedableRng};
    let (lo, hi) = match std::env::var("CHURN").as_deref() {
        Ok("small") => (8.0, 20.0),
        Ok("large") => (20.0, 26.0),
        _ => (8.0, 26.0),
    };
    // RESERVE=1: the pool takes the whole device up front (as the peers in benches/peers.rs)
    let mut cfg = PoolConfig::new(2 * MIB);
    if std::env::var("RESERVE").is_ok_and(|v| v == "1") {
        cfg.initial_size = 80 << 30;
    }
    cfg.size_cache = std::env::var("SIZE_CACHE").map_or(true, |v| v != "0");
    let mut p = Pool::new(device(80 << 30), cfg).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let size = move |rng: &mut rand::rngs::StdRng| 2f64.powf(rng.gen_range(lo..hi)) as u64;
    let mut live: Vec<AllocId> = (0..2048)
        .map(|_| p.alloc(req(size(&mut rng))).unwrap().0)
        .collect();
    let n: u64 = std::env::var("PAIRS").map_or(200_000, |v| v.parse().unwrap());
    // POOL_ONLY=1: the stream's pairs drawn up front (the same draws in the same order, at
    // least 40,000 of them whatever n), so that the loop counts the pool's work alone, as
    // benches/peers.rs's churn does
    let pool_only = std::env::var("POOL_ONLY").is_ok_and(|v| v == "1");
    let drawn: Vec<(usize, u64)> = (0..if pool_only { n.max(40_000) } else { 0 })
        .map(|_| (rng.gen_range(0..1024), size(&mut rng)))
        .collect();
    let stitched = p.stats().stitched;
    let t = Instant::now();
    if pool_only {
        for &(k, s) in &drawn[..n as usize] {
            p.free(live[k]).unwrap();
            live[k] = p.alloc(req(s)).unwrap().0;
        }
    } else {
        for _ in 0..n {
            let k = rng.gen_range(0..1024);
            p.free(live[k]).unwrap();
            live[k] = p.alloc(req(size(&mut rng))).unwrap().0;
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let s = p.stats();
    eprintln!(
        "{ns:.1} ns per pair; live {} MiB, reserved {} MiB, windowed allocations {} in {n} pairs",
        s.live_bytes >> 20,
        s.reserved_bytes >> 20,
        s.stitched - stitched,
    );
}
