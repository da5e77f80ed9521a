//! The last resort under stress: random streams of requests (256 B to three pages, small and
//! large mixed), frees (now, by pointer, in batches, on streams), batches, arenas, steps,
//! defrag and trim, replayed on a device a few pages short of what the stream needs without
//! refusals, so that requests are refused (and the last resort runs) often. Every invariant
//! is checked after every mutation (`PoolConfig::check`), and a refused request must leave
//! the pool exactly as it found it. `PROPTEST_CASES=2000 cargo test --no-default-features
//! --lib pressure::stress` for a longer run.

use std::cell::Cell;

use proptest::prelude::*;

use super::super::tests::{device, MIB};
use super::*;
use crate::backend::{Faulty, Simulated};

const KIB: u64 = 1 << 10;
const SHORT: u64 = 6;

thread_local! {
    /// (last resorts run, last resorts that placed the request), counted in test builds.
    pub(in crate::alloc) static LAST_RESORTS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

#[derive(Clone, Debug)]
enum Op {
    /// size, stream, movable, through the quick path first (as the bindings), the next call
    /// of the backend fails (a pool with a faulty backend)
    Alloc(u64, u64, bool, bool, bool),
    Batch(Vec<u64>),
    Arena(Vec<u64>),
    Free(usize),
    FreePtr(usize),
    FreeBatch(usize, usize),
    FreeAsync(usize, u64),
    FreeWhenDone(usize, u64),
    Complete(usize),
    Sync,
    Defrag,
    Trim(u64),
    Step,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 256u64..64 * KIB,
        3 => 64 * KIB..1024 * KIB,
        1 => prop::sample::select(vec![256, 1000, 64 * KIB, 576 * KIB, 1984 * KIB, 2 * MIB]),
        3 => 1024 * KIB..2 * MIB,
        2 => 2 * MIB..6 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (size(), 0u64..2, prop::bool::weighted(0.2), any::<bool>(), prop::bool::weighted(0.3))
            .prop_map(|(s, st, m, q, f)| Op::Alloc(s, st, m, q, f)),
        1 => proptest::collection::vec(size(), 1..5).prop_map(Op::Batch),
        1 => proptest::collection::vec(size(), 1..4).prop_map(Op::Arena),
        5 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreePtr),
        1 => (any::<usize>(), 1usize..4).prop_map(|(i, n)| Op::FreeBatch(i, n)),
        2 => (any::<usize>(), 0u64..2).prop_map(|(i, s)| Op::FreeAsync(i, s)),
        1 => (any::<usize>(), 0u64..2).prop_map(|(i, s)| Op::FreeWhenDone(i, s)),
        1 => any::<usize>().prop_map(Op::Complete),
        1 => Just(Op::Sync),
        1 => Just(Op::Defrag),
        1 => (0u64..3).prop_map(|k| Op::Trim(k * 2 * MIB)),
        1 => Just(Op::Step),
    ]
}

/// What a refusal must leave as it was: the statistics (less the failure and latency
/// counts), every page's blocks and every allocation.
type Picture = (PoolStats, Vec<PageSnapshot>, Vec<AllocInfo>);

fn picture(p: &Pool) -> Picture {
    let mut s = p.stats();
    s.failures = 0;
    s.success_rate = 0.0;
    s.latency_samples = 0;
    s.latency_mean_ns = 0.0;
    s.latency_p50_ns = 0.0;
    s.latency_p99_ns = 0.0;
    (s, p.page_snapshot(), p.allocations())
}

/// Whether a refusal now must change nothing: nothing that may move (compaction runs on the
/// way to out of memory), nothing cached or pending on a stream (given back or polled on the
/// way), no step open or plan held (a plan is dropped when the normal path runs out).
fn refusal_is_exact(p: &Pool) -> bool {
    let s = p.stats();
    s.cached_allocs == 0
        && p.pending_frees() == 0
        && !p.steps.open
        && p.steps.plan.is_none()
        && p.allocations().iter().all(|x| !x.movable)
}

struct Run {
    p: Pool,
    live: Vec<AllocId>,
    fences: Vec<u64>,
    in_step: bool,
    refusals: u64,
    /// Another pool on the same device, holding pages (so that the device runs out before
    /// this pool's limit: the pool is not under pressure when it refuses).
    _hog: Option<Pool>,
    /// The backend, when it fails on purpose (`Shape::faulty`).
    faulty: Option<Arc<Faulty>>,
}

