//! Real GPU memory through the CUDA driver's virtual-memory API, loaded at run time from
//! `libcuda.so.1` (or `GPUMM_LIBCUDA`): no build-time CUDA dependency, and a clear error when
//! no driver is present. Physical memory is made in chunks of the device's allocation
//! granularity (`cuMemCreate`) when the pool takes pages, and mapped once into a direct map
//! (`cuMemAddressReserve` + `cuMemMap` + `cuMemSetAccess`); stitching maps the same handles
//! again into a window; pages given back are unmapped and released (`cuMemRelease`).
//! Copies are `cuMemcpyAsync` and scrub `cuMemsetD8Async` on the null stream, waited for;
//! stream-ordered frees record a CUDA event on their stream and complete when it is reached.
//!
//! Tested against `tests/fake_cuda/fake_cuda.c`, a fake driver over host memory.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::Backend;
use crate::error::{Error, Result};

pub(super) type CUresult = c_int;
type CUdeviceptr = u64;
type Handle = u64;

#[repr(C)]
#[derive(Copy, Clone, Default)]
struct Location {
    kind: c_int,
    id: c_int,
}

#[repr(C)]
#[derive(Copy, Clone, Default)]
struct AllocFlags {
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

#[repr(C)]
struct AllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: Location,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: AllocFlags,
}

#[repr(C)]
struct AccessDesc {
    location: Location,
    flags: c_int,
}

const MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

struct Fns {
    init: unsafe extern "C" fn(c_uint) -> CUresult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CUresult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CUresult,
    device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CUresult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CUresult,
    granularity: unsafe extern "C" fn(*mut usize, *const AllocationProp, c_int) -> CUresult,
    mem_create:
        unsafe extern "C" fn(*mut Handle, usize, *const AllocationProp, c_ulonglong) -> CUresult,
    mem_release: unsafe extern "C" fn(Handle) -> CUresult,
    address_reserve:
        unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) -> CUresult,
    address_free: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult,
    mem_map: unsafe extern "C" fn(CUdeviceptr, usize, usize, Handle, c_ulonglong) -> CUresult,
    set_access: unsafe extern "C" fn(CUdeviceptr, usize, *const AccessDesc, usize) -> CUresult,
    mem_unmap: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult,
    memcpy_async: unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, *mut c_void) -> CUresult,
    memset_d8_async: unsafe extern "C" fn(CUdeviceptr, u8, usize, *mut c_void) -> CUresult,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CUresult,
    event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CUresult,
    event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CUresult,
    event_query: unsafe extern "C" fn(*mut c_void) -> CUresult,
    event_destroy: unsafe extern "C" fn(*mut c_void) -> CUresult,
}

/// What the driver says about the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub total_mem: u64,
    pub compute_capability: (i32, i32),
    pub granularity: u64,
}

pub struct Cuda {
    _lib: libloading::Library,
    f: Fns,
    device: c_int,
    ctx: usize,
    info: DeviceInfo,
    capacity: u64,
    direct: u64,
    /// Physical chunks by index (offset / granularity).
    handles: Mutex<FxHashMap<u64, Handle>>,
    windows: Mutex<Vec<(u64, u64)>>,
    /// Events no longer in use, for the next stream-ordered free.
    spare_events: Mutex<Vec<u64>>,
}

pub(super) fn check(what: &str, r: CUresult) -> Result<()> {
    match r {
        0 => Ok(()),
        2 => Err(Error::OutOfMemory(format!(
            "{what}: CUDA_ERROR_OUT_OF_MEMORY"
        ))),
        e => Err(Error::InvalidState(format!(
            "{what} failed with CUDA error {e}"
        ))),
    }
}

/// Loads the driver: `GPUMM_LIBCUDA`, else `libcuda.so.1`. Returns it and the path tried.
pub(super) fn open_driver() -> Result<(libloading::Library, String)> {
    let path = std::env::var("GPUMM_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".into());
    // SAFETY: loading a shared library runs its initializers; libcuda's are the driver's.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
        Error::InvalidState(format!(
            "no CUDA driver: cannot load {path} ({e}); install the NVIDIA driver or set \
             GPUMM_LIBCUDA to its path"
        ))
    })?;
    Ok((lib, path))
}

/// A driver entry point from `lib` (loaded from `path`) as a function pointer of the type the
/// binding expects.
macro_rules! driver_sym {
    ($lib:ident, $path:ident, $name:literal) => {
        // SAFETY: the symbol has the C signature of the driver API entry point named (checked
        // against cuda.h), and the library outlives the pointer (both live in one struct).
        *unsafe { $lib.get($name) }.map_err(|e| {
            Error::InvalidState(format!(
                "the CUDA driver {} lacks {}: {e}",
                $path,
                String::from_utf8_lossy(&$name[..$name.len() - 1])
            ))
        })?
    };
}
pub(super) use driver_sym;

