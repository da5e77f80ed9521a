#![allow(unsafe_code)] // the host-backend tests read and write the memory they allocate

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::backend::Simulated;
use crate::pmm::{PmmConfig, SizeMask};

pub(super) const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

pub(super) fn device(vidmem: u64) -> Arc<Device> {
    let mut cfg = PmmConfig::new(
        vidmem,
        SizeMask::from_sizes(&[4096, 65536, 2 * MIB]).unwrap(),
        SizeMask::from_sizes(&[256, 4096, 65536, 2 * MIB]).unwrap(),
    );
    cfg.check = false;
    Arc::new(Device {
        pmm: Arc::new(Mutex::new(Pmm::new(cfg).unwrap())),
        backend: Arc::new(Simulated::new(vidmem, 2 * MIB).unwrap()),
    })
}

#[cfg(target_os = "linux")]
fn host_device(vidmem: u64) -> Arc<Device> {
    let d = device(vidmem);
    Arc::new(Device {
        pmm: d.pmm.clone(),
        backend: Arc::new(crate::backend::host::Host::new(vidmem).unwrap()),
    })
}

fn pool_on(dev: Arc<Device>) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    Pool::new(dev, cfg).unwrap()
}

fn pool(vidmem: u64) -> Pool {
    pool_on(device(vidmem))
}

/// `sizes` allocated by `alloc_arena` (`arena`) or `alloc_batch`: their pointers.
fn batch_of(p: &mut Pool, sizes: &[u64], arena: bool) -> Vec<u64> {
    let mut out = vec![];
    if arena {
        p.alloc_arena(sizes, 0, &mut out).unwrap();
    } else {
        p.alloc_batch(sizes, 0, &mut out).unwrap();
    }
    out
}

fn req(size: u64) -> Request {
    Request {
        size,
        ..Request::default()
    }
}

/// A request for a movable allocation (one `defrag` may move).
fn movable(size: u64) -> Request {
    Request {
        size,
        movable: true,
        ..Request::default()
    }
}

/// A pool that scrubs (zeroes what is freed) on `vidmem` bytes of host memory.
#[cfg(target_os = "linux")]
fn scrubbing_host_pool(vidmem: u64) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    (cfg.check, cfg.scrub) = (true, true);
    Pool::new(host_device(vidmem), cfg).unwrap()
}

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

#[test]
fn reclaim_gives_stitching_the_pages_inside_segments() {
    // 16 MiB: two 7 MiB allocations (with 1 MiB after each), then the first freed. Its four
    // pages stay in its segment; a 9 MiB request fits no free block, so they are reclaimed and
    // stitched with the rest, without growing past the device.
    let mut p = pool(16 * MIB);
    let (a, _) = p.alloc(req(7 * MIB)).unwrap();
    let (_b, _) = p.alloc(req(7 * MIB)).unwrap();
    p.free(a).unwrap();
    // (a's block waits in the exact-size cache, which a refused request gives back: give it
    // back first, so that the refusal below changes nothing at all)
    p.flush_cache();
    let before = (unchanging(&p), p.page_snapshot());
    assert_eq!(before.0.pages_free, 0);
    // too big for what is free: refused, and the reclaim it tried is undone
    assert!(matches!(p.alloc(req(10 * MIB)), Err(Error::OutOfMemory(_))));
    assert_eq!(before, (unchanging(&p), p.page_snapshot()));
    let (c, _) = p.alloc(req(8 * MIB + 512 * 1024)).unwrap();
    assert!(p.info(c).unwrap().stitched);
    assert_eq!(p.stats().reserved_bytes, 16 * MIB);
    p.free(c).unwrap();
    p.validate().unwrap();
}

#[test]
fn a_batch_in_one_block_is_cut_into_independent_allocations() {
    let mut p = pool(64 * MIB);
    let mut ptrs = vec![];
    p.alloc_batch(&[1000, 3000, 256, 5000], 0, &mut ptrs)
        .unwrap();
    // one placement, back to back at 256 B
    assert_eq!(ptrs[1] - ptrs[0], 1024);
    assert_eq!(ptrs[2] - ptrs[1], 3072);
    assert_eq!(ptrs[3] - ptrs[2], 256);
    // one block until a member is named alone (its record is uncut), but each member is its
    // own allocation in the page map all the same
    let slots: Vec<u32> = p.batches[0].members.iter().map(|e| e.1).collect();
    let layouts: Vec<Layout> = slots.iter().map(|&a| p.allocs[a as usize].layout).collect();
    assert!(layouts.iter().all(|&l| l == layouts[0]), "{layouts:?}");
    let owners = |p: &Pool| -> Vec<u64> {
        let map = p.page_snapshot();
        map.iter()
            .flat_map(|pg| pg.blocks.iter().filter_map(|b| b.2))
            .collect()
    };
    let uncut = owners(&p);
    assert_eq!(uncut, ptrs);
    p.validate().unwrap();
    // a lookup by pointer cuts it: each member its own block, the page map the same
    for &ptr in &ptrs {
        let a = p.slot_of_ptr(ptr).unwrap();
        assert!(matches!(p.allocs[a as usize].layout, Layout::Block(_)));
    }
    let mut blocks: Vec<Layout> = slots.iter().map(|&a| p.allocs[a as usize].layout).collect();
    blocks.dedup();
    assert_eq!(blocks.len(), ptrs.len());
    assert_eq!(owners(&p), uncut);
    p.validate().unwrap();
    // one freed alone is reusable at once, by a request of its size
    p.free_ptr(ptrs[1]).unwrap();
    let (_, again) = p.alloc(req(3000)).unwrap();
    assert_eq!(again, ptrs[1]);
    p.free_ptr(again).unwrap();
    // the rest freed together merge back into one free page
    p.free_batch(&[ptrs[3], ptrs[0], ptrs[2]]).unwrap();
    let s = p.stats();
    assert_eq!((s.used_bytes, s.pages_heap, s.pages_free), (0, 0, 1));
    // one placement, not one per size: two 600 KiB sizes would each go to a heap page; the
    // batch of 1.2 MiB is one large request, cut in two
    let mut two = vec![];
    p.alloc_batch(&[600 * KIB, 600 * KIB], 0, &mut two).unwrap();
    assert_eq!((p.stats().pages_heap, p.stats().pages_large), (0, 1));
    assert_eq!(two[1] - two[0], 600 * KIB);
    p.free_batch(&two).unwrap();
    // a batch that would be stitched is placed size by size instead
    let mut big = vec![];
    p.alloc_batch(&[3 * MIB, 3 * MIB], 0, &mut big).unwrap();
    p.free_batch(&big).unwrap();
    p.validate().unwrap();
}

/// A one-block batch freed whole, in its order, is freed as one block: its first block takes
/// in the others and merges once with the free blocks around it, leaving the pages exactly as
/// a free of each member would. An arena freed whole gives its memory back once, after its
/// members' slots.
#[test]
fn a_batch_freed_whole_merges_once() {
    let mut p = pool(64 * MIB);
    // live neighbours on both sides of a free hole the batch will be cut from
    let (left, _) = p.alloc(req(10_000)).unwrap();
    let (hole, _) = p.alloc(req(200_000)).unwrap();
    let (_right, _) = p.alloc(req(10_000)).unwrap();
    p.free(hole).unwrap();
    let sizes = [1000u64, 5000, 70_000, 300];
    let mut out = vec![];
    p.alloc_batch(&sizes, 0, &mut out).unwrap();
    p.free_batch(&out).unwrap();
    let before = (unchanging(&p), p.page_snapshot());
    for arena in [false, true] {
        out = batch_of(&mut p, &sizes, arena);
        let shape = p.batches.last().expect("the batch's record").shape;
        let blocks = p.vacant_blocks.len();
        if arena {
            assert!(
                matches!(shape, Record::Group(_)),
                "an arena's record is its group, not {shape:?}"
            );
        } else {
            assert!(
                matches!(shape, Record::Uncut(_)),
                "a batch in one block is uncut, not {shape:?}"
            );
        }
        p.free_batch(&out).unwrap();
        assert!(p.batches.is_empty());
        if !arena {
            // no block was made for the members, and theirs merged with the hole around it
            assert!(p.vacant_blocks.len() > blocks);
        }
        p.validate().unwrap();
        let mut now = unchanging(&p);
        now.allocs = before.0.allocs;
        now.frees = before.0.frees;
        assert_eq!((now, p.page_snapshot()), before, "arena: {arena}");
    }
    p.free(left).unwrap();
    p.validate().unwrap();
}