/// How a stressed pool differs from the default one.
#[derive(Clone, Copy, Debug)]
struct Shape {
    rules: u8,
    /// A release threshold of 4 MiB (whole free pages leave segments at once).
    eager: bool,
    /// 64 KiB, not 1 MiB: more requests below a page are large ones.
    low_threshold: bool,
    /// Pages held by another pool of the device.
    hog: u64,
    /// A backend whose next reserve, map or copy fails where an `Op::Alloc` says so.
    faulty: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        0u8..4,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        prop::sample::select(vec![0u64, 0, 0, 2, 5]),
        prop::bool::weighted(0.25),
    )
        .prop_map(|(rules, eager, low_threshold, hog, faulty)| Shape {
            // (both rules twice as often as each alone)
            rules: rules | ((rules == 0) as u8 * 3),
            eager,
            low_threshold,
            hog,
            faulty,
        })
}

impl Run {
    fn new(pages: u64, shape: Shape, check: bool) -> Run {
        let vidmem = (pages + shape.hog) * 2 * MIB;
        let mut dev = device(vidmem);
        let faulty = shape.faulty.then(|| {
            let inner = Box::new(Simulated::new(vidmem, 2 * MIB).unwrap());
            let f = Arc::new(Faulty::new(inner, 0));
            let pmm = dev.pmm.clone();
            dev = Arc::new(Device {
                pmm,
                backend: f.clone(),
            });
            f
        });
        let mut cfg = PoolConfig::new(2 * MIB);
        cfg.check = check;
        cfg.release_threshold = shape.eager.then_some(4 * MIB);
        if shape.low_threshold {
            cfg.small_threshold = 64 * KIB;
        }
        let hog = (shape.hog > 0).then(|| {
            let mut c = PoolConfig::new(2 * MIB);
            c.initial_size = shape.hog * 2 * MIB;
            Pool::new(dev.clone(), c).unwrap()
        });
        let mut p = Pool::new(dev, cfg).unwrap();
        p.last_resort_rules = shape.rules;
        p.set_step_recording(1).unwrap();
        Run {
            p,
            live: vec![],
            fences: vec![],
            in_step: false,
            refusals: 0,
            _hog: hog,
            faulty,
        }
    }

