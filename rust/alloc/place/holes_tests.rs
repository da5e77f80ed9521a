//! A pool above `SMALL_POOL` whose heap pages hold no free block for a small request uses a
//! free block inside a large segment before it takes a page (`holes.rs`), and leaves a free
//! block that ends its segment whole.

use super::super::tests::{device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

fn alloc(p: &mut Pool, size: u64) -> AllocId {
    p.alloc(Request {
        size,
        ..Request::default()
    })
    .unwrap()
    .0
}

/// A pool above `SMALL_POOL` with a full heap page and no free page: 130 MiB of whole pages,
/// then two heap requests of 1 MiB less 256 B (256 B of the heap page left free).
fn large_pool() -> Pool {
    let mut p = Pool::new(device(1 << 30), PoolConfig::new(2 * MIB)).unwrap();
    alloc(&mut p, 130 * MIB);
    alloc(&mut p, MIB - 256);
    alloc(&mut p, MIB - 256);
    assert!(!p.small_pool() && p.reserved_bytes() == 132 * MIB);
    p
}

#[test]
fn a_small_request_takes_a_free_page_start_before_a_heap_page() {
    let mut p = large_pool();
    // a page of two large blocks, the first freed: a free page start of 1 MiB
    let a = alloc(&mut p, MIB);
    alloc(&mut p, MIB);
    p.free(a).unwrap();
    assert_eq!(p.reserved_bytes(), 134 * MIB);
    alloc(&mut p, 300 * KIB);
    assert_eq!(
        p.reserved_bytes(),
        134 * MIB,
        "a heap page taken beside a free page start that holds the request"
    );
    p.validate().unwrap();
}

#[test]
fn a_small_request_takes_a_free_block_between_two_large_ones() {
    let mut p = large_pool();
    // three large blocks in one segment, the middle one freed
    alloc(&mut p, 3 * MIB / 2);
    let b = alloc(&mut p, MIB);
    alloc(&mut p, 3 * MIB / 2);
    p.free(b).unwrap();
    let before = p.reserved_bytes();
    alloc(&mut p, 600 * KIB);
    assert_eq!(
        p.reserved_bytes(),
        before,
        "a heap page taken beside a free block inside a segment"
    );
    p.validate().unwrap();
}

#[test]
fn a_free_block_that_ends_its_segment_stays_whole() {
    let mut p = large_pool();
    alloc(&mut p, MIB); // a page: the request, then a free page end of 1 MiB
    let before = p.reserved_bytes();
    alloc(&mut p, 300 * KIB);
    assert_eq!(p.reserved_bytes(), before + 2 * MIB, "a heap page");
    let end = p
        .page_snapshot()
        .iter()
        .filter(|pg| pg.kind == "large")
        .flat_map(|pg| pg.blocks.iter().copied())
        .filter(|b| b.2.is_none())
        .map(|b| b.1)
        .max();
    assert_eq!(end, Some(MIB), "the free page end of the large page, whole");
}
