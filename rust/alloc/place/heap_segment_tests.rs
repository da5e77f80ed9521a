//! A pool that grows by a page for a small request runs the heap segment before that page
//! on over it (`extend_heap`), and a heap segment's whole free pages go back (`reclaim`).
//! Each test fails without its rule (docs/reserve.md, "Heap pages").

use super::super::tests::{device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

fn pool(check: bool, max: Option<u64>, eager: bool) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = check;
    cfg.max_size = max;
    if eager {
        cfg.release_threshold = Some(0);
    }
    Pool::new(device(1 << 30), cfg).unwrap()
}

fn alloc(p: &mut Pool, size: u64) -> Option<AllocId> {
    p.alloc(Request {
        size,
        ..Request::default()
    })
    .ok()
    .map(|r| r.0)
}

/// Heap pages spanned by segments of more than one page.
fn spanning(p: &Pool) -> u32 {
    (0..p.pages.len() as u32)
        .filter(|&q| p.pages[q as usize] == PageKind::Heap)
        .map(|q| p.segment_pages(q))
        .filter(|&n| n > 1)
        .sum()
}

/// A heap page of two 874 KiB blocks and a 300 KiB free end, and an 800 KiB request.
fn crossed(p: &mut Pool) -> [AllocId; 3] {
    let a = alloc(p, 874 * KIB).unwrap();
    let b = alloc(p, 874 * KIB).unwrap();
    let c = alloc(p, 800 * KIB).unwrap();
    [a, b, c]
}

#[test]
fn a_request_crosses_into_the_page_the_pool_grew_by() {
    let mut p = pool(true, None, false);
    crossed(&mut p);
    assert_eq!(p.reserved_bytes(), 4 * MIB);
    assert_eq!(spanning(&p), 2, "one heap segment over both pages");
    // 2,048 - 500 = 1,548 KiB left after the request: three 500 KiB blocks fit (with a
    // fresh heap page: 1,248 KiB and the 300 KiB end, two fit)
    for _ in 0..3 {
        alloc(&mut p, 500 * KIB).unwrap();
    }
    assert_eq!(p.reserved_bytes(), 4 * MIB, "the page end kept as a sliver");
}

#[test]
fn a_heap_segment_gives_its_whole_free_pages_back() {
    let mut p = pool(true, None, false);
    let [_, _, c] = crossed(&mut p);
    let rest: Vec<AllocId> = (0..3).map(|_| alloc(&mut p, 500 * KIB).unwrap()).collect();
    p.free(c).unwrap();
    for r in rest {
        p.free(r).unwrap();
    }
    // the second page is free, inside the heap segment: a large request takes it
    alloc(&mut p, 2 * MIB).unwrap();
    assert_eq!(
        p.reserved_bytes(),
        4 * MIB,
        "a heap segment's free page kept"
    );
    assert_eq!(spanning(&p), 0);
    let s = p.stats();
    assert_eq!((s.pages_heap, s.pages_large), (1, 1));
}

#[test]
fn statistics_count_a_heap_segment_page_by_page() {
    let mut p = pool(true, None, false);
    crossed(&mut p);
    let s = p.stats();
    assert_eq!((s.pages_heap, s.pages_large, s.pages_free), (2, 0, 0));
    assert_eq!(s.heap_free_bytes, (4096 - 2 * 874 - 800) * KIB);
    let snap = p.page_snapshot();
    let free: u64 = snap
        .iter()
        .flat_map(|pg| pg.blocks.iter())
        .filter(|b| b.2.is_none())
        .map(|b| b.1)
        .sum();
    assert_eq!(free, s.heap_free_bytes);
}

/// An LCG over small requests (64–960 KiB) and frees, checked after every operation
/// (`PoolConfig::check`), in a pool capped so that some requests fail and are undone.
fn churn(seed: u64, max: Option<u64>, eager: bool) -> (Pool, u64) {
    let mut p = pool(true, max, eager);
    let mut x = seed;
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let (mut live, mut most) = (Vec::new(), 0u32);
    for _ in 0..3000 {
        if live.is_empty() || next(100) < 55 {
            let size = (64 + next(896)) * KIB;
            if let Some(a) = alloc(&mut p, size) {
                live.push(a);
            }
        } else {
            let i = next(live.len() as u64) as usize;
            p.free(live.swap_remove(i)).unwrap();
        }
        most = most.max(spanning(&p));
    }
    for a in live {
        p.free(a).unwrap();
    }
    let s = p.stats();
    assert_eq!(
        s.pages_heap + s.pages_large,
        0,
        "all free: every page a free page"
    );
    (p, most as u64)
}

#[test]
fn generated_streams_run_heap_segments_over_pages_and_stay_valid() {
    for seed in 1..=4 {
        let (_, most) = churn(seed, None, false);
        assert!(most > 1, "seed {seed}: no heap segment over two pages");
    }
}

#[test]
fn generated_streams_stay_valid_capped_and_released_at_once() {
    let mut spanned = 0;
    for seed in 1..=4 {
        spanned += churn(seed, Some(24 * MIB), false).1 + churn(seed, None, true).1;
    }
    assert!(spanned > 0, "no heap segment over two pages");
}

