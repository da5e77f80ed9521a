//! Frees that wait: stream-ordered frees and their fences, `synchronize`, and scopes that free
//! what they made.

use super::*;

#[test]
fn stream_ordered_frees_wait_for_their_fence() {
    let mut p = pool(4 * MIB);
    let (a, pa) = p.alloc(req(4 * MIB)).unwrap();
    let f = p.free_async(a, 7).unwrap();
    assert_eq!(p.stats().freeing_bytes, 4 * MIB);
    // another stream cannot have it yet
    let o = Request {
        size: 4 * MIB,
        stream: 8,
        ..Request::default()
    };
    assert!(matches!(p.alloc(o), Err(Error::OutOfMemory(_))));
    // the same stream may reuse it at once
    let same = Request {
        size: 4 * MIB - 100,
        stream: 7,
        ..Request::default()
    };
    let (b, pb) = p.alloc(same).unwrap();
    assert_eq!(pb, pa);
    assert_ne!(b, a);
    assert!(matches!(p.free(a), Err(Error::InvalidFree(_))));
    let f2 = p.free_async(b, 7).unwrap();
    assert!(f2 > f);
    assert_eq!(
        p.complete(f).unwrap(),
        0,
        "the first free was taken over by the reuse"
    );
    assert_eq!(p.complete(f2).unwrap(), 1);
    assert_eq!(p.complete(f2).unwrap(), 0, "completing twice is harmless");
    assert!(matches!(p.complete(999), Err(Error::InvalidArgument(_))));
    p.alloc(o).unwrap();
}

#[test]
fn synchronize_completes_every_stream() {
    let mut p = pool(16 * MIB);
    for s in 1..4u64 {
        let (a, _) = p
            .alloc(Request {
                size: MIB,
                stream: s,
                ..Request::default()
            })
            .unwrap();
        p.free_async(a, s).unwrap();
    }
    assert_eq!(p.pending_frees(), 3);
    assert_eq!(p.synchronize(Some(2)).unwrap(), 1);
    assert_eq!(p.synchronize(None).unwrap(), 2);
    assert_eq!(p.stats().used_bytes, 0);
}

#[test]
fn scopes_free_what_they_made() {
    let mut p = pool(16 * MIB);
    let outer = p.alloc(req(1000)).unwrap();
    let s = p.open_scope().unwrap();
    let inner = p
        .alloc(Request {
            size: 3 * MIB,
            scope: s,
            ..Request::default()
        })
        .unwrap();
    let freed_inside = p
        .alloc(Request {
            size: 100,
            scope: s,
            ..Request::default()
        })
        .unwrap();
    p.free(freed_inside.0).unwrap();
    let r = p.close_scope(s).unwrap();
    assert_eq!((r.allocs, r.freed), (2, 1));
    assert_eq!(r.leaked[0].ptr, inner.1);
    assert!(p.info(inner.0).is_err());
    assert!(p.info(outer.0).is_ok());
}
