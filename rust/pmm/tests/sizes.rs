//! Size masks and device sizes, new chunks of every type and size, and sweeps of the sizes up
//! and down.

use super::*;

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
