//! `defrag` and `defrag_plan`: heap pages emptied, large segments compacted (also on the way to
//! out of memory), stitched allocations slid down their window, and the plan that says what
//! `defrag` then does.

use super::*;

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
