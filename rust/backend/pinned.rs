//! Pinned (page-locked) host memory for a CUDA device: the [`Host`] backend's memfd pages,
//! registered with the driver (`cuMemHostRegister`, portable and device-mapped) while the pool
//! uses them, so copies between them and the GPU run at DMA speed, asynchronously.
//!
//! Why registration and not `cuMemHostAlloc`: `cuMemHostAlloc` returns memory at an address the
//! driver picks, which cannot be mapped a second time, so a pool over it could not stitch and
//! a large pinned buffer would need contiguous free space (PyTorch's host allocator rounds every
//! request up to a power of two for this reason). Registering memfd pages pins exactly the same
//! kind of memory and keeps stitching: a stitched allocation's window is registered too.
//!
//! Every registration is recorded (address, length) and undone before its pages are unmapped
//! or given back, and on drop. Tested against the fake driver (`tests/fake_cuda`).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};

use parking_lot::Mutex;

use super::cuda::{check, driver_sym, open_driver, primary_context, CUresult};
use super::host::Host;
use super::Backend;
use crate::error::{Error, Result};

/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`: pinned for every context,
/// and mapped into the device's address space.
const REGISTER_FLAGS: c_uint = 0x01 | 0x02;

pub struct Pinned {
    host: Host,
    _lib: libloading::Library,
    set_current: unsafe extern "C" fn(*mut c_void) -> CUresult,
    register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult,
    unregister: unsafe extern "C" fn(*mut c_void) -> CUresult,
    ctx: usize,
    /// Registered ranges: address -> length.
    regs: Mutex<BTreeMap<u64, u64>>,
}

// SAFETY: the driver API is thread safe; the registration table is behind a lock; `ctx` is the
// address of the device's primary context, used only to make it current.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// Loads the driver (as the CUDA backend does), makes device `device`'s primary context
    /// current, and makes a host backend of `capacity` bytes whose pages it pins.
    pub fn new(device: i32, capacity: u64) -> Result<Self> {
        let (lib, path) = open_driver()?;
        let init: unsafe extern "C" fn(c_uint) -> CUresult = driver_sym!(lib, path, b"cuInit\0");
        let device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CUresult =
            driver_sym!(lib, path, b"cuDeviceGet\0");
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult =
            driver_sym!(lib, path, b"cuDevicePrimaryCtxRetain\0");
        let set_current = driver_sym!(lib, path, b"cuCtxSetCurrent\0");
        let register = driver_sym!(lib, path, b"cuMemHostRegister_v2\0");
        let unregister = driver_sym!(lib, path, b"cuMemHostUnregister\0");
        // SAFETY: the four are the driver's entry points, loaded above.
        let (_, ctx) = unsafe { primary_context(init, device_get, retain, set_current, device)? };
        Ok(Pinned {
            host: Host::new(capacity)?,
            _lib: lib,
            set_current,
            register,
            unregister,
            ctx: ctx as usize,
            regs: Mutex::new(BTreeMap::new()),
        })
    }

    /// Bytes registered with the driver now.
    pub fn pinned_bytes(&self) -> u64 {
        self.regs.lock().values().sum()
    }

    fn pin(&self, va: u64, len: u64) -> Result<()> {
        // SAFETY: the primary context retained in `new`; `[va, va + len)` is mapped read-write
        // memory of the host backend (the direct map or a window just mapped).
        let r = unsafe {
            (self.set_current)(self.ctx as *mut c_void);
            (self.register)(va as *mut c_void, len as usize, REGISTER_FLAGS)
        };
        check("cuMemHostRegister", r)?;
        self.regs.lock().insert(va, len);
        Ok(())
    }

    /// Unregisters every registration inside `[va, va + len)`.
    fn unpin(&self, va: u64, len: u64) {
        let mut regs = self.regs.lock();
        let inside: Vec<u64> = regs
            .range(va..va.saturating_add(len))
            .map(|(&a, _)| a)
            .collect();
        for a in inside {
            regs.remove(&a);
            // SAFETY: `a` was registered by `pin` and is still mapped.
            unsafe {
                (self.set_current)(self.ctx as *mut c_void);
                (self.unregister)(a as *mut c_void);
            }
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // before `host` unmaps the memory
        self.unpin(0, u64::MAX);
    }
}

impl Backend for Pinned {
    fn name(&self) -> &'static str {
        "pinned"
    }
    fn capacity(&self) -> u64 {
        self.host.capacity()
    }
    fn granularity(&self) -> u64 {
        self.host.granularity()
    }
    /// 2 MiB: one registration per page, so pages as large as a GPU's root chunk keep the
    /// driver calls few (a pool may still be made with smaller pages).
    fn default_page_size(&self) -> u64 {
        2 << 20
    }
    fn has_bytes(&self) -> bool {
        true
    }
    fn direct_base(&self) -> u64 {
        self.host.direct_base()
    }
    fn commit(&self, phys: u64, len: u64) -> Result<()> {
        if phys.saturating_add(len) > self.capacity() {
            return Err(Error::InvalidArgument(format!(
                "cannot pin {phys:#x}+{len}: outside the backend"
            )));
        }
        self.pin(self.direct_base() + phys, len)
    }
    fn discard(&self, phys: u64, len: u64) {
        self.unpin(self.direct_base() + phys, len);
        self.host.discard(phys, len);
    }
    fn reserve(&self, len: u64) -> Result<u64> {
        self.host.reserve(len)
    }
    fn unreserve(&self, base: u64, len: u64) {
        self.unpin(base, len);
        self.host.unreserve(base, len)
    }
    fn map(&self, va: u64, phys: u64, len: u64) -> Result<()> {
        self.host.map(va, phys, len)?;
        if let Err(e) = self.pin(va, len) {
            let _ = self.host.unmap(va, len);
            return Err(e);
        }
        Ok(())
    }
    fn unmap(&self, va: u64, len: u64) -> Result<()> {
        self.unpin(va, len);
        self.host.unmap(va, len)
    }
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.host.copy(dst, src, len)
    }
    fn zero(&self, va: u64, len: u64) -> Result<()> {
        self.host.zero(va, len)
    }
}