/// `free_batch` of a whole batch checks and frees each member in one pass; a member that
/// cannot be freed (pinned, or freed on a stream) met halfway restores the ones freed before
/// it: the call is refused and the pool is as it was (the record then goes into the pointer
/// index, as any lookup by pointer sends it, and its block is cut, which changes no page).
#[test]
fn a_refused_free_batch_restores_the_members_it_passed() {
    let mut p = pool(64 * MIB);
    let sizes = [1000u64, 5000, 70_000, 300, 9000];
    for arena in [false, true] {
        for on_stream in [false, true] {
            let mut out = batch_of(&mut p, &sizes, arena);
            let third = p.id(p.batches[0].members[3].1);
            let fence = if on_stream {
                Some(p.free_async(third, 7).unwrap())
            } else {
                p.pin(third).unwrap();
                None
            };
            let before = (unchanging(&p), p.page_snapshot(), p.allocations());
            assert!(p.free_batch(&out).is_err());
            let after = (unchanging(&p), p.page_snapshot(), p.allocations());
            assert_eq!(after, before, "arena {arena}, on a stream {on_stream}");
            assert!(p.batches.is_empty());
            p.validate().unwrap();
            match fence {
                Some(fence) => {
                    p.complete(fence).unwrap();
                    out.remove(3);
                }
                None => p.unpin(third).unwrap(),
            }
            p.free_batch(&out).unwrap();
            assert_eq!(p.stats().live_allocs, 0);
            p.validate().unwrap();
        }
    }
}

/// The members of a batch made in one step wait in its record, not in the pointer index; a
/// `free_batch` of exactly those pointers, in order, is served from the record. Any other
/// lookup by pointer indexes them first, with the same answers as ever: another order or a
/// part is freed, a member freed by handle is refused in a later `free_batch` (nothing freed).
#[test]
fn batch_members_wait_in_a_record_for_their_free_batch() {
    let mut p = pool(64 * MIB);
    let sizes = [1000u64, 5000, 70_000, 3 * MIB];
    let index_len = |p: &Pool| p.by_ptr.as_ref().map_or(0, |m| m.len());
    for arena in [false, true] {
        let out = batch_of(&mut p, &sizes, arena);
        assert_eq!((p.batches.len(), index_len(&p)), (1, 0));
        p.validate().unwrap();
        p.free_batch(&out).unwrap();
        assert_eq!((p.batches.len(), p.stats().used_bytes), (0, 0));
    }
    // another order: indexed, then freed
    let mut out = vec![];
    p.alloc_batch(&sizes, 0, &mut out).unwrap();
    let reversed: Vec<u64> = out.iter().rev().copied().collect();
    p.free_batch(&reversed).unwrap();
    assert_eq!(
        (p.batches.len(), index_len(&p), p.stats().live_allocs),
        (0, 0, 0)
    );
    // a member freed by handle: the whole batch is refused, nothing freed; the rest in parts
    out.clear();
    p.alloc_batch(&sizes, 0, &mut out).unwrap();
    let member = p
        .allocations()
        .into_iter()
        .find(|x| x.ptr == out[1])
        .unwrap();
    p.free(member.id).unwrap();
    assert!(matches!(p.free_batch(&out), Err(Error::InvalidFree(_))));
    assert_eq!((p.stats().live_allocs, index_len(&p)), (3, 3));
    p.free_batch(&out[2..]).unwrap();
    p.free_ptr(out[0]).unwrap();
    assert_eq!(p.stats().used_bytes, 0);
    // at most BATCH_RECORDS records wait: older batches are indexed (and freed all the same)
    let batches: Vec<Vec<u64>> = (0..BATCH_RECORDS + 3)
        .map(|_| {
            let mut out = vec![];
            p.alloc_batch(&[256, 512], 0, &mut out).unwrap();
            out
        })
        .collect();
    assert!(p.batches.len() <= BATCH_RECORDS);
    assert!(index_len(&p) >= 2 * (batches.len() - BATCH_RECORDS));
    p.validate().unwrap();
    for b in &batches {
        p.free_batch(b).unwrap();
    }
    assert_eq!(p.stats().used_bytes, 0);
    p.validate().unwrap();
}

#[test]
fn a_batch_does_not_grow_the_pool_for_one_block_when_its_holes_hold_it() {
    let mut p = pool(64 * MIB);
    let ids: Vec<_> = (0..8)
        .map(|_| p.alloc(req(3 * MIB / 2)).unwrap().0)
        .collect();
    for id in ids.iter().step_by(2) {
        p.free(*id).unwrap(); // four 1.5 MiB holes, none holding a whole page
    }
    let reserved = p.stats().reserved_bytes;
    let mut ptrs = vec![];
    p.alloc_batch(&[MIB; 4], 0, &mut ptrs).unwrap();
    // one 4 MiB block would need new pages; the holes hold the sizes one by one
    assert_eq!(p.stats().reserved_bytes, reserved);
    p.validate().unwrap();
}

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

/// A large request whose head is not followed by free pages (so head + pages would need the
/// window) takes a free run that holds it whole instead, while the pool has free pages
/// aplenty: one block of a new segment, in the direct map, nothing stitched.
#[test]
fn a_free_run_is_taken_before_a_layout_that_needs_the_window() {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.initial_size = 32 * MIB;
    let mut p = Pool::new(device(64 * MIB), cfg).unwrap();
    // pages 0-1: 3 MiB and a free 1 MiB page end (a head); page 2: a heap page
    let (_a, pa) = p.alloc(req(3 * MIB)).unwrap();
    let _small = p.alloc(req(1000)).unwrap();
    let base = pa; // the direct map's page 0
    assert_eq!(p.stats().pages_heap, 1);
    // 5 MiB: the 1 MiB head and two whole pages would be stitched (page 2 is taken); a run
    // of three free pages holds it whole
    let (c, pc) = p.alloc(req(5 * MIB)).unwrap();
    assert!(!p.info(c).unwrap().stitched);
    assert_eq!(pc, base + 3 * 2 * MIB);
    assert_eq!(p.stats().stitched, 0);
}

/// Free page ends of 0.5 and 0.75 MiB and a free page start of 1 MiB, in separate segments,
/// then a 3.5 MiB request. Under pressure the pool pairs the 0.5 MiB end with the 1 MiB start
/// (nothing left over); with room to spare it takes the larger end and leaves the rest.
fn pairing_scenario(max_size: Option<u64>) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.small_threshold = 64 * 1024;
    cfg.max_size = max_size;
    let mut p = Pool::new(device(256 * MIB), cfg).unwrap();
    let kib = |k: u64| req(k * 1024);
    let _big = p.alloc(req(40 * MIB)).unwrap(); // pages 0-19
    let _x1 = p.alloc(kib(1536)).unwrap(); // page 20: x1 then y1
    let (y1, _) = p.alloc(kib(512)).unwrap();
    let _x2 = p.alloc(kib(1280)).unwrap(); // page 21: x2 then y2
    let (y2, _) = p.alloc(kib(768)).unwrap();
    let (z1, _) = p.alloc(kib(1024)).unwrap(); // page 22: z1 then w
    let _w = p.alloc(kib(1024)).unwrap();
    // page 23 (last: a small pool would place a large request below a page in its free
    // block before it took a page, `SMALL_POOL`)
    let _heap = p.alloc(req(1000)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 48 * MIB);
    assert_eq!(p.stats().large_free_bytes, 0);
    for id in [y1, y2, z1] {
        p.free(id).unwrap();
    }
    p.flush_cache();
    assert_eq!(p.stats().large_free_bytes, (512 + 768 + 1024) * 1024);
    p
}

#[test]
fn under_pressure_a_head_is_chosen_for_its_tail() {
    // 52 MiB: 4 MiB of room left, under an eighth of the pool's limit
    let mut p = pairing_scenario(Some(52 * MIB));
    let (r, _) = p.alloc(req(3584 * 1024)).unwrap();
    assert!(p.info(r).unwrap().stitched);
    assert_eq!(p.stats().reserved_bytes, 50 * MIB);
    assert_eq!(p.stats().large_free_bytes, 768 * 1024);
    // with room: the largest page end, and for the tail the free page start that holds it
    // (a small pool takes no fresh page for a tail while one does, `SMALL_POOL`)
    let mut p = pairing_scenario(None);
    p.alloc(req(3584 * 1024)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 50 * MIB);
    assert_eq!(p.stats().large_free_bytes, (512 + 256) * 1024);
}