/// Makes the device's primary context current on the calling thread (the driver's context is
/// per thread; the pool is called from any thread). Returns the device and context.
///
/// # Safety
/// `init`, `device_get`, `retain` and `set_current` are the driver's entry points.
pub(super) unsafe fn primary_context(
    init: unsafe extern "C" fn(c_uint) -> CUresult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CUresult,
    retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult,
    set_current: unsafe extern "C" fn(*mut c_void) -> CUresult,
    ordinal: i32,
) -> Result<(c_int, *mut c_void)> {
    check("cuInit", init(0))?;
    let mut dev = 0;
    check("cuDeviceGet", device_get(&mut dev, ordinal))?;
    let mut ctx = std::ptr::null_mut();
    check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
    check("cuCtxSetCurrent", set_current(ctx))?;
    Ok((dev, ctx))
}

impl Cuda {
    /// Loads the driver (`GPUMM_LIBCUDA`, else `libcuda.so.1`), picks `device`, and reserves a
    /// direct map of `capacity` bytes (the device's memory if None).
    pub fn new(device: i32, capacity: Option<u64>) -> Result<Self> {
        let (lib, path) = open_driver()?;
        macro_rules! sym {
            ($name:literal) => {
                driver_sym!(lib, path, $name)
            };
        }
        let f = Fns {
            init: sym!(b"cuInit\0"),
            device_get: sym!(b"cuDeviceGet\0"),
            device_get_name: sym!(b"cuDeviceGetName\0"),
            device_total_mem: sym!(b"cuDeviceTotalMem_v2\0"),
            device_get_attribute: sym!(b"cuDeviceGetAttribute\0"),
            primary_ctx_retain: sym!(b"cuDevicePrimaryCtxRetain\0"),
            ctx_set_current: sym!(b"cuCtxSetCurrent\0"),
            granularity: sym!(b"cuMemGetAllocationGranularity\0"),
            mem_create: sym!(b"cuMemCreate\0"),
            mem_release: sym!(b"cuMemRelease\0"),
            address_reserve: sym!(b"cuMemAddressReserve\0"),
            address_free: sym!(b"cuMemAddressFree\0"),
            mem_map: sym!(b"cuMemMap\0"),
            set_access: sym!(b"cuMemSetAccess\0"),
            mem_unmap: sym!(b"cuMemUnmap\0"),
            memcpy_async: sym!(b"cuMemcpyAsync\0"),
            memset_d8_async: sym!(b"cuMemsetD8Async\0"),
            stream_synchronize: sym!(b"cuStreamSynchronize\0"),
            event_create: sym!(b"cuEventCreate\0"),
            event_record: sym!(b"cuEventRecord\0"),
            event_query: sym!(b"cuEventQuery\0"),
            event_destroy: sym!(b"cuEventDestroy_v2\0"),
        };
        // SAFETY (this block): driver calls with valid out-pointers to locals.
        let (dev, ctx, info) = unsafe {
            let (dev, ctx) = primary_context(
                f.init,
                f.device_get,
                f.primary_ctx_retain,
                f.ctx_set_current,
                device,
            )?;
            let mut name = [0 as c_char; 256];
            check(
                "cuDeviceGetName",
                (f.device_get_name)(name.as_mut_ptr(), 256, dev),
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            let mut total = 0usize;
            check("cuDeviceTotalMem", (f.device_total_mem)(&mut total, dev))?;
            let (mut major, mut minor) = (0, 0);
            check(
                "cuDeviceGetAttribute",
                (f.device_get_attribute)(&mut major, ATTR_CC_MAJOR, dev),
            )?;
            check(
                "cuDeviceGetAttribute",
                (f.device_get_attribute)(&mut minor, ATTR_CC_MINOR, dev),
            )?;
            let prop = prop(dev);
            let mut g = 0usize;
            check(
                "cuMemGetAllocationGranularity",
                (f.granularity)(&mut g, &prop, 0),
            )?;
            (
                dev,
                ctx,
                DeviceInfo {
                    name,
                    total_mem: total as u64,
                    compute_capability: (major, minor),
                    granularity: g as u64,
                },
            )
        };
        let g = info.granularity.max(1);
        let capacity = capacity.unwrap_or(info.total_mem) / g * g;
        let mut direct = 0;
        // SAFETY: reserves virtual space only; the out-pointer is a local.
        check("cuMemAddressReserve", unsafe {
            (f.address_reserve)(&mut direct, capacity as usize, g as usize, 0, 0)
        })?;
        Ok(Cuda {
            _lib: lib,
            f,
            device: dev,
            ctx: ctx as usize,
            info,
            capacity,
            direct,
            handles: Mutex::new(FxHashMap::default()),
            windows: Mutex::new(Vec::new()),
            spare_events: Mutex::new(Vec::new()),
        })
    }

    /// Makes this device's context current on the calling thread (per-thread driver state;
    /// pools are used from many threads).
    fn current(&self) {
        // SAFETY: the primary context retained in `new`, alive as long as `self`.
        unsafe { (self.f.ctx_set_current)(self.ctx as *mut c_void) };
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn access(&self, va: u64, len: u64) -> Result<()> {
        let desc = AccessDesc {
            location: Location {
                kind: MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            flags: MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: a mapped range of ours; `desc` is a valid local.
        check("cuMemSetAccess", unsafe {
            (self.f.set_access)(va, len as usize, &desc, 1)
        })
    }

    /// Maps the chunks backing physical [phys, phys + len) at `va`, one by one.
    fn map_chunks(&self, va: u64, phys: u64, len: u64) -> Result<()> {
        let g = self.info.granularity;
        let handles = self.handles.lock();
        let mut done = 0;
        while done < len {
            let Some(&h) = handles.get(&((phys + done) / g)) else {
                return Err(Error::InvalidArgument(format!(
                    "no physical chunk at {:#x}",
                    phys + done
                )));
            };
            // SAFETY: `va + done` lies in a reservation of ours; `h` is a live handle.
            let r = unsafe { (self.f.mem_map)(va + done, g as usize, 0, h, 0) };
            if let Err(e) = check("cuMemMap", r) {
                if done > 0 {
                    // SAFETY: unmaps only what this call mapped.
                    unsafe { (self.f.mem_unmap)(va, done as usize) };
                }
                return Err(e);
            }
            done += g;
        }
        drop(handles);
        self.access(va, len)
    }
}

fn prop(device: c_int) -> AllocationProp {
    AllocationProp {
        kind: MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: Location {
            kind: MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: AllocFlags::default(),
    }
}

// SAFETY: the driver API is thread safe; the handle table and windows are behind locks.
unsafe impl Send for Cuda {}
// SAFETY: as above.
unsafe impl Sync for Cuda {}

impl Drop for Cuda {
    fn drop(&mut self) {
        let g = self.info.granularity;
        for (idx, h) in self.handles.lock().drain() {
            // SAFETY: our own mappings and handles, no longer used.
            unsafe {
                (self.f.mem_unmap)(self.direct + idx * g, g as usize);
                (self.f.mem_release)(h);
            }
        }
        for (b, l) in self.windows.lock().drain(..) {
            // SAFETY: our own reservations.
            unsafe { (self.f.address_free)(b, l as usize) };
        }
        for ev in self.spare_events.lock().drain(..) {
            // SAFETY: our own events, no longer used.
            unsafe { (self.f.event_destroy)(ev as *mut c_void) };
        }
        // SAFETY: our own reservation.
        unsafe { (self.f.address_free)(self.direct, self.capacity as usize) };
        let _ = self.ctx;
    }
}

impl Backend for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn granularity(&self) -> u64 {
        self.info.granularity
    }
    fn has_bytes(&self) -> bool {
        false // device memory: not readable from the host through the buffer protocol
    }
    fn direct_base(&self) -> u64 {
        self.direct
    }
    fn commit(&self, phys: u64, len: u64) -> Result<()> {
        self.current();
        let g = self.info.granularity;
        let p = prop(self.device);
        let mut made = Vec::new();
        let mut off = phys;
        while off < phys + len {
            let idx = off / g;
            if !self.handles.lock().contains_key(&idx) {
                let mut h = 0;
                // SAFETY: `h` and `p` are valid locals.
                let r = unsafe { (self.f.mem_create)(&mut h, g as usize, &p, 0) };
                let r = check("cuMemCreate", r).and_then(|_| {
                    self.handles.lock().insert(idx, h);
                    self.map_chunks(self.direct + off, off, g)
                });
                if let Err(e) = r {
                    if let Some(h) = self.handles.lock().remove(&idx) {
                        // SAFETY: the handle was just made and is mapped nowhere.
                        unsafe { (self.f.mem_release)(h) };
                    }
                    for idx in made {
                        self.discard(idx * g, g);
                    }
                    return Err(e);
                }
                made.push(idx);
            }
            off += g;
        }
        Ok(())
    }
    fn reserve(&self, len: u64) -> Result<u64> {
        let mut base = 0;
        let g = self.info.granularity;
        // SAFETY: reserves virtual space only.
        check("cuMemAddressReserve", unsafe {
            (self.f.address_reserve)(&mut base, len as usize, g as usize, 0, 0)
        })?;
        self.windows.lock().push((base, len));
        Ok(base)
    }
    fn unreserve(&self, base: u64, len: u64) {
        let mut w = self.windows.lock();
        if let Some(i) = w.iter().position(|&x| x == (base, len)) {
            w.swap_remove(i);
            // SAFETY: our own reservation, emptied by the pool.
            unsafe { (self.f.address_free)(base, len as usize) };
        }
    }
    fn map(&self, va: u64, phys: u64, len: u64) -> Result<()> {
        self.current();
        self.map_chunks(va, phys, len)
    }
    fn unmap(&self, va: u64, len: u64) -> Result<()> {
        // SAFETY: a range the pool mapped in one of our windows.
        check("cuMemUnmap", unsafe {
            (self.f.mem_unmap)(va, len as usize)
        })
    }
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.current();
        // The driver's copy of overlapping ranges is undefined (a large allocation slid down
        // over a smaller hole by `defrag` overlaps itself): disjoint pieces, in order.
        // SAFETY: both ranges are mapped device memory of this backend (the pool's own); the
        // copies are queued on the null stream, in order, which is then waited for.
        unsafe {
            let null = std::ptr::null_mut();
            for (d, s, l) in super::disjoint_pieces(dst, src, len) {
                check(
                    "cuMemcpyAsync",
                    (self.f.memcpy_async)(d, s, l as usize, null),
                )?;
            }
            check("cuStreamSynchronize", (self.f.stream_synchronize)(null))
        }
    }
    fn zero(&self, va: u64, len: u64) -> Result<()> {
        self.current();
        // SAFETY: a mapped device range of the pool's; queued on the null stream, waited for.
        unsafe {
            let null = std::ptr::null_mut();
            check(
                "cuMemsetD8Async",
                (self.f.memset_d8_async)(va, 0, len as usize, null),
            )?;
            check("cuStreamSynchronize", (self.f.stream_synchronize)(null))
        }
    }
    /// A CUDA event recorded on `stream` (a `CUstream` handle; 0 is the null stream). Events
    /// are recycled: one that was reached goes back to a free list, not to the driver.
    fn fence(&self, stream: u64) -> Option<u64> {
        self.current();
        let mut ev = self.spare_events.lock().pop().unwrap_or(0) as *mut c_void;
        // SAFETY: `ev` is a live event of ours or a local to create one into; the stream
        // handle is the caller's (PyTorch's, CuPy's).
        unsafe {
            if ev.is_null() && (self.f.event_create)(&mut ev, 2 /* DISABLE_TIMING */) != 0 {
                return None;
            }
            if (self.f.event_record)(ev, stream as *mut c_void) != 0 {
                (self.f.event_destroy)(ev);
                return None;
            }
        }
        Some(ev as u64)
    }
    fn fence_done(&self, fence: u64) -> bool {
        self.current();
        // SAFETY: an event made by `fence` and not yet dropped. Only CUDA_ERROR_NOT_READY
        // means "still running"; any other error cannot be waited out, so the free completes
        // rather than holding its memory forever.
        unsafe { (self.f.event_query)(fence as *mut c_void) != 600 }
    }
    fn fence_drop(&self, fence: u64) {
        let mut spare = self.spare_events.lock();
        if spare.len() < 1024 {
            spare.push(fence);
        } else {
            drop(spare);
            self.current();
            // SAFETY: an event made by `fence`, no longer used by the pool.
            unsafe { (self.f.event_destroy)(fence as *mut c_void) };
        }
    }
    fn discard(&self, phys: u64, len: u64) {
        self.current();
        let g = self.info.granularity;
        let mut off = phys / g * g;
        while off < phys + len {
            if let Some(h) = self.handles.lock().remove(&(off / g)) {
                // SAFETY: the chunk's direct mapping and handle are ours; the pool no longer
                // uses the page.
                unsafe {
                    (self.f.mem_unmap)(self.direct + off, g as usize);
                    (self.f.mem_release)(h);
                }
            }
            off += g;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(unsafe_code)]
    use super::*;
    use crate::alloc::{Device, Pool, PoolConfig, Request};
    use crate::pmm::{Pmm, PmmConfig, SizeMask};
    use std::sync::Arc;

    const M: u64 = 1 << 20;

    /// Builds the fake driver into its own file (one per test: each load has its own state).
    fn fake(tag: &str) -> std::path::PathBuf {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake_cuda/fake_cuda.c");
        let out =
            std::env::temp_dir().join(format!("gpumm-fakecuda-{}-{tag}.so", std::process::id()));
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .expect("a C compiler (cc) to build the fake CUDA driver");
        assert!(ok.success());
        out
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
}
