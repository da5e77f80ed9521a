//! A pool of at least `SMALL_POOL` with free pages aplenty, for a large request whose head
//! would need the window: it takes a fresh run only when the free page end it would pass
//! over saves no page or is under 1/`RUN_FIRST_HEAD_DIV` of one (`keeps_head`).

use super::super::tests::{alloc_id as alloc, device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

/// A pool of 160 MiB (not a small pool) holding 130 MiB of whole pages, a page whose second
/// half is free (a 1 MiB allocation freed there) followed by a page in use, and 13 free
/// pages. Then a 2,364 KiB request (that half page as its head and one page, or a run of
/// two pages) and twelve of 2 MiB: the pool holds them all only when the first took the
/// head. Passed over, the half page stayed free and the pool grew a page (162 MiB).
#[test]
fn a_free_page_end_that_saves_a_page_is_not_passed_over() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.initial_size = 160 * MIB;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    for _ in 0..65 {
        alloc(&mut p, 2 * MIB);
    }
    alloc(&mut p, MIB);
    let half = alloc(&mut p, MIB);
    alloc(&mut p, 2 * MIB);
    p.free(half).unwrap();
    p.flush_cache();
    let before = p.reserved_bytes();
    assert_eq!(p.stats().pages_free, 13);
    alloc(&mut p, 2364 * KIB);
    for _ in 0..12 {
        alloc(&mut p, 2 * MIB);
    }
    p.validate().unwrap();
    let after = p.reserved_bytes();
    assert_eq!(
        after,
        before,
        "the pool grew {} MiB",
        (after - before) >> 20
    );
}

/// A pool below `SMALL_POOL` never passes over a free page end for a fresh run: 32 MiB held,
/// a page whose second half is free followed by a page in use, and nine free pages; a 3 MiB
/// request (that half page and one page through the window, or a run of two) and eight of
/// 2 MiB then fit without the pool growing. With the run taken, the half page stayed free
/// and the eighth grew the pool (34 MiB).
#[test]
fn a_small_pool_takes_the_free_page_end_over_a_fresh_run() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.initial_size = 32 * MIB;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    for _ in 0..5 {
        alloc(&mut p, 2 * MIB);
    }
    alloc(&mut p, MIB);
    let half = alloc(&mut p, MIB);
    alloc(&mut p, 2 * MIB);
    p.free(half).unwrap();
    p.flush_cache();
    let before = p.reserved_bytes();
    assert!(p.small_pool());
    assert_eq!(p.stats().pages_free, 9);
    alloc(&mut p, 3 * MIB);
    for _ in 0..8 {
        alloc(&mut p, 2 * MIB);
    }
    p.validate().unwrap();
    let after = p.reserved_bytes();
    assert_eq!(
        after,
        before,
        "the pool grew {} MiB",
        (after - before) >> 20
    );
}
