//! The size cache: a freed heap block waits for the request that follows, when that request
//! is of its size and the pool would place it there anyway; anything else gives it back.

use super::*;
use crate::alloc::cache::MAX_MISSES;

/// A pool with a 5000 B allocation live, then `n` of 64 KiB (`size_cache` as given).
fn warm(n: usize, size_cache: bool) -> (Pool, Vec<(AllocId, u64)>) {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.size_cache = size_cache;
    cfg.check = true;
    let mut p = Pool::new(device(64 * MIB), cfg).unwrap();
    p.alloc(req(5000)).unwrap();
    let live = (0..n).map(|_| p.alloc(req(64 * KIB)).unwrap()).collect();
    (p, live)
}

/// A freed block waits, whole, for the next request of its size: same address, no search,
/// no merge. Its memory counts as free and its handle is stale.
#[test]
fn a_freed_block_waits_for_the_next_request_of_its_size() {
    let (mut p, live) = warm(3, true);
    let (a, pa) = live[2];
    let before = p.stats();
    p.free(a).unwrap();
    let s = p.stats();
    assert_eq!((s.cached_allocs, s.cache_hits), (1, 0));
    assert_eq!(
        s.free_bytes,
        before.free_bytes + 64 * KIB,
        "cached memory counts as free"
    );
    assert!(
        matches!(p.free(a), Err(Error::InvalidFree(_))),
        "its handle is stale"
    );
    assert!(matches!(p.free_ptr(pa), Err(Error::InvalidFree(_))));
    assert!(p.info(a).is_err() && p.allocations().iter().all(|x| x.ptr != pa));
    // any size that rounds to it takes it back
    let (_c, pc) = p.alloc(req(64 * KIB - 100)).unwrap();
    assert_eq!(pc, pa);
    let s = p.stats();
    assert_eq!((s.cached_allocs, s.cache_hits), (0, 1));
    assert_eq!(s.live_bytes, 5000 + 3 * 64 * KIB - 100);
}

/// Anything but a request of its size gives the block back first, merged, so that the pool
/// goes on as the pool without the cache does: another size, another free, a batch, trim,
/// defrag, close, and nothing left live.
#[test]
fn anything_else_gives_the_block_back_first() {
    type Op = fn(&mut Pool, &[(AllocId, u64)]);
    let ops: [(&str, Op); 6] = [
        ("another size", |p, _| {
            p.alloc(req(4096)).unwrap();
        }),
        ("another free", |p, live| p.free(live[0].0).unwrap()),
        ("a batch", |p, _| {
            p.alloc_batch(&[1000, 2000], 0, &mut vec![]).unwrap();
        }),
        ("trim", |p, _| {
            p.trim(0).unwrap();
        }),
        ("defrag", |p, _| {
            p.defrag().unwrap();
        }),
        ("close", |p, _| {
            p.close().unwrap();
        }),
    ];
    for (what, op) in ops {
        let mut pools = [warm(4, true), warm(4, false)];
        for (p, live) in &mut pools {
            p.free(live[3].0).unwrap();
            op(p, live);
            // (only another free's own block may be held now)
            let held = p.stats().cached_allocs;
            assert!(held == 0 || what == "another free", "{what}");
            p.flush_cache();
        }
        let [(a, _), (b, _)] = &pools;
        assert_eq!(
            a.page_snapshot(),
            b.page_snapshot(),
            "{what}: the same layout"
        );
    }
    // nothing left live: the pool's pages are all free
    let (mut p, live) = warm(1, true);
    p.free(live[0].0).unwrap();
    p.free(p.allocations()[0].id).unwrap();
    let s = p.stats();
    assert_eq!((s.cached_allocs, s.pages_heap), (0, 0));
}

