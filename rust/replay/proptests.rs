//! Random event streams of the kinds real allocators log, through every model at random
//! capacities (the `min_capacity` bisection included): no panic, and after every event no two
//! live blocks overlap, reserved covers the bytes handed out, reserved stays within the capacity
//! and each model's own bookkeeping validates.

use proptest::prelude::*;

use super::*;

const MIB: u64 = 1 << 20;
/// Trace addresses come from a small range so that hints, start segments and allocations
/// collide often.
const BASE: u64 = 0x7f00_0000_0000;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
        addr: u64,
    },
    /// Frees the i-th allocation made so far (maybe freed already: a free never seen).
    Free(usize),
    /// A free of an id no event made.
    FreeUnknown(u32),
    /// An allocation that reuses the id of an allocation still live (a missed free).
    Realloc {
        pick: usize,
        size: u64,
    },
    SegAlloc {
        addr: u64,
        size: u64,
    },
    SegFree {
        addr: u64,
        size: u64,
    },
    SegMap {
        addr: u64,
        size: u64,
    },
    SegUnmap {
        addr: u64,
        size: u64,
    },
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        3 => 4096u64..(1 << 20),
        3 => (1u64 << 20)..(12 << 20),
        1 => (12u64 << 20)..(64 << 20),
        1 => Just(0u64),
        1 => Just(2 * MIB),
        1 => Just(20 * MIB),
    ]
}

/// An address near BASE: on 2 MiB steps (where segments start), or anywhere on 512 B steps.
fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (0u64..48).prop_map(|k| BASE + k * 2 * MIB),
        2 => (0u64..(96 * 2048)).prop_map(|k| BASE + k * 512),
        1 => Just(0u64),
    ]
}

fn seg_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(2 * MIB),
        3 => Just(20 * MIB),
        2 => (1u64..32).prop_map(|k| k * 2 * MIB),
        1 => (1u64..4096).prop_map(|k| k * 512),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), 0u64..3, addr()).prop_map(|(size, stream, addr)| Op::Alloc { size, stream, addr }),
        6 => any::<usize>().prop_map(Op::Free),
        1 => (0u32..4096).prop_map(Op::FreeUnknown),
        1 => (any::<usize>(), size()).prop_map(|(pick, size)| Op::Realloc { pick, size }),
        2 => (addr(), seg_size()).prop_map(|(addr, size)| Op::SegAlloc { addr, size }),
        2 => (addr(), seg_size()).prop_map(|(addr, size)| Op::SegFree { addr, size }),
        2 => (addr(), seg_size()).prop_map(|(addr, size)| Op::SegMap { addr, size }),
        1 => (addr(), seg_size()).prop_map(|(addr, size)| Op::SegUnmap { addr, size }),
    ]
}

/// A start state rebuilt from segments: maybe overlapping, with blocks inside, across or
/// outside them, some overlapping each other.
fn start() -> impl Strategy<Value = StartState> {
    let seg = (addr(), seg_size(), 0u64..3);
    let block = (addr(), size(), 0u64..4096, 0u64..3);
    (
        proptest::collection::vec(seg, 0..5),
        proptest::collection::vec(block, 0..8),
    )
        .prop_map(|(segments, blocks)| StartState {
            segments,
            blocks: blocks
                .into_iter()
                .enumerate()
                .map(|(i, (a, req, extra, st))| (i as u32, a, req, req + extra * 512, st))
                .collect(),
        })
}

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => 0u64..(4 * MIB),
        3 => (1u64..96).prop_map(|k| k * MIB),
        1 => 1u64..(256 * MIB),
        1 => Just(1u64 << 34),
    ]
}

