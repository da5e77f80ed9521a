//! A large request about to grow the pool takes a heap page's free end as its head (or a
//! free start as its tail) when that saves a page (`heap_ends_for`); in a pool of at least
//! `SMALL_POOL`, the end of the heap page opened last, which the next small requests use,
//! only where no other end does as well and another heap block of a quarter page is free.

use super::super::tests::{alloc_id as alloc, device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

/// `held` bytes in a large allocation, then two heap pages and no free page: the first
/// holds 1,000 KiB and ends in 1,048 KiB free, the second, opened last, holds 64 KiB and
/// ends in 1,984 KiB free.
fn two_heap_pages(held: u64) -> Pool {
    two_heap_pages_of(held, &[1000 * KIB], &[1000 * KIB, 48 * KIB], 1048 * KIB)
}

/// `held` bytes in a large allocation, then the first heap page filled with `kept` and
/// `freed` (a page's worth), a second opened for 64 KiB, and `freed` freed: the first page
/// ends in `first_free` bytes free, the second in 1,984 KiB.
fn two_heap_pages_of(held: u64, kept: &[u64], freed: &[u64], first_free: u64) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    alloc(&mut p, held);
    for &k in kept {
        alloc(&mut p, k);
    }
    // (the first page full: the next request opens a page of its own)
    let ends: Vec<AllocId> = freed.iter().map(|&f| alloc(&mut p, f)).collect();
    alloc(&mut p, 64 * KIB);
    for x in ends {
        p.free(x).unwrap();
    }
    p.flush_cache();
    let s = p.stats();
    assert_eq!((s.pages_heap, s.pages_free), (2, 0));
    assert_eq!(s.heap_free_bytes, first_free + 1984 * KIB);
    p
}

/// A 3,096 KiB request, then eight of 240 KiB, on `two_heap_pages(SMALL_POOL)` (reserving
/// `before`): the large one takes the first heap page's 1,048 KiB end as its head and one
/// page (not two), and the heap page opened last keeps its free end for the small ones.
fn large_then_small_take_one_page(mut p: Pool, before: u64, why: &str) {
    alloc(&mut p, 3096 * KIB);
    assert_eq!(
        p.reserved_bytes() - before,
        2 * MIB,
        "no heap page end taken"
    );
    for _ in 0..8 {
        alloc(&mut p, 240 * KIB);
    }
    assert_eq!(p.reserved_bytes() - before, 2 * MIB, "{why}");
    p.validate().unwrap();
}

#[test]
fn a_large_request_takes_an_older_heap_page_end_and_leaves_the_last_one_to_the_heap() {
    let p = two_heap_pages(SMALL_POOL);
    let before = p.reserved_bytes();
    large_then_small_take_one_page(p, before, "the heap page opened last lost its free end");
}

#[test]
fn a_small_pool_takes_the_end_of_the_heap_page_opened_last_too() {
    // (4 MiB held: a small pool) the last heap page's 1,984 KiB end as the head of a
    // 4,032 KiB request: one page, not two
    let p = two_heap_pages(4 * MIB);
    grows_by(p, 4032 * KIB, 2 * MIB, "the last heap page's end not taken");
}

#[test]
fn a_refused_batch_leaves_the_heap_page_opened_last_as_it_was() {
    let mut p = two_heap_pages(SMALL_POOL);
    let before = p.reserved_bytes();
    // 1,000 KiB three times (not lossy: a page holds two with 48 KiB over): the first heap
    // page's end, the second's, then a heap page of their own; the 1 GiB refuses the batch,
    // and its heap page goes back
    let mut out = vec![];
    let err = p.alloc_batch(&[1000 * KIB, 1000 * KIB, 1000 * KIB, 1 << 30], 0, &mut out);
    assert!(err.is_err() && out.is_empty());
    assert_eq!(p.reserved_bytes(), before);
    // the heap page opened last is the second one again
    large_then_small_take_one_page(
        p,
        before,
        "the refused batch moved the heap page opened last",
    );
}

#[test]
fn a_large_pool_takes_the_end_of_the_heap_page_opened_last_beside_a_quarter_page_free() {
    // the first heap page's free 1,048 KiB (a quarter page or more) is left to the small
    // requests: a 4,032 KiB request takes the last heap page's 1,984 KiB end and one page
    let p = two_heap_pages(SMALL_POOL);
    grows_by(p, 4032 * KIB, 2 * MIB, "the last heap page's end not taken");
}

#[test]
fn a_large_pool_leaves_the_end_of_the_heap_page_opened_last_with_less_than_a_quarter_page_free() {
    // as `two_heap_pages`, but the first heap page ends in 448 KiB free: nowhere else for the
    // small requests, so the 4,032 KiB request takes two pages
    let p = two_heap_pages_of(
        SMALL_POOL,
        &[200 * KIB; 8],
        &[200 * KIB, 200 * KIB, 48 * KIB],
        448 * KIB,
    );
    grows_by(p, 4032 * KIB, 4 * MIB, "the last heap page's end taken");
}

/// A request of `size` on `p` grows it by `by` bytes (`why` if not).
fn grows_by(mut p: Pool, size: u64, by: u64, why: &str) {
    let before = p.reserved_bytes();
    alloc(&mut p, size);
    assert_eq!(p.reserved_bytes() - before, by, "{why}");
    p.validate().unwrap();
}