#[test]
fn stitching_uses_scattered_pages() {
    // A 20 MiB pool: ten 2 MiB allocations, every other freed: 10 MiB free in 2 MiB holes.
    let mut p = pool(20 * MIB);
    let ids: Vec<_> = (0..10).map(|_| p.alloc(req(2 * MIB)).unwrap()).collect();
    for (i, (id, _)) in ids.iter().enumerate() {
        if i % 2 == 0 {
            p.free(*id).unwrap();
        }
    }
    let s = p.stats();
    assert_eq!(s.free_bytes, 10 * MIB);
    assert_eq!(s.largest_free_run, 2 * MIB);
    assert!((s.fragmentation - 0.8).abs() < 1e-9);
    // A contiguous allocator fails here; stitching maps the five holes back to back.
    let (big, ptr) = p.alloc(req(10 * MIB)).unwrap();
    let info = p.info(big).unwrap();
    assert!(info.stitched);
    assert!(p.va.in_window(ptr));
    assert_eq!(p.stats().free_bytes, 0);
    assert!(p.alloc(req(1)).is_err());
    p.free(big).unwrap();
    // the window range is cached for the next stitched allocation of its length
    assert_eq!(p.va.used_pages(), 0);
    p.va.flush();
    assert_eq!(p.va.cached_pages(), 0);
    assert_eq!(p.va.used_pages(), 0);
}

#[test]
fn out_of_memory_says_why_and_changes_nothing() {
    let mut p = pool(8 * MIB);
    let (_a, _) = p.alloc(req(5 * MIB)).unwrap();
    let before = p.stats();
    let e = p.alloc(req(4 * MIB)).unwrap_err();
    let Error::OutOfMemory(msg) = e else {
        panic!("{e:?}")
    };
    for word in [
        "4 MiB",
        "live 5 MiB",
        "reserved 6 MiB",
        "free 1 MiB",
        "fragmentation",
        "device: 2 MiB free",
    ] {
        assert!(msg.contains(word), "{word:?} missing from {msg}");
    }
    let after = p.stats();
    assert_eq!(after.failures, 1);
    assert_eq!(
        (after.live_bytes, after.used_bytes, after.reserved_bytes),
        (before.live_bytes, before.used_bytes, before.reserved_bytes)
    );
    // but 3 MiB fits: a head of 1 MiB and one page
    p.alloc(req(3 * MIB)).unwrap();
}

#[test]
fn bad_requests_are_refused() {
    let mut p = pool(8 * MIB);
    assert!(matches!(p.alloc(req(0)), Err(Error::InvalidSize(_))));
    assert!(matches!(p.alloc(req(9 * MIB)), Err(Error::InvalidSize(_))));
    let (a, ptr) = p.alloc(req(1000)).unwrap();
    assert!(matches!(p.free_ptr(ptr + 256), Err(Error::InvalidFree(m)) if m.contains("interior")));
    assert!(matches!(p.free_ptr(12345), Err(Error::InvalidFree(m)) if m.contains("foreign")));
    p.free(a).unwrap();
    assert!(matches!(p.free(a), Err(Error::InvalidFree(m)) if m.contains("double free")));
    assert!(matches!(p.free_ptr(ptr), Err(Error::InvalidFree(_))));
    let (b, ptr_b) = p.alloc(req(1000)).unwrap();
    p.pin(b).unwrap();
    assert!(matches!(p.free(b), Err(Error::InvalidState(_))));
    assert!(matches!(p.close(), Err(Error::InvalidState(_))));
    p.unpin(b).unwrap();
    assert!(matches!(
        p.free_batch(&[ptr_b, ptr_b]),
        Err(Error::InvalidFree(_))
    ));
    assert_eq!(p.stats().live_allocs, 1);
    assert_eq!(p.close().unwrap(), 1);
    assert!(matches!(p.alloc(req(1)), Err(Error::InvalidState(_))));
}

#[test]
fn max_size_limits_the_pool() {
    let dev = device(64 * MIB);
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.max_size = Some(4 * MIB);
    cfg.initial_size = 2 * MIB;
    let mut p = Pool::new(dev.clone(), cfg).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB);
    p.alloc(req(4 * MIB)).unwrap();
    assert!(matches!(p.alloc(req(1)), Err(Error::OutOfMemory(_))));
    // the device still has memory for another pool
    let mut q = pool_on(dev);
    q.alloc(req(8 * MIB)).unwrap();
}

#[test]
fn stream_ordered_frees_wait_for_their_fence() {
    let mut p = pool(4 * MIB);
    let (a, pa) = p.alloc(req(4 * MIB)).unwrap();
    let f = p.free_async(a, 7).unwrap();
    assert_eq!(p.stats().freeing_bytes, 4 * MIB);
    // another stream cannot have it yet
    let o = Request {
        size: 4 * MIB,
        stream: 8,
        ..Request::default()
    };
    assert!(matches!(p.alloc(o), Err(Error::OutOfMemory(_))));
    // the same stream may reuse it at once
    let same = Request {
        size: 4 * MIB - 100,
        stream: 7,
        ..Request::default()
    };
    let (b, pb) = p.alloc(same).unwrap();
    assert_eq!(pb, pa);
    assert_ne!(b, a);
    assert!(matches!(p.free(a), Err(Error::InvalidFree(_))));
    let f2 = p.free_async(b, 7).unwrap();
    assert!(f2 > f);
    assert_eq!(
        p.complete(f).unwrap(),
        0,
        "the first free was taken over by the reuse"
    );
    assert_eq!(p.complete(f2).unwrap(), 1);
    assert_eq!(p.complete(f2).unwrap(), 0, "completing twice is harmless");
    assert!(matches!(p.complete(999), Err(Error::InvalidArgument(_))));
    p.alloc(o).unwrap();
}

#[test]
fn synchronize_completes_every_stream() {
    let mut p = pool(16 * MIB);
    for s in 1..4u64 {
        let (a, _) = p
            .alloc(Request {
                size: MIB,
                stream: s,
                ..Request::default()
            })
            .unwrap();
        p.free_async(a, s).unwrap();
    }
    assert_eq!(p.pending_frees(), 3);
    assert_eq!(p.synchronize(Some(2)).unwrap(), 1);
    assert_eq!(p.synchronize(None).unwrap(), 2);
    assert_eq!(p.stats().used_bytes, 0);
}

#[test]
fn defrag_empties_heap_pages() {
    let mut p = pool(64 * MIB);
    // fill 4 heap pages with 64 KiB allocations, then keep one in eight
    let ids: Vec<_> = (0..128)
        .map(|_| p.alloc(movable(64 * KIB)).unwrap())
        .collect();
    assert_eq!(p.stats().pages_heap, 4);
    for (i, (id, _)) in ids.iter().enumerate() {
        if i % 8 != 0 {
            p.free(*id).unwrap();
        }
    }
    assert_eq!(p.stats().pages_heap, 4);
    let r = p.defrag().unwrap();
    // each page first slides its three later allocations down (12 copies), then three of
    // the pages are emptied into the fourth (12 more): 15 allocations moved, 24 copies
    assert_eq!(r.moved_allocs, 15);
    assert_eq!(r.moves.len(), 15);
    assert_eq!(r.moved_bytes, 24 * 64 * KIB);
    assert_eq!(r.pages_emptied, 3);
    assert_eq!(r.bytes_released, 3 * 2 * MIB);
    let s = p.stats();
    assert_eq!(
        (s.pages_heap, s.reserved_bytes, s.live_allocs),
        (1, 2 * MIB, 16)
    );
    // moved allocations are found at their new address, and their old one no longer names
    // them (another allocation may have moved there)
    for (id, old, new) in r.moves {
        assert_ne!(old, new);
        assert_eq!(p.info(id).unwrap().ptr, new);
        assert_eq!(p.id_of(new).unwrap(), id);
        assert!(!p.id_of(old).is_ok_and(|other| other == id));
    }
}

