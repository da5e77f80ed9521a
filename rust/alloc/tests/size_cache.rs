//! The exact-size cache: a freed block waits for the next request of its size, and goes back
//! on trim, defrag, close, before a batch and when its way goes stale.

use super::*;

/// A freed block whose size keeps being asked for waits, whole, for the next request of that
/// size (the exact-size cache): same block, no search, no merge. Its memory counts as free,
/// its handle is stale, and it goes back before the pool would grow, and when nothing is
/// left live.
#[test]
fn freed_blocks_wait_for_the_next_request_of_their_size() {
    let mut p = pool(8 * MIB);
    let _keep = p.alloc(req(5000)).unwrap();
    let (a, pa) = p.alloc(req(64 * KIB)).unwrap();
    let (b, pb) = p.alloc(req(64 * KIB)).unwrap(); // the size asked for twice
    let before = p.stats();
    p.free(a).unwrap();
    let s = p.stats();
    assert_eq!((s.cached_allocs, s.cache_hits), (1, 0));
    assert_eq!(
        s.free_bytes,
        before.free_bytes + 64 * KIB,
        "cached memory counts as free"
    );
    assert_eq!(s.largest_free_run, before.largest_free_run.max(64 * KIB));
    assert!(p.page_snapshot()[0]
        .blocks
        .iter()
        .any(|&(_, len, owner)| len >= 64 * KIB && owner.is_none()));
    assert!(
        matches!(p.free(a), Err(Error::InvalidFree(_))),
        "its handle is stale"
    );
    assert!(matches!(p.free_ptr(pa), Err(Error::InvalidFree(_))));
    assert!(p.info(a).is_err() && p.allocations().iter().all(|x| x.ptr != pa));
    // the next request of its size (any size that rounds to it) takes it back
    let (c, pc) = p.alloc(req(64 * KIB - 100)).unwrap();
    assert_eq!(pc, pa);
    let s = p.stats();
    assert_eq!(
        (s.cached_allocs, s.cache_hits, s.live_bytes),
        (0, 1, 5000 + 2 * 64 * KIB - 100)
    );
    p.free(c).unwrap();
    p.free(b).unwrap();
    assert_eq!(p.stats().cached_allocs, 2);
    assert!(pb != pa);
    // nothing live: every page is free again
    p.free(_keep.0).unwrap();
    let s = p.stats();
    assert_eq!((s.cached_allocs, s.pages_heap, s.pages_large), (0, 0, 0));
    // a request that only a cached block holds (the pool is one full page at its limit):
    // the cache gives it back and the request takes it
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.max_size = Some(2 * MIB);
    cfg.check = true;
    let mut q = Pool::new(device(8 * MIB), cfg.clone()).unwrap();
    let (x, px) = q.alloc(req(64 * KIB)).unwrap();
    let _y = q.alloc(req(64 * KIB)).unwrap();
    let mut rest = 2 * MIB - 128 * KIB;
    while rest > 0 {
        let n = rest.min(512 * KIB);
        q.alloc(req(n)).unwrap();
        rest -= n;
    }
    q.free(x).unwrap();
    assert_eq!(q.stats().cached_allocs, 1);
    let (_z, pz) = q.alloc(req(60 * KIB)).unwrap();
    assert_eq!(pz, px);
    assert_eq!(
        (q.stats().cached_allocs, q.stats().reserved_bytes),
        (0, 2 * MIB)
    );
    // switched off, nothing waits
    cfg.size_cache = false;
    let mut q = Pool::new(device(8 * MIB), cfg).unwrap();
    let _k = q.alloc(req(100)).unwrap();
    for _ in 0..3 {
        let (x, _) = q.alloc(req(4096)).unwrap();
        q.free(x).unwrap();
    }
    assert_eq!((q.stats().cached_allocs, q.stats().cache_hits), (0, 0));
}

/// A cached block is given back by trim, defrag, close and before a batch; a way whose size
/// stops coming goes stale and gives its blocks back.
#[test]
fn the_size_cache_gives_back_what_it_holds() {
    let mut p = pool(64 * MIB);
    let _keep = p.alloc(req(100)).unwrap();
    let cached = |p: &mut Pool, size: u64| {
        let (x, _) = p.alloc(req(size)).unwrap();
        let (y, _) = p.alloc(req(size)).unwrap();
        p.free(x).unwrap();
        p.free(y).unwrap();
        assert!(p.stats().cached_allocs >= 1);
    };
    cached(&mut p, 3 * MIB);
    p.trim(0).unwrap();
    assert_eq!(p.stats().cached_allocs, 0);
    cached(&mut p, 300 * KIB);
    p.defrag().unwrap();
    assert_eq!(p.stats().cached_allocs, 0);
    cached(&mut p, 5 * MIB);
    let mut out = vec![];
    p.alloc_batch(&[1000, 2000], 0, &mut out).unwrap();
    assert_eq!(p.stats().cached_allocs, 0);
    p.free_batch(&out).unwrap();
    // stale: requests of other sizes of the same way, none of its own
    cached(&mut p, 4096);
    let held = p.stats().cached_allocs;
    let units = 4096 / GRANULE as u32;
    let other = (units + 1..)
        .find(|&u| cache::way(u) == cache::way(units))
        .unwrap() as u64
        * GRANULE;
    let mut live = vec![];
    for _ in 0..8 {
        live.push(p.alloc(req(other)).unwrap().0);
    }
    assert!(
        p.stats().cached_allocs < held,
        "the stale way gave its block back"
    );
    for x in live {
        p.free(x).unwrap();
    }
    cached(&mut p, 64 * KIB);
    assert_eq!(p.close().unwrap(), 1);
    assert_eq!(p.stats().cached_allocs, 0);
    assert_eq!(p.stats().reserved_bytes, 0);
}
