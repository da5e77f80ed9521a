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

mod backend;
mod device;
mod driver;
#[cfg(test)]
mod tests;

use std::ffi::{c_int, c_void};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

pub(super) use driver::{check, driver_sym, open_driver, primary_context, CUresult};
use driver::{Fns, Handle};

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
