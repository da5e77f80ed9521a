//! Root lists and eviction: the order roots are evicted in, roots that are skipped (pinned, in
//! eviction), and allocations that may evict.

use super::*;

fn fill_unpinned_roots(p: &mut Pmm, n: usize) -> Vec<ChunkId> {
    (0..n)
        .map(|_| {
            let id = p.alloc_chunk(2 * M, ChunkType::User, false).unwrap();
            let kids = p.split(id, None).unwrap();
            for &k in &kids {
                p.unpin(k).unwrap();
            }
            kids[0]
        })
        .collect()
}

#[test]
fn lru_lists_and_eviction_order() {
    let mut p = pmm(8 * M);
    let first = fill_unpinned_roots(&mut p, 3);
    assert_eq!(
        p.stats().root_list_len,
        [0, 0, 3],
        "unpinned roots go to USED"
    );
    // Order: UNUSED head before DISCARDED before USED.
    p.mark_root(first[2], RootList::Discarded).unwrap();
    p.mark_root(first[1], RootList::Unused).unwrap();
    assert_eq!(p.stats().root_list_len, [1, 1, 1]);
    // A free USER root is chosen first.
    let free_root = p.alloc_chunk(2 * M, ChunkType::User, false).unwrap();
    p.free(free_root).unwrap();
    let ev = p.evict_root().unwrap();
    assert_eq!(ev.root_addr, 6 * M);
    assert!(ev.chunks.is_empty());
    // A free root stays free, so it would be chosen again: each one is taken away as kernel
    // memory before the next eviction.
    let mut held = vec![p.alloc_chunk(2 * M, ChunkType::Kernel, false).unwrap()];
    for (addr, why) in [
        (2 * M, "unused list first"),
        (4 * M, "then discarded"),
        (0, "then used"),
    ] {
        let ev = p.evict_root().unwrap();
        assert_eq!(ev.root_addr, addr, "{why}");
        assert_eq!(ev.chunks.len(), 32);
        assert!(ev.chunks.iter().all(|c| c.state == ChunkState::Allocated));
        assert!(
            ev.chunks.iter().all(|c| p.info(c.id).is_err()),
            "evicted chunks are freed"
        );
        held.push(p.alloc_chunk(2 * M, ChunkType::Kernel, false).unwrap());
    }
    assert_eq!(p.counters().evictions, 4);
    assert!(
        matches!(p.evict_root(), Err(Error::OutOfMemory(_))),
        "kernel roots are never evicted"
    );
    for id in held {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

#[test]
fn pinned_and_in_eviction_roots_are_skipped() {
    let mut p = pmm(6 * M);
    let roots = fill_unpinned_roots(&mut p, 2);
    let pinned = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap(); // root 2, pinned
                                                                         // Root 0 is the USED head; pin it by allocating... mark it instead and begin eviction.
    let ev = p.begin_eviction().unwrap();
    assert_eq!(ev.root_addr, 0);
    assert_eq!(p.stats().roots_in_eviction, 1);
    // Its chunks may be freed by the caller while the eviction runs.
    p.free(roots[0]).unwrap();
    let ev2 = p.begin_eviction().unwrap();
    assert_eq!(ev2.root_addr, 2 * M, "root 0 is in eviction, root 2 pinned");
    assert!(matches!(p.begin_eviction(), Err(Error::OutOfMemory(_))));
    // Memory held by evictions is not allocatable.
    assert!(p.alloc_chunk(2 * M, ChunkType::User, false).is_err());
    p.end_eviction(ev.root_index).unwrap();
    p.end_eviction(ev2.root_index).unwrap();
    assert_eq!(p.stats().roots_free, 2);
    p.free(pinned).unwrap();
    assert_all_free(&p);
}

#[test]
fn allocation_may_evict_when_allowed() {
    let mut p = pmm(4 * M);
    fill_unpinned_roots(&mut p, 2);
    assert!(p.alloc_chunk(64 * K, ChunkType::User, false).is_err());
    assert!(
        p.alloc_chunk(64 * K, ChunkType::Kernel, true).is_err(),
        "kernel never evicts"
    );
    let a = p.alloc_chunk(64 * K, ChunkType::User, true).unwrap();
    let ev = p.take_evicted();
    assert_eq!(ev.len(), 32);
    assert_eq!(p.info(a).unwrap().addr, 0);
    // A batch evicts before it allocates, so its own chunks never block it.
    let b = p
        .alloc_chunks(31 + 32, 64 * K, ChunkType::User, true)
        .unwrap();
    assert_eq!(b.len(), 63);
    assert_eq!(p.take_evicted().len(), 32);
    assert!(p.alloc_chunks(1, 64 * K, ChunkType::User, true).is_err());
}
