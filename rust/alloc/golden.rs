//! Golden outputs: the pool's statistics and page snapshot after every operation of fixed
//! random streams (the property test's operations, from fixed seeds) and of recorded traces.
//! A refactoring that keeps behaviour leaves them byte-identical:
//!
//! ```text
//! GOLDEN_OUT=/tmp/golden-before cargo test --release --no-default-features --lib \
//!     golden_outputs -- --ignored --nocapture
//! GOLDEN_OUT=/tmp/golden-after  ...;  diff -r /tmp/golden-before /tmp/golden-after
//! ```
//!
//! `GOLDEN_EVENTS` names a folder of `NAME.txt` event files, one event a line: `a PTR SIZE
//! STREAM` (an allocation the trace placed at PTR) or `f PTR` (its free), the start state's
//! live blocks first, written from `gpumm.traces.read_traces` over `../shared/traces/`:
//!
//! ```text
//! for path in glob("../shared/traces/*.csv.gz") + glob("../shared/traces/**/*.pickle"):
//!     for k, t in enumerate(read_traces(path)):
//!         lines = [f"a {a} {r} {s}" for (a, r, _, s) in (t.start.blocks if t.start else [])]
//!         lines += [f"a {e.ptr} {e.size} {e.stream}" if e.action == "alloc" else f"f {e.ptr}"
//!                   for e in t.events if e.action in ("alloc", "free")]
//!         write(f"{stem(path)}.{k}.txt", lines)
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write as _;
use std::path::Path;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::tests::{device, drain_ptrs, ids_of, op, stream_pool, Op, MIB};
use super::*;

/// The statistics without the measured latencies (times differ from run to run).
fn stats_of(p: &Pool) -> PoolStats {
    let mut s = p.stats();
    (s.latency_mean_ns, s.latency_p50_ns, s.latency_p99_ns) = (0.0, 0.0, 0.0);
    s
}

fn picture(p: &Pool) -> String {
    format!("{:?}\n{:?}\n", stats_of(p), p.page_snapshot())
}

/// One property-test stream from `seed`, the same operations as
/// `random_streams_keep_every_invariant`, with the pool's picture after each.
fn random_stream(seed: u8, out: &mut String) {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    let strategy = (proptest::collection::vec(op(), 1..120), proptest::bool::ANY);
    let (ops, threshold) = strategy.new_tree(&mut runner).unwrap().current();
    let mut p = stream_pool(threshold);
    let mut live: Vec<AllocId> = vec![];
    let (mut fences, mut batches) = (vec![], vec![]);
    for op in ops {
        let _ = writeln!(out, "{op:?}");
        let r = match op {
            Op::Alloc(size, stream, movable) => {
                let r = p.alloc(Request {
                    size,
                    stream,
                    movable,
                    scope: 0,
                });
                if let Ok((id, _)) = r {
                    live.push(id);
                }
                format!("{r:?}")
            }
            Op::Batch(sizes) => {
                let mut v = vec![];
                let r = p.alloc_batch(&sizes, 0, &mut v);
                if r.is_ok() {
                    let ids = ids_of(&p, &v);
                    live.extend(&ids);
                    batches.push(ids);
                }
                format!("{r:?} {v:?}")
            }
            Op::Arena(sizes, stream) => {
                let mut v = vec![];
                let r = p.alloc_arena(&sizes, stream, &mut v);
                if r.is_ok() {
                    let ids = ids_of(&p, &v);
                    live.extend(&ids);
                    batches.push(ids);
                }
                format!("{r:?} {v:?}")
            }
            Op::FreeBatch(i, n) if !live.is_empty() => {
                let ptrs = drain_ptrs(&p, &mut live, i, n);
                format!("{:?}", p.free_batch(&ptrs))
            }
            Op::FreeLastBatch => {
                let mut r = String::new();
                while let Some(ids) = batches.pop() {
                    if ids.iter().all(|id| live.contains(id)) {
                        let ptrs: Vec<u64> =
                            ids.iter().map(|&id| p.info(id).unwrap().ptr).collect();
                        r = format!("{:?}", p.free_batch(&ptrs));
                        live.retain(|id| !ids.contains(id));
                        break;
                    }
                }
                r
            }
            Op::Free(i) if !live.is_empty() => {
                let id = live.swap_remove(i % live.len());
                format!("{:?}", p.free(id))
            }
            Op::FreePtr(i) if !live.is_empty() => {
                let id = live.swap_remove(i % live.len());
                let ptr = p.info(id).unwrap().ptr;
                format!("{:?}", p.free_ptr(ptr))
            }
            Op::FreeAsync(i, s) if !live.is_empty() => {
                let id = live.swap_remove(i % live.len());
                let r = p.free_async(id, s);
                if let Ok(f) = r {
                    fences.push(f);
                }
                format!("{r:?}")
            }
            Op::Complete(i) if !fences.is_empty() => {
                format!("{:?}", p.complete(fences[i % fences.len()]))
            }
            Op::Sync => format!("{:?}", p.synchronize(None)),
            Op::Defrag => format!("{:?}", p.defrag()),
            Op::Trim => format!("{:?}", p.trim(4 * MIB)),
            _ => String::new(),
        };
        let _ = writeln!(out, "{r}\n{:?}\n{}", p.allocations(), picture(&p));
    }
    let _ = writeln!(out, "{:?}", p.synchronize(None));
    for id in live {
        let _ = writeln!(out, "{:?}", p.free(id));
    }
    let _ = writeln!(out, "{}", picture(&p));
}

