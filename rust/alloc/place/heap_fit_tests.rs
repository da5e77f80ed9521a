//! Which free heap block a small request takes: the good fit below `SMALL_POOL`, the best of
//! `HEAP_BEST_SCAN` candidates of two bins from it up (`place_small`; config.rs,
//! `HEAP_BEST_SCAN`).

use super::super::bins::bin_of;
use super::super::tests::{device, MIB};
use super::*;

const KIB: u64 = 1 << 10;

/// (where a 101 KiB request lands, where the freed 102 KiB and 200 KiB blocks were) in a
/// heap page that holds both free, apart, on a pool that first took `base` bytes.
fn landing(base: u64) -> (u64, u64, u64) {
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.check = true;
    let mut p = Pool::new(device(1 << 30), cfg).unwrap();
    let mut alloc = |size| {
        p.alloc(Request {
            size,
            ..Request::default()
        })
        .unwrap()
    };
    if base > 0 {
        alloc(base);
    }
    let (x, px) = alloc(102 * KIB);
    alloc(4 * KIB);
    let (y, py) = alloc(200 * KIB);
    alloc(4 * KIB);
    p.free(x).unwrap();
    p.free(y).unwrap();
    let (_, pz) = p
        .alloc(Request {
            size: 101 * KIB,
            ..Request::default()
        })
        .unwrap();
    (pz, px, py)
}

#[test]
fn a_large_pool_takes_the_closest_block_of_the_requests_own_bin() {
    // 101 and 102 KiB share a bin (404 and 408 granules, in [400, 416)); the good fit skips
    // that bin, as it holds blocks below 101 KiB, and takes the 200 KiB block
    assert_eq!(bin_of(404), bin_of(408));
    let (z, x, _) = landing(SMALL_POOL);
    assert_eq!(z, x, "the best fit: the 102 KiB block");
}

#[test]
fn a_small_pool_keeps_the_good_fit() {
    let (z, _, y) = landing(0);
    assert_eq!(
        z, y,
        "the good fit: the head of the lowest bin whose blocks all hold it"
    );
}
