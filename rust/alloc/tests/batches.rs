//! Batches and arenas (`alloc_batch`, `alloc_arena`, `free_batch`): a batch in one block cut
//! into independent members, its record, frees of a whole batch, refusals, all or nothing.

use super::*;

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
