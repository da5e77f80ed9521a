//! The pool's configured bounds (`max_size`, `release_threshold`) and its sampled latency.

use super::*;

#[test]
fn max_size_limits_the_pool() {
    let dev = device(64 * MIB);
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.max_size = Some(4 * MIB);
    cfg.initial_size = 2 * MIB;
    let mut p = Pool::new(dev.clone(), cfg).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB);
    p.alloc(req(4 * MIB)).unwrap();
    assert!(matches!(p.alloc(req(1)), Err(Error::OutOfMemory(_))));
    // the device still has memory for another pool
    let mut q = pool_on(dev);
    q.alloc(req(8 * MIB)).unwrap();
}

#[test]
fn release_threshold_gives_pages_back() {
    let dev = device(64 * MIB);
    let mut cfg = PoolConfig::new(2 * MIB);
    cfg.release_threshold = Some(2 * MIB);
    cfg.check = true;
    let mut p = Pool::new(dev.clone(), cfg).unwrap();
    let (a, _) = p.alloc(req(10 * MIB)).unwrap();
    p.free(a).unwrap();
    assert_eq!(p.stats().reserved_bytes, 2 * MIB);
    assert_eq!(dev.pmm.lock().stats().allocated_bytes, 2 * MIB);
    assert_eq!(p.trim(0).unwrap(), 2 * MIB);
    assert_eq!(dev.pmm.lock().stats().allocated_bytes, 0);
}

#[test]
fn latency_is_sampled() {
    let mut p = pool(8 * MIB);
    for _ in 0..256 {
        let (a, _) = p.alloc(req(1000)).unwrap();
        p.free(a).unwrap();
    }
    let s = p.stats();
    assert_eq!(s.latency_samples, 4);
    assert!(s.latency_p99_ns > 0.0 && s.latency_mean_ns > 0.0);
    assert_eq!(s.success_rate, 1.0);
}
