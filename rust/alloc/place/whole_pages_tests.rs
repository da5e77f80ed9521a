//! A pool below `SMALL_POOL` lays a request of whole pages over whole free pages when, over
//! a free page end, it would end in a fresh page (`Pool::whole_pages_first`).

use super::super::tests::{alloc_id as alloc, pool_with_a_free_half_page, MIB};

/// A 32 MiB pool: a page whose second half is free, the page after it in use, 14 free
/// pages. A 4 MiB request over that half page would take it, a whole page and half of a
/// fresh one (stitched through the window, the fresh page's second half left free): the
/// same two pages as the run it takes instead, which leaves the half page where it was and
/// every page boundary of the run clean for the next request of whole pages.
#[test]
fn a_request_of_whole_pages_takes_free_pages_over_a_head_that_saves_none() {
    let mut p = pool_with_a_free_half_page(32 * MIB, 0);
    assert_eq!(p.stats().pages_free, 14);
    alloc(&mut p, 4 * MIB);
    assert_eq!((p.stats().pages_free, p.stats().stitched), (12, 0));
    // a 1 MiB request still fits in what the pool holds (the half page)
    alloc(&mut p, MIB);
    assert_eq!(p.stats().pages_free, 12);
    p.validate().unwrap();
}
