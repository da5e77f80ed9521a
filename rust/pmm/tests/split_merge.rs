//! Splits and merges: lazy one-level splits with eager merges, Maxwell's 128 KiB level,
//! explicit split and merge, and temporary pins passed to children.

use super::*;

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
