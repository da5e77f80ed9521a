//! `Allocation`: memory from a pool, its address read from the core when it may move. On
//! the host backend its bytes are exported without copies through the buffer protocol,
//! `__array_interface__` and DLPack (`dlpack.rs`); each view or tensor pins it.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::stream_arg;
use super::dlpack::{self, DL_CUDA};
use super::errors::IntoPy;
use super::gil::{self, Access, CoreRef};
use super::recycle::{Recycled, Recycler};
use crate::alloc::{AllocId, Pool};
use crate::units::format_size;

/// Memory from a `MemoryPool`: `ptr`, `size`, `free()`; a context manager that frees on exit.
/// On the host backend its bytes are reachable without copies through the buffer protocol
/// (`memoryview(a)`, `numpy.asarray(a)`), `__array_interface__` and `__dlpack__`.
#[pyclass(module = "gpumm._core", name = "Allocation", frozen, weakref)]
pub struct PyAllocation {
    pub(super) pool: CoreRef,
    pub(super) pool_id: u64,
    pub(super) has_bytes: bool,
    /// DLPack device type: kDLCUDA for device memory of a CUDA backend (exported with
    /// `__cuda_array_interface__`), kDLCUDAHost for pinned host memory, else kDLCPU.
    pub(super) dl: i32,
    pub(super) id: AllocId,
    pub(super) ptr: AtomicU64,
    #[pyo3(get)]
    pub(super) size: u64,
    #[pyo3(get)]
    pub(super) stream: u64,
    #[pyo3(get)]
    pub(super) movable: bool,
}

impl Recycled for PyAllocation {
    fn recycler() -> &'static Recycler {
        static KEPT: Recycler = Recycler::new();
        &KEPT
    }
}

impl PyAllocation {
    /// Another handle to the same allocation (same pool, id and address).
    pub(super) fn clone_handle(&self, py: Python<'_>) -> PyAllocation {
        PyAllocation {
            pool: self.pool.clone_ref(py),
            pool_id: self.pool_id,
            has_bytes: self.has_bytes,
            dl: self.dl,
            id: self.id,
            ptr: AtomicU64::new(self.ptr.load(Ordering::Relaxed)),
            size: self.size,
            stream: self.stream,
            movable: self.movable,
        }
    }

    /// The current address (a movable allocation may have been moved by `defrag`).
    pub(super) fn current_ptr(&self, py: Python<'_>) -> PyResult<u64> {
        if self.movable {
            let info =
                gil::run(py, &*self.pool, Access::Detached, |p| p.info(self.id)).py_err(py)?;
            self.ptr.store(info.ptr, Ordering::Relaxed);
        }
        Ok(self.ptr.load(Ordering::Relaxed))
    }

    pub(super) fn bytes_or_raise(&self, py: Python<'_>) -> PyResult<u64> {
        if self.dl == DL_CUDA {
            return Err(PyBufferError::new_err(
                "this allocation is GPU memory: use __cuda_array_interface__ or __dlpack__",
            ));
        }
        if !self.has_bytes {
            return Err(PyBufferError::new_err(
                "this allocation is on a simulated device: it has no bytes to view",
            ));
        }
        self.current_ptr(py)
    }

    pub(super) fn pin(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &*self.pool, Access::Detached, |p| p.pin(self.id)).py_err(py)
    }

    pub(super) fn unpin(&self) {
        let _ = self.pool.lock().unpin(self.id);
    }
}

#[pymethods]
impl PyAllocation {
    #[getter]
    fn ptr(&self, py: Python<'_>) -> PyResult<u64> {
        self.current_ptr(py)
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.size
    }

    /// True once freed (by `free`, a scope, the pool's close, or a free by pointer).
    #[getter]
    fn freed(&self, py: Python<'_>) -> bool {
        gil::run(py, &*self.pool, Access::Detached, |p| {
            p.info(self.id).map(|i| i.freeing).unwrap_or(true)
        })
    }

