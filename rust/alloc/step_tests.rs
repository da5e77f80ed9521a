//! Steps served from a plan: recording, serving, departures, carried and stream-ordered
//! frees, rebuilds, and a property test of random steps with random departures.

use proptest::prelude::*;

use super::tests::{device, MIB};
use super::*;

pub(super) fn pool(vidmem: u64) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    Pool::new(device(vidmem), cfg).unwrap()
}

pub(super) fn on(size: u64, stream: u64) -> Request {
    Request {
        size,
        stream,
        ..Request::default()
    }
}

/// One event of a step: allocate request `i` (its size and stream), or free request `i`.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ev {
    A(usize, u64, u64),
    F(usize),
}

/// A training-like step: a long-lived buffer, activations freed in reverse, temporaries.
fn base_step() -> Vec<Ev> {
    use Ev::*;
    vec![
        A(0, 3 * MIB, 0),
        A(1, MIB, 0),
        A(2, 5 * MIB, 0),
        A(3, 4096, 0),
        F(3),
        A(4, 2 * MIB + 512, 0),
        F(2),
        A(5, 700 * 1024, 0),
        F(4),
        F(5),
        F(1),
        F(0),
    ]
}

/// Runs `evs` as one step; returns the handles left live (by request index).
fn run_step(p: &mut Pool, evs: &[Ev]) -> BTreeMap<usize, AllocId> {
    p.step_begin().unwrap();
    let mut live = BTreeMap::new();
    for &e in evs {
        match e {
            Ev::A(i, size, stream) => {
                live.insert(i, p.alloc(on(size, stream)).unwrap().0);
            }
            Ev::F(i) => p.free(live.remove(&i).unwrap()).unwrap(),
        }
        disjoint(p);
    }
    p.step_end().unwrap();
    live
}

use std::collections::BTreeMap;

/// A pool that recorded one `base_step` and holds its plan.
fn planned() -> Pool {
    let mut p = pool(256 * MIB);
    p.set_step_recording(1).unwrap();
    run_step(&mut p, &base_step());
    p
}

/// No two live or freeing allocations share a byte.
fn disjoint(p: &Pool) {
    let mut r: Vec<(u64, u64)> = p
        .allocations()
        .iter()
        .map(|x| (x.ptr, x.ptr + x.rounded))
        .collect();
    r.sort_unstable();
    for w in r.windows(2) {
        assert!(w[1].0 >= w[0].1, "overlapping allocations {w:?}");
    }
}

#[test]
fn later_steps_are_served_from_the_plan() {
    let mut p = pool(256 * MIB);
    run_step(&mut p, &base_step());
    run_step(&mut p, &base_step());
    let c = p.step_counts();
    assert_eq!((c.hits, c.misses, c.entries), (0, 0, 6));
    // the step's live peak: requests 0, 1, 2 and 4 (3 + 1 + 5 + 2 MiB + 512 B, rounded)
    let live_peak = 11 * MIB + 512;
    assert!(
        c.arena_bytes >= live_peak && c.arena_bytes <= live_peak + 4096,
        "{c:?}"
    );
    let used = p.stats().used_bytes;
    assert_eq!(used, c.arena_bytes, "the arena shows as used");
    for _ in 0..3 {
        run_step(&mut p, &base_step());
    }
    let c = p.step_counts();
    assert_eq!((c.hits, c.misses, c.served_steps), (18, 0, 3));
    // outside a step: the normal path
    let (id, ptr) = p.alloc(on(MIB, 0)).unwrap();
    let s = p.steps.plan.as_ref().unwrap();
    assert!(ptr < s.base || ptr >= s.base + s.bytes);
    p.free(id).unwrap();
    assert_eq!(p.step_counts().hits, 18);
    p.validate().unwrap();
}