/// Allocations of `sizes` in turn (movable or not) on a 16 MiB device, then every one at an
/// odd position freed: what is left is `(pool, [(id, ptr, size)] kept)`.
fn holes_between(movable: bool, sizes: &[u64], count: usize) -> (Pool, Vec<(AllocId, u64, u64)>) {
    let mut p = pool(16 * MIB);
    let mut made = vec![];
    for i in 0..count {
        let size = sizes[i % sizes.len()];
        let (id, ptr) = p
            .alloc(Request {
                size,
                movable,
                ..Request::default()
            })
            .unwrap();
        made.push((id, ptr, size));
    }
    let mut kept = vec![];
    for (i, m) in made.into_iter().enumerate() {
        if i % 2 == 1 {
            p.free(m.0).unwrap();
        } else {
            kept.push(m);
        }
    }
    (p, kept)
}

#[test]
fn defrag_compacts_large_segments() {
    // 10 × 1.5 MiB back to back in 8 pages, every other freed: 7.5 MiB free in holes of
    // 1.5 MiB, none of which holds a whole page
    let (mut p, kept) = holes_between(true, &[3 * MIB / 2], 10);
    let s = p.stats();
    assert_eq!((s.pages_free, s.reserved_bytes), (0, 16 * MIB));
    assert!(s.largest_request < 4 * MIB, "{s:?}");
    let r = p.defrag().unwrap();
    // the pool made three segments of them (pages 0–2, 3–5, 6–7); in each, the allocation
    // after a hole slides down over it, and the hole, now at the segment's end, holds a
    // whole page
    assert_eq!(r.moved_allocs, 2);
    assert_eq!(r.moved_bytes, 2 * 3 * MIB / 2);
    for &(id, old, new) in &r.moves {
        assert_eq!(p.info(id).unwrap().ptr, new);
        assert_eq!(old - new, 3 * MIB / 2);
    }
    assert_eq!(r.bytes_released, 3 * 2 * MIB);
    assert_eq!(p.stats().reserved_bytes, 10 * MIB);
    for k in &kept {
        assert_eq!(p.info(k.0).unwrap().size, k.2);
    }
    // and a request that no layout of the holes could serve now fits
    p.alloc(req(6 * MIB)).unwrap();
}

#[test]
fn the_way_to_out_of_memory_compacts_large_segments() {
    // a 5 MiB request among holes of 1.5 MiB: refused while the allocations may not move
    // (the last resort lays out at most 4.5 MiB there: a 1.5 MiB page end, the free last
    // page, a 1 MiB page start), served once they may (compacted on the way to out of memory)
    let (mut fixed, _) = holes_between(false, &[3 * MIB / 2], 10);
    assert!(matches!(
        fixed.alloc(req(5 * MIB)),
        Err(Error::OutOfMemory(_))
    ));
    let (mut p, kept) = holes_between(true, &[3 * MIB / 2], 10);
    p.alloc(req(5 * MIB)).unwrap();
    for k in kept {
        p.free(k.0).unwrap();
    }
}

#[test]
fn defrag_empties_heap_pages_into_large_segment_holes() {
    // a 1.5 MiB hole between two allocations that may not move, in the middle of a large
    // segment (pages 0–2), and one movable 256 KiB allocation alone in a heap page: no other
    // heap page can take it, the hole can
    let mut p = pool(32 * MIB);
    let big: Vec<_> = (0..4).map(|_| p.alloc(req(3 * MIB / 2)).unwrap()).collect();
    // (made before the hole: a small pool places a request in a free block of a large
    // segment before it takes a heap page, `SMALL_POOL`)
    let (m, old) = p.alloc(movable(256 * KIB)).unwrap();
    p.free(big[1].0).unwrap();
    assert_eq!(
        (p.stats().pages_heap, p.stats().reserved_bytes),
        (1, 8 * MIB)
    );
    let r = p.defrag().unwrap();
    assert_eq!((r.moved_allocs, r.pages_emptied), (1, 1));
    assert_eq!(r.moves, vec![(m, old, big[1].1)]);
    assert_eq!(r.bytes_released, 2 * MIB);
    let s = p.stats();
    assert_eq!(
        (s.pages_heap, s.reserved_bytes, s.live_allocs),
        (0, 6 * MIB, 4)
    );
    assert_eq!(p.info(m).unwrap().ptr, big[1].1);
    assert_eq!(p.id_of(big[1].1).unwrap(), m);
    // a page is emptied whole or not at all: two 900 KiB allocations, of which the hole
    // holds one, stay where they are
    let mut p = pool(32 * MIB);
    let big: Vec<_> = (0..4).map(|_| p.alloc(req(3 * MIB / 2)).unwrap()).collect();
    p.free(big[1].0).unwrap();
    let two = [(); 2].map(|_| p.alloc(movable(900 * KIB)).unwrap());
    let r = p.defrag().unwrap();
    assert_eq!((r.moved_allocs, r.pages_emptied), (0, 0));
    for (id, ptr) in two {
        assert_eq!(p.info(id).unwrap().ptr, ptr);
    }
}

/// On a 16 MiB device: pages 1, 2, 4, 6 and 7 held by allocations that may not move; `k`
/// (1.5 MiB, may not move) at the start of page 5; `s` (2.75 MiB, movable) stitched from
/// the rest of page 5 (its head), page 3 and the start of page 0 (its tail). Returns `k`
/// and `s`.
fn stitched_after(p: &mut Pool) -> ((AllocId, u64), (AllocId, u64)) {
    let whole: Vec<_> = (0..8).map(|_| p.alloc(req(2 * MIB)).unwrap()).collect();
    for i in [0, 3, 5] {
        p.free(whole[i].0).unwrap();
    }
    let k = p.alloc(req(3 * MIB / 2)).unwrap();
    let s = p.alloc(movable(11 * MIB / 4)).unwrap();
    let Layout::Stitched(i) = p.allocs[s.0.index as usize].layout else {
        panic!("not stitched")
    };
    let st = &p.stitches[i as usize];
    let (h, t) = (p.blocks[st.head as usize], p.blocks[st.tail as usize]);
    assert_eq!(p.allocs[k.0.index as usize].layout, Layout::Block(h.prev));
    assert_eq!((h.page, h.off), (5, 6144));
    assert_eq!(
        (st.runs.as_slice(), t.page, t.off, t.len),
        (&[(3, 1)][..], 0, 0, 1024)
    );
    (k, s)
}

#[test]
fn defrag_slides_stitched_allocations() {
    let mut p = pool(16 * MIB);
    let (k, (s, old)) = stitched_after(&mut p);
    let live = p.stats().live_bytes;
    // freed, `k` leaves 1.5 MiB free before the head: the allocation slides down through its
    // window as far as its tail allows (it keeps one granule), its pages and window as they
    // were
    p.free(k.0).unwrap();
    let r = p.defrag().unwrap();
    let d = 1023 * GRANULE;
    assert_eq!(r.moves, vec![(s, old, old - d)]);
    assert_eq!((r.moved_allocs, r.moved_bytes), (1, 11 * MIB / 4));
    assert_eq!(p.info(s).unwrap().ptr, old - d);
    assert_eq!(p.id_of(old - d).unwrap(), s);
    let Layout::Stitched(i) = p.allocs[s.index as usize].layout else {
        panic!("not stitched")
    };
    let st = &p.stitches[i as usize];
    let (h, t) = (p.blocks[st.head as usize], p.blocks[st.tail as usize]);
    assert_eq!((h.page, h.off, h.len), (5, 6144 - 1023, 2048 + 1023));
    assert_eq!((t.page, t.off, t.len), (0, 0, 1));
    assert_eq!(p.stats().live_bytes, live - 3 * MIB / 2);
    // one that may not move stays
    let mut q = pool(16 * MIB);
    let (k, (s, old)) = stitched_after(&mut q);
    q.free(k.0).unwrap();
    q.pin(s).unwrap();
    assert_eq!(q.defrag().unwrap().moved_allocs, 0);
    assert_eq!(q.info(s).unwrap().ptr, old);
    q.unpin(s).unwrap();
    // and everything goes back
    p.free(s).unwrap();
    q.free(s).unwrap();
    for pool in [&mut p, &mut q] {
        pool.trim(0).unwrap();
        assert_eq!(pool.stats().used_bytes, pool.stats().live_bytes);
    }
}