    /// Frees now, or stream-ordered on `stream` (returns the fence).
    #[pyo3(signature = (stream = None))]
    fn free(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
        let stream = stream.map(stream_arg).transpose()?;
        let op = |p: &mut Pool| match stream {
            None => p.free(self.id).map(|_| None),
            Some(s) => p.free_async(self.id, s).map(Some),
        };
        gil::run(py, &*self.pool, Access::QuickIf(Pool::frees_are_quick), op).py_err(py)
    }

    /// Frees once the work queued on `stream` so far has finished (a CUDA event the pool
    /// polls, on the CUDA backend; at once elsewhere). `stream` may reuse the memory at once.
    fn free_when_done(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = stream_arg(stream)?;
        gil::run(
            py,
            &*self.pool,
            Access::QuickIf(Pool::frees_are_quick),
            |p: &mut Pool| p.free_when_done(self.id, s),
        )
        .py_err(py)
    }

    /// Writes zeros over the allocation (a no-op on a simulated device).
    fn zero(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &*self.pool, Access::Detached, |p| p.zero(self.id)).py_err(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Frees on leaving the block, unless already freed.
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let r = gil::run(py, &*self.pool, Access::Detached, |p| {
            match p.info(self.id) {
                Ok(i) if !i.freeing => p.free(self.id),
                _ => Ok(()),
            }
        });
        r.py_err(py)?;
        Ok(false)
    }

    /// numpy's array interface: a uint8 array of `size` bytes at `ptr`. numpy keeps the
    /// allocation object alive as the array's base, but this path cannot pin it: prefer
    /// `numpy.asarray(a)` (buffer protocol) or `numpy.from_dlpack(a)`, which do.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let ptr = self.bytes_or_raise(py)?;
        let d = PyDict::new(py);
        d.set_item("shape", (self.size,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (ptr, false))?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// The CUDA array interface (v3) of device memory: a uint8 array of `size` bytes at `ptr`.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.dl != DL_CUDA {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__: not device memory (this pool is not on a CUDA backend)",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", (self.size,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.current_ptr(py)?, false))?;
        d.set_item("version", 3)?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    /// (device type, device id) for DLPack: kDLCPU for host memory, kDLCUDA for a CUDA pool,
    /// kDLCUDAHost for a pinned host pool.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        if self.dl == DL_CUDA {
            return Ok((DL_CUDA, 0));
        }
        if !self.has_bytes {
            return Err(PyBufferError::new_err(
                "this allocation is on a simulated device: it has no bytes to export",
            ));
        }
        Ok((self.dl, 0))
    }

    /// A DLPack capsule of a uint8 tensor of `size` bytes. The allocation is pinned until the
    /// consumer releases the tensor.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        dlpack::export(slf, dl_device, copy)
    }

    /// The buffer protocol: a writable 1-D view of unsigned bytes; the allocation is pinned
    /// until the view is released.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let ptr = this.bytes_or_raise(py)?;
        this.pin(py)?;
        let shape = Box::into_raw(Box::new([this.size as ffi::Py_ssize_t, 1]));
        // SAFETY: `view` is the buffer struct CPython gave us to fill; `shape` outlives it
        // (freed in __releasebuffer__).
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = ptr as *mut c_void;
            (*view).len = this.size as ffi::Py_ssize_t;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
                c"B".as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND != 0 {
                shape as *mut ffi::Py_ssize_t
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                (shape as *mut ffi::Py_ssize_t).add(1)
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = shape as *mut c_void;
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` is the shape box made in __getbuffer__ for this view.
        unsafe { drop(Box::from_raw((*view).internal as *mut [ffi::Py_ssize_t; 2])) };
        self.unpin();
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpumm.Allocation ptr={:#x} size={} stream={}>",
            self.ptr.load(Ordering::Relaxed),
            format_size(self.size),
            self.stream
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyAllocation>()
            .is_ok_and(|o| o.get().pool_id == self.pool_id && o.get().id == self.id)
    }

    fn __hash__(&self) -> u64 {
        self.id.to_bits() ^ self.pool_id.rotate_left(40)
    }
}
