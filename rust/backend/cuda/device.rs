//! Opening the device (the driver's entry points, the primary context, what the device
//! says about itself, the direct map) and mapping physical chunks into a range.

use std::ffi::{c_char, c_void};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::driver::{check, driver_sym, open_driver, primary_context, prop, Fns};
use super::driver::{AccessDesc, Location, ATTR_CC_MAJOR, ATTR_CC_MINOR};
use super::driver::{MEM_ACCESS_FLAGS_PROT_READWRITE, MEM_LOCATION_TYPE_DEVICE};
use super::{Cuda, DeviceInfo};
use crate::error::{Error, Result};

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
    pub(super) fn current(&self) {
        // SAFETY: the primary context retained in `new`, alive as long as `self`.
        unsafe { (self.f.ctx_set_current)(self.ctx as *mut c_void) };
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub(super) fn access(&self, va: u64, len: u64) -> Result<()> {
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
    pub(super) fn map_chunks(&self, va: u64, phys: u64, len: u64) -> Result<()> {
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
