//! Stitched layouts (pages mapped back to back in the window): scattered pages, pages
//! reclaimed from inside segments, and which head is paired with which tail.

use super::*;

#[test]
fn reclaim_gives_stitching_the_pages_inside_segments() {
    // 16 MiB: two 7 MiB allocations (with 1 MiB after each), then the first freed. Its four
    // pages stay in its segment; a 9 MiB request fits no free block, so they are reclaimed and
    // stitched with the rest, without growing past the device.
    let mut p = pool(16 * MIB);
    let (a, _) = p.alloc(req(7 * MIB)).unwrap();
    let (_b, _) = p.alloc(req(7 * MIB)).unwrap();
    p.free(a).unwrap();
    // (a's block waits in the size cache, which a refused request gives back: give it
    // back first, so that the refusal below changes nothing at all)
    p.flush_cache();
    let before = (unchanging(&p), p.page_snapshot());
    assert_eq!(before.0.pages_free, 0);
    // too big for what is free: refused, and the reclaim it tried is undone
    assert!(matches!(p.alloc(req(10 * MIB)), Err(Error::OutOfMemory(_))));
    assert_eq!(before, (unchanging(&p), p.page_snapshot()));
    let (c, _) = p.alloc(req(8 * MIB + 512 * 1024)).unwrap();
    assert!(p.info(c).unwrap().stitched);
    assert_eq!(p.stats().reserved_bytes, 16 * MIB);
    p.free(c).unwrap();
    p.validate().unwrap();
}

/// Free page ends of 0.5 and 0.75 MiB and a free page start of 1 MiB, in separate segments,
/// then a 3.5 MiB request. Under pressure the pool pairs the 0.5 MiB end with the 1 MiB start
/// (nothing left over); with room to spare it takes the larger end and leaves the rest.
fn pairing_scenario(max_size: Option<u64>) -> Pool {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    cfg.small_threshold = 64 * 1024;
    cfg.max_size = max_size;
    let mut p = Pool::new(device(256 * MIB), cfg).unwrap();
    let kib = |k: u64| req(k * 1024);
    let _big = p.alloc(req(40 * MIB)).unwrap(); // pages 0-19
    let _x1 = p.alloc(kib(1536)).unwrap(); // page 20: x1 then y1
    let (y1, _) = p.alloc(kib(512)).unwrap();
    let _x2 = p.alloc(kib(1280)).unwrap(); // page 21: x2 then y2
    let (y2, _) = p.alloc(kib(768)).unwrap();
    let (z1, _) = p.alloc(kib(1024)).unwrap(); // page 22: z1 then w
    let _w = p.alloc(kib(1024)).unwrap();
    // page 23 (last: a small pool would place a large request below a page in its free
    // block before it took a page, `SMALL_POOL`)
    // (its free end, 725 KiB, is shorter than the page ends: no head, `heap_ends_for`)
    for _ in 0..21 {
        p.alloc(req(63 * 1024)).unwrap();
    }
    assert_eq!(p.stats().reserved_bytes, 48 * MIB);
    assert_eq!(p.stats().large_free_bytes, 0);
    for id in [y1, y2, z1] {
        p.free(id).unwrap();
    }
    p.flush_cache();
    assert_eq!(p.stats().large_free_bytes, (512 + 768 + 1024) * 1024);
    p
}

#[test]
fn under_pressure_a_head_is_chosen_for_its_tail() {
    // 52 MiB: 4 MiB of room left, under an eighth of the pool's limit
    let mut p = pairing_scenario(Some(52 * MIB));
    let (r, _) = p.alloc(req(3584 * 1024)).unwrap();
    assert!(p.info(r).unwrap().stitched);
    assert_eq!(p.stats().reserved_bytes, 50 * MIB);
    assert_eq!(p.stats().large_free_bytes, 768 * 1024);
    // with room: the largest page end, and for the tail the free page start that holds it
    // (a small pool takes no fresh page for a tail while one does, `SMALL_POOL`)
    let mut p = pairing_scenario(None);
    p.alloc(req(3584 * 1024)).unwrap();
    assert_eq!(p.stats().reserved_bytes, 50 * MIB);
    assert_eq!(p.stats().large_free_bytes, (512 + 256) * 1024);
}

#[test]
fn stitching_uses_scattered_pages() {
    // A 20 MiB pool: ten 2 MiB allocations, every other freed: 10 MiB free in 2 MiB holes.
    let mut p = pool(20 * MIB);
    let ids: Vec<_> = (0..10).map(|_| p.alloc(req(2 * MIB)).unwrap()).collect();
    for (i, (id, _)) in ids.iter().enumerate() {
        if i % 2 == 0 {
            p.free(*id).unwrap();
        }
    }
    let s = p.stats();
    assert_eq!(s.free_bytes, 10 * MIB);
    assert_eq!(s.largest_free_run, 2 * MIB);
    assert!((s.fragmentation - 0.8).abs() < 1e-9);
    // A contiguous allocator fails here; stitching maps the five holes back to back.
    let (big, ptr) = p.alloc(req(10 * MIB)).unwrap();
    let info = p.info(big).unwrap();
    assert!(info.stitched);
    assert!(p.va.in_window(ptr));
    assert_eq!(p.stats().free_bytes, 0);
    assert!(p.alloc(req(1)).is_err());
    p.free(big).unwrap();
    // the window range is cached for the next stitched allocation of its length
    assert_eq!(p.va.used_pages(), 0);
    p.va.flush();
    assert_eq!(p.va.cached_pages(), 0);
    assert_eq!(p.va.used_pages(), 0);
}