#[test]
fn served_pointers_lie_in_the_arena_at_their_offsets() {
    let mut p = planned();
    p.step_begin().unwrap();
    let (_, p0) = p.alloc(on(3 * MIB, 0)).unwrap();
    let s = p.steps.plan.as_ref().unwrap();
    assert_eq!(p0, s.base + s.entries[0].off);
    assert!(
        p.set_step_recording(3).is_err(),
        "set before the first step"
    );
}

#[test]
fn a_departing_request_falls_back_and_the_rest_still_hit() {
    let mut p = planned();
    // request 2 asks another size (dynamic shape), request 5 is on another stream
    let mut step = base_step();
    step[2] = Ev::A(2, 6 * MIB, 0);
    step[7] = Ev::A(5, 700 * 1024, 9);
    run_step(&mut p, &step);
    let c = p.step_counts();
    assert_eq!((c.hits, c.misses), (4, 2));
    // an extra request inserted, and one dropped: the cursor re-synchronises
    let mut step = base_step();
    step.insert(1, Ev::A(9, 123_456, 0));
    step.insert(2, Ev::F(9));
    step.retain(|e| !matches!(e, Ev::A(3, ..) | Ev::F(3)));
    run_step(&mut p, &step);
    let c = p.step_counts();
    assert_eq!((c.hits, c.misses), (4 + 5, 2 + 1));
    p.validate().unwrap();
}

#[test]
fn a_served_block_live_after_its_step_blocks_only_what_overlaps_it() {
    let mut p = planned();
    // request 1 (1 MiB) kept past the step's end
    let mut step = base_step();
    step.retain(|e| !matches!(e, Ev::F(1)));
    let kept = run_step(&mut p, &step);
    assert_eq!(p.step_counts().hits, 6);
    // next step: entry 1 is still held; it and whatever overlaps it fall back, safely
    let before = p.step_counts();
    run_step(&mut p, &base_step());
    let c = p.step_counts();
    assert!(c.misses > before.misses, "entry 1 itself cannot be served");
    assert!(c.hits > before.hits, "entries away from it still are");
    p.free(kept[&1]).unwrap();
    let before = p.step_counts();
    run_step(&mut p, &base_step());
    assert_eq!(p.step_counts().hits - before.hits, 6);
    p.validate().unwrap();
}

/// A pool that recorded a step of two 2 MiB requests, each freed before the next (the plan
/// puts them at one address), then `more`, and holds its plan.
fn planned_twice(more: &[Ev]) -> Pool {
    let mut p = pool(256 * MIB);
    p.set_step_recording(1).unwrap();
    let mut step = vec![
        Ev::A(0, 2 * MIB, 0),
        Ev::F(0),
        Ev::A(1, 2 * MIB, 0),
        Ev::F(1),
    ];
    step.extend_from_slice(more);
    run_step(&mut p, &step);
    p
}

#[test]
fn a_served_block_freed_on_another_stream_waits_for_its_fence() {
    let mut p = planned_twice(&[]);
    let s = p.steps.plan.as_ref().unwrap();
    assert_eq!(
        s.entries[0].off, s.entries[1].off,
        "the plan reuses the address"
    );
    p.step_begin().unwrap();
    let (a, pa) = p.alloc(on(2 * MIB, 0)).unwrap();
    let fence = p.free_async(a, 5).unwrap();
    // stream 5's work may still use it: the second request takes other memory
    let (b, pb) = p.alloc(on(2 * MIB, 0)).unwrap();
    assert_ne!(pa, pb);
    assert_eq!(p.step_counts().misses, 1);
    p.free(b).unwrap();
    p.step_end().unwrap();
    p.complete(fence).unwrap();
    p.step_begin().unwrap();
    let (a, pa2) = p.alloc(on(2 * MIB, 0)).unwrap();
    assert_eq!(pa2, pa);
    p.free(a).unwrap();
    p.step_end().unwrap();
    p.validate().unwrap();
}

