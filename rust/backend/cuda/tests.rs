#![allow(unsafe_code)]
use super::*;
use crate::alloc::{Device, Pool, PoolConfig, Request};
use crate::backend::Backend;
use crate::error::Error;
use crate::pmm::{Pmm, PmmConfig, SizeMask};
use std::sync::Arc;

const M: u64 = 1 << 20;

/// The fake driver built into its own file (one per test: each load has its own state);
/// the file goes when the test ends.
struct FakeSo(std::path::PathBuf);

impl Drop for FakeSo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl std::ops::Deref for FakeSo {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for FakeSo {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

fn fake(tag: &str) -> FakeSo {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_cuda/fake_cuda.c");
    let out = std::env::temp_dir().join(format!("gpumm-fakecuda-{}-{tag}.so", std::process::id()));
    let ok = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("a C compiler (cc) to build the fake CUDA driver");
    assert!(ok.success());
    FakeSo(out)
}

fn pool_on(cuda: impl Backend + 'static) -> (Pool, u64) {
    let cap = cuda.capacity();
    let mut c = PmmConfig::new(
        cap,
        SizeMask::from_sizes(&[4096, 64 << 10, 2 * M]).unwrap(),
        SizeMask::from_sizes(&[256, 4096, 64 << 10, 2 * M]).unwrap(),
    );
    c.check = false;
    let dev = Arc::new(Device {
        pmm: Arc::new(Mutex::new(Pmm::new(c).unwrap())),
        backend: Arc::new(cuda),
    });
    let mut cfg = PoolConfig::new(2 * M);
    cfg.check = true;
    (Pool::new(dev, cfg).unwrap(), cap)
}

/// Ten 2 MiB allocations, every other one freed, then a 10 MiB request: stitched across
/// the holes. Returns it.
fn fragment_and_stitch(p: &mut Pool) -> (crate::alloc::AllocId, u64) {
    let held: Vec<_> = (0..10)
        .map(|_| {
            p.alloc(Request {
                size: 2 * M,
                ..Request::default()
            })
            .unwrap()
        })
        .collect();
    for (id, _) in held.iter().step_by(2) {
        p.free(*id).unwrap();
    }
    let (big, ptr) = p
        .alloc(Request {
            size: 10 * M,
            ..Request::default()
        })
        .unwrap();
    assert!(p.info(big).unwrap().stitched);
    (big, ptr)
}

// One test owns the environment variables it sets (tests in this module run one by one:
// they share the process environment).
#[test]
fn pool_on_the_fake_driver() {
    let so = fake("basic");
    std::env::set_var("GPUMM_LIBCUDA", &so);
    std::env::set_var("FAKE_CUDA_MEM", (64 * M).to_string());
    std::env::remove_var("FAKE_CUDA_FAIL_AT");
    let cuda = Cuda::new(0, None).unwrap();
    assert_eq!(cuda.info().compute_capability, (9, 0));
    assert_eq!(cuda.info().granularity, 2 * M);
    assert!(cuda.info().name.contains("H100"));
    let (mut p, cap) = pool_on(cuda);
    assert_eq!(cap, 64 * M);
    let (big, ptr) = fragment_and_stitch(&mut p);
    // the fake's device memory is host memory: write through the stitched range
    // SAFETY: [ptr, ptr + 10 MiB) is the allocation, mapped read-write by the fake driver.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, (10 * M) as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i % 241) as u8;
    }
    assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i % 241) as u8));
    p.free(big).unwrap();
    p.validate().unwrap();
    assert!(p.trim(0).unwrap() > 0);
    p.close().unwrap();

    // an injected cuMemCreate/cuMemMap failure: the request fails, nothing changes
    let so = fake("fail");
    std::env::set_var("GPUMM_LIBCUDA", &so);
    std::env::set_var("FAKE_CUDA_FAIL_AT", "4");
    let (mut p, _) = pool_on(Cuda::new(0, None).unwrap());
    let mut failures = 0;
    for _ in 0..6 {
        let before = p.stats().reserved_bytes;
        match p.alloc(Request {
            size: 3 * M,
            ..Request::default()
        }) {
            Ok(_) => {}
            Err(Error::OutOfMemory(_)) => {
                failures += 1;
                assert_eq!(p.stats().reserved_bytes, before);
            }
            Err(e) => panic!("{e:?}"),
        }
        p.validate().unwrap();
    }
    // the failed cuMemMap is absorbed by the allocator's retry; nothing leaks: every
    // page the PMM handed out is the pool's, and each has its physical chunk
    assert!(failures <= 1);
    let pmm_allocated = p.device().pmm.lock().stats().allocated_bytes;
    assert_eq!(pmm_allocated, p.stats().reserved_bytes);
    std::env::remove_var("FAKE_CUDA_FAIL_AT");
    std::env::remove_var("FAKE_CUDA_MEM");

    pinned_host_pool();

    // no driver at all: a clear error
    std::env::set_var("GPUMM_LIBCUDA", "/nonexistent/libcuda.so.1");
    let e = Cuda::new(0, None).err().unwrap();
    assert!(e.to_string().contains("no CUDA driver"), "{e}");
    let e = crate::backend::pinned::Pinned::new(0, 64 * M)
        .err()
        .unwrap();
    assert!(e.to_string().contains("no CUDA driver"), "{e}");
    std::env::remove_var("GPUMM_LIBCUDA");
}

