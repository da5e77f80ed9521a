//! DLPack export of an allocation (v0.8 layout, unversioned capsule "dltensor"): the tensor
//! pins its allocation until the consumer calls its deleter, or the capsule is dropped
//! unconsumed.

use std::ffi::{c_void, CStr};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::allocation::PyAllocation;
use super::gil;

pub(super) const DL_CPU: i32 = 1;
pub(super) const DL_CUDA: i32 = 2;
pub(super) const DL_CUDA_HOST: i32 = 3;
const DLTENSOR: &CStr = c"dltensor";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

struct DlpackCtx {
    shape: [i64; 1],
    owner: Py<PyAllocation>,
}

/// Called by the consumer when it is done with the tensor (or by the capsule's destructor
/// when nobody consumed it): unpins the allocation and frees the tensor.
unsafe extern "C" fn dlpack_deleter(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` and its ctx were made by Box::into_raw in __dlpack__ and are freed once.
    let managed = unsafe { Box::from_raw(t) };
    let ctx = unsafe { Box::from_raw(managed.manager_ctx as *mut DlpackCtx) };
    // The unpin works on the core, which a quick call reaches with the GIL alone: both it and
    // the reference's drop need the GIL (`with_gil_anywhere`: where it cannot be had, the
    // allocation stays pinned and its memory valid until the process ends).
    gil::with_gil_anywhere(ctx.owner, |py, owner| {
        owner.get().unpin();
        owner.drop_ref(py);
    });
}

unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the capsule; a consumer renames a capsule it took to
    // "used_dltensor", so a capsule still named "dltensor" still owns its tensor.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, DLTENSOR.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(cap, DLTENSOR.as_ptr()) as *mut DLManagedTensor;
            dlpack_deleter(t);
        }
    }
}

/// A DLPack capsule of a uint8 tensor of the allocation's `size` bytes, pinning it until
/// the consumer releases the tensor (`Allocation.__dlpack__`).
pub(super) fn export<'py>(
    slf: &Bound<'py, PyAllocation>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let this = slf.get();
    let dev_type = this.dl;
    let ptr = if this.dl == DL_CUDA {
        this.current_ptr(py)?
    } else {
        this.bytes_or_raise(py)?
    };
    if dl_device.is_some_and(|d| d != (dev_type, 0)) {
        return Err(PyBufferError::new_err(
            "an allocation exports only to its own device",
        ));
    }
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "__dlpack__(copy=True) is not supported",
        ));
    }
    this.pin(py)?;
    let ctx = Box::new(DlpackCtx {
        shape: [this.size as i64],
        owner: slf.clone().unbind(),
    });
    let ctx = Box::into_raw(ctx);
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: ptr as *mut c_void,
            device: DLDevice {
                device_type: dev_type,
                device_id: 0,
            },
            ndim: 1,
            dtype: DLDataType {
                code: 1, // kDLUInt
                bits: 8,
                lanes: 1,
            },
            // SAFETY: ctx is a live Box; the shape lives as long as the tensor.
            shape: unsafe { (*ctx).shape.as_mut_ptr() },
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: ctx as *mut c_void,
        deleter: Some(dlpack_deleter),
    });
    let raw = Box::into_raw(managed);
    // SAFETY: `raw` is a valid DLManagedTensor; the name is a static C string; the
    // capsule destructor frees it only if no consumer took it.
    let cap = unsafe {
        ffi::PyCapsule_New(
            raw as *mut c_void,
            DLTENSOR.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if cap.is_null() {
        // SAFETY: nobody else has seen `raw`.
        unsafe { dlpack_deleter(raw) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}
