//! Exhaustion: every chunk of a size taken until the device is full, then freed in every order
//! (256 B kernel chunks of one root, 64 KiB chunks of an 80 GiB device).

use super::*;

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
