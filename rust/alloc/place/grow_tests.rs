//! A pool about to grow for a large request: it cuts a free block that crosses a page
//! boundary inside a segment when its part as the head or tail saves pages (`cut_for`), and
//! (above `SMALL_POOL`) a tail takes a free page start that it leaves at most
//! 1/`GROW_TAIL_DIV` of a page of.

use super::super::tests::{device, MIB};
use super::*;

fn alloc(p: &mut Pool, size: u64) -> Result<(AllocId, u64)> {
    p.alloc(Request {
        size,
        ..Request::default()
    })
}

/// The bytes an allocation of `size` grows the pool by.
fn grown_by(p: &mut Pool, size: u64) -> u64 {
    let before = p.reserved_bytes();
    alloc(p, size).unwrap();
    p.reserved_bytes() - before
}

/// `held` bytes held (`SMALL_POOL`: not a small pool; 0: nothing), then one two-page
/// segment: a 1 MiB allocation, a free block of 2 MiB from 1 to 3 MiB (across the
/// segment's page boundary, holding no whole page) and a 1 MiB allocation.
fn pool_with_a_straddle(held: u64, max_size: Option<u64>) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.max_size = max_size;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    if held > 0 {
        alloc(&mut p, held).unwrap();
    }
    let (_, a) = alloc(&mut p, MIB).unwrap();
    let (b, b_ptr) = alloc(&mut p, 2 * MIB).unwrap();
    let (_, c_ptr) = alloc(&mut p, MIB).unwrap();
    // (the segment is contiguous: the three follow each other)
    assert_eq!((b_ptr, c_ptr), (a + MIB, a + 3 * MIB));
    p.free(b).unwrap();
    p.flush_cache();
    assert_eq!(p.reserved_bytes(), held + 4 * MIB);
    assert_eq!(p.stats().largest_free_run, 2 * MIB);
    p
}

#[test]
fn a_head_takes_the_page_end_of_a_free_block_across_a_page_boundary() {
    // 3.5 MiB: the block's first 1 MiB as the head, one fresh page, its last 0.5 MiB as
    // the tail (without the cut: one whole page and a fresh page for a 1.5 MiB tail); in a
    // small pool as in a large one (a CNN's activations of whole pages and a half:
    // docs/reserve.md, "Small pools as large ones")
    for held in [SMALL_POOL, 0] {
        let mut p = pool_with_a_straddle(held, None);
        let grew = grown_by(&mut p, 7 * MIB / 2);
        assert_eq!(
            grew,
            2 * MIB,
            "two pages taken beside a free block across a boundary ({held} bytes held)"
        );
    }
}

#[test]
fn a_tail_takes_a_free_page_start_a_quarter_page_longer() {
    let mut p = Pool::new(device(1 << 30), PoolConfig::new(2 * MIB)).unwrap();
    alloc(&mut p, SMALL_POOL).unwrap();
    // one page: a free page start of 1 MiB, then a 1 MiB allocation
    let (first, _) = alloc(&mut p, MIB).unwrap();
    alloc(&mut p, MIB).unwrap();
    p.free(first).unwrap();
    p.flush_cache();
    // 2.75 MiB: one page and a 0.75 MiB tail, which leaves 256 KiB of the free page
    // start (more than `tail_slack`, 128 KiB)
    let grew = grown_by(&mut p, 11 * MIB / 4);
    assert_eq!(
        grew,
        2 * MIB,
        "a fresh page taken for a tail a free page start held"
    );
}

#[test]
fn a_request_refused_after_a_cut_leaves_the_block_whole() {
    let held = SMALL_POOL + 4 * MIB;
    let mut p = pool_with_a_straddle(SMALL_POOL, Some(held));
    let ends = |p: &Pool| (p.secondary[SUFFIX].len(), p.secondary[PREFIX].len());
    let before = ends(&p);
    // (it would need a page even with the cut, and the pool is at its maximum)
    assert!(alloc(&mut p, 7 * MIB / 2).is_err());
    assert_eq!(p.reserved_bytes(), held);
    assert_eq!(ends(&p), before, "the cut was not undone");
}

/// A small pool (4 MiB of one segment, one page more) about to grow for 1.5 MiB: the free
/// block across the segment's page boundary (0.5 MiB each side) is cut, its first half the
/// head and a free page start of 1 MiB the tail, so the pool takes no page. (A KV buffer
/// grown token by token leaves such blocks: docs/reserve.md.)
#[test]
fn a_small_pool_cuts_a_block_across_a_page_boundary_for_a_request_below_a_page() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    let (_, a) = alloc(&mut p, 3 * MIB / 2).unwrap();
    let (b, b_ptr) = alloc(&mut p, MIB).unwrap();
    let (_, c_ptr) = alloc(&mut p, 3 * MIB / 2).unwrap();
    assert_eq!((b_ptr, c_ptr), (a + 3 * MIB / 2, a + 5 * MIB / 2));
    // a third page: a 1 MiB allocation freed before another 1 MiB one
    let (d, _) = alloc(&mut p, MIB).unwrap();
    alloc(&mut p, MIB).unwrap();
    p.free(b).unwrap();
    p.free(d).unwrap();
    assert_eq!(p.reserved_bytes(), 6 * MIB);
    assert_eq!(
        grown_by(&mut p, 3 * MIB / 2),
        0,
        "a page taken beside the cut's layout"
    );
}