/// A block the next request of its size would not get back is not taken back: one after a free
/// block (the merge would start before it), the last of its page (the page would go back),
/// one whose size the heap's good fit does not look for in its own bin, and one when a free
/// block of a bin between would be taken first. Switched off, nothing is held.
#[test]
fn a_block_is_held_only_where_the_request_would_go() {
    // freed, then asked for again: 1 if the cache served it
    let held = |p: &mut Pool, id: AllocId| {
        let size = p.info(id).unwrap().size;
        let hits = p.stats().cache_hits;
        p.free(id).unwrap();
        let (again, _) = p.alloc(req(size)).unwrap();
        p.free(again).unwrap();
        p.flush_cache();
        p.stats().cache_hits - hits
    };
    let (mut p, live) = warm(4, true);
    assert_eq!(held(&mut p, live[2].0), 1, "live on both sides");
    assert_eq!(held(&mut p, live[3].0), 0, "a free block before it");
    // the only block of its page
    let (mut p, live) = warm(0, true);
    let (x, _) = p.alloc(req(3000)).unwrap();
    p.free(p.allocations().iter().find(|a| a.size == 5000).unwrap().id)
        .unwrap();
    assert_eq!(held(&mut p, x), 0, "its whole page");
    drop(live);
    // 65 granules: not a bin's lower bound, so the good fit looks in the bins above
    let (mut p, _) = warm(2, true);
    let (a, _) = p.alloc(req(65 * GRANULE)).unwrap();
    p.alloc(req(64 * KIB)).unwrap();
    assert_eq!(held(&mut p, a), 0, "a size the good fit passes over");
    // a free block in a bin between the request's and the merged block's is taken first
    let (mut p, live) = warm(6, true);
    p.free(live[1].0).unwrap(); // (held, then given back by the next free: a 64 KiB hole)
    assert_eq!(
        held(&mut p, live[5].0),
        0,
        "merged with the free tail, the hole is the better fit"
    );
    let (mut q, live) = warm(3, false);
    q.free(live[1].0).unwrap();
    assert_eq!(q.stats().cached_allocs, 0);
}

/// After `MAX_MISSES` blocks given back in a row without a hit the cache rests: a freed heap
/// block merges at once, as with no cache. A request of the size freed just before it wakes
/// it, and the next free is held again. Every request lands where the pool without the cache
/// puts it.
#[test]
fn a_cache_that_keeps_missing_rests_until_a_request_follows_a_free_of_its_size() {
    let n = 2 * MAX_MISSES as usize + 2;
    let (mut p, live) = warm(n, true);
    let (mut q, qlive) = warm(n, false);
    let mut live = live.into_iter().zip(qlive);
    let mut free_next = |p: &mut Pool, q: &mut Pool| {
        let ((a, pa), (b, qa)) = live.next().unwrap();
        assert_eq!(pa, qa);
        p.free(a).unwrap();
        q.free(b).unwrap();
    };
    let both = |p: &mut Pool, q: &mut Pool, size| {
        let at = p.alloc(req(size)).unwrap().1;
        assert_eq!(at, q.alloc(req(size)).unwrap().1, "as without the cache");
    };
    for _ in 0..MAX_MISSES {
        // a 64 KiB block held, then given back by a request of another size
        free_next(&mut p, &mut q);
        assert_eq!(p.stats().cached_allocs, 1);
        both(&mut p, &mut q, 4096);
    }
    free_next(&mut p, &mut q);
    assert_eq!(
        p.stats().cached_allocs,
        0,
        "resting: the free merged at once"
    );
    let hits = p.stats().cache_hits;
    both(&mut p, &mut q, 64 * KIB);
    assert_eq!(p.stats().cache_hits, hits, "served by the full path");
    // awake again: the next free of a heap block is held
    free_next(&mut p, &mut q);
    assert_eq!(p.stats().cached_allocs, 1);
    both(&mut p, &mut q, 64 * KIB);
}

/// A stream-ordered free that completes in the pool's poll (its backend fence reached) may
/// leave its block held; the request that polled gets the pool as the pool without the cache
/// has it: the block given back, merged, before it is placed.
#[test]
fn a_free_completed_by_a_poll_is_given_back_before_the_request_that_polled_is_placed() {
    let at = |size_cache| {
        let sim = Arc::new(Simulated::with_streams(64 * MIB, 2 * MIB).unwrap());
        let d = device(64 * MIB);
        let dev = Arc::new(Device {
            pmm: d.pmm.clone(),
            backend: sim.clone(),
        });
        let mut cfg = PoolConfig::new(2 * MIB);
        cfg.size_cache = size_cache;
        cfg.check = true;
        let mut p = Pool::new(dev, cfg).unwrap();
        p.alloc(req(5000)).unwrap();
        let live: Vec<_> = (0..3).map(|_| p.alloc(req(64 * KIB)).unwrap()).collect();
        let fence = p.free_async(live[1].0, 0).unwrap();
        assert_eq!(p.pending_frees(), 1);
        sim.finish(fence);
        // On another stream (stream 0 would reuse the block at once): the pool holds no free
        // page, so this request polls before it is placed.
        let other = Request {
            size: 64 * KIB,
            stream: 1,
            ..Request::default()
        };
        let (_, ptr) = p.alloc(other).unwrap();
        assert_eq!(p.pending_frees(), 0, "the poll completed the free");
        (ptr, live[1].1, p.page_snapshot())
    };
    let (with, freed, pages) = at(true);
    let without = at(false);
    assert_eq!(with, freed, "the request takes the block the poll freed");
    assert_eq!(
        (with, pages),
        (without.0, without.2),
        "as without the cache"
    );
}
