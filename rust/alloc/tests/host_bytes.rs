//! On host memory (`backend::host`): the bytes of stitched allocations, of allocations that
//! `defrag` moves (overlapping ranges, stitched slides, random streams), and what a scrubbing
//! pool zeroes.
#![allow(unsafe_code)] // the host-backend tests read and write the memory they allocate

use proptest::prelude::*;

use super::*;

#[cfg(target_os = "linux")]
fn host_device(vidmem: u64) -> Arc<Device> {
    let d = device(vidmem);
    Arc::new(Device {
        pmm: d.pmm.clone(),
        backend: Arc::new(crate::backend::host::Host::new(vidmem).unwrap()),
    })
}

/// A pool that scrubs (zeroes what is freed) on `vidmem` bytes of host memory.
#[cfg(target_os = "linux")]
fn scrubbing_host_pool(vidmem: u64) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    (cfg.check, cfg.scrub) = (true, true);
    Pool::new(host_device(vidmem), cfg).unwrap()
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
