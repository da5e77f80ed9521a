//! A small pool (under `SMALL_POOL`) never grows while a free block it holds can serve
//! the request (issue 27's small traces: docs/reserve.md, "Reserve on every trace").

use super::super::tests::{alloc_id as alloc, device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

fn small_pool() -> Pool {
    Pool::new(device(1 << 30), PoolConfig::new(2 * MIB)).unwrap()
}

/// The largest free block of any page, in bytes.
fn largest_free(p: &Pool) -> u64 {
    p.page_snapshot()
        .iter()
        .flat_map(|pg| pg.blocks.iter())
        .filter(|b| b.2.is_none())
        .map(|b| b.1)
        .max()
        .unwrap_or(0)
}

#[test]
fn a_small_request_takes_a_larger_block_of_its_own_heap_bin() {
    // (two sizes of one heap bin: the good fit looks only at the bins above)
    let (hole, req) = (300 * KIB, 290 * KIB);
    let g = |b: u64| (b / GRANULE) as u32;
    assert_eq!(bin_of(g(hole)), bin_of(g(req)));
    let mut p = small_pool();
    let a = alloc(&mut p, hole);
    alloc(&mut p, 2 * MIB - hole - 256); // fills the heap page (below the heap threshold)
    assert_eq!(p.reserved_bytes(), 2 * MIB);
    p.free(a).unwrap();
    alloc(&mut p, req);
    assert_eq!(
        p.reserved_bytes(),
        2 * MIB,
        "a page taken beside a free block that holds it"
    );
}

#[test]
fn a_small_request_takes_a_free_block_of_a_large_segment() {
    let mut p = small_pool();
    alloc(&mut p, 3 * MIB / 2);
    alloc(&mut p, 100 * KIB);
    assert_eq!(
        p.reserved_bytes(),
        2 * MIB,
        "a heap page taken beside the large page's end"
    );
}

#[test]
fn a_request_below_a_page_takes_a_free_block_of_a_heap_page() {
    let mut p = small_pool();
    alloc(&mut p, 4 * KIB);
    alloc(&mut p, 3 * MIB / 2);
    assert_eq!(
        p.reserved_bytes(),
        2 * MIB,
        "a page taken beside the heap page's free block"
    );
}

/// Buffers grown step by step (as a KV cache: the new one made while the old is live),
/// with short-lived tensors between: before each allocation that grows the pool, no
/// free block it holds was as large as the request (requests below a page).
#[test]
fn a_small_pool_grows_only_when_no_free_block_holds_the_request() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut p = small_pool();
    let mut bufs: Vec<(AllocId, u64)> = (0..6)
        .map(|k| (alloc(&mut p, 200 * KIB + k * 4 * KIB), 0))
        .collect();
    for (k, b) in bufs.iter_mut().enumerate() {
        b.1 = 200 * KIB + k as u64 * 4 * KIB;
    }
    let mut grew_beside = 0;
    for _ in 0..300 {
        let tmp: Vec<u64> = (0..3).map(|_| (1 + next(400)) * KIB).collect();
        let mut sizes = tmp.clone();
        sizes.extend(bufs.iter().map(|b| b.1 + 3 * KIB));
        let mut tmp_ids = vec![];
        for (i, &size) in sizes.iter().enumerate() {
            let (before, free) = (p.reserved_bytes(), largest_free(&p));
            let id = alloc(&mut p, size);
            if p.reserved_bytes() > before && free >= size.next_multiple_of(GRANULE) {
                grew_beside += 1;
            }
            if i < tmp.len() {
                tmp_ids.push(id);
            } else {
                let b = &mut bufs[i - tmp.len()];
                p.free(b.0).unwrap();
                *b = (id, size);
            }
        }
        for id in tmp_ids {
            p.free(id).unwrap();
        }
        assert!(p.reserved_bytes() < SMALL_POOL);
    }
    assert_eq!(
        grew_beside, 0,
        "allocations that grew the pool beside a free block that held them"
    );
}

#[test]
fn a_small_request_takes_a_free_block_of_a_large_segment_while_a_page_is_held_free() {
    let mut p = small_pool();
    let whole = alloc(&mut p, 2 * MIB);
    alloc(&mut p, 3 * MIB / 2);
    p.free(whole).unwrap();
    p.flush_cache();
    let s = p.stats();
    assert_eq!((s.reserved_bytes, s.pages_free), (4 * MIB, 1));
    // the large page's free 512 KiB end, not a heap page on the page held free ...
    alloc(&mut p, 100 * KIB);
    assert_eq!(
        p.stats().pages_free,
        1,
        "a heap page opened on the page held free"
    );
    // ... which the next large request then takes without growing
    alloc(&mut p, 2 * MIB);
    assert_eq!(p.reserved_bytes(), 4 * MIB);
    p.validate().unwrap();
}
