//! The size cache never costs memory: on any stream of requests, a pool with the cache
//! reserves at its peak no more than the same pool without it (`cache.rs`). Random streams
//! of sizes that repeat, grow (a buffer extended step by step, old and new live together),
//! interleave long- and short-lived tensors, and come from several streams.

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

/// The peak reserve of a pool (`size_cache` as given) on 64 GiB that replays `steps`.
fn peak_reserved(steps: &[Step], size_cache: bool) -> u64 {
    let (failures, peak) = run_on(steps, 64 << 30, false, size_cache);
    assert_eq!(failures, 0);
    peak
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Open (issue 27): fails. Deferred coalescing changes where later requests of other
    /// sizes go, and the two layouts part; on 1,000 streams of `stream_of_requests` the pool
    /// with the cache peaks higher on 236 and lower on 194, by up to 6 MiB (`cargo test
    /// --release --lib cache_props::tally -- --ignored --nocapture`). A cache that never
    /// places otherwise than the uncached pool holds nothing back, and then the merges it
    /// skips, which are what it saves memory with on resnet50_train, convnext_train and
    /// swin_train, go too (docs/reserve.md, "The size cache is not free of cost"). Run it
    /// with `--ignored` to get a shrunk stream.
    #[test]
    #[ignore = "open: the cache's layout parts from the uncached pool's (issue 27)"]
    fn the_size_cache_never_raises_the_peak_reserve(steps in stream_of_requests()) {
        let with = peak_reserved(&steps, true);
        let without = peak_reserved(&steps, false);
        prop_assert!(with <= without, "with the cache {} MiB, without {} MiB", with / MIB, without / MIB);
    }
}

/// How often the pool with the cache peaks higher, lower or the same as without it, on
/// 1,000 deterministic streams (a measurement, printed; it asserts nothing but that the
/// streams replay).
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn tally() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut r = TestRunner::deterministic();
    let (mut worse, mut better, mut same, mut extra) = (0, 0, 0, 0u64);
    for _ in 0..1000 {
        let s = stream_of_requests().new_tree(&mut r).unwrap().current();
        let (w, o) = (peak_reserved(&s, true), peak_reserved(&s, false));
        match w.cmp(&o) {
            std::cmp::Ordering::Greater => {
                worse += 1;
                extra = extra.max((w - o) / MIB);
            }
            std::cmp::Ordering::Less => better += 1,
            std::cmp::Ordering::Equal => same += 1,
        }
    }
    println!(
        "with the cache: higher {worse}, lower {better}, same {same}; at most {extra} MiB higher"
    );
}

/// (failures, peak reserved) of `steps` on a pool of `vidmem` bytes; `quick`: each request
/// tries `try_alloc_quick` first, as the Python bindings do. `Free(i)` frees live allocation
/// `i % live` counted from the newest when `i` is near `usize::MAX` (the growing buffers'
/// frees), else from the oldest.
fn run_on(steps: &[Step], vidmem: u64, quick: bool, size_cache: bool) -> (u64, u64) {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.size_cache = size_cache;
    let mut p = Pool::new(device(vidmem), cfg).unwrap();
    let mut live: Vec<AllocId> = vec![];
    let mut failures = 0;
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
                    Ok((id, _)) => live.push(id),
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
    (failures, p.stats().peak_reserved)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// The quick path (under the GIL) then the full one place every request as the full one
    /// alone does, on a device small enough that requests fail.
    #[test]
    fn the_quick_path_places_as_the_full_one(steps in stream_of_requests(), short in 0u64..4) {
        // (a device a few pages short of what the stream needs: the requests near its peak
        // take the paths on the way to out of memory)
        let peak = run_on(&steps, 64 << 30, false, true).1;
        let vidmem = (peak.saturating_sub(short * 2 * MIB)).max(2 * MIB);
        prop_assert_eq!(run_on(&steps, vidmem, true, true), run_on(&steps, vidmem, false, true));
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