#[test]
fn scopes_free_what_they_made() {
    let mut p = pool(16 * MIB);
    let outer = p.alloc(req(1000)).unwrap();
    let s = p.open_scope().unwrap();
    let inner = p
        .alloc(Request {
            size: 3 * MIB,
            scope: s,
            ..Request::default()
        })
        .unwrap();
    let freed_inside = p
        .alloc(Request {
            size: 100,
            scope: s,
            ..Request::default()
        })
        .unwrap();
    p.free(freed_inside.0).unwrap();
    let r = p.close_scope(s).unwrap();
    assert_eq!((r.allocs, r.freed), (2, 1));
    assert_eq!(r.leaked[0].ptr, inner.1);
    assert!(p.info(inner.0).is_err());
    assert!(p.info(outer.0).is_ok());
}

#[test]
fn batches_are_all_or_nothing() {
    let mut p = pool(8 * MIB);
    let mut out = vec![];
    assert!(p.alloc_batch(&[MIB, 0], 0, &mut out).is_err());
    assert!(p
        .alloc_batch(&[4 * MIB, 4 * MIB, 4 * MIB], 0, &mut out)
        .is_err());
    assert!(out.is_empty());
    assert_eq!(p.stats().live_allocs, 0);
    p.alloc_batch(&[100, 2 * MIB, 3 * MIB], 0, &mut out)
        .unwrap();
    assert_eq!(out.len(), 3);
    assert!(p.free_batch(&[out[0], 1]).is_err());
    assert_eq!(p.stats().live_allocs, 3);
    p.free_batch(&out).unwrap();
    assert_eq!(p.stats().live_allocs, 0);
}

#[test]
fn arenas_pack_their_members_and_go_back_with_the_last() {
    let mut p = pool(64 * MIB);
    let mut out = vec![];
    let sizes = [100, 3 * MIB, 256, 5000, MIB];
    p.alloc_arena(&sizes, 0, &mut out).unwrap();
    // back to back at 256-byte alignment, in one placement
    let rounded: Vec<u64> = sizes.iter().map(|s| s.div_ceil(256) * 256).collect();
    for i in 1..out.len() {
        assert_eq!(out[i], out[i - 1] + rounded[i - 1]);
    }
    let total: u64 = rounded.iter().sum();
    let s = p.stats();
    assert_eq!(s.live_allocs, 5);
    assert_eq!(s.live_bytes, sizes.iter().sum::<u64>());
    assert_eq!(s.used_bytes, total);
    assert_eq!(p.allocations().len(), 5);
    // one freed early: counted as freed, its memory still held by the arena
    let before = p.stats();
    p.free_ptr(out[1]).unwrap();
    let s = p.stats();
    assert_eq!(s.live_allocs, 4);
    assert_eq!(s.live_bytes, before.live_bytes - 3 * MIB);
    assert_eq!(s.used_bytes, total);
    assert_eq!(s.reserved_bytes, before.reserved_bytes);
    // a new request does not land in the arena's freed member
    let (x, xp) = p.alloc(req(3 * MIB)).unwrap();
    assert!(xp + 3 * MIB <= out[0] || xp >= out[0] + total);
    p.free(x).unwrap();
    // bad frees change nothing: interior, twice in one batch, already freed
    assert!(p.free_ptr(out[0] + 256).is_err());
    assert!(p.free_batch(&[out[0], out[0]]).is_err());
    assert!(p.free_batch(&[out[0], out[1]]).is_err());
    assert_eq!(p.stats().live_allocs, 4);
    // a pinned member cannot be freed, in a batch or alone
    let id = p.id_of(out[2]).unwrap();
    p.pin(id).unwrap();
    assert!(p.free_batch(&[out[0], out[2]]).is_err());
    p.unpin(id).unwrap();
    // stream-ordered: a member waits for its fence like any allocation
    let id4 = p.id_of(out[4]).unwrap();
    let f = p.free_async(id4, 7).unwrap();
    p.free_batch(&[out[0], out[2], out[3]]).unwrap();
    assert_eq!(p.stats().used_bytes, total); // the pending member holds the arena
    p.complete(f).unwrap();
    let s = p.stats();
    assert_eq!((s.live_allocs, s.used_bytes, s.live_bytes), (0, 0, 0));
    p.validate().unwrap();
    // refused arenas: a zero size, or more than the pool can hold; nothing changes
    assert!(p.alloc_arena(&[MIB, 0], 0, &mut out).is_err());
    assert!(p.alloc_arena(&[40 * MIB, 40 * MIB], 0, &mut out).is_err());
    assert_eq!(out.len(), 5);
    assert_eq!(p.stats().live_allocs, 0);
    // an arena still live when the pool closes goes back with it
    let mut out = vec![];
    p.alloc_arena(&[MIB, MIB], 0, &mut out).unwrap();
    assert_eq!(p.close().unwrap(), 2);
}

#[test]
fn release_threshold_gives_pages_back() {
    let dev = device(64 * MIB);
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.release_threshold = Some(2 * MIB);
    cfg.check = true;
    let mut p = Pool::new(dev.clone(), cfg).unwrap();
    let (a, _) = p.alloc(req(10 * MIB)).unwrap();
    p.free(a).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB);
    assert_eq!(dev.pmm.lock().stats().allocated_bytes, 2 * MIB);
    assert_eq!(p.trim(0).unwrap(), 2 * MIB);
    assert_eq!(dev.pmm.lock().stats().allocated_bytes, 0);
}

#[test]
fn latency_is_sampled() {
    let mut p = pool(8 * MIB);
    for _ in 0..256 {
        let (a, _) = p.alloc(req(1000)).unwrap();
        p.free(a).unwrap();
    }
    let s = p.stats();
    assert_eq!(s.latency_samples, 4);
    assert!(s.latency_p99_ns > 0.0 && s.latency_mean_ns > 0.0);
    assert_eq!(s.success_rate, 1.0);
}

