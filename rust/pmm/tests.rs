//! PMM tests: the driver's own test patterns (uvm_pmm_test.c: size sweeps, exhaustion, free
//! orders, split/merge), every illegal operation, eviction order, and a model-based proptest
//! against a shadow map of allocated ranges.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

fn turing(vidmem: u64) -> PmmConfig {
    let mut c = PmmConfig::new(
        vidmem,
        SizeMask::from_sizes(&[4 * K, 64 * K, 2 * M]).unwrap(),
        SizeMask::from_sizes(&[256, 4 * K, 64 * K, 2 * M]).unwrap(),
    );
    c.check = true;
    c
}

fn maxwell(vidmem: u64) -> PmmConfig {
    let mut c = turing(vidmem);
    c.user_sizes = SizeMask::from_sizes(&[4 * K, 64 * K, 128 * K, 2 * M]).unwrap();
    c
}

fn pmm(vidmem: u64) -> Pmm {
    Pmm::new(turing(vidmem)).unwrap()
}

/// After everything is freed: every root is device-owned or free, and no chunk leaks.
fn assert_all_free(p: &Pmm) {
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.allocated_bytes, 0);
    assert_eq!(s.roots_pma_owned + s.roots_free, s.num_roots);
    assert_eq!(s.free_bytes, s.roots_free * ROOT_CHUNK_SIZE);
    assert!(p.allocated_chunks().is_empty());
}

fn all_types_and_sizes(p: &Pmm) -> Vec<(ChunkType, u64)> {
    ChunkType::ALL
        .iter()
        .flat_map(|&t| p.size_mask(t).sizes().into_iter().map(move |s| (t, s)))
        .collect()
}

#[test]
fn size_mask_arithmetic() {
    let m = SizeMask::from_sizes(&[4 * K, 64 * K, 2 * M]).unwrap();
    assert_eq!(m.child_shift(21), Some(16)); // 2 MiB -> 32 x 64 KiB
    assert_eq!(m.child_shift(16), Some(12)); // 64 KiB -> 16 x 4 KiB
    assert_eq!(m.child_shift(12), None);
    assert_eq!(m.sizes(), vec![4 * K, 64 * K, 2 * M]);
    assert!(SizeMask::from_sizes(&[4 * K]).is_err(), "2 MiB is required");
    assert!(SizeMask::from_sizes(&[3 * K, 2 * M]).is_err());
    assert!(SizeMask::from_sizes(&[128, 2 * M]).is_err());
    assert!(SizeMask::from_sizes(&[4 * M]).is_err());
}

#[test]
fn rejects_bad_vidmem() {
    for v in [0, M, 3 * M, MAX_VIDMEM + 2 * M] {
        assert!(
            matches!(Pmm::new(turing(v)), Err(Error::InvalidSize(_))),
            "{v}"
        );
    }
    let mut big = turing(MAX_VIDMEM);
    big.check = false;
    let p = Pmm::new(big).unwrap();
    assert_eq!(p.num_roots(), 512 * 1024);
}

#[test]
fn new_chunks_are_aligned_zeroed_and_pinned_by_type() {
    for (t, size) in all_types_and_sizes(&pmm(2 * M)) {
        let mut p = pmm(16 * M);
        let id = p.alloc_chunk(size, t, false).unwrap();
        let info = p.info(id).unwrap();
        assert_eq!(info.addr % size, 0);
        assert_eq!(info.size, size);
        assert!(info.is_zero, "memory fresh from the device is zeroed");
        let expect = if t == ChunkType::User {
            ChunkState::TempPinned
        } else {
            ChunkState::Allocated
        };
        assert_eq!(info.state, expect);
        p.free(id).unwrap();
        assert_all_free(&p);
    }
}

#[test]
fn sweep_sizes_up_and_down() {
    let mut p = pmm(32 * M);
    for (t, _) in all_types_and_sizes(&p) {
        let mut sizes = p.size_mask(t).sizes();
        for pass in 0..2 {
            let mut held = Vec::new();
            for &s in &sizes {
                for _ in 0..3 {
                    held.push(p.alloc_chunk(s, t, false).unwrap());
                }
            }
            for id in held {
                p.free(id).unwrap();
            }
            assert_all_free(&p);
            if pass == 0 {
                sizes.reverse();
            }
        }
    }
}