#[test]
fn a_served_block_freed_on_a_stream_serves_that_stream_at_once() {
    // entries 0 and 1 share an address; 2 and 3 (on stream 4) share another
    let mut p = planned_twice(&[
        Ev::A(2, MIB, 4),
        Ev::F(2),
        Ev::A(3, 512 * 1024, 4),
        Ev::F(3),
    ]);
    p.step_begin().unwrap();
    let (a, pa) = p.alloc(on(2 * MIB, 0)).unwrap();
    let fence = p.free_async(a, 0).unwrap();
    // stream 0's next request runs after the work queued before the free: it takes the block
    let (b, pb) = p.alloc(on(2 * MIB, 0)).unwrap();
    assert_eq!(pb, pa);
    assert_eq!((p.step_counts().hits, p.step_counts().misses), (2, 0));
    assert_eq!(
        p.stats().freeing_bytes,
        0,
        "the pending free was taken over"
    );
    p.free(b).unwrap();
    // a request that covers only part of a block freed on its stream does not take it
    let (c, pc) = p.alloc(on(MIB, 4)).unwrap();
    let fence2 = p.free_async(c, 4).unwrap();
    let (d, pd) = p.alloc(on(512 * 1024, 4)).unwrap();
    assert!(pd < pc || pd >= pc + MIB, "outside the block still freeing");
    assert_eq!(p.step_counts().misses, 1);
    p.free(d).unwrap();
    p.step_end().unwrap();
    assert_eq!(p.complete(fence).unwrap(), 0, "a stale fence frees nothing");
    assert_eq!(p.complete(fence2).unwrap(), 1);
    p.validate().unwrap();
}

#[test]
fn a_plan_that_keeps_missing_is_rebuilt() {
    let mut p = planned();
    let other: Vec<Ev> = base_step()
        .into_iter()
        .map(|e| match e {
            Ev::A(i, s, st) => Ev::A(i, s + 256 * 3, st),
            f => f,
        })
        .collect();
    run_step(&mut p, &other);
    assert_eq!(
        p.step_counts().rebuilds,
        0,
        "one step is not enough to judge"
    );
    run_step(&mut p, &other);
    let c = p.step_counts();
    assert_eq!(
        (c.rebuilds, c.arena_bytes),
        (1, 0),
        "dropped: recording again"
    );
    run_step(&mut p, &other); // recorded
    run_step(&mut p, &other);
    let c = p.step_counts();
    assert_eq!(c.hits, 6, "the new plan serves the new step");
    assert!(c.arena_bytes > 0);
    p.validate().unwrap();
}

#[test]
fn closing_with_served_blocks_live_gives_every_page_back() {
    let mut p = planned();
    p.step_begin().unwrap();
    p.alloc(on(3 * MIB, 0)).unwrap();
    assert_eq!(p.close().unwrap(), 1);
    assert_eq!(p.reserved_bytes(), 0);
    assert!(p.step_begin().is_err());
}

#[test]
fn steps_open_and_close_in_pairs() {
    let mut p = pool(64 * MIB);
    assert!(matches!(p.step_end(), Err(Error::InvalidState(_))));
    p.step_begin().unwrap();
    assert!(matches!(p.step_begin(), Err(Error::InvalidState(_))));
    p.step_end().unwrap();
    assert!(matches!(
        p.set_step_recording(0),
        Err(Error::InvalidArgument(_))
    ));
}

#[derive(Clone, Debug)]
pub(super) enum Dep {
    /// Request `i` asks `extra` more granules.
    Resize(usize, u64),
    /// Request `i` is not made (nor freed).
    Drop(usize),
    /// Request `i` is freed at the step's end instead.
    Late(usize),
    /// Request `i` is freed on stream 7 (stream-ordered), completed at the step's end.
    Async(usize),
    /// Request `i` is left live into the next step, freed at its end.
    Carry(usize),
    /// Requests `i` and `i + 1` come in the other order (their sizes and streams swap).
    Swap(usize),
}

