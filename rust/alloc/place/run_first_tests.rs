//! A pool with free pages aplenty, for a large request whose head would need the window: of
//! at least `SMALL_POOL`, it takes a fresh run only when the free page end it would pass
//! over saves no page or is under 1/`RUN_FIRST_HEAD_DIV` of one (`keeps_head`), and no
//! other free page end followed by free pages saves it one (`contiguous_head`); below it,
//! never (`RUN_FIRST_DIV`).

use super::super::tests::{alloc_id as alloc, device, pool_with_a_free_half_page, MIB};
use super::*;

const KIB: u64 = 1 << 10;

/// A pool of `initial` MiB holding `full` whole pages, then a page whose second half is
/// free (a 1 MiB allocation freed there) followed by a page in use, and the rest free; then
/// `request` and as many 2 MiB requests as there are free pages left when the request takes
/// the half page as its head. Returns how many MiB the pool grew by (0: the head was taken).
fn growth_after_a_half_page_head(initial: u64, full: usize, request: u64) -> u64 {
    let mut p = pool_with_a_free_half_page(initial * MIB, full);
    let before = p.reserved_bytes();
    let free = p.stats().pages_free;
    assert_eq!(free, initial / 2 - full as u64 - 2);
    alloc(&mut p, request);
    // the request over the head takes all but the half page's part in whole pages
    let more = free - (request - MIB).div_ceil(2 * MIB);
    for _ in 0..more {
        alloc(&mut p, 2 * MIB);
    }
    p.validate().unwrap();
    (p.reserved_bytes() - before) >> 20
}

/// A pool of 160 MiB (not a small pool) with 13 free pages beside the half page: a 2,364
/// KiB request (that half page as its head and one page, or a run of two pages) and twelve
/// of 2 MiB fit only when the first took the head. Passed over, the half page stayed free
/// and the pool grew a page (162 MiB).
#[test]
fn a_free_page_end_that_saves_a_page_is_not_passed_over() {
    assert_eq!(growth_after_a_half_page_head(160, 65, 2364 * KIB), 0);
}

/// A pool below `SMALL_POOL` never passes over a free page end for a fresh run: 32 MiB held,
/// nine free pages beside the half page; a 3 MiB request (that half page and one page
/// through the window, or a run of two) and eight of 2 MiB fit only when it took the head.
/// With the run taken, the half page stayed free and the eighth grew the pool (34 MiB).
#[test]
fn a_small_pool_takes_the_free_page_end_over_a_fresh_run() {
    assert_eq!(growth_after_a_half_page_head(32, 5, 3 * MIB), 0);
}

/// A request that the run-first rule would lay over a fresh run, because the largest free
/// page end (1 MiB, the page after it in use) is not followed by free pages, takes another
/// free page end that is (512 KiB, which holds its 256 KiB past whole pages) and runs on
/// over four free pages from there (`contiguous_head`): contiguous, as the fresh run of
/// five would have been, and one page shorter. Then 73 requests of 2 MiB fit the 160 MiB
/// pool; with the fresh run, the last one grew it to 162.
#[test]
fn a_free_page_end_followed_by_free_pages_is_taken_over_a_fresh_run() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.initial_size = 160 * MIB;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    alloc(&mut p, MIB);
    let half = alloc(&mut p, MIB);
    alloc(&mut p, 2 * MIB);
    alloc(&mut p, 1536 * KIB);
    p.free(half).unwrap();
    p.flush_cache();
    assert_eq!(p.stats().pages_free, 77);
    alloc(&mut p, 8448 * KIB);
    assert_eq!((p.stats().pages_free, p.stats().stitched), (73, 0));
    for _ in 0..73 {
        alloc(&mut p, 2 * MIB);
    }
    p.validate().unwrap();
    assert_eq!(p.reserved_bytes(), 160 * MIB);
}