#[test]
fn exhaustion_then_free_in_every_order() {
    for (t, size) in all_types_and_sizes(&pmm(2 * M)) {
        if size < 4 * K {
            continue; // 256 B on 8 MiB is 32768 chunks: covered by the kernel-sized test below
        }
        for order in ["forward", "reverse", "every_third"] {
            let mut p = pmm(8 * M);
            p.config.check = false; // O(n^2) otherwise; validated at the end
            let n = 8 * M / size;
            let ids: Vec<_> = (0..n)
                .map(|_| p.alloc_chunk(size, t, false).unwrap())
                .collect();
            p.validate().unwrap();
            assert!(matches!(
                p.alloc_chunk(size, t, false),
                Err(Error::OutOfMemory(_))
            ));
            assert_eq!(p.stats().allocated_bytes, 8 * M);
            let mut seen: Vec<u64> = ids.iter().map(|&i| p.info(i).unwrap().addr).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len() as u64, n, "no two chunks share an address");
            let mut idx: Vec<usize> = (0..ids.len()).collect();
            match order {
                "reverse" => idx.reverse(),
                "every_third" => {
                    let (a, b): (Vec<_>, Vec<_>) = idx.iter().partition(|&&i| i % 3 == 0);
                    idx = a.into_iter().chain(b).collect();
                }
                _ => {}
            }
            for i in idx {
                p.free(ids[i]).unwrap();
            }
            assert_all_free(&p);
            assert_eq!(p.stats().roots_free, 4);
        }
    }
}