pub(super) fn dep() -> impl Strategy<Value = Dep> {
    prop_oneof![
        (0..24usize, 1..64u64).prop_map(|(i, e)| Dep::Resize(i, e)),
        (0..24usize).prop_map(Dep::Drop),
        (0..24usize).prop_map(Dep::Late),
        (0..24usize).prop_map(Dep::Async),
        (0..24usize).prop_map(Dep::Carry),
        (0..24usize).prop_map(Dep::Swap),
    ]
}

/// A random step of up to 24 requests: sizes from 256 B to 6 MiB, each freed after a
/// random number of later events (some outlive the step).
pub(super) fn step_seq() -> impl Strategy<Value = Vec<(u64, u64, usize)>> {
    proptest::collection::vec((8u32..23, 0..2u64, 0usize..30), 1..24).prop_map(|v| {
        v.into_iter()
            .map(|(lg, stream, life)| {
                (
                    (1u64 << lg) + (life as u64 * 4096) % (1 << lg),
                    stream,
                    life,
                )
            })
            .collect()
    })
}

/// The events of a step from `seq` with departures `deps`.
pub(super) fn events(seq: &[(u64, u64, usize)], deps: &[Dep]) -> (Vec<Ev>, Vec<usize>, Vec<usize>) {
    let mut sizes: Vec<Option<(u64, u64)>> = seq.iter().map(|&(s, st, _)| Some((s, st))).collect();
    let (mut late, mut asyncs, mut carry) = (vec![], vec![], vec![]);
    for d in deps {
        match *d {
            Dep::Resize(i, e) if i < seq.len() => {
                sizes[i] = sizes[i].map(|(s, st)| (s + e * GRANULE, st))
            }
            Dep::Drop(i) if i < seq.len() => sizes[i] = None,
            Dep::Late(i) if i < seq.len() => late.push(i),
            Dep::Async(i) if i < seq.len() => asyncs.push(i),
            Dep::Carry(i) if i < seq.len() => carry.push(i),
            Dep::Swap(i) if i + 1 < seq.len() => sizes.swap(i, i + 1),
            _ => {}
        }
    }
    // event order: request i at time 2i, its free at 2(i + life) + 1
    let mut evs: Vec<(usize, Ev)> = vec![];
    for (i, &(_, _, life)) in seq.iter().enumerate() {
        let Some((s, st)) = sizes[i] else { continue };
        evs.push((2 * i, Ev::A(i, s, st)));
        let end = i + life;
        if end < seq.len() && !late.contains(&i) && !carry.contains(&i) {
            evs.push((2 * end + 1, Ev::F(i)));
        }
    }
    evs.sort_by_key(|e| e.0);
    let present = |i: &usize| sizes[*i].is_some();
    (
        evs.into_iter().map(|e| e.1).collect(),
        asyncs.into_iter().filter(present).collect(),
        carry.into_iter().filter(present).collect(),
    )
}

