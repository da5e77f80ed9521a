//! The C functions frameworks load from this extension (`gpumm/_core.abi3.so`):
//! PyTorch's pluggable-allocator ABI
//! (`void* alloc(ssize_t size, int device, cudaStream_t stream)`,
//! `void free(void* ptr, ssize_t size, int device, cudaStream_t stream)`), served by the pool
//! `gpumm.integrations.torch.use(pool)` chose. They take the pool's lock, never the GIL.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use parking_lot::RwLock;
use pyo3::prelude::*;

use super::gil::Core;
use super::pool::PyPool;
use crate::alloc::Request;

static C_POOL: RwLock<Option<Arc<Core>>> = RwLock::new(None);

/// Chooses the pool the C functions allocate from (None: none; they then return null).
#[pyfunction]
#[pyo3(signature = (pool = None))]
pub fn _set_c_pool(pool: Option<&Bound<'_, PyPool>>) {
    // (marked before the C functions can see it: from then on its calls from Python take
    // its lock too)
    *C_POOL.write() = pool.map(|p| {
        let core = p.get().shared();
        core.share_with_c(p.py());
        core
    });
}

/// PyTorch's pluggable `alloc`: `size` bytes for work on `stream`; null when it cannot.
#[no_mangle]
pub extern "C" fn gpumm_torch_alloc(
    size: isize,
    _device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let Some(pool) = C_POOL.read().clone() else {
        return std::ptr::null_mut();
    };
    if size <= 0 {
        return std::ptr::null_mut();
    }
    let req = Request {
        size: size as u64,
        stream: stream as u64,
        ..Request::default()
    };
    let r = pool.lock().alloc(req);
    match r {
        Ok((_, ptr)) => ptr as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    }
}

/// PyTorch's pluggable `free`: PyTorch frees when the tensor is dropped on the host, while
/// kernels on `stream` may still use it, so the free is ordered behind a CUDA event recorded
/// on `stream` (the pool polls it): `stream` may reuse the memory at once, other streams and
/// frameworks once the event is reached. A pointer the pool does not know is ignored.
#[no_mangle]
pub extern "C" fn gpumm_torch_free(
    ptr: *mut c_void,
    _size: isize,
    _device: c_int,
    stream: *mut c_void,
) {
    if let Some(pool) = C_POOL.read().clone() {
        let mut p = pool.lock();
        if let Ok(id) = p.id_of(ptr as u64) {
            let _ = p.free_when_done(id, stream as u64);
        }
    }
}