#[test]
fn defrag_keeps_heap_segments_over_pages_valid() {
    let mut p = pool(true, None, false);
    let mut x = 7u64;
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let (mut live, mut most, mut moved) = (Vec::new(), 0u32, 0);
    for i in 0..3000 {
        if live.is_empty() || next(100) < 55 {
            let size = (64 + next(896)) * KIB;
            let r = p.alloc(Request {
                size,
                movable: true,
                ..Request::default()
            });
            live.push(r.unwrap().0);
        } else {
            let i = next(live.len() as u64) as usize;
            p.free(live.swap_remove(i)).unwrap();
        }
        most = most.max(spanning(&p));
        if i % 250 == 249 {
            // (checked after it by `PoolConfig::check`) and as its plan says
            let plan = p.defrag_plan().unwrap();
            let report = p.defrag().unwrap();
            assert_eq!(report.moved_allocs, plan.report.moved_allocs);
            assert_eq!(report.bytes_released, plan.report.bytes_released);
            moved += report.moved_allocs;
        }
    }
    assert!(
        most > 1 && moved > 0,
        "no heap segment over two pages, or nothing moved"
    );
}

#[test]
fn a_free_end_of_an_eighth_of_the_request_is_run_on_from() {
    // two 974 KiB blocks leave a 100 KiB free end: a request of up to 8 × 100 KiB starts in
    // it, across the page end; a larger one takes a fresh heap page (`HEAP_EXTEND_DIV`)
    for (size, runs_on) in [(600 * KIB, true), (800 * KIB, true), (900 * KIB, false)] {
        let mut p = pool(true, None, false);
        alloc(&mut p, 974 * KIB).unwrap();
        alloc(&mut p, 974 * KIB).unwrap();
        assert_eq!((p.reserved_bytes(), spanning(&p)), (2 * MIB, 0));
        alloc(&mut p, size).unwrap();
        assert_eq!(p.reserved_bytes(), 4 * MIB);
        assert_eq!(spanning(&p) == 2, runs_on, "{} KiB", size / KIB);
    }
}

/// Eight 255 KiB blocks in a heap page leave an 8 KiB free end, under an eighth of a
/// 200 KiB request; `large_first` makes the pool 64 MiB (`SMALL_POOL`) before them.
fn sliver_then_request(large_first: bool) -> Pool {
    let mut p = pool(true, None, false);
    if large_first {
        alloc(&mut p, 64 * MIB).unwrap();
    }
    for _ in 0..8 {
        alloc(&mut p, 255 * KIB).unwrap();
    }
    assert_eq!(spanning(&p), 0);
    alloc(&mut p, 200 * KIB).unwrap();
    p
}

#[test]
fn a_large_pool_runs_a_heap_segment_on_from_any_free_end() {
    // a fresh heap page would leave the 8 KiB end a sliver for good; at 64 MiB and more the
    // segment runs on whatever the end's length (the interleaved class over 80 seeds,
    // docs/reserve.md, "The classes on seeds they were not tuned on")
    let p = sliver_then_request(true);
    assert_eq!(p.reserved_bytes(), 68 * MIB);
    assert_eq!(
        spanning(&p),
        2,
        "the heap segment runs on over the new page"
    );
}

#[test]
fn a_small_pool_runs_on_only_from_an_eighth_of_the_request() {
    let p = sliver_then_request(false);
    assert_eq!(p.reserved_bytes(), 4 * MIB);
    assert_eq!(spanning(&p), 0, "a fresh heap page");
}

/// Two heap pages side by side, each full: 1,000 + 1,000 + 48 KiB, then 48 + 1,000 + 1,000
/// KiB; the 48 KiB blocks around the page end are freed, the next page's first then the
/// other page's last, and a 96 KiB request follows (the size cache gives the last freed
/// block back for it, which is when that block merges). `large_first` makes the pool 64
/// MiB (`SMALL_POOL`) before them. Returns the pool and its reserve besides that 64 MiB.
fn two_free_ends_then_request(large_first: bool) -> (Pool, u64) {
    let mut p = pool(true, None, false);
    if large_first {
        alloc(&mut p, 64 * MIB).unwrap();
    }
    let base = p.reserved_bytes();
    let [_, _, y] = [1000, 1000, 48].map(|k| alloc(&mut p, k * KIB).unwrap());
    let [z, _, _] = [48, 1000, 1000].map(|k| alloc(&mut p, k * KIB).unwrap());
    assert_eq!((p.reserved_bytes() - base, spanning(&p)), (4 * MIB, 0));
    p.free(z).unwrap();
    p.free(y).unwrap();
    alloc(&mut p, 96 * KIB).unwrap();
    let grown = p.reserved_bytes() - base;
    (p, grown)
}

#[test]
fn a_small_pool_joins_a_freed_heap_end_with_the_next_pages_free_start() {
    // the two 48 KiB ends become one 96 KiB block across the page end, which holds the
    // request: without the join the pool grows by a page for it
    let (p, grown) = two_free_ends_then_request(false);
    assert_eq!(grown, 4 * MIB, "the request in the joined ends");
    assert_eq!(spanning(&p), 2, "one heap segment over both pages");
}

#[test]
fn a_large_pool_keeps_its_heap_pages_apart() {
    // at 64 MiB and more the join raised the three streams (docs/reserve.md)
    let (p, grown) = two_free_ends_then_request(true);
    assert_eq!((grown, spanning(&p)), (6 * MIB, 0));
}
