//! Every illegal operation is refused with its error and changes nothing; batch allocations
//! and batch frees are all or nothing.

use super::*;

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
