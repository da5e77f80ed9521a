//! Where requests go: small ones share heap pages, large ones share page ends and are blocks
//! of segments, and a free run that holds a request whole is taken before a layout that needs
//! the stitching window.

use super::*;

#[test]
fn small_requests_share_a_heap_page() {
    let mut p = pool(64 * MIB);
    let ids: Vec<_> = (0..100).map(|_| p.alloc(req(1000)).unwrap()).collect();
    let s = p.stats();
    assert_eq!(s.reserved_bytes, 2 * MIB);
    assert_eq!(s.pages_heap, 1);
    assert_eq!(s.used_bytes, 100 * 1024);
    assert_eq!(s.live_bytes, 100 * 1000);
    // consecutive, 256-aligned
    assert_eq!(ids[1].1 - ids[0].1, 1024);
    for (id, _) in ids {
        p.free(id).unwrap();
    }
    let s = p.stats();
    assert_eq!((s.pages_heap, s.pages_free, s.used_bytes), (0, 1, 0));
}

#[test]
fn large_requests_share_page_ends() {
    let mut p = pool(64 * MIB);
    // 3 MiB: one whole page and the start of a fresh one; the next 3 MiB takes the 1 MiB
    // left at the end of that page, then one more page: 6 MiB of requests in 3 pages.
    let (a, pa) = p.alloc(req(3 * MIB)).unwrap();
    let (b, pb) = p.alloc(req(3 * MIB)).unwrap();
    assert_eq!(pb, pa + 3 * MIB, "consecutive pages use the direct map");
    assert_eq!(p.stats().reserved_bytes, 6 * MIB);
    assert_eq!(p.stats().stitched, 0);
    p.free(a).unwrap();
    p.free(b).unwrap();
    assert_eq!(p.stats().pages_free, 3);
    p.validate().unwrap();
}

#[test]
fn large_allocations_are_blocks_of_segments() {
    let mut p = pool(64 * MIB);
    // 5 MiB then 1 MiB: one three-page segment, one block each, back to back
    let (a, pa) = p.alloc(req(5 * MIB)).unwrap();
    let (b, pb) = p.alloc(req(MIB)).unwrap();
    assert_eq!(pb, pa + 5 * MIB);
    assert!(matches!(
        p.allocs[a.index as usize].layout,
        Layout::Block(_)
    ));
    assert_eq!(
        (p.stats().pages_large, p.stats().reserved_bytes),
        (3, 6 * MIB)
    );
    // freed, its pages stay in the segment: the next request that fits reuses them as they
    // are, and nothing is mapped or merged page by page (a free block at a segment's start
    // is used from its end, so what is left still starts the segment)
    p.free(a).unwrap();
    assert_eq!((p.stats().pages_free, p.stats().pages_large), (0, 3));
    let (c, pc) = p.alloc(req(4 * MIB)).unwrap();
    assert_eq!(pc, pa + MIB);
    p.free(c).unwrap();
    // trim gives the whole free pages inside the segment back: two of them (the third
    // holds the start of b)
    assert_eq!(p.trim(0).unwrap(), 4 * MIB);
    assert_eq!(p.stats().pages_large, 1);
    p.free(b).unwrap();
    assert_eq!(p.stats().pages_large, 0);
}

/// A large request whose head is not followed by free pages (so head + pages would need the
/// window) takes a free run that holds it whole instead, while the pool (of at least
/// `SMALL_POOL`) has free pages aplenty and the head saves no page: one block of a new
/// segment, in the direct map, nothing stitched.
#[test]
fn a_free_run_is_taken_before_a_layout_that_needs_the_window() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.initial_size = 128 * MIB;
    let mut p = Pool::new(device(256 * MIB), cfg).unwrap();
    assert!(!p.small_pool());
    // pages 0-1: 3.75 MiB and a free 256 KiB page end (a head); page 2: a heap page
    let (_a, pa) = p.alloc(req(15 * MIB / 4)).unwrap();
    let _small = p.alloc(req(1000)).unwrap();
    let base = pa; // the direct map's page 0
    assert_eq!(p.stats().pages_heap, 1);
    // 5 MiB: the 256 KiB head, two whole pages and a tail would be stitched (page 2 is
    // taken), three pages as the run; a run of three free pages holds it whole
    let (c, pc) = p.alloc(req(5 * MIB)).unwrap();
    assert!(!p.info(c).unwrap().stitched);
    assert_eq!(pc, base + 3 * 2 * MIB);
    assert_eq!(p.stats().stitched, 0);
}