#[cfg(target_os = "linux")]
#[test]
fn host_stitching_is_real_memory() {
    let dev = host_device(16 * MIB);
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.scrub = true;
    let mut p = Pool::new(dev, cfg).unwrap();
    let ids: Vec<_> = (0..8).map(|_| p.alloc(req(2 * MIB)).unwrap()).collect();
    for (i, (id, _)) in ids.iter().enumerate() {
        if i % 2 == 1 {
            p.free(*id).unwrap();
        }
    }
    let (big, ptr) = p.alloc(req(7 * MIB)).unwrap();
    assert!(p.info(big).unwrap().stitched);
    let n = (7 * MIB) as usize;
    // SAFETY: [ptr, ptr + 7 MiB) is the allocation, mapped read-write by the host backend.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, n) };
    assert!(bytes.iter().all(|&b| b == 0), "fresh pages are zero");
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    // the same bytes, through the direct map of the pages it was stitched from
    let Layout::Stitched(i) = p.allocs[big.index as usize].layout else {
        panic!()
    };
    let first = p.stitches[i as usize].runs[0].0;
    let direct = p.direct_addr(first, 0);
    // SAFETY: the direct map covers every page of the device.
    let page = unsafe { std::slice::from_raw_parts(direct as *const u8, (2 * MIB) as usize) };
    assert!(page.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    p.free(big).unwrap();
    // scrubbed on free
    assert!(page.iter().all(|&b| b == 0));
}

/// `defrag_plan` changes nothing, and says what `defrag` then does.
fn plan_then_defrag(p: &mut Pool) -> DefragPlan {
    let (snap, s) = (p.page_snapshot(), p.stats());
    let plan = p.defrag_plan().unwrap();
    let after = p.stats();
    assert_eq!(p.page_snapshot(), snap);
    assert_eq!(
        (
            after.reserved_bytes,
            after.used_bytes,
            after.pages_free,
            after.live_allocs
        ),
        (s.reserved_bytes, s.used_bytes, s.pages_free, s.live_allocs)
    );
    p.validate().unwrap();
    let r = p.defrag().unwrap();
    assert_eq!(plan.report, r);
    assert_eq!(
        plan.pages_freed,
        (r.bytes_released >> p.cfg.page_size.trailing_zeros()) - s.pages_free
    );
    plan
}

#[test]
fn defrag_plan_is_what_defrag_does() {
    let mut p = pool(64 * MIB);
    let ids: Vec<_> = (0..128)
        .map(|_| p.alloc(movable(64 * KIB)).unwrap())
        .collect();
    for (i, (id, _)) in ids.iter().enumerate() {
        if i % 8 != 0 {
            p.free(*id).unwrap();
        }
    }
    let plan = plan_then_defrag(&mut p);
    assert_eq!((plan.movable_heap_pages, plan.report.pages_emptied), (4, 3));
    let (mut p, _) = holes_between(true, &[3 * MIB / 2], 10);
    let plan = plan_then_defrag(&mut p);
    assert!(plan.report.moved_allocs > 0 && plan.pages_freed > 0);
    // nothing may move: an empty plan
    let (mut p, _) = holes_between(false, &[3 * MIB / 2, 64 * KIB], 12);
    let plan = plan_then_defrag(&mut p);
    assert_eq!((plan.report.moved_allocs, plan.movable_heap_pages), (0, 0));
    p.close().unwrap();
    assert!(p.defrag_plan().is_err());
}

#[cfg(target_os = "linux")]
#[test]
fn host_defrag_moves_bytes() {
    let dev = host_device(16 * MIB);
    let mut p = pool_on(dev);
    let ids: Vec<_> = (0..64)
        .map(|_| p.alloc(movable(64 * KIB)).unwrap())
        .collect();
    for (i, &(id, ptr)) in ids.iter().enumerate() {
        if i % 8 != 0 {
            p.free(id).unwrap();
        } else {
            // SAFETY: a live 64 KiB allocation of the host backend.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, i as u8, (64 * KIB) as usize) };
        }
    }
    let r = p.defrag().unwrap();
    assert!(r.moved_allocs > 0);
    for (i, &(id, _)) in ids.iter().enumerate().filter(|(i, _)| i % 8 == 0) {
        let ptr = p.info(id).unwrap().ptr;
        // SAFETY: as above, at its (possibly new) address.
        let b = unsafe { std::slice::from_raw_parts(ptr as *const u8, (64 * KIB) as usize) };
        assert!(
            b.iter().all(|&x| x == i as u8),
            "allocation {i} lost its bytes"
        );
    }
}

#[cfg(target_os = "linux")]
#[test]
fn host_stitched_slide_keeps_the_bytes() {
    let mut p = pool_on(host_device(16 * MIB));
    let (k, (s, old)) = stitched_after(&mut p);
    let n = (11 * MIB / 4) as usize;
    // SAFETY: `s` is a live allocation of `n` bytes, mapped read-write by the host backend.
    let b = unsafe { std::slice::from_raw_parts_mut(old as *mut u8, n) };
    for (j, x) in b.iter_mut().enumerate() {
        *x = (j % 251) as u8;
    }
    p.free(k.0).unwrap();
    let r = p.defrag().unwrap();
    assert_eq!(r.moves, vec![(s, old, old - 1023 * GRANULE)]);
    let ptr = p.info(s).unwrap().ptr;
    // SAFETY: as above, at its new address (the same window, lower down).
    let b = unsafe { std::slice::from_raw_parts(ptr as *const u8, n) };
    assert!(b.iter().enumerate().all(|(j, &x)| x == (j % 251) as u8));
    p.free(s).unwrap();
}

#[cfg(target_os = "linux")]
#[test]
fn host_compaction_moves_bytes_over_overlapping_ranges() {
    // 1 MiB and 3 MiB allocations in turn (the pool puts each pair in a segment of two
    // pages); the 1 MiB ones freed: each 3 MiB one slides down by 1 MiB, less than its own
    // length (source and destination overlap)
    let dev = host_device(16 * MIB);
    let mut p = pool_on(dev);
    let mut made = vec![];
    for i in 0..8u64 {
        let size = if i % 2 == 0 { MIB } else { 3 * MIB };
        let (id, ptr) = p.alloc(movable(size)).unwrap();
        made.push((id, ptr, size));
    }
    for (i, &(id, ptr, size)) in made.iter().enumerate() {
        if i % 2 == 0 {
            p.free(id).unwrap();
        } else {
            // SAFETY: a live allocation of `size` bytes of the host backend.
            let b = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size as usize) };
            for (j, x) in b.iter_mut().enumerate() {
                *x = (j % 251) as u8 ^ i as u8;
            }
        }
    }
    let r = p.defrag().unwrap();
    assert!(
        r.moves.iter().any(|&(_, old, new)| old - new < 3 * MIB),
        "no overlapping move: {r:?}"
    );
    for (i, &(id, _, size)) in made.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        let ptr = p.info(id).unwrap().ptr;
        // SAFETY: as above, at its (possibly new) address.
        let b = unsafe { std::slice::from_raw_parts(ptr as *const u8, size as usize) };
        assert!(
            b.iter()
                .enumerate()
                .all(|(j, &x)| x == (j % 251) as u8 ^ i as u8),
            "allocation {i} lost its bytes"
        );
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_scrubbing_pool_zeroes_what_a_slide_leaves_behind() {
    // as above, in a pool that scrubs: the end of the old range that a slide leaves free
    // reads zero, as memory a free gives back does
    let mut p = scrubbing_host_pool(16 * MIB);
    let made: Vec<_> = (0..4u64)
        .map(|i| {
            p.alloc(movable(if i % 2 == 0 { MIB } else { 3 * MIB }))
                .unwrap()
        })
        .collect();
    for (i, &(id, ptr)) in made.iter().enumerate() {
        if i % 2 == 0 {
            p.free(id).unwrap();
        } else {
            // SAFETY: a live 3 MiB allocation of the host backend.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, 0xAB, (3 * MIB) as usize) };
        }
    }
    let r = p.defrag().unwrap();
    assert_eq!(r.moved_allocs, 2);
    for &(_, old, new) in &r.moves {
        assert_eq!(old - new, MIB);
        // the last MiB of the old range: free now, in the page the allocation still ends in
        let tail = old + 2 * MIB;
        // SAFETY: held memory of the host backend (the allocation ends in the same page).
        let b = unsafe { std::slice::from_raw_parts(tail as *const u8, MIB as usize) };
        assert!(b.iter().all(|&x| x == 0), "stale bytes at {tail:#x}");
        // SAFETY: the allocation, at its new address.
        let a = unsafe { std::slice::from_raw_parts(new as *const u8, (3 * MIB) as usize) };
        assert!(a.iter().all(|&x| x == 0xAB));
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_scrubbing_pool_zeroes_what_a_heap_move_leaves_behind() {
    // Two heap pages, each half used by movable 256 KiB allocations holding 0xCD, and two free
    // pages: a 6 MiB request needs three pages, so the way to out of memory empties one heap
    // page into the other's holes and takes it. In a pool that scrubs, the request then
    // reads zero everywhere, the emptied page's old bytes included.
    let mut p = scrubbing_host_pool(8 * MIB);
    let small = 256 * KIB;
    let made: Vec<_> = (0..16).map(|_| p.alloc(movable(small)).unwrap()).collect();
    assert_eq!(p.stats().pages_heap, 2);
    for (i, &(id, ptr)) in made.iter().enumerate() {
        if i % 2 == 0 {
            p.free(id).unwrap();
        } else {
            // SAFETY: a live 256 KiB allocation of the host backend.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, 0xCD, small as usize) };
        }
    }
    let (id, ptr) = p.alloc(req(6 * MIB)).unwrap();
    assert_eq!(p.stats().pages_heap, 1);
    // SAFETY: the live 6 MiB allocation just made.
    let b = unsafe { std::slice::from_raw_parts(ptr as *const u8, (6 * MIB) as usize) };
    if let Some(at) = b.iter().position(|&x| x != 0) {
        panic!(
            "stale byte {:#x} at offset {at:#x} of the new allocation",
            b[at]
        );
    }
    for &(id, ptr) in made.iter().skip(1).step_by(2) {
        let now = p.info(id).unwrap().ptr;
        // SAFETY: a live 256 KiB allocation, at its current address.
        let a = unsafe { std::slice::from_raw_parts(now as *const u8, small as usize) };
        assert!(
            a.iter().all(|&x| x == 0xCD),
            "moved from {ptr:#x} to {now:#x}"
        );
    }
    p.free(id).unwrap();
}

// ------------------------------------------------------------------------------------------
// Model-based: random streams of operations against a shadow map of live ranges.

#[derive(Clone, Debug)]
pub(super) enum Op {
    Alloc(u64, u64, bool),
    Arena(Vec<u64>, u64),
    Batch(Vec<u64>),
    FreeBatch(usize, usize),
    /// `free_batch` of the pointers of the latest batch still wholly live, in their order.
    FreeLastBatch,
    Free(usize),
    FreePtr(usize),
    FreeAsync(usize, u64),
    Complete(usize),
    Sync,
    Defrag,
    Trim,
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    // (and a few sizes that come back, for the exact-size cache)
    let size = prop_oneof![
        1 => 1u64..4096,
        1 => 4096u64..(1 << 20),
        1 => (1u64 << 20)..(9 << 20),
        1 => (9u64 << 20)..(40 << 20),
        3 => prop::sample::select(vec![1000u64, 64 << 10, (3 << 20) + 5]),
    ];
    prop_oneof![
        6 => (size.clone(), 0u64..3, any::<bool>()).prop_map(|(s, st, m)| Op::Alloc(s, st, m)),
        1 => (proptest::collection::vec(size.clone(), 1..6), 0u64..3).prop_map(|(v, st)| Op::Arena(v, st)),
        1 => proptest::collection::vec(size, 1..6).prop_map(Op::Batch),
        1 => (any::<usize>(), 1usize..6).prop_map(|(i, n)| Op::FreeBatch(i, n)),
        1 => Just(Op::FreeLastBatch),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreePtr),
        2 => (any::<usize>(), 0u64..3).prop_map(|(i, s)| Op::FreeAsync(i, s)),
        1 => any::<usize>().prop_map(Op::Complete),
        1 => Just(Op::Sync),
        1 => Just(Op::Defrag),
        1 => Just(Op::Trim),
    ]
}

/// The statistics a refused request leaves as they were: all but the failure and latency
/// counts.
fn unchanging(p: &Pool) -> PoolStats {
    let mut s = p.stats();
    s.failures = 0;
    s.success_rate = 0.0;
    s.latency_samples = 0;
    s.latency_mean_ns = 0.0;
    s.latency_p50_ns = 0.0;
    s.latency_p99_ns = 0.0;
    s
}

/// What a refused request (no movable allocation to compact) leaves: the pool as it was
/// (`before`), or, if the exact-size cache held `cached` allocations, the same allocations and
/// counters with the cache given back (out of memory releases what is cached first).
fn refused_changes_nothing(
    p: &Pool,
    before: &(PoolStats, Vec<PageSnapshot>),
    cached: u64,
    live: &[(u64, u64)],
) -> std::result::Result<(), TestCaseError> {
    if cached == 0 {
        prop_assert_eq!(before, &(unchanging(p), p.page_snapshot()));
    } else {
        let (s, t) = (&before.0, unchanging(p));
        prop_assert_eq!(t.cached_allocs, 0);
        let key = |s: &PoolStats| {
            (
                s.live_bytes,
                s.used_bytes,
                s.reserved_bytes,
                s.peak_reserved,
                s.allocs,
                s.frees,
            )
        };
        prop_assert_eq!(key(s), key(&t));
        prop_assert_eq!(live, &ranges(p)[..]);
    }
    Ok(())
}

/// (pointer, rounded size) of every live or freeing allocation.
fn ranges(p: &Pool) -> Vec<(u64, u64)> {
    p.allocations().iter().map(|x| (x.ptr, x.rounded)).collect()
}

/// The pool of `random_streams_keep_every_invariant`: 128 MiB, checked after every mutation;
/// with a release threshold (`threshold`), whole free pages leave large segments at once.
pub(super) fn stream_pool(threshold: bool) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.release_threshold = threshold.then_some(8 * MIB);
    Pool::new(device(128 * MIB), cfg).unwrap()
}