    /// One operation; Err: a property broken.
    fn apply(&mut self, op: &Op) -> std::result::Result<(), TestCaseError> {
        let exact = refusal_is_exact(&self.p);
        let before = if exact { Some(picture(&self.p)) } else { None };
        let p = &mut self.p;
        let refused = |r: &mut Run| -> std::result::Result<(), TestCaseError> {
            r.refusals += 1;
            if let Some(b) = &before {
                let now = picture(&r.p);
                prop_assert!(*b == now, "a refusal changed the pool:\n{b:?}\n{now:?}");
            }
            Ok(())
        };
        match op.clone() {
            Op::Alloc(size, stream, movable, quick, fail) => {
                if let Some(f) = self.faulty.as_ref().filter(|_| fail) {
                    let n = f.calls.load(std::sync::atomic::Ordering::Relaxed);
                    f.fail_at.store(n + 1, std::sync::atomic::Ordering::Relaxed);
                }
                let req = Request {
                    size,
                    stream,
                    movable,
                    scope: 0,
                };
                let q = if quick { p.try_alloc_quick(req) } else { None };
                match q.unwrap_or_else(|| p.alloc(req)) {
                    Ok((id, _)) => self.live.push(id),
                    Err(Error::OutOfMemory(_) | Error::InvalidSize(_)) => refused(self)?,
                    Err(e) => panic!("{e:?}"),
                }
                if let Some(f) = &self.faulty {
                    f.fail_at.store(0, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Op::Batch(sizes) | Op::Arena(sizes) => {
                let mut out = vec![];
                let r = if matches!(op, Op::Batch(_)) {
                    p.alloc_batch(&sizes, 0, &mut out)
                } else {
                    p.alloc_arena(&sizes, 0, &mut out)
                };
                match r {
                    Ok(()) => {
                        let by_ptr: std::collections::HashMap<u64, AllocId> =
                            p.allocations().iter().map(|x| (x.ptr, x.id)).collect();
                        self.live.extend(out.iter().map(|ptr| by_ptr[ptr]));
                    }
                    Err(Error::OutOfMemory(_) | Error::InvalidSize(_)) => {
                        prop_assert!(out.is_empty());
                        refused(self)?
                    }
                    Err(e) => panic!("{e:?}"),
                }
            }
            Op::Free(i) if !self.live.is_empty() => {
                let id = self.live.swap_remove(i % self.live.len());
                p.free(id).unwrap();
            }
            Op::FreePtr(i) if !self.live.is_empty() => {
                let id = self.live.swap_remove(i % self.live.len());
                let ptr = p.info(id).unwrap().ptr;
                p.free_ptr(ptr).unwrap();
            }
            Op::FreeBatch(i, n) if !self.live.is_empty() => {
                let i = i % self.live.len();
                let n = n.min(self.live.len() - i);
                let ptrs: Vec<u64> = self
                    .live
                    .drain(i..i + n)
                    .map(|id| p.info(id).unwrap().ptr)
                    .collect();
                p.free_batch(&ptrs).unwrap();
            }
            Op::FreeAsync(i, s) if !self.live.is_empty() => {
                let id = self.live.swap_remove(i % self.live.len());
                self.fences.push(p.free_async(id, s).unwrap());
            }
            Op::FreeWhenDone(i, s) if !self.live.is_empty() => {
                let id = self.live.swap_remove(i % self.live.len());
                p.free_when_done(id, s).unwrap();
            }
            Op::Complete(i) if !self.fences.is_empty() => {
                p.complete(self.fences[i % self.fences.len()]).unwrap();
            }
            Op::Sync => {
                p.synchronize(None).unwrap();
            }
            Op::Defrag => match p.defrag() {
                Ok(_) => {}
                Err(e) => prop_assert!(self.faulty.is_some(), "{e:?}"),
            },
            Op::Trim(keep) => {
                p.trim(keep).unwrap();
            }
            Op::Step => {
                if self.in_step {
                    p.step_end().unwrap();
                } else {
                    p.step_begin().unwrap();
                }
                self.in_step = !self.in_step;
            }
            _ => {}
        }
        Ok(())
    }

    /// Everything freed: the pool holds no page in use.
    fn finish(mut self) -> std::result::Result<(), TestCaseError> {
        if self.in_step {
            self.p.step_end().unwrap();
        }
        self.p.synchronize(None).unwrap();
        for id in std::mem::take(&mut self.live) {
            self.p.free(id).unwrap();
        }
        self.p.validate().map_err(TestCaseError::fail)?;
        let s = self.p.stats();
        if self.p.steps.plan.is_some() {
            return Ok(()); // (the plan's arena stays while the plan does)
        }
        prop_assert_eq!(s.used_bytes, 0);
        prop_assert_eq!(s.pages_heap + s.pages_large, 0);
        Ok(())
    }
}

/// The pages the stream's pool peaks at on a device it never runs short on.
fn peak_pages(ops: &[Op], shape: Shape) -> u64 {
    let mut r = Run::new(256, Shape { hog: 0, ..shape }, false);
    for op in ops {
        r.apply(op).unwrap();
    }
    r.p.stats().peak_reserved / (2 * MIB)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn the_last_resort_keeps_every_invariant(
        ops in proptest::collection::vec(op(), 20..200),
        short in 1u64..8,
        shape in shape(),
    ) {
        let pages = peak_pages(&ops, shape).saturating_sub(short).max(4);
        let mut r = Run::new(pages, shape, true);
        for op in &ops {
            r.apply(op)?;
        }
        r.finish()?;
    }

    /// At the limit: a small device, and after each refusal a live allocation freed, so
    /// that the pool stays full and most requests past the first fill are refused or placed
    /// by the last resort.
    #[test]
    fn the_last_resort_at_the_limit(
        ops in proptest::collection::vec(op(), 20..300),
        pages in 4u64..16,
        shape in shape(),
    ) {
        let mut r = Run::new(pages, shape, true);
        for op in &ops {
            let n = r.refusals;
            r.apply(op)?;
            if r.refusals > n {
                if let Op::Alloc(size, ..) = op {
                    r.apply(&Op::Free(*size as usize))?;
                }
            }
        }
        r.finish()?;
    }
}

/// How often the last resort runs and places requests in the streams above (`--ignored
/// --nocapture`): a stress that never reaches it checks nothing.
#[test]
#[ignore]
fn tally() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    for limit in [false, true] {
        let mut refusals = 0;
        LAST_RESORTS.with(|c| c.set((0, 0)));
        for k in 0..200u64 {
            let ops = proptest::collection::vec(op(), 20..300)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            let shape = Shape {
                rules: 3,
                eager: false,
                low_threshold: false,
                hog: 0,
                faulty: k % 2 == 1,
            };
            let pages = if limit {
                4 + k % 12
            } else {
                peak_pages(&ops, shape).saturating_sub(SHORT).max(4)
            };
            let mut r = Run::new(pages, shape, false);
            for op in &ops {
                let n = r.refusals;
                r.apply(op).unwrap();
                if limit && r.refusals > n {
                    if let Op::Alloc(size, ..) = op {
                        r.apply(&Op::Free(*size as usize)).unwrap();
                    }
                }
            }
            refusals += r.refusals;
        }
        let (ran, placed) = LAST_RESORTS.with(|c| c.get());
        println!("at the limit {limit}: {refusals} refusals, last resort ran {ran} times, placed {placed}");
    }
}
