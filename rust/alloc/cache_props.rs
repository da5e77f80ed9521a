//! The size cache never costs memory: on any stream of requests, a pool with the cache puts
//! every request where the same pool without it does, so it reserves the same (`cache.rs`).
//! Random streams of sizes that repeat, grow (a buffer extended step by step, old and new live
//! together), interleave long- and short-lived tensors, and come from several streams.

use proptest::prelude::*;

use super::tests::{device, MIB};
use super::*;

/// One step of a stream: allocate `size` on `stream`, or free the live allocation at
/// `index % live` (when any is live).
#[derive(Clone, Debug)]
enum Step {
    Alloc { size: u64, stream: u64 },
    Free(usize),
}

/// Sizes drawn from a small palette (so that they repeat and the cache admits them), with
/// a random few off it; small (heap) and large (page) sizes both.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => prop::sample::select(vec![
            512, 4096, 40_000, 200_000, 700_000, 1 << 20, 3 << 20, 5 * MIB + 12_345, 9 * MIB,
        ]),
        1 => 1u64..12 * MIB,
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (size(), prop::sample::select(vec![0u64, 7, 9]))
            .prop_map(|(size, stream)| Step::Alloc { size, stream }),
        2 => any::<usize>().prop_map(Step::Free),
    ]
}

/// A buffer grown `n` times by `by` bytes: the new one is made while the old is live, then
/// the old is freed; a short-lived tensor of `tmp` bytes comes and goes at every step.
fn growing() -> impl Strategy<Value = Vec<Step>> {
    (1u64..400_000, 1usize..60, size()).prop_map(|(by, n, tmp)| {
        let mut out = vec![Step::Alloc {
            size: by,
            stream: 0,
        }];
        for k in 1..=n as u64 {
            out.push(Step::Alloc {
                size: tmp,
                stream: 0,
            });
            out.push(Step::Alloc {
                size: by * (k + 1),
                stream: 0,
            });
            // live: [.., old, tmp, new]: free old, then tmp (each then second newest)
            out.push(Step::Free(usize::MAX - 2));
            out.push(Step::Free(usize::MAX - 2));
        }
        out
    })
}

/// A stream: random steps with growing buffers spliced in.
fn stream_of_requests() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::collection::vec(step(), 1..40),
            1 => growing(),
        ],
        1..12,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Every request lands at the same address with the cache and without it, so the peak
    /// reserve is the same too (and the cache serves some of them).
    #[test]
    fn the_size_cache_never_changes_where_memory_goes(steps in stream_of_requests()) {
        let (with, _) = run_on(&steps, 64 << 30, false, true);
        let (without, none) = run_on(&steps, 64 << 30, false, false);
        prop_assert_eq!(with.failures, 0);
        prop_assert_eq!(none, 0, "no cache, no hits");
        prop_assert_eq!(&with, &without);
    }
}

proptest! {
    // (64 streams, to keep the unoptimised `cargo test` short, where the 256 streams of each
    // property above take minutes with the checks after every mutation)
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// The same in a pool of at least `SMALL_POOL`, whose heap takes the best fit (the check
    /// mirrors that search: `Pool::best_takes`).
    #[test]
    fn the_size_cache_never_changes_where_memory_goes_in_a_large_pool(
        steps in stream_of_requests()
    ) {
        let steps = in_a_large_pool(steps);
        let (with, _) = run_on(&steps, 64 << 30, false, true);
        let (without, _) = run_on(&steps, 64 << 30, false, false);
        prop_assert_eq!(with.failures, 0);
        prop_assert_eq!(&with, &without);
    }
}

/// `steps` after a first request of `SMALL_POOL` bytes: the pool is a large one throughout
/// (it keeps its pages when that request is freed).
fn in_a_large_pool(steps: Vec<Step>) -> Vec<Step> {
    let first = Step::Alloc {
        size: SMALL_POOL,
        stream: 0,
    };
    std::iter::once(first).chain(steps).collect()
}

/// On a warm pool, a fixed pair and a free followed by a request of its size are served by
/// the cache, at the addresses the pool without it gives.
#[test]
fn the_size_cache_serves_repeated_sizes() {
    let mut steps: Vec<Step> = (0..70)
        .map(|_| Step::Alloc {
            size: 64 << 10,
            stream: 0,
        })
        .collect();
    for k in 0..100 {
        steps.push(Step::Alloc {
            size: 64 << 10,
            stream: 0,
        });
        steps.push(Step::Free(k % 7));
    }
    for steps in [steps.clone(), in_a_large_pool(steps)] {
        let (with, hits) = run_on(&steps, 64 << 30, false, true);
        let (without, _) = run_on(&steps, 64 << 30, false, false);
        assert_eq!(with, without);
        assert!(hits >= 90, "{hits} of 100 requests served by the cache");
    }
}

