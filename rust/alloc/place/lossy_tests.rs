//! Small requests whose heap pages would each leave a large tail take the large path in a
//! pool that has served a large request (`lossy`; docs/reserve.md, "Heap pages" and "Small
//! pools as large ones").

use super::super::tests::{alloc_id as alloc, device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

/// (reserved MiB, heap pages) after `n` requests of `size` on a pool that holds `base` MiB
/// live.
fn after(base: u64, size: u64, n: usize) -> (u64, usize) {
    let mut p = Pool::new(device(1 << 30), PoolConfig::new(2 * MIB)).unwrap();
    alloc(&mut p, base * MIB);
    for _ in 0..n {
        alloc(&mut p, size);
    }
    p.validate().unwrap();
    let heap = p
        .page_snapshot()
        .iter()
        .filter(|pg| pg.kind == "heap")
        .count();
    ((p.reserved_bytes() - base * MIB) / MIB, heap)
}

#[test]
fn activations_that_leave_a_page_tail_lie_back_to_back_in_a_large_pool() {
    // three 588 KiB to a heap page leave 284 KiB of each; ten back to back in a large
    // segment take three pages and no heap page
    assert!((2 * MIB) % (588 * KIB) > 2 * MIB / LOSSY_TAIL_DIV as u64);
    assert_eq!(after(130, 588 * KIB, 10), (6, 0));
    const { assert!(70 * MIB >= SMALL_POOL) };
    assert_eq!(after(70, 588 * KIB, 10), (6, 0));
}

#[test]
fn activations_that_leave_a_page_tail_lie_back_to_back_in_a_small_pool_too() {
    // below `SMALL_POOL` (64 MiB), once a large request has come: as in a large pool (in heap
    // pages, three to a page, each page's last 284 KiB would be left to small requests only)
    const { assert!(4 * MIB < SMALL_POOL) };
    assert_eq!(after(4, 588 * KIB, 10), (6, 0));
}

#[test]
fn the_rule_leaves_requests_that_tile_a_page_alone() {
    // 512 KiB tiles a page: heap pages, four to a page
    assert_eq!(after(130, 512 * KIB, 8), (4, 2));
    // under an eighth of a page: heap pages, whatever the tail
    assert!(200 * KIB * (LOSSY_DIV as u64) < 2 * MIB);
    assert_eq!(after(130, 200 * KIB, 6), (2, 1));
    // an eighth or more with a tail over 1/16 (300 KiB leaves 248 KiB): back to back
    assert!(300 * KIB * (LOSSY_DIV as u64) >= 2 * MIB);
    assert_eq!(after(130, 300 * KIB, 6), (2, 0));
}

#[test]
fn a_pool_of_small_requests_only_keeps_them_in_heap_pages() {
    // 70 MiB of 200 KiB requests, then 588 KiB ones: no large request has come, so no large
    // segment is opened for them (the heap pages' holes stay usable by every small request)
    let mut p = Pool::new(device(1 << 30), PoolConfig::new(2 * MIB)).unwrap();
    for _ in 0..(70 * MIB / (200 * KIB)) {
        alloc(&mut p, 200 * KIB);
    }
    assert!(p.reserved_bytes() >= SMALL_POOL);
    for _ in 0..10 {
        alloc(&mut p, 588 * KIB);
    }
    let large = |p: &Pool| {
        p.page_snapshot()
            .iter()
            .filter(|pg| pg.kind == "large")
            .count()
    };
    assert_eq!(large(&p), 0);
    // the first large request turns the rule on
    alloc(&mut p, 3 * MIB);
    let before = large(&p);
    for _ in 0..10 {
        alloc(&mut p, 588 * KIB);
    }
    assert!(
        large(&p) > before,
        "588 KiB requests lie back to back in large segments"
    );
    p.validate().unwrap();
}
