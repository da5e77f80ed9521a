//! Heap requests of at least 1/`HEAP_END_DIV` of a page carved from the end of the free block
//! they take, in a large pool that serves large requests (`carves_at_block_end`; config.rs,
//! `HEAP_END_DIV`).

use super::super::tests::{device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

/// A 64 KiB tensor (it opens a heap page), then three 512 KiB activations, each followed by a
/// 64 KiB tensor that lives on, in a pool that first took `base` bytes (a large request); the
/// activations freed, then a 1000 KiB request. Returns (the pool's reserve before that request, after it, where the
/// first activation was from its page's start).
fn after_the_activations(base: u64) -> (u64, u64, u64) {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    let alloc = |p: &mut Pool, size| {
        p.alloc(Request {
            size,
            ..Request::default()
        })
        .unwrap()
    };
    alloc(&mut p, base);
    alloc(&mut p, 64 * KIB);
    let mut acts = Vec::new();
    for _ in 0..3 {
        acts.push(alloc(&mut p, 512 * KIB));
        alloc(&mut p, 64 * KIB);
    }
    let first = acts[0].1 % (2 * MIB);
    for (a, _) in acts {
        p.free(a).unwrap();
    }
    let before = p.reserved_bytes();
    alloc(&mut p, 1000 * KIB);
    (before, p.reserved_bytes(), first)
}

#[test]
fn activations_from_the_block_end_leave_one_hole_when_freed() {
    // from the end: the three lie at [512 KiB, 2 MiB) above the small tensors' [0, 256 KiB),
    // and freed they join into one 1.75 MiB block that holds the 1000 KiB request; from the
    // start each 512 KiB hole lies between two small tensors and none holds it
    let (before, after, first) = after_the_activations(SMALL_POOL);
    assert_eq!(after, before, "the pool did not grow");
    assert_eq!(first, 2 * MIB - 512 * KIB, "carved from the page's end");
}

#[test]
fn a_small_pool_carves_from_the_block_start() {
    // below SMALL_POOL a page is a larger share of the pool: the rule stays off there
    let (_, _, first) = after_the_activations(8 * MIB);
    assert_eq!(first, 64 * KIB, "right after the first small tensor");
}