/// A freed heap block that ends its page's segment, before a heap page whose first block is
/// free, joins that block in a pool below `SMALL_POOL` (`Pool::join_next_heap`): the cache
/// holds it, but the request of its size that follows goes where the pool without the cache
/// puts it, into the other free block of its size (`w`) and not the joined one.
#[test]
fn a_heap_end_that_would_join_the_next_page_is_not_taken_back() {
    const KIB: u64 = 1 << 10;
    let alloc = |k: u64| Step::Alloc {
        size: k * KIB,
        stream: 0,
    };
    // page A: 1,000 + 48 (w) + 952 + 48 (y) KiB; page B: 48 (z) + 1,000 + 1,000 KiB; then
    // w, z and y are freed (live: a, w, a952, y, z, b, c), and 48 KiB asked for
    let steps = [
        alloc(1000),
        alloc(48),
        alloc(952),
        alloc(48),
        alloc(48),
        alloc(1000),
        alloc(1000),
        Step::Free(1),
        Step::Free(3),
        Step::Free(2),
        alloc(48),
    ];
    let (with, _) = run_on(&steps, 64 << 30, false, true);
    let (without, _) = run_on(&steps, 64 << 30, false, false);
    assert_eq!(with.ptrs[..7], without.ptrs[..7]);
    assert_eq!(with.ptrs[7], with.ptrs[1], "the request takes w's block");
    assert_eq!(with, without);
}

/// What a replay of a stream gave: requests refused, the peak reserve, and the address of
/// every request served, in order.
#[derive(Debug, PartialEq, Eq)]
struct Replayed {
    failures: u64,
    peak: u64,
    ptrs: Vec<u64>,
}

/// The replay of `steps` on a pool of `vidmem` bytes, and the requests the size cache served;
/// `quick`: each request tries `try_alloc_quick` first, as the Python bindings do. `Free(i)`
/// frees live allocation `i % live` counted from the newest when `i` is near `usize::MAX`
/// (the growing buffers' frees), else from the oldest.
fn run_on(steps: &[Step], vidmem: u64, quick: bool, size_cache: bool) -> (Replayed, u64) {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.size_cache = size_cache;
    cfg.check = true;
    let mut p = Pool::new(device(vidmem), cfg).unwrap();
    let mut live: Vec<AllocId> = vec![];
    let (mut failures, mut ptrs) = (0, vec![]);
    for s in steps {
        match *s {
            Step::Alloc { size, stream } => {
                let req = Request {
                    size,
                    stream,
                    ..Request::default()
                };
                let r = match quick.then(|| p.try_alloc_quick(req)).flatten() {
                    Some(r) => r,
                    None => p.alloc(req),
                };
                match r {
                    Ok((id, ptr)) => {
                        live.push(id);
                        ptrs.push(ptr);
                    }
                    Err(_) => failures += 1,
                }
            }
            Step::Free(i) if !live.is_empty() => {
                let back = usize::MAX - i;
                let at = if back < 8 {
                    live.len().saturating_sub(back)
                } else {
                    i % live.len()
                };
                p.free(live.remove(at.min(live.len() - 1))).unwrap();
            }
            Step::Free(_) => {}
        }
    }
    let s = p.stats();
    let replayed = Replayed {
        failures,
        peak: s.peak_reserved,
        ptrs,
    };
    (replayed, s.cache_hits)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// The quick path (under the GIL) then the full one place every request as the full one
    /// alone does, on a device small enough that requests fail.
    #[test]
    fn the_quick_path_places_as_the_full_one(steps in stream_of_requests(), short in 0u64..4) {
        // (a device a few pages short of what the stream needs: the requests near its peak
        // take the paths on the way to out of memory)
        let peak = run_on(&steps, 64 << 30, false, true).0.peak;
        let vidmem = (peak.saturating_sub(short * 2 * MIB)).max(2 * MIB);
        prop_assert_eq!(run_on(&steps, vidmem, true, true), run_on(&steps, vidmem, false, true));
        // and as the pool without the cache, even on the way to out of memory
        prop_assert_eq!(run_on(&steps, vidmem, true, true).0, run_on(&steps, vidmem, false, false).0);
    }
}

/// A fixed pair for profilers (`PAIRS=n valgrind --tool=callgrind <release lib test binary>
/// --ignored --exact alloc::cache_props::fixed_pair_for_profiler`): alloc and free of 64 KiB
/// on a pool with 70 of that size live, with the size cache (`SIZE_CACHE=0`: without it).
#[test]
#[ignore = "a profiling loop for callgrind, not a check"]
fn fixed_pair_for_profiler() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.size_cache = std::env::var("SIZE_CACHE").map_or(true, |v| v != "0");
    let mut p = Pool::new(device(80 << 30), cfg).unwrap();
    let r = Request {
        size: 64 << 10,
        ..Request::default()
    };
    let _warm: Vec<_> = (0..70).map(|_| p.alloc(r).unwrap().0).collect();
    let n: u64 = std::env::var("PAIRS").map_or(200_000, |v| v.parse().unwrap());
    for _ in 0..n {
        let (id, _) = p.alloc(r).unwrap();
        p.free(id).unwrap();
    }
}