/// The end of a step of `events`: the allocations carried from the step before are freed,
/// the step closed (`stepped`), and those left `live` freed but the ones to `carry` on.
pub(super) fn end_step(
    p: &mut Pool,
    stepped: bool,
    live: BTreeMap<usize, AllocId>,
    carry: &[usize],
    carried: &mut Vec<AllocId>,
) {
    for id in carried.drain(..) {
        p.free(id).unwrap();
    }
    if stepped {
        p.step_end().unwrap();
    }
    for (i, id) in live {
        if carry.contains(&i) {
            carried.push(id);
        } else {
            p.free(id).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Random steps with random departures: served or not, no two live allocations ever share
    /// a byte, every request succeeds (the device is large enough for the normal path to
    /// serve all of them), and the plan's invariants hold after every call: through the
    /// pool's self-check (`cfg.check`, where every request takes `step_alloc_slow`), or,
    /// without it (`checked` false: the served path), by `validate` after each event. With
    /// `by_ptr`, every second free is by pointer (`free_ptr`, or `free_batch` of one).
    #[test]
    fn random_departures_never_overlap_or_fail(
        seq in step_seq(),
        steps in proptest::collection::vec(proptest::collection::vec(dep(), 0..4), 1..7),
        record in 1u32..3,
        checked in any::<bool>(),
        by_ptr in any::<bool>(),
    ) {
        let mut p = pool(1 << 30);
        p.cfg.check = checked;
        p.set_step_recording(record).unwrap();
        let mut carried: Vec<AllocId> = vec![];
        let mut plain = 0;
        for deps in std::iter::once(vec![]).chain(std::iter::once(vec![])).chain(steps) {
            let (evs, asyncs, carry) = events(&seq, &deps);
            p.step_begin().unwrap();
            let mut live: BTreeMap<usize, (AllocId, u64)> = BTreeMap::new();
            let mut fences = vec![];
            for e in evs {
                match e {
                    Ev::A(i, s, st) => {
                        live.insert(i, p.alloc(on(s, st)).unwrap());
                        // allocations outside the plan's arena and its requests interleave
                        if i % 5 == 0 {
                            plain += 1;
                            let (x, _) = p.alloc(on(4096 * (plain % 7 + 1), 0)).unwrap();
                            p.free(x).unwrap();
                        }
                    }
                    Ev::F(i) => {
                        let (id, ptr) = live.remove(&i).unwrap();
                        if asyncs.contains(&i) {
                            fences.push(p.free_async(id, 7).unwrap());
                        } else if by_ptr && i % 4 == 1 {
                            p.free_ptr(ptr).unwrap();
                        } else if by_ptr && i % 4 == 3 {
                            p.free_batch(&[ptr]).unwrap();
                        } else {
                            p.free(id).unwrap();
                        }
                    }
                }
                disjoint(&p);
                if !checked {
                    p.validate().unwrap();
                }
            }
            let live = live.into_iter().map(|(i, (id, _))| (i, id)).collect();
            end_step(&mut p, true, live, &carry, &mut carried);
            for f in fences {
                p.complete(f).unwrap();
            }
            disjoint(&p);
        }
        p.validate().unwrap();
        p.close().unwrap();
        prop_assert_eq!(p.reserved_bytes(), 0);
    }
}

#[test]
fn served_allocations_are_found_by_pointer_outside_the_pointer_index() {
    let mut p = planned();
    p.cfg.check = false; // (the served path; `validate` below)
    p.step_begin().unwrap();
    let (a0, p0) = p.alloc(on(3 * MIB, 0)).unwrap();
    let (a1, p1) = p.alloc(on(MIB, 0)).unwrap();
    let (_, p2) = p.alloc(on(5 * MIB, 0)).unwrap();
    assert_eq!(p.step_counts().hits, 3);
    assert_eq!(p.id_of(p0).unwrap(), a0, "found with the index built now");
    assert_eq!(
        p.by_ptr.as_ref().unwrap().get(p0),
        None,
        "served: not in the index"
    );
    assert!(matches!(p.free_ptr(p0 + 4096), Err(Error::InvalidFree(_))));
    assert!(matches!(
        p.free_batch(&[p1, p1]),
        Err(Error::InvalidFree(_))
    ));
    assert!(p.info(a1).is_ok(), "a refused batch frees nothing");
    p.validate().unwrap();
    let (_, p3) = p.alloc(on(4096, 0)).unwrap();
    p.free_ptr(p3).unwrap();
    assert!(
        matches!(p.free_ptr(p3), Err(Error::InvalidFree(_))),
        "freed twice"
    );
    let (a4, _) = p.alloc(on(2 * MIB + 512, 0)).unwrap();
    p.free_batch(&[p2]).unwrap();
    let (_, p5) = p.alloc(on(700 * 1024, 0)).unwrap();
    p.free(a4).unwrap();
    p.free_batch(&[p5]).unwrap();
    let (_, q) = p.alloc(on(MIB, 0)).unwrap(); // (past the step's requests: the normal path)
    p.free_batch(&[p1, q]).unwrap();
    p.step_end().unwrap();
    assert_eq!(p.step_counts().hits, 6);
    p.validate().unwrap();
    // request 0 stays live; once the plan is dropped it is a plain allocation, indexed
    p.step_drop_plan();
    assert_eq!(p.by_ptr.as_ref().unwrap().get(p0), Some(a0.index));
    p.validate().unwrap();
    p.free_ptr(p0).unwrap();
    p.validate().unwrap();
}

#[test]
fn a_plan_never_makes_a_request_fail_that_the_normal_path_serves() {
    // the plan's arena holds 40 of the device's 64 MiB; a departing 48 MiB request fits
    // only once the arena goes back
    let mut p = pool(64 * MIB);
    p.set_step_recording(1).unwrap();
    run_step(&mut p, &[Ev::A(0, 40 * MIB, 0), Ev::F(0)]);
    assert_eq!(p.step_counts().arena_bytes, 40 * MIB);
    let live = run_step(&mut p, &[Ev::A(0, 48 * MIB, 0)]);
    let c = p.step_counts();
    assert_eq!((c.misses, c.rebuilds, c.arena_bytes), (1, 1, 0));
    p.free(live[&0]).unwrap();
    // the step the plan was dropped in is not recorded; the next is, and planned
    run_step(&mut p, &[Ev::A(0, 8 * MIB, 0), Ev::F(0)]);
    assert_eq!(p.step_counts().arena_bytes, 8 * MIB);
    run_step(&mut p, &[Ev::A(0, 8 * MIB, 0), Ev::F(0)]);
    assert_eq!(p.step_counts().hits, 1);
    p.validate().unwrap();
}

/// A served-step loop for profilers, as benches/step.rs: steps of 512 log-uniform requests
/// (256 B – 8 MiB), request `i` freed once request `i + 8` is made, served from the plan.
/// `PAIRS=n` (rounded to whole steps); `NORMAL=1` runs the same requests without steps. The
/// cost of a pair is the difference of two runs over the difference of their pairs:
/// `PAIRS=5120 valgrind --tool=callgrind <lib test binary> --ignored --exact
/// alloc::step_tests::served_for_profiler` and again with `PAIRS=20480`.
#[test]
#[ignore = "a profiling loop for callgrind and perf, not a check"]
fn served_for_profiler() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let sizes: Vec<u64> = (0..512)
        .map(|_| 2f64.powf(rng.gen_range(8.0..23.0)) as u64)
        .collect();
    let normal = std::env::var("NORMAL").is_ok_and(|v| v == "1");
    let steps = std::env::var("PAIRS").map_or(100_000, |v| v.parse::<usize>().unwrap()) / 512;
    let mut p = Pool::new(device(80 << 30), PoolConfig::new(2 * MIB)).unwrap();
    p.set_step_recording(1).unwrap();
    let mut live = std::collections::VecDeque::with_capacity(9);
    let mut run = |p: &mut Pool| {
        if !normal {
            p.step_begin().unwrap();
        }
        for &s in &sizes {
            live.push_back(p.alloc(on(s, 0)).unwrap().0);
            if live.len() > 8 {
                p.free(live.pop_front().unwrap()).unwrap();
            }
        }
        while let Some(id) = live.pop_front() {
            p.free(id).unwrap();
        }
        if !normal {
            p.step_end().unwrap();
        }
    };
    for _ in 0..3 {
        run(&mut p);
    }
    let hits = p.step_counts().hits;
    let t = std::time::Instant::now();
    for _ in 0..steps {
        run(&mut p);
    }
    let ns = t.elapsed().as_nanos() as f64 / (steps * 512).max(1) as f64;
    let c = p.step_counts();
    eprintln!(
        "{ns:.1} ns per pair; {} of {} requests served from the plan",
        c.hits - hits,
        steps * 512
    );
}