/// The fake driver at `so` (the instance the backend loads: dlopen returns it) and a
/// reader of its test hook `uint64_t fake_cuda_registered_bytes(void)`.
fn registered_bytes(so: &std::path::Path) -> (libloading::Library, impl Fn() -> u64) {
    // SAFETY: loading the fake driver built by `fake`; its initializers do nothing.
    let lib = unsafe { libloading::Library::new(so) }.unwrap();
    // SAFETY: the hook has that C signature (tests/fake_cuda/fake_cuda.c).
    let f: unsafe extern "C" fn() -> u64 =
        *unsafe { lib.get(b"fake_cuda_registered_bytes\0") }.unwrap();
    // SAFETY: a plain read of a counter; `lib` is returned with it and kept alive.
    (lib, move || unsafe { f() })
}

/// The pinned host pool: pages are registered with the driver while the pool holds them,
/// stitched windows too, and every registration is undone.
fn pinned_host_pool() {
    use crate::backend::pinned::Pinned;
    let so = fake("pinned");
    std::env::set_var("GPUMM_LIBCUDA", &so);
    let (_lib, reg) = registered_bytes(&so);
    let (mut p, _) = pool_on(Pinned::new(0, 64 * M).unwrap());
    let (big, ptr) = fragment_and_stitch(&mut p);
    // the direct map's pages and the window are both registered
    assert_eq!(reg(), p.stats().reserved_bytes + 10 * M);
    // SAFETY: [ptr, ptr + 10 MiB) is the allocation: host memory mapped read-write.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, (10 * M) as usize) };
    bytes.fill(7);
    p.free(big).unwrap();
    assert_eq!(reg(), p.stats().reserved_bytes);
    p.trim(0).unwrap();
    assert_eq!(reg(), 5 * 2 * M);
    p.validate().unwrap();
    p.close().unwrap();
    drop(p);
    assert_eq!(reg(), 0);

    // a registration refused by the driver: the request fails or is retried, and what
    // is registered is always exactly what the pool holds
    std::env::set_var("FAKE_CUDA_FAIL_AT", "3");
    let so = fake("pinned-fail");
    std::env::set_var("GPUMM_LIBCUDA", &so);
    let (lib, registered) = registered_bytes(&so);
    let (mut p, _) = pool_on(Pinned::new(0, 64 * M).unwrap());
    let calls: libloading::Symbol<unsafe extern "C" fn() -> std::ffi::c_long> =
        unsafe { lib.get(b"fake_cuda_calls\0") }.unwrap();
    let mut live = Vec::new();
    for _ in 0..3 {
        match p.alloc(Request {
            size: 4 * M,
            ..Request::default()
        }) {
            Ok((a, _)) => live.push(a),
            Err(Error::OutOfMemory(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
        assert_eq!(registered(), p.stats().reserved_bytes);
        p.validate().unwrap();
    }
    assert!(unsafe { calls() } >= 3, "the injected failure was reached");
    assert!(!live.is_empty());
    for a in live {
        p.free(a).unwrap();
    }
    p.validate().unwrap();
    drop(p);
    assert_eq!(registered(), 0);
    std::env::remove_var("FAKE_CUDA_FAIL_AT");
}