/// The engine's events for `ops`, ids fresh per allocation as the readers make them (after the
/// start state's ids), except where an op reuses one on purpose.
fn events(start: &StartState, ops: &[Op]) -> Vec<Event> {
    let mut next = start.blocks.len() as u32;
    let mut made: Vec<u32> = Vec::new();
    let ev = |action, id, size, stream, addr| Event {
        action,
        id,
        size,
        stream,
        addr,
    };
    ops.iter()
        .map(|op| match *op {
            Op::Alloc { size, stream, addr } => {
                made.push(next);
                next += 1;
                ev(Action::Alloc, next - 1, size, stream, addr)
            }
            Op::Free(i) if !made.is_empty() => ev(Action::Free, made[i % made.len()], 0, 0, 0),
            Op::Free(_) => ev(Action::Free, 0, 0, 0, 0),
            Op::FreeUnknown(id) => ev(Action::Free, id + 100_000, 0, 0, 0),
            Op::Realloc { pick, size } if !made.is_empty() => {
                ev(Action::Alloc, made[pick % made.len()], size, 0, 0)
            }
            Op::Realloc { size, .. } => ev(Action::Alloc, 0, size, 0, 0),
            Op::SegAlloc { addr, size } => ev(Action::SegmentAlloc, 0, size, 0, addr),
            Op::SegFree { addr, size } => ev(Action::SegmentFree, 0, size, 0, addr),
            Op::SegMap { addr, size } => ev(Action::SegmentMap, 0, size, 0, addr),
            Op::SegUnmap { addr, size } => ev(Action::SegmentUnmap, 0, size, 0, addr),
        })
        .collect()
}

fn options() -> impl Strategy<Value = CachingOptions> {
    (
        any::<bool>(),
        prop_oneof![3 => Just(u64::MAX), 1 => (1u64..64).prop_map(|k| k * MIB)],
        prop_oneof![Just(0u64), Just(4u64)],
        prop_oneof![
            Just(None),
            Just(Some([8, 4, 0, 2, 0, 0, 0, 1, 16, 2, 2, 2, 2, 2, 2, 2]))
        ],
        prop_oneof![3 => Just(0.0), 1 => Just(0.3), 1 => Just(0.8)],
    )
        .prop_map(|(e, m, d, t, gc)| CachingOptions {
            expandable_segments: e,
            max_split_size: m,
            roundup_power2_divisions: d,
            divisions_by_interval: t,
            garbage_collection_threshold: gc,
            recorded_expandable: e,
            ..CachingOptions::default()
        })
}

/// Every check after every event; the first broken one, with the event index.
fn check_every_event(
    name: &str,
    cap: u64,
    opts: CachingOptions,
    start: &StartState,
    ev: &[Event],
) -> Result<(), String> {
    let mut m = model_by_name(name, cap, opts).map_err(|e| e.to_string())?;
    let mut broken: Option<String> = None;
    let mut check = |i: usize, m: &dyn Model, live: u64, count: usize| {
        if broken.is_some() {
            return;
        }
        let fail = |what: String| Some(format!("{name} at event {i}: {what}"));
        if let Err(e) = m.validate() {
            broken = fail(e);
            return;
        }
        let mut blocks = m.live_blocks();
        if blocks.len() != count {
            broken = fail(format!(
                "{} live blocks, {count} live allocations",
                blocks.len()
            ));
            return;
        }
        blocks.retain(|b| b.1 > 0);
        blocks.sort_unstable();
        if let Some(w) = blocks.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
            broken = fail(format!("live blocks {:x?} and {:x?} overlap", w[0], w[1]));
            return;
        }
        let reserved = m.reserved();
        if reserved < live {
            broken = fail(format!("reserved {reserved} < live {live}"));
        } else if reserved > cap {
            broken = fail(format!("reserved {reserved} > capacity {cap}"));
        }
    };
    run_checked(
        m.as_mut(),
        cap,
        start,
        ev,
        ev.len() / 2,
        50,
        Some(&mut check),
    );
    broken.map_or(Ok(()), Err)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn every_model_survives_real_event_streams(
        start in start(),
        ops in proptest::collection::vec(op(), 0..120),
        cap in capacity(),
        opts in options(),
    ) {
        let ev = events(&start, &ops);
        for name in MODEL_NAMES {
            if let Err(e) = check_every_event(name, cap, opts, &start, &ev) {
                prop_assert!(false, "{}", e);
            }
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn min_capacity_survives_real_event_streams(
        start in start(),
        ops in proptest::collection::vec(op(), 0..60),
        hi in prop_oneof![0u64..(4 * MIB), (1u64..160).prop_map(|k| k * MIB)],
        step in prop_oneof![Just(MIB), Just(2 * MIB), Just(64 * MIB), 1u64..(8 * MIB)],
        opts in options(),
    ) {
        let ev = events(&start, &ops);
        for name in MODEL_NAMES {
            let make = |cap| model_by_name(name, cap, opts);
            let got = min_capacity(&make, &start, &ev, 0, hi, step).unwrap();
            if let Some(c) = got {
                prop_assert!(c <= hi.div_ceil(step).max(1) * step, "{name}: {c} above {hi}");
            }
        }
    }
}