/// A trace's events through a pool on an 80 GiB simulated device: one line an event (the
/// result and a hash of the picture; a picture of thousands of pages an event would be
/// gigabytes), the whole picture every 1,000 events and at the end. `movable`: every
/// allocation movable, `defrag` every 1,000 events.
fn trace(events: &str, movable: bool, out: &mut String) {
    let mut p = Pool::new(device(80 << 30), PoolConfig::new(2 * MIB)).unwrap();
    let mut ids: HashMap<u64, AllocId> = HashMap::new();
    for (i, line) in events.lines().enumerate() {
        let f: Vec<u64> = line[2..].split(' ').map(|x| x.parse().unwrap()).collect();
        let r = if line.starts_with('a') {
            let r = p.alloc(Request {
                size: f[1].max(1),
                stream: f[2],
                movable,
                scope: 0,
            });
            if let Ok((id, _)) = r {
                ids.insert(f[0], id);
            }
            format!("{r:?}")
        } else {
            match ids.remove(&f[0]) {
                Some(id) => format!("{:?}", p.free(id)),
                None => "-".into(),
            }
        };
        let pic = picture(&p);
        let mut h = DefaultHasher::new();
        pic.hash(&mut h);
        let _ = writeln!(out, "{i} {r} {:016x}", h.finish());
        if i % 1000 == 999 {
            if movable {
                let _ = writeln!(out, "{:?}", p.defrag());
            }
            out.push_str(&pic);
        }
    }
    let _ = writeln!(out, "{:?}\n{}", p.trim(0), picture(&p));
}

#[test]
#[ignore = "a tool, not a check: writes every picture to GOLDEN_OUT for a diff (minutes)"]
fn golden_outputs() {
    let dir = std::env::var("GOLDEN_OUT").expect("GOLDEN_OUT: the folder to write to");
    let dir = Path::new(&dir);
    std::fs::create_dir_all(dir).unwrap();
    let write = |name: &str, text: &str| {
        let mut f = std::fs::File::create(dir.join(name)).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };
    for seed in 0..48u8 {
        let mut out = String::new();
        random_stream(seed, &mut out);
        write(&format!("stream-{seed:02}.txt"), &out);
    }
    let Ok(events) = std::env::var("GOLDEN_EVENTS") else {
        return;
    };
    let mut names: Vec<_> = std::fs::read_dir(events)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for path in names {
        let text = std::fs::read_to_string(&path).unwrap();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        for movable in [false, true] {
            let mut out = String::new();
            trace(&text, movable, &mut out);
            write(
                &format!(
                    "trace-{stem}-{}.txt",
                    ["fixed", "movable"][movable as usize]
                ),
                &out,
            );
            eprintln!("{stem} {movable}");
        }
    }
}
