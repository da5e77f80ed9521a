//! The driver's C ABI as this backend uses it: the structures and constants of `cuda.h`,
//! the table of entry points loaded from the library, and result checking.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use crate::error::{Error, Result};

pub(in crate::backend) type CUresult = c_int;
type CUdeviceptr = u64;
pub(super) type Handle = u64;

#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(super) struct Location {
    pub(super) kind: c_int,
    pub(super) id: c_int,
}

#[repr(C)]
#[derive(Copy, Clone, Default)]
pub(super) struct AllocFlags {
    pub(super) compression_type: u8,
    pub(super) gpu_direct_rdma_capable: u8,
    pub(super) usage: u16,
    pub(super) reserved: [u8; 4],
}

#[repr(C)]
pub(super) struct AllocationProp {
    pub(super) kind: c_int,
    pub(super) requested_handle_types: c_int,
    pub(super) location: Location,
    pub(super) win32_handle_meta_data: *mut c_void,
    pub(super) alloc_flags: AllocFlags,
}

#[repr(C)]
pub(super) struct AccessDesc {
    pub(super) location: Location,
    pub(super) flags: c_int,
}

pub(super) const MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub(super) const MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub(super) const MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
pub(super) const ATTR_CC_MAJOR: c_int = 75;
pub(super) const ATTR_CC_MINOR: c_int = 76;

pub(super) struct Fns {
    pub(super) init: unsafe extern "C" fn(c_uint) -> CUresult,
    pub(super) device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CUresult,
    pub(super) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CUresult,
    pub(super) device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CUresult,
    pub(super) device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult,
    pub(super) primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult,
    pub(super) ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CUresult,
    pub(super) granularity:
        unsafe extern "C" fn(*mut usize, *const AllocationProp, c_int) -> CUresult,
    pub(super) mem_create:
        unsafe extern "C" fn(*mut Handle, usize, *const AllocationProp, c_ulonglong) -> CUresult,
    pub(super) mem_release: unsafe extern "C" fn(Handle) -> CUresult,
    pub(super) address_reserve:
        unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) -> CUresult,
    pub(super) address_free: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult,
    pub(super) mem_map:
        unsafe extern "C" fn(CUdeviceptr, usize, usize, Handle, c_ulonglong) -> CUresult,
    pub(super) set_access:
        unsafe extern "C" fn(CUdeviceptr, usize, *const AccessDesc, usize) -> CUresult,
    pub(super) mem_unmap: unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult,
    pub(super) memcpy_async:
        unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, *mut c_void) -> CUresult,
    pub(super) memset_d8_async:
        unsafe extern "C" fn(CUdeviceptr, u8, usize, *mut c_void) -> CUresult,
    pub(super) stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CUresult,
    pub(super) event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CUresult,
    pub(super) event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CUresult,
    pub(super) event_query: unsafe extern "C" fn(*mut c_void) -> CUresult,
    pub(super) event_destroy: unsafe extern "C" fn(*mut c_void) -> CUresult,
}

pub(in crate::backend) fn check(what: &str, r: CUresult) -> Result<()> {
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
pub(in crate::backend) fn open_driver() -> Result<(libloading::Library, String)> {
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
pub(in crate::backend) use driver_sym;

/// Makes the device's primary context current on the calling thread (the driver's context is
/// per thread; the pool is called from any thread). Returns the device and context.
///
/// # Safety
/// `init`, `device_get`, `retain` and `set_current` are the driver's entry points.
pub(in crate::backend) unsafe fn primary_context(
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

pub(super) fn prop(device: c_int) -> AllocationProp {
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