#[test]
fn kernel_256b_exhaustion_of_one_root() {
    let mut p = pmm(2 * M);
    p.config.check = false;
    let ids = p
        .alloc_chunks((2 * M / 256) as usize, 256, ChunkType::Kernel, false)
        .unwrap();
    assert!(p.alloc_chunk(256, ChunkType::Kernel, false).is_err());
    for id in ids {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

#[test]
fn split_is_lazy_one_level_and_merge_is_eager() {
    let mut p = pmm(2 * M);
    let a = p.alloc_chunk(4 * K, ChunkType::User, false).unwrap();
    let s = p.stats();
    let order = |size: u64| order_of(size.trailing_zeros());
    let user = ChunkType::User as usize;
    // 2M -> 32 x 64K (31 free), 64K -> 16 x 4K (15 free), one 4K pinned.
    assert_eq!(
        s.chunks[user][order(2 * M)][ChunkState::IsSplit as usize],
        1
    );
    assert_eq!(
        s.chunks[user][order(64 * K)][ChunkState::IsSplit as usize],
        1
    );
    assert_eq!(s.chunks[user][order(64 * K)][ChunkState::Free as usize], 31);
    assert_eq!(s.chunks[user][order(4 * K)][ChunkState::Free as usize], 15);
    assert_eq!(p.info(a).unwrap().addr, 0, "child 0 is kept at each level");
    p.free(a).unwrap();
    let s = p.stats();
    assert_eq!(s.roots_free, 1);
    assert_eq!(s.chunks[user][order(64 * K)][ChunkState::Free as usize], 0);
    assert!(p.info(a).is_err());
}

#[test]
fn maxwell_splits_through_128k() {
    let mut p = Pmm::new(maxwell(2 * M)).unwrap();
    let a = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    let s = p.stats();
    let o128 = order_of(17);
    assert_eq!(s.chunks[0][o128][ChunkState::IsSplit as usize], 1);
    assert_eq!(s.chunks[0][o128][ChunkState::Free as usize], 15);
    p.free(a).unwrap();
    assert_all_free(&p);
}

#[test]
fn split_then_merge_restores_the_parent() {
    let mut p = pmm(4 * M);
    let root = p.alloc_chunk(2 * M, ChunkType::User, false).unwrap();
    p.unpin(root).unwrap();
    let before = p.info(root).unwrap();
    let kids = p.split(root, None).unwrap();
    assert_eq!(kids.len(), 32);
    for (k, &c) in kids.iter().enumerate() {
        let i = p.info(c).unwrap();
        assert_eq!(i.addr, before.addr + k as u64 * 64 * K);
        assert_eq!(i.state, ChunkState::Allocated);
    }
    assert_eq!(p.info(root).unwrap().state, ChunkState::IsSplit);
    p.merge(root).unwrap();
    assert_eq!(p.info(root).unwrap(), before);
    // Two levels at once: 2M -> 512 x 4K.
    let leaves = p.split(root, Some(4 * K)).unwrap();
    assert_eq!(leaves.len(), 512);
    assert!(
        matches!(p.merge(root), Err(Error::InvalidState(_))),
        "children are split"
    );
    for c in leaves.iter().skip(1) {
        p.free(*c).unwrap();
    }
    p.free(leaves[0]).unwrap();
    assert_all_free(&p);
}

#[test]
fn temp_pinned_split_passes_the_pin_to_children() {
    let mut p = pmm(2 * M);
    let a = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    let kids = p.split(a, None).unwrap();
    assert_eq!(p.stats().pinned_chunks, 16);
    p.merge(a).unwrap();
    assert_eq!(p.stats().pinned_chunks, 1);
    assert!(kids.iter().all(|&k| p.info(k).is_err()));
    p.free(a).unwrap();
    assert_all_free(&p);
}

/// Runs `op`, expects the named error, and checks that nothing changed.
fn refused<T: std::fmt::Debug>(p: &mut Pmm, op: impl FnOnce(&mut Pmm) -> Result<T>, kind: &str) {
    let before = p.stats();
    let allocated = p.allocated_chunks();
    let err = op(p).expect_err("operation should be refused");
    assert_eq!(err.kind(), kind, "{err}");
    let mut after = p.stats();
    // Counting the failure is the one change a refused allocation makes.
    after.counters.failed_allocs = before.counters.failed_allocs;
    assert_eq!(after, before, "a refused operation changed the stats");
    assert_eq!(p.allocated_chunks(), allocated);
    p.validate().unwrap();
}

#[test]
fn illegal_operations_are_refused_and_change_nothing() {
    let mut p = pmm(4 * M);
    let a = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    let b = p.alloc_chunk(4 * K, ChunkType::User, false).unwrap();
    let k = p.alloc_chunk(256, ChunkType::Kernel, false).unwrap();
    p.free(b).unwrap();
    refused(&mut p, |p| p.free(b), "InvalidFreeError"); // double free (merged away)
    refused(&mut p, |p| p.unpin(k), "InvalidStateError"); // kernel chunks are not pinned
    p.unpin(a).unwrap();
    refused(&mut p, |p| p.unpin(a), "InvalidStateError"); // unpin of an allocated chunk
    refused(
        &mut p,
        |p| p.alloc_chunk(256, ChunkType::User, false),
        "InvalidSizeError",
    );
    refused(
        &mut p,
        |p| p.alloc_chunk(0, ChunkType::User, false),
        "InvalidSizeError",
    );
    refused(
        &mut p,
        |p| p.alloc_chunk(3 * K, ChunkType::Kernel, false),
        "InvalidSizeError",
    );
    refused(
        &mut p,
        |p| p.alloc_chunk(4 * M, ChunkType::Kernel, false),
        "InvalidSizeError",
    );
    refused(
        &mut p,
        |p| p.alloc_chunks(5, 2 * M, ChunkType::User, false),
        "OutOfMemoryError",
    );
    refused(
        &mut p,
        |p| p.free(ChunkId::from_bits(999_999)),
        "InvalidFreeError",
    );
    refused(
        &mut p,
        |p| p.info(ChunkId::from_bits(1 << 40)),
        "InvalidHandleError",
    );
    let kids = p.split(a, None).unwrap();
    refused(&mut p, |p| p.free(a), "InvalidFreeError"); // free of a split parent
    refused(&mut p, |p| p.split(kids[0], None), "InvalidSizeError"); // 4K is the smallest
    refused(
        &mut p,
        |p| p.split(kids[0], Some(64 * K)),
        "InvalidSizeError",
    );
    refused(&mut p, |p| p.merge(kids[0]), "InvalidStateError");
    p.free(kids[3]).unwrap();
    refused(&mut p, |p| p.free(kids[3]), "InvalidFreeError"); // double free (still a free leaf)
    refused(&mut p, |p| p.merge(a), "InvalidStateError"); // a child is free
    refused(&mut p, |p| p.split(kids[3], None), "InvalidStateError");
    refused(&mut p, |p| p.end_eviction(0), "InvalidStateError");
    refused(
        &mut p,
        |p| p.mark_root(k, RootList::Unused),
        "InvalidStateError",
    );
    // A stale handle: the slot has been reused by a later allocation.
    let c = p.alloc_chunk(64 * K, ChunkType::Kernel, false).unwrap();
    p.free(c).unwrap();
    let d = p.alloc_chunk(64 * K, ChunkType::Kernel, false).unwrap();
    assert_eq!(p.info(d).unwrap().addr, p.info(d).unwrap().addr);
    refused(&mut p, |p| p.free(c), "InvalidFreeError");
}

#[test]
fn allocation_prefers_zeroed_chunks_and_free_clears_zero() {
    let mut p = pmm(4 * M);
    let a = p.alloc_chunk(2 * M, ChunkType::Kernel, false).unwrap();
    p.free(a).unwrap(); // one free root, now dirty
    assert!(!p.info(a).is_ok_and(|i| i.is_zero));
    let b = p.alloc_chunk(2 * M, ChunkType::Kernel, false).unwrap();
    // The dirty free root was taken before asking the device for a new one.
    assert_eq!(p.info(b).unwrap().addr, 0);
    assert!(!p.info(b).unwrap().is_zero);
    let c = p.alloc_chunk(2 * M, ChunkType::Kernel, false).unwrap();
    assert!(p.info(c).unwrap().is_zero);
    p.free(b).unwrap();
    p.free(c).unwrap();
    // Both free now; a 64K split prefers... both dirty: whichever, but never marked zero.
    let d = p.alloc_chunk(64 * K, ChunkType::Kernel, false).unwrap();
    assert!(!p.info(d).unwrap().is_zero);
    p.free(d).unwrap();
    assert_all_free(&p);
}

#[test]
fn zeroed_free_chunk_wins_over_dirty() {
    let mut p = pmm(4 * M);
    // Root 0: dirty after a free; root 1 fresh from the device (zeroed) split into 64K.
    let a = p.alloc_chunk(2 * M, ChunkType::User, false).unwrap();
    let keep = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap(); // root 1, zeroed siblings
    p.free(a).unwrap(); // root 0 dirty, free
    let b = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    let info = p.info(b).unwrap();
    assert!(info.is_zero);
    assert_eq!(info.addr >> 21, 1);
    p.free(b).unwrap();
    p.free(keep).unwrap();
    assert_all_free(&p);
}

#[test]
fn release_free_roots_when_configured() {
    let mut cfg = turing(8 * M);
    cfg.release_free_roots = true;
    let mut p = Pmm::new(cfg).unwrap();
    let a = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    assert_eq!(p.stats().roots_pma_owned, 3);
    p.free(a).unwrap();
    assert_eq!(p.stats().roots_pma_owned, 4);
    assert_eq!(p.counters().roots_released, 1);

    let mut q = pmm(8 * M);
    let ids = q.alloc_chunks(3, 2 * M, ChunkType::Kernel, false).unwrap();
    for id in ids {
        q.free(id).unwrap();
    }
    assert_eq!(q.stats().roots_free, 3);
    assert_eq!(q.release_free_roots(), 3);
    assert_eq!(q.stats().roots_pma_owned, 4);
    assert_all_free(&q);
}

#[test]
fn free_roots_of_the_other_type_are_retyped() {
    let mut p = pmm(4 * M);
    let ids = p.alloc_chunks(2, 2 * M, ChunkType::Kernel, false).unwrap();
    for id in ids {
        p.free(id).unwrap();
    }
    let u = p.alloc_chunks(64, 64 * K, ChunkType::User, false).unwrap();
    assert_eq!(u.len(), 64);
    for id in u {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

#[test]
fn batch_is_all_or_nothing() {
    let mut p = pmm(4 * M);
    let ids = p.alloc_chunks(33, 64 * K, ChunkType::User, false).unwrap();
    assert_eq!(ids.len(), 33);
    let before = p.stats();
    assert!(matches!(
        p.alloc_chunks(32, 64 * K, ChunkType::User, false),
        Err(Error::OutOfMemory(_))
    ));
    let mut after = p.stats();
    after.counters.failed_allocs -= 1;
    assert_eq!(after, before);
    assert_eq!(
        p.alloc_chunks(31, 64 * K, ChunkType::User, false)
            .unwrap()
            .len(),
        31
    );
    assert!(p.alloc_chunk(4 * K, ChunkType::User, false).is_err());
}

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

#[test]
fn exhaustion_of_an_80gib_device() {
    let mut cfg = turing(80 * 1024 * M);
    cfg.check = false;
    let mut p = Pmm::new(cfg).unwrap();
    let n = (80 * 1024 * M / (64 * K)) as usize;
    let ids = p.alloc_chunks(n, 64 * K, ChunkType::User, false).unwrap();
    assert!(p.alloc_chunk(64 * K, ChunkType::User, false).is_err());
    p.validate().unwrap();
    for id in ids.into_iter().rev() {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

// ------------------------------------------------------------------------------------------
// Model-based test: random operation streams against a shadow map of allocated ranges.

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        kernel: bool,
        size_idx: usize,
        count: usize,
    },
    Free {
        pick: usize,
    },
    Unpin {
        pick: usize,
    },
    Split {
        pick: usize,
    },
    Merge {
        pick: usize,
    },
    Mark {
        pick: usize,
        list: usize,
    },
    Evict,
    AllocEvict {
        size_idx: usize,
    },
    ReleaseRoots,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 0..4usize, 1..4usize).prop_map(|(kernel, size_idx, count)| Op::Alloc { kernel, size_idx, count }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Unpin { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Split { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Merge { pick }),
        1 => (any::<usize>(), 0..3usize).prop_map(|(pick, list)| Op::Mark { pick, list }),
        1 => Just(Op::Evict),
        1 => (0..3usize).prop_map(|size_idx| Op::AllocEvict { size_idx }),
        1 => Just(Op::ReleaseRoots),
    ]
}

/// The shadow: allocated leaf ranges by address. Any overlap is a failure.
struct Shadow {
    ranges: BTreeMap<u64, (u64, ChunkId)>,
    /// Split parents we may merge: parent -> its leaves.
    parents: Vec<(ChunkId, Vec<ChunkId>)>,
}

impl Shadow {
    fn insert(&mut self, p: &Pmm, id: ChunkId) {
        let i = p.info(id).unwrap();
        let end = i.addr + i.size;
        if let Some((&a, &(e, _))) = self.ranges.range(..end).next_back() {
            assert!(
                e <= i.addr || a >= end,
                "overlap: [{a:#x},{e:#x}) and [{:#x},{end:#x})",
                i.addr
            );
        }
        self.ranges.insert(i.addr, (end, id));
    }

    fn remove(&mut self, p: &Pmm, id: ChunkId) {
        let addr = p.info(id).unwrap().addr;
        assert_eq!(self.ranges.remove(&addr).map(|r| r.1), Some(id));
    }

    fn nth(&self, pick: usize) -> Option<ChunkId> {
        if self.ranges.is_empty() {
            return None;
        }
        self.ranges
            .values()
            .nth(pick % self.ranges.len())
            .map(|r| r.1)
    }
}

fn run_ops(maxwell_arch: bool, ops: Vec<Op>) {
    let cfg = if maxwell_arch {
        maxwell(8 * M)
    } else {
        turing(8 * M)
    };
    let mut p = Pmm::new(cfg).unwrap();
    let mut sh = Shadow {
        ranges: BTreeMap::new(),
        parents: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Alloc {
                kernel,
                size_idx,
                count,
            } => {
                let t = if kernel {
                    ChunkType::Kernel
                } else {
                    ChunkType::User
                };
                let sizes = p.size_mask(t).sizes();
                let size = sizes[size_idx % sizes.len()];
                if let Ok(ids) = p.alloc_chunks(count, size, t, false) {
                    for id in ids {
                        sh.insert(&p, id);
                    }
                }
            }
            Op::AllocEvict { size_idx } => {
                let sizes = p.size_mask(ChunkType::User).sizes();
                let size = sizes[size_idx % sizes.len()];
                let before: Vec<_> = sh.ranges.values().map(|r| r.1).collect();
                if let Ok(id) = p.alloc_chunk(size, ChunkType::User, true) {
                    let evicted = p.take_evicted();
                    for e in &evicted {
                        assert_eq!(sh.ranges.remove(&e.addr).map(|r| r.1), Some(e.id));
                    }
                    sh.parents.retain(|(parent, _)| p.info(*parent).is_ok());
                    sh.insert(&p, id);
                    for b in before {
                        if !evicted.iter().any(|e| e.id == b) {
                            assert!(p.info(b).is_ok(), "a chunk that was not evicted vanished");
                        }
                    }
                }
            }
            Op::Free { pick } => {
                if let Some(id) = sh.nth(pick) {
                    sh.remove(&p, id);
                    p.free(id).unwrap();
                    sh.parents.retain(|(_, kids)| !kids.contains(&id));
                    assert!(p.free(id).is_err(), "double free must be refused");
                }
            }
            Op::Unpin { pick } => {
                if let Some(id) = sh.nth(pick) {
                    let pinned = p.info(id).unwrap().state == ChunkState::TempPinned;
                    assert_eq!(p.unpin(id).is_ok(), pinned);
                }
            }
            Op::Split { pick } => {
                if let Some(id) = sh.nth(pick) {
                    if let Ok(kids) = p.split(id, None) {
                        sh.ranges.remove(&p.info(id).unwrap().addr);
                        for &k in &kids {
                            sh.insert(&p, k);
                        }
                        sh.parents.push((id, kids));
                    }
                }
            }
            Op::Merge { pick } => {
                if !sh.parents.is_empty() {
                    let (parent, kids) = sh.parents[pick % sh.parents.len()].clone();
                    if p.merge(parent).is_ok() {
                        for k in &kids {
                            sh.ranges.retain(|_, r| r.1 != *k);
                        }
                        sh.insert(&p, parent);
                        sh.parents.retain(|(q, _)| *q != parent);
                    }
                }
            }
            Op::Mark { pick, list } => {
                if let Some(id) = sh.nth(pick) {
                    let _ = p.mark_root(id, RootList::ALL[list]);
                }
            }
            Op::Evict => {
                if let Ok(ev) = p.evict_root() {
                    for c in ev.chunks {
                        assert_eq!(sh.ranges.remove(&c.addr).map(|r| r.1), Some(c.id));
                    }
                    sh.parents.retain(|(parent, _)| p.info(*parent).is_ok());
                }
            }
            Op::ReleaseRoots => {
                p.release_free_roots();
            }
        }
        // check=true validated inside the PMM; the shadow agrees on the allocated bytes.
        let bytes: u64 = sh.ranges.iter().map(|(a, (e, _))| e - a).sum();
        assert_eq!(p.stats().allocated_bytes, bytes);
    }
    // Free everything left: no chunk leaks, all roots back.
    let left: Vec<_> = sh.ranges.values().map(|r| r.1).collect();
    for id in left {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_match_the_shadow_model(ops in prop::collection::vec(op(), 1..160)) {
        run_ops(false, ops);
    }

    #[test]
    fn random_streams_on_maxwell(ops in prop::collection::vec(op(), 1..120)) {
        run_ops(true, ops);
    }
}

#[test]
fn fixed_seed_stress() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut cfg = turing(64 * M);
    cfg.check = false;
    let mut p = Pmm::new(cfg).unwrap();
    let mut rng = StdRng::seed_from_u64(0x6770_756d);
    let mut live: Vec<ChunkId> = Vec::new();
    for step in 0..200_000u32 {
        if rng.gen_bool(0.55) || live.is_empty() {
            let t = if rng.gen_bool(0.8) {
                ChunkType::User
            } else {
                ChunkType::Kernel
            };
            let sizes = p.size_mask(t).sizes();
            let size = sizes[rng.gen_range(0..sizes.len())];
            if let Ok(id) = p.alloc_chunk(size, t, false) {
                live.push(id);
            }
        } else {
            let id = live.swap_remove(rng.gen_range(0..live.len()));
            p.free(id).unwrap();
        }
        if step % 20_000 == 0 {
            p.validate().unwrap();
        }
    }
    for id in live {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

#[test]
fn batch_free_is_all_or_nothing() {
    let mut p = pmm(4 * M);
    let a = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    let b = p.alloc_chunk(64 * K, ChunkType::User, false).unwrap();
    refused(&mut p, |p| p.free_chunks(&[a, a]), "InvalidFreeError");
    let c = p.alloc_chunk(4 * K, ChunkType::User, false).unwrap();
    p.free(c).unwrap();
    refused(&mut p, |p| p.free_chunks(&[a, b, c]), "InvalidFreeError");
    p.free_chunks(&[a, b]).unwrap();
    assert_all_free(&p);
}