/// The pointers of up to `n` of the `live` allocations from position `i` (modulo their
/// number) on, which leave `live`.
pub(super) fn drain_ptrs(p: &Pool, live: &mut Vec<AllocId>, i: usize, n: usize) -> Vec<u64> {
    let i = i % live.len();
    let n = n.min(live.len() - i);
    live.drain(i..i + n)
        .map(|id| p.info(id).unwrap().ptr)
        .collect()
}

/// The handles of the allocations at pointers `out`.
pub(super) fn ids_of(p: &Pool, out: &[u64]) -> Vec<AllocId> {
    let by_ptr: HashMap<u64, AllocId> = p.allocations().iter().map(|x| (x.ptr, x.id)).collect();
    out.iter().map(|ptr| by_ptr[ptr]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_streams_keep_every_invariant(
        ops in proptest::collection::vec(op(), 1..120),
        threshold in any::<bool>(),
    ) {
        let mut p = stream_pool(threshold);
        let mut live: Vec<AllocId> = vec![];
        let mut fences: Vec<u64> = vec![];
        // the members of each batch made (found without a lookup by pointer, which would
        // index them: `free_batch` of a whole batch is then served from its record)
        let mut batches: Vec<Vec<AllocId>> = vec![];
        for op in ops {
            // a refused request leaves the pool as it was (but for counting the failure),
            // unless it had movable allocations to compact on the way
            let before = (unchanging(&p), p.page_snapshot());
            let (cached, held) = (before.0.cached_allocs, ranges(&p));
            let fixed = p.allocations().iter().all(|x| !x.movable);
            match op {
                Op::Alloc(size, stream, movable) => {
                    match p.alloc(Request { size, stream, movable, scope: 0 }) {
                        Ok((id, _)) => live.push(id),
                        Err(Error::OutOfMemory(_)) => if fixed {
                            refused_changes_nothing(&p, &before, cached, &held)?;
                        },
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Op::Batch(sizes) => {
                    let mut out = vec![];
                    match p.alloc_batch(&sizes, 0, &mut out) {
                        Ok(()) => {
                            let ids = ids_of(&p, &out);
                            live.extend(&ids);
                            batches.push(ids);
                        }
                        Err(Error::OutOfMemory(_)) => if fixed {
                            prop_assert!(out.is_empty());
                            refused_changes_nothing(&p, &before, cached, &held)?;
                        },
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Op::Arena(sizes, stream) => {
                    let mut out = vec![];
                    match p.alloc_arena(&sizes, stream, &mut out) {
                        Ok(()) => {
                            let ids = ids_of(&p, &out);
                            live.extend(&ids);
                            batches.push(ids);
                        }
                        Err(Error::OutOfMemory(_) | Error::InvalidSize(_)) => {
                            prop_assert!(out.is_empty())
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Op::FreeBatch(i, n) if !live.is_empty() => {
                    // up to n allocations from position i on, freed together by pointer
                    let ptrs = drain_ptrs(&p, &mut live, i, n);
                    p.free_batch(&ptrs).unwrap();
                }
                Op::FreeLastBatch => {
                    while let Some(ids) = batches.pop() {
                        if ids.iter().all(|id| live.contains(id)) {
                            let ptrs: Vec<u64> = ids.iter().map(|&id| p.info(id).unwrap().ptr).collect();
                            p.free_batch(&ptrs).unwrap();
                            live.retain(|id| !ids.contains(id));
                            break;
                        }
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    p.free(id).unwrap();
                }
                Op::FreePtr(i) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    let ptr = p.info(id).unwrap().ptr;
                    p.free_ptr(ptr).unwrap();
                }
                Op::FreeAsync(i, s) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    fences.push(p.free_async(id, s).unwrap());
                }
                Op::Complete(i) if !fences.is_empty() => {
                    p.complete(fences[i % fences.len()]).unwrap();
                }
                Op::Sync => { p.synchronize(None).unwrap(); }
                Op::Defrag => { p.defrag().unwrap(); }
                Op::Trim => { p.trim(4 * MIB).unwrap(); }
                _ => {}
            }
            // the shadow: live and freeing ranges never overlap, in virtual or physical space
            let mut ranges = BTreeMap::new();
            for x in p.allocations() {
                ranges.insert(x.ptr, x.rounded);
            }
            let mut end = 0;
            for (&start, &len) in &ranges {
                prop_assert!(start >= end, "overlap at {start:#x}");
                end = start + len;
            }
            for id in &live {
                prop_assert!(p.info(*id).is_ok());
            }
        }
        p.synchronize(None).unwrap();
        for id in live {
            p.free(id).unwrap();
        }
        let s = p.stats();
        prop_assert_eq!(s.used_bytes, 0);
        prop_assert_eq!(s.pages_heap + s.pages_large + s.pages_full, 0);
        p.validate().unwrap();
    }
}

/// A churn loop for profilers (`valgrind --tool=callgrind <test binary> churn_for_profiler
/// --ignored`): log-uniform sizes, 2048 live, half churning. `CHURN=small|large`, `PAIRS=n`,
/// `RESERVE=1`; prints the time a pair, live and reserved memory, and how many allocations
/// needed the stitching window (`cargo test --release --no-default-features --lib
/// churn_for_profiler -- --ignored --nocapture`).
#[test]
#[ignore = "a profiling loop for callgrind and perf, not a check"]
fn churn_for_profiler() {
    use rand::{Rng, SeedableRng};
    let (lo, hi) = match std::env::var("CHURN").as_deref() {
        Ok("small") => (8.0, 20.0),
        Ok("large") => (20.0, 26.0),
        _ => (8.0, 26.0),
    };
    // RESERVE=1: the pool takes the whole device up front (as the peers in benches/peers.rs)
    let mut cfg = PoolConfig::new(2 * MIB);
    if std::env::var("RESERVE").is_ok_and(|v| v == "1") {
        cfg.initial_size = 80 << 30;
    }
    let mut p = Pool::new(device(80 << 30), cfg).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let size = move |rng: &mut rand::rngs::StdRng| 2f64.powf(rng.gen_range(lo..hi)) as u64;
    let mut live: Vec<AllocId> = (0..2048)
        .map(|_| p.alloc(req(size(&mut rng))).unwrap().0)
        .collect();
    let n: u64 = std::env::var("PAIRS").map_or(200_000, |v| v.parse().unwrap());
    let stitched = p.stats().stitched;
    let t = Instant::now();
    for _ in 0..n {
        let k = rng.gen_range(0..1024);
        p.free(live[k]).unwrap();
        live[k] = p.alloc(req(size(&mut rng))).unwrap().0;
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let s = p.stats();
    eprintln!(
        "{ns:.1} ns per pair; live {} MiB, reserved {} MiB, windowed allocations {} in {n} pairs",
        s.live_bytes >> 20,
        s.reserved_bytes >> 20,
        s.stitched - stitched,
    );
}

/// Fault injection: for every N, the N-th reserve/map/copy of the backend fails. Every
/// operation either completes or returns an error with the pool exactly as it was: same
/// statistics (but the failure count), same pages, `validate` passes.
#[test]
fn injected_backend_failures_change_nothing() {
    use crate::backend::Faulty;
    let mut injected = 0;
    // with and without a release threshold (whole free pages leave segments at every free)
    for (fail_at, threshold) in (1..=40u64).flat_map(|n| [(n, None), (n, Some(4 * MIB))]) {
        let d = device(64 * MIB);
        let dev = Arc::new(Device {
            pmm: d.pmm.clone(),
            backend: Arc::new(Faulty::new(
                Box::new(Simulated::new(64 * MIB, 2 * MIB).unwrap()),
                fail_at,
            )),
        });
        let mut cfg = PoolConfig::new(2 * MIB);
        cfg.check = true;
        cfg.release_threshold = threshold;
        let Ok(mut p) = Pool::new(dev, cfg) else {
            injected += 1; // the window reservation failed: no pool, nothing held
            assert_eq!(d.pmm.lock().stats().allocated_bytes, 0);
            continue;
        };
        let mut live = vec![];
        let movable = |size| Request {
            size,
            movable: true,
            ..Request::default()
        };
        // A scenario that maps (stitched allocations) and copies (defrag): free pages
        // scattered one by one first, so that no free run holds a multi-page request.
        let mut checker = vec![];
        for _ in 0..12 {
            match p.alloc(req(2 * MIB)) {
                Ok((id, _)) => checker.push(id),
                Err(Error::OutOfMemory(_)) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        for id in checker.iter().step_by(2) {
            p.free(*id).unwrap();
        }
        for step in 0..30u64 {
            let size = match step % 3 {
                0 => 2 * MIB,
                1 => 5 * MIB + 4096,
                _ => 64 * KIB,
            };
            // (a request that fails after giving the size cache back changes the cache; the
            // property test checks that case: here the cache is given back first)
            p.flush_cache();
            let before = (p.stats(), p.page_snapshot());
            match p.alloc(movable(size)) {
                Ok((id, _)) => live.push(id),
                Err(Error::OutOfMemory(m)) => {
                    if m.contains("injected") {
                        injected += 1;
                    }
                    let after = (p.stats(), p.page_snapshot());
                    let mut b = before.0.clone();
                    b.failures = after.0.failures;
                    b.success_rate = after.0.success_rate;
                    b.latency_samples = after.0.latency_samples;
                    b.latency_mean_ns = after.0.latency_mean_ns;
                    b.latency_p50_ns = after.0.latency_p50_ns;
                    b.latency_p99_ns = after.0.latency_p99_ns;
                    assert_eq!(b, after.0, "fail_at {fail_at}, step {step}");
                    assert_eq!(before.1, after.1);
                }
                Err(e) => panic!("{e:?}"),
            }
            if step % 2 == 1 && live.len() > 2 {
                p.free(live.remove(1)).unwrap();
            }
            p.validate().unwrap();
        }
        let r = p.defrag().unwrap();
        let _ = r;
        p.validate().unwrap();
        for id in live {
            p.free(id).unwrap();
        }
        p.validate().unwrap();
    }
    eprintln!("fault injection: {injected} failures injected over 80 runs");
    assert!(injected >= 20, "only {injected} failures were injected");
}

/// An operation of `host_compaction_keeps_every_byte`: `(Some((size, movable)), _)` allocates
/// (4 KiB to 4 MiB, log-uniform), `(None, i)` frees the `i`-th live allocation (modulo), and
/// `(None, usize::MAX)` is a `defrag`.
#[cfg(target_os = "linux")]
fn host_op() -> impl Strategy<Value = (Option<(u64, bool)>, usize)> {
    prop_oneof![
        4 => (12.0f64..22.0, any::<bool>())
            .prop_map(|(e, m)| (Some((2f64.powf(e) as u64, m)), 0usize)),
        3 => any::<usize>().prop_map(|i| (None, i)),
        1 => Just((None, usize::MAX)),
    ]
}

#[cfg(target_os = "linux")]
proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Random streams of movable and fixed allocations (heap, large and stitched) on host
    /// memory, each written with its own bytes; after every `defrag` and every request that
    /// reached the way to out of memory, every live allocation still holds its bytes at its
    /// (possibly new) address.
    #[test]
    fn host_compaction_keeps_every_byte(ops in proptest::collection::vec(host_op(), 1..80)) {
        // bytes to copy from: allocation `k` holds `noise[k % 4096..][..size]`, which differs
        // from byte to byte, so a copy to the wrong offset shows
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..(8 * MIB + 4096))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut p = pool_on(host_device(16 * MIB));
        let mut live: Vec<(AllocId, usize, usize)> = vec![];
        let check = |p: &Pool, live: &[(AllocId, usize, usize)]| {
            for &(id, k, n) in live {
                let ptr = p.info(id).unwrap().ptr;
                // SAFETY: a live allocation of `n` bytes of the host backend.
                let b = unsafe { std::slice::from_raw_parts(ptr as *const u8, n) };
                assert!(b == &noise[k % 4096..][..n], "allocation {k} lost its bytes");
            }
        };
        for (k, op) in ops.into_iter().enumerate() {
            match op {
                (Some((size, movable)), _) => {
                    let r = p.alloc(Request { size, movable, ..Request::default() });
                    match r {
                        Ok((id, ptr)) => {
                            let n = size as usize;
                            // SAFETY: as above, just allocated.
                            let b = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, n) };
                            b.copy_from_slice(&noise[k % 4096..][..n]);
                            live.push((id, k, n));
                        }
                        Err(Error::OutOfMemory(_)) => check(&p, &live),
                        Err(e) => panic!("{e:?}"),
                    }
                }
                (None, usize::MAX) => {
                    p.defrag().unwrap();
                    check(&p, &live);
                }
                (None, i) if !live.is_empty() => {
                    let (id, _, _) = live.swap_remove(i % live.len());
                    p.free(id).unwrap();
                }
                _ => {}
            }
        }
        p.defrag().unwrap();
        check(&p, &live);
    }
}
