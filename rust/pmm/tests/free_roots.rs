//! Which free chunk an allocation takes (zeroed before dirty, a free root of the other type
//! retyped) and free roots given back to the device.

use super::*;

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
