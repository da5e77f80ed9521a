//! Pools, allocations and backends for Python. Each pool is one core `Pool` behind one lock;
//! every call takes it with the GIL released (through `PyPool::with`). Allocations export
//! their bytes (host backend) through the buffer protocol, `__array_interface__` and DLPack;
//! every exported view pins the allocation, so it cannot be freed or moved under a view.

use std::cell::{RefCell, UnsafeCell};
use std::ffi::{c_int, c_void, CStr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use numpy::PyArray1;
use parking_lot::Mutex;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::recycle::{self, Recycled, Recycler};
use super::{size_arg, to_pyerr, IntoPy, PyPmm};
use crate::alloc::{self, AllocId, AllocInfo, Device, Pool, PoolConfig, Request};
use crate::backend::{self, Backend};
use crate::error::Error;
use crate::units::format_size;

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Open scopes of this thread, innermost last: (pool id, scope).
    static SCOPES: RefCell<Vec<(u64, u32)>> = const { RefCell::new(Vec::new()) };
}

/// Scopes open on all threads: while none is, a request skips the thread-local lookup (a
/// call into the TLS resolver of a shared library on every allocation).
static OPEN_SCOPES: AtomicUsize = AtomicUsize::new(0);

/// The most items of a batch call worked under the GIL (see `PyPool::with_bounded`).
const QUICK_BATCH: usize = 4096;

fn current_scope(pool_id: u64) -> u32 {
    if OPEN_SCOPES.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    SCOPES.with(|s| {
        let s = s.borrow();
        s.iter()
            .rev()
            .find(|(p, _)| *p == pool_id)
            .map_or(0, |&(_, sc)| sc)
    })
}

// ------------------------------------------------------------------------------------------
// Backend

/// Where a device's bytes live: "simulated" (accounting only), "host" (a memfd, really
/// mapped), "pinned" (host memory page-locked for a GPU) or "cuda" (GPU memory).
#[pyclass(module = "gpumm._core", name = "Backend", frozen)]
pub struct PyBackend {
    inner: Arc<dyn Backend>,
    /// The driver's report, for the CUDA backend.
    cuda: Option<backend::cuda::DeviceInfo>,
}

#[pymethods]
impl PyBackend {
    /// `kind`: "simulated", "host", "pinned" (host memory page-locked for CUDA device
    /// `device`) or "cuda" (the driver loaded at run time from `libcuda.so.1` or
    /// `GPUMM_LIBCUDA`; `capacity` None means the device's memory).
    #[new]
    #[pyo3(signature = (kind, capacity = None, *, granularity = None, device = 0))]
    fn py_new(
        py: Python<'_>,
        kind: &str,
        capacity: Option<&Bound<'_, PyAny>>,
        granularity: Option<&Bound<'_, PyAny>>,
        device: i32,
    ) -> PyResult<Self> {
        #[cfg(target_os = "linux")]
        if kind == "cuda" {
            let cap = capacity.map(|c| size_arg(py, c, "capacity")).transpose()?;
            let c = py
                .detach(|| backend::cuda::Cuda::new(device, cap))
                .py_err(py)?;
            let info = c.info().clone();
            return Ok(PyBackend {
                inner: Arc::new(c),
                cuda: Some(info),
            });
        }
        #[cfg(not(target_os = "linux"))]
        let _ = device;
        let capacity = match capacity {
            Some(c) => size_arg(py, c, "capacity")?,
            None => {
                return Err(to_pyerr(
                    py,
                    Error::InvalidArgument(format!("the {kind} backend needs a capacity")),
                ))
            }
        };
        let inner: Arc<dyn Backend> = match kind {
            "simulated" => {
                let g = match granularity {
                    Some(g) => size_arg(py, g, "granularity")?,
                    None => 2 << 20,
                };
                Arc::new(backend::Simulated::new(capacity, g).py_err(py)?)
            }
            #[cfg(target_os = "linux")]
            "host" => {
                if granularity.is_some() {
                    return Err(to_pyerr(
                        py,
                        Error::InvalidArgument("the host backend maps 4 KiB pages".into()),
                    ));
                }
                Arc::new(
                    py.detach(|| backend::host::Host::new(capacity))
                        .py_err(py)?,
                )
            }
            #[cfg(target_os = "linux")]
            "pinned" => {
                if granularity.is_some() {
                    return Err(to_pyerr(
                        py,
                        Error::InvalidArgument("the pinned backend maps 4 KiB pages".into()),
                    ));
                }
                Arc::new(
                    py.detach(|| backend::pinned::Pinned::new(device, capacity))
                        .py_err(py)?,
                )
            }
            other => {
                return Err(to_pyerr(
                    py,
                    Error::InvalidArgument(format!(
                        "unknown backend {other:?}; known: 'simulated', 'host', 'pinned', 'cuda'"
                    )),
                ))
            }
        };
        Ok(PyBackend { inner, cuda: None })
    }

    #[getter]
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    #[getter]
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    #[getter]
    fn has_bytes(&self) -> bool {
        self.inner.has_bytes()
    }
    #[getter]
    fn default_page_size(&self) -> u64 {
        self.inner.default_page_size()
    }

    /// The CUDA driver's report (name, total_mem, compute_capability, granularity), or None.
    #[getter]
    fn device_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(i) = &self.cuda else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("name", &i.name)?;
        d.set_item("total_mem", i.total_mem)?;
        d.set_item("compute_capability", i.compute_capability)?;
        d.set_item("granularity", i.granularity)?;
        Ok(Some(d))
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpumm.Backend {} capacity={}>",
            self.inner.name(),
            format_size(self.inner.capacity())
        )
    }
}

// ------------------------------------------------------------------------------------------
// Pool

type SharedPool = Arc<Core>;

/// Whether this extension is built for an interpreter with a GIL (a free-threaded build has
/// none, and there every access to a pool's core takes its lock; one whose GIL is enabled at
/// run time takes it too, which is always sound).
const GIL_BUILD: bool = cfg!(not(Py_GIL_DISABLED));

/// What the GIL guards in a `Core` (read and written only with it held, on a build with one).
#[derive(Default)]
struct GilState {
    /// `Allocation` objects that refer to the core (see `CoreRef`).
    handles: usize,
    /// Threads of Python working on the core with the GIL released (see `Core::detached`).
    detached: u32,
    /// The C functions of `capi` may use the core: they take its lock without the GIL.
    shared_with_c: bool,
}

/// A pool's core behind its lock, and what the GIL guards of it.
///
/// A call from Python that can be served at once (`Core::quick`) works on the core with the
/// GIL alone when no other thread can reach the core without the GIL: none works on it with
/// the GIL released (each such thread is counted, with the GIL held, before it releases it
/// and after it takes it back) and the C functions do not use it. The GIL then excludes every
/// other thread, as the lock would: the lock's two atomic read-modify-writes each call, and
/// an `Arc` clone and drop for each `Allocation`, were most of what a Python alloc + free
/// pair cost beyond the core's work once the `Allocation` objects were recycled without
/// atomics too (`recycle.rs`; benches/RESULTS.md, "Twelfth session").
#[repr(C)]
pub(super) struct Core {
    /// Used on a build with a GIL (`GIL_BUILD`); without one every access takes the lock,
    /// and each `Allocation` holds an `Arc` count of its own.
    gil: UnsafeCell<GilState>,
    pool: Mutex<Pool>,
}

// SAFETY: `pool` is behind its lock, or reached with the GIL alone under the rules above;
// `gil` is only read or written with the GIL held on a build with one (`GIL_BUILD`).
unsafe impl Sync for Core {}

impl std::ops::Deref for Core {
    type Target = Mutex<Pool>;
    fn deref(&self) -> &Mutex<Pool> {
        &self.pool
    }
}

impl Core {
    fn new(pool: Pool) -> Core {
        Core {
            gil: UnsafeCell::new(GilState::default()),
            pool: Mutex::new(pool),
        }
    }

    /// What the GIL guards (`_gil`: it is held; called only on a build with one).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    fn gil_state(&self, _gil: Python<'_>) -> &mut GilState {
        // SAFETY: the GIL is held, so no other thread reads or writes it, and no reference
        // from an earlier call is alive (each is used within one statement).
        unsafe { &mut *self.gil.get() }
    }

    /// Runs `f` on the core now if that needs no wait: with the GIL alone when no other
    /// thread can reach the core, else under its lock if that is free. None: it is not.
    /// (`f` must not call into Python: the GIL could be handed on meanwhile.)
    #[inline]
    fn quick<T>(&self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T) -> Option<T> {
        if GIL_BUILD {
            let g = self.gil_state(py);
            if g.detached == 0 && !g.shared_with_c {
                // SAFETY: the GIL is held and no thread works on the core without it (see
                // `Core`), and `f` keeps it: nothing else has the pool until `f` returns.
                return Some(f(unsafe { &mut *self.pool.data_ptr() }));
            }
        }
        self.pool.try_lock().map(|mut p| f(&mut p))
    }

    /// Runs `f` on the core under its lock with the GIL released, this thread counted as
    /// working without the GIL meanwhile.
    fn detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T + Send) -> T {
        let _away = Detached::new(py, self);
        py.detach(|| f(&mut self.pool.lock()))
    }

    /// From now on the C functions may use the core.
    pub(super) fn share_with_c(&self, py: Python<'_>) {
        if GIL_BUILD {
            self.gil_state(py).shared_with_c = true;
        }
    }
}

/// A thread of Python counted, with the GIL held, as working on a core without it (from
/// before it releases the GIL until after it takes it back: the count is dropped with the GIL
/// held, also when unwinding, `py.detach` having taken the GIL back first).
struct Detached<'a>(&'a Core);

impl<'a> Detached<'a> {
    fn new(py: Python<'_>, core: &'a Core) -> Self {
        if GIL_BUILD {
            core.gil_state(py).detached += 1;
        }
        Detached(core)
    }
}

impl Drop for Detached<'_> {
    fn drop(&mut self) {
        if GIL_BUILD {
            // SAFETY: dropped with the GIL held (see the type).
            unsafe { (*self.0.gil.get()).detached -= 1 };
        }
    }
}

/// An `Allocation`'s reference to its pool's core. With a GIL, the references are counted in
/// the core under it, and together hold one strong count of the core's `Arc` while there is
/// at least one; without, each holds one. The core outlives its `Pool` object while
/// allocations refer to it.
pub(super) struct CoreRef(NonNull<Core>);

// SAFETY: it points to a `Core` (which is `Sync`) kept alive by a strong count of its `Arc`;
// with a GIL it is made and dropped only with the GIL held (`new` and `clone_ref` take the
// token, and an `Allocation` is dropped by its object's deallocation, which holds the GIL).
unsafe impl Send for CoreRef {}
unsafe impl Sync for CoreRef {}

impl CoreRef {
    fn new(py: Python<'_>, core: &Arc<Core>) -> CoreRef {
        let p = Arc::as_ptr(core);
        if GIL_BUILD {
            let g = core.gil_state(py);
            if g.handles == 0 {
                // SAFETY: `p` is a live `Arc`'s.
                unsafe { Arc::increment_strong_count(p) };
            }
            g.handles += 1;
        } else {
            // SAFETY: `p` is a live `Arc`'s.
            unsafe { Arc::increment_strong_count(p) };
        }
        CoreRef(NonNull::from(&**core))
    }

    fn clone_ref(&self, py: Python<'_>) -> CoreRef {
        if GIL_BUILD {
            self.gil_state(py).handles += 1;
        } else {
            // SAFETY: this reference holds a strong count, so the `Arc` is live.
            unsafe { Arc::increment_strong_count(self.0.as_ptr()) };
        }
        CoreRef(self.0)
    }
}

impl std::ops::Deref for CoreRef {
    type Target = Core;
    fn deref(&self) -> &Core {
        // SAFETY: the strong count the references hold keeps the core alive.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for CoreRef {
    fn drop(&mut self) {
        let core = self.0.as_ptr();
        debug_assert!(!GIL_BUILD || unsafe { ffi::PyGILState_Check() } == 1);
        // SAFETY: with a GIL, dropped with it held (see the `Send` impl); the count is
        // written before the last strong count may free the core.
        unsafe {
            if GIL_BUILD {
                let n = &mut (*(*core).gil.get()).handles;
                *n -= 1;
                if *n > 0 {
                    return;
                }
            }
            Arc::decrement_strong_count(core);
        }
    }
}

/// (allocations made, freed by the scope, [(ptr, size)] of those freed)
type ScopeResult = (u64, u64, Vec<(u64, u64)>);

/// The core of `gpumm.MemoryPool`: an allocator over the pages of one device.
#[pyclass(module = "gpumm._core", name = "Pool", subclass, frozen)]
pub struct PyPool {
    inner: SharedPool,
    id: u64,
    has_bytes: bool,
    /// DLPack device type of its memory: kDLCPU, kDLCUDA or kDLCUDAHost (pinned).
    dl: i32,
    on_failure: Option<Py<PyAny>>,
    tracking: AtomicBool,
}

impl PyPool {
    /// The core, shared (for the C functions of `capi`).
    pub(super) fn shared(&self) -> SharedPool {
        self.inner.clone()
    }

    /// Runs `f` on the core under its lock with the GIL released.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T + Send) -> T {
        self.inner.detached(py, f)
    }

    /// `with` for the work of a batch of `n`: a small batch runs under the GIL when the
    /// pool's lock is free (releasing and retaking the GIL, and waking a thread that waits
    /// for it, cost more than the work would let it do: a 1,024 batch pair is about 17 µs
    /// through Python); a larger one, or a contended lock, releases the GIL. A small batch
    /// that grows the pool holds the GIL through the device's calls too.
    fn with_bounded<T: Send>(
        &self,
        py: Python<'_>,
        n: usize,
        f: impl FnOnce(&mut Pool) -> T + Send,
    ) -> T {
        if n <= QUICK_BATCH {
            let mut f = Some(f);
            if let Some(r) = self.inner.quick(py, |p| (f.take().expect("once"))(p)) {
                return r;
            }
            return self.with(py, f.take().expect("not run"));
        }
        self.with(py, f)
    }

    /// The pointers of a batch (see `alloc_batch`).
    fn batch(
        &self,
        py: Python<'_>,
        sizes: &Bound<'_, PyAny>,
        stream: u64,
        arena: bool,
    ) -> PyResult<Vec<u64>> {
        let sizes = u64_buffer(py, sizes, "sizes")?;
        let mut out = Vec::with_capacity(sizes.len());
        self.with_bounded(py, sizes.len(), |p| {
            if arena {
                p.alloc_arena(&sizes, stream, &mut out)
            } else {
                p.alloc_batch(&sizes, stream, &mut out)
            }
        })
        .py_err(py)?;
        Ok(out)
    }

    fn allocation(&self, py: Python<'_>, info: &AllocInfo) -> PyAllocation {
        PyAllocation {
            pool: CoreRef::new(py, &self.inner),
            pool_id: self.id,
            has_bytes: self.has_bytes,
            dl: self.dl,
            id: info.id,
            ptr: AtomicU64::new(info.ptr),
            size: info.size,
            stream: info.stream,
            movable: info.movable,
        }
    }

    /// The allocation an argument names: an `Allocation` of this pool or an int pointer.
    fn target(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Target> {
        if let Ok(a) = obj.cast::<PyAllocation>() {
            let a = a.get();
            if a.pool_id != self.id {
                return Err(to_pyerr(
                    py,
                    Error::InvalidFree(format!(
                        "the allocation at {:#x} belongs to another pool",
                        a.ptr.load(Ordering::Relaxed)
                    )),
                ));
            }
            return Ok(Target::Id(a.id));
        }
        if obj.is_instance_of::<pyo3::types::PyBool>() {
            return Err(PyTypeError::new_err(
                "expected an Allocation or an int pointer, not bool",
            ));
        }
        if obj.is_instance_of::<pyo3::types::PyInt>() {
            return match obj.extract::<u64>() {
                Ok(p) => Ok(Target::Ptr(p)),
                Err(_) => Err(to_pyerr(
                    py,
                    Error::InvalidFree(format!("{obj} is not a pointer (foreign pointer)")),
                )),
            };
        }
        Err(PyTypeError::new_err(format!(
            "expected an Allocation or an int pointer, not {}",
            obj.get_type().name()?
        )))
    }
}

enum Target {
    Id(AllocId),
    Ptr(u64),
}

fn stream_arg(stream: &Bound<'_, PyAny>) -> PyResult<u64> {
    if stream.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("stream must be an int, not bool"));
    }
    stream
        .extract::<u64>()
        .map_err(|_| PyTypeError::new_err("stream must be a non-negative int (a stream handle)"))
}

fn opt_size(py: Python<'_>, v: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<u64>> {
    v.map(|v| size_arg(py, v, what)).transpose()
}

#[pymethods]
impl PyPool {
    #[new]
    #[pyo3(signature = (pmm, backend, *, page_size, initial_size = None, max_size = None,
        small_threshold = None, release_threshold = None, tail_slack = None, scrub = false,
        size_cache = true, on_failure = None, check = false))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        pmm: &Bound<'_, PyPmm>,
        backend: &Bound<'_, PyBackend>,
        page_size: &Bound<'_, PyAny>,
        initial_size: Option<&Bound<'_, PyAny>>,
        max_size: Option<&Bound<'_, PyAny>>,
        small_threshold: Option<&Bound<'_, PyAny>>,
        release_threshold: Option<&Bound<'_, PyAny>>,
        tail_slack: Option<&Bound<'_, PyAny>>,
        scrub: bool,
        size_cache: bool,
        on_failure: Option<Py<PyAny>>,
        check: bool,
    ) -> PyResult<Self> {
        let mut cfg = PoolConfig::new(size_arg(py, page_size, "page_size")?);
        cfg.initial_size = opt_size(py, initial_size, "size")?.unwrap_or(0);
        cfg.max_size = opt_size(py, max_size, "max_size")?;
        if let Some(t) = opt_size(py, small_threshold, "small_threshold")? {
            cfg.small_threshold = t;
        }
        cfg.release_threshold = opt_size(py, release_threshold, "release_threshold")?;
        if let Some(t) = opt_size(py, tail_slack, "tail_slack")? {
            cfg.tail_slack = t;
        }
        cfg.scrub = scrub;
        cfg.size_cache = size_cache;
        cfg.check = check;
        if let Some(cb) = &on_failure {
            if !cb.bind(py).is_callable() {
                return Err(PyTypeError::new_err("on_failure must be callable"));
            }
        }
        let dev = Arc::new(Device {
            pmm: pmm.get().inner.clone(),
            backend: backend.get().inner.clone(),
        });
        let has_bytes = dev.backend.has_bytes();
        let dl = match dev.backend.name() {
            "cuda" => DL_CUDA,
            "pinned" => DL_CUDA_HOST,
            _ => DL_CPU,
        };
        let pool = py.detach(|| Pool::new(dev, cfg)).py_err(py)?;
        Ok(PyPool {
            inner: Arc::new(Core::new(pool)),
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            has_bytes,
            dl,
            on_failure,
            tracking: AtomicBool::new(false),
        })
    }

    #[getter]
    fn page_size(&self) -> u64 {
        self.inner.lock().config().page_size
    }
    #[getter]
    fn small_threshold(&self) -> u64 {
        self.inner.lock().config().small_threshold
    }
    #[getter]
    fn max_size(&self) -> Option<u64> {
        self.inner.lock().config().max_size
    }
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.lock().device().backend.name()
    }
    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().is_closed()
    }

    /// Allocates `nbytes` (an int ≥ 1 or a size string) for work on `stream`. On failure the
    /// `on_failure` callback, if any, is called with the size and the request is retried
    /// while it returns True (at most 100 times); then `OutOfMemoryError`, with the pool's
    /// diagnosis. `tag` names the allocation in leak reports and snapshots (kept while
    /// tracking is on).
    #[pyo3(signature = (nbytes, stream = 0, *, movable = false, tag = None))]
    fn alloc(
        slf: &Bound<'_, Self>,
        nbytes: &Bound<'_, PyAny>,
        stream: u64,
        movable: bool,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAllocation>> {
        let py = slf.py();
        let this = slf.get();
        let size = size_arg(py, nbytes, "nbytes")?;
        let req = Request {
            size,
            stream,
            movable,
            scope: current_scope(this.id),
        };
        // (the object is made here and a pointer returned: returning the struct by value
        // copied it through memory twice, with loads wider than its stores)
        let made = |id, ptr| -> PyResult<Py<PyAllocation>> {
            let a = PyAllocation {
                pool: CoreRef::new(py, &this.inner),
                pool_id: this.id,
                has_bytes: this.has_bytes,
                dl: this.dl,
                id,
                ptr: AtomicU64::new(ptr),
                size,
                stream,
                movable,
            };
            if this.tracking.load(Ordering::Relaxed) {
                let obj = Py::new(py, a)?;
                slf.call_method1("_on_alloc", (obj.clone_ref(py), tag))?;
                return Py::new(py, obj.borrow(py).clone_handle(py));
            }
            Py::new(py, a)
        };
        // Quick path under the GIL (alone, or with an uncontended lock: `Core::quick`) for a
        // request the held pages serve.
        let quick = this.inner.quick(py, |p| p.try_alloc_quick(req)).flatten();
        match quick {
            Some(Ok((id, ptr))) => return made(id, ptr),
            Some(Err(e)) => return Err(to_pyerr(py, e)),
            None => {}
        }
        let mut tries = 0;
        loop {
            match this.with(py, |p| p.alloc(req)) {
                Ok((id, ptr)) => return made(id, ptr),
                Err(Error::OutOfMemory(msg)) => {
                    let retry = match &this.on_failure {
                        Some(cb) if tries < 100 => cb.call1(py, (size,))?.is_truthy(py)?,
                        _ => false,
                    };
                    if !retry {
                        // The Python side turns the core's message into an OutOfMemoryError
                        // that carries the diagnosis.
                        let exc = slf.call_method1("_oom_error", (size, msg))?;
                        return Err(PyErr::from_value(exc));
                    }
                    tries += 1;
                }
                Err(e) => return Err(to_pyerr(py, e)),
            }
        }
    }

    /// Turns on (or off) the call of `_on_alloc(allocation, tag)` after each allocation.
    fn _set_tracking(&self, on: bool) {
        self.tracking.store(on, Ordering::Relaxed);
    }

    /// Frees an `Allocation` of this pool or the allocation at an int pointer. With a
    /// `stream`, the free is stream-ordered: the memory stays "freeing" until that stream's
    /// fence completes (returned; see `complete`, `synchronize`); only that stream may reuse
    /// it before.
    #[pyo3(signature = (allocation, stream = None))]
    fn free(
        &self,
        py: Python<'_>,
        allocation: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<u64>> {
        let target = self.target(py, allocation)?;
        let stream = stream.map(stream_arg).transpose()?;
        let op = |p: &mut Pool| {
            let id = match target {
                Target::Id(id) => id,
                Target::Ptr(ptr) => p.id_of(ptr)?,
            };
            match stream {
                None => p.free(id).map(|_| None),
                Some(s) => p.free_async(id, s).map(Some),
            }
        };
        quick_or_detached(py, &self.inner, op).py_err(py)
    }

    /// Allocates every size in `sizes` (a numpy int64/uint64 array or a list) in one call and
    /// one lock: all or none. Returns the pointers as a numpy uint64 array; free them with
    /// `free_batch` (or one by one with `free`): the whole array, as returned, is the fastest
    /// (the batch remembers its members; any other set is looked up pointer by pointer). Each
    /// is an allocation of its own; when the whole batch fits in one free range of the pool
    /// it is placed there, back to back, in one step (several times cheaper than a call per
    /// size; a batch that does not fit one free range is placed size by size).
    ///
    /// `arena=True` places them all at once, back to back at 256-byte alignment, in memory
    /// that goes back to the pool when the last of them is freed: one placement whatever the
    /// pool's free ranges (stitched if need be), for buffers that live and die together (one
    /// step's activations, a set of staging buffers). Memory of one freed early is not
    /// reusable until the whole arena is freed (`used_bytes` keeps counting it).
    ///
    /// (The array owns the vector the pointers were written to: no copy, no bytes object.)
    #[pyo3(signature = (sizes, stream = 0, *, arena = false))]
    fn alloc_batch<'py>(
        &self,
        py: Python<'py>,
        sizes: &Bound<'py, PyAny>,
        stream: u64,
        arena: bool,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        Ok(PyArray1::from_vec(
            py,
            self.batch(py, sizes, stream, arena)?,
        ))
    }

    /// `alloc_batch`, the pointers as bytes of native uint64.
    #[pyo3(signature = (sizes, stream = 0, arena = false))]
    fn alloc_batch_raw<'py>(
        &self,
        py: Python<'py>,
        sizes: &Bound<'py, PyAny>,
        stream: u64,
        arena: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let out = self.batch(py, sizes, stream, arena)?;
        Ok(PyBytes::new(py, as_bytes(&out)))
    }

    /// Frees every pointer of `ptrs` (a buffer of uint64): all or none.
    fn free_batch(&self, py: Python<'_>, ptrs: &Bound<'_, PyAny>) -> PyResult<()> {
        let ptrs = u64_buffer(py, ptrs, "ptrs")?;
        self.with_bounded(py, ptrs.len(), |p| p.free_batch(&ptrs))
            .py_err(py)
    }

    /// Fence `fence` completed: the stream-ordered frees before it are done. Returns how
    /// many allocations became free.
    fn complete(&self, py: Python<'_>, fence: u64) -> PyResult<u64> {
        self.with(py, |p| p.complete(fence)).py_err(py)
    }

    /// Completes the stream-ordered frees whose CUDA event has been reached (the pool also
    /// does this before it grows). Returns how many allocations became free.
    fn poll(&self, py: Python<'_>) -> u64 {
        self.with(py, |p| p.poll())
    }

    /// Completes every pending free on `stream` (every stream if None).
    #[pyo3(signature = (stream = None))]
    fn synchronize(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<u64> {
        self.with(py, |p| p.synchronize(stream)).py_err(py)
    }

    /// Compacts the pool, moving allocations made with `movable=True`: slides the allocations
    /// of each large segment and heap page down over the free space before them (a stitched
    /// one through its window), so that holes inside partly used pages gather; empties the
    /// emptiest heap pages into free blocks elsewhere (other heap pages, or holes of large
    /// segments); and gives every free page back to the device. Returns a report:
    /// `moved_allocations` (each counted once), `moved_bytes` (bytes copied), `moves` (one
    /// `(old, new)` pointer pair per allocation moved), `pages_emptied`, `bytes_released`
    /// and `roots_released`.
    fn defrag<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.with(py, |p| p.defrag()).py_err(py)?;
        let d = PyDict::new(py);
        d.set_item("moved_allocations", r.moved_allocs)?;
        d.set_item("moved_bytes", r.moved_bytes)?;
        d.set_item("pages_emptied", r.pages_emptied)?;
        d.set_item("bytes_released", r.bytes_released)?;
        d.set_item(
            "roots_released",
            r.bytes_released / crate::pmm::ROOT_CHUNK_SIZE,
        )?;
        let moves: Vec<(u64, u64)> = r.moves.iter().map(|m| (m.1, m.2)).collect();
        d.set_item("moves", moves)?;
        Ok(d)
    }

    /// Gives free pages back to the device until at most `keep` bytes of them stay.
    #[pyo3(signature = (keep = None))]
    fn trim(&self, py: Python<'_>, keep: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        let keep = opt_size(py, keep, "keep")?.unwrap_or(0);
        self.with(py, |p| p.trim(keep)).py_err(py)
    }

    /// Live and freeing allocations as new `Allocation` handles.
    fn allocations(&self, py: Python<'_>) -> PyResult<Vec<PyAllocation>> {
        let infos = self.with(py, |p| p.allocations());
        Ok(infos.iter().map(|i| self.allocation(py, i)).collect())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |p| p.stats());
        let d = PyDict::new(py);
        macro_rules! put {
            ($($f:ident),*) => { $( d.set_item(stringify!($f), s.$f)?; )* };
        }
        put!(
            page_size,
            live_bytes,
            used_bytes,
            freeing_bytes,
            reserved_bytes,
            free_bytes,
            peak_live,
            peak_used,
            peak_reserved,
            largest_free_run,
            fragmentation,
            largest_request,
            allocs,
            frees,
            failures,
            success_rate,
            reused,
            cache_hits,
            cached_allocs,
            stitched,
            live_allocs,
            pending_frees,
            pages_free,
            pages_heap,
            pages_large,
            pages_full,
            heap_free_bytes,
            large_free_bytes,
            pages_taken,
            pages_released,
            latency_samples,
            latency_mean_ns,
            latency_p50_ns,
            latency_p99_ns
        );
        let classes = PyList::empty(py);
        for (upper, count, bytes) in &s.live_by_size {
            classes.append((upper, count, bytes))?;
        }
        d.set_item("live_by_size", classes)?;
        Ok(d)
    }

    /// Pages and allocations, for pictures of fragmentation and for trace writers.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (pages, allocs, direct) = self.with(py, |p| {
            (
                p.page_snapshot(),
                p.allocations(),
                p.device().backend.direct_base(),
            )
        });
        let d = PyDict::new(py);
        let pl = PyList::empty(py);
        for pg in pages {
            let e = PyDict::new(py);
            e.set_item("address", direct + pg.addr)?;
            e.set_item("kind", pg.kind)?;
            e.set_item("blocks", pg.blocks)?;
            pl.append(e)?;
        }
        let al = PyList::empty(py);
        for a in allocs {
            let e = PyDict::new(py);
            e.set_item("ptr", a.ptr)?;
            e.set_item("size", a.size)?;
            e.set_item("rounded", a.rounded)?;
            e.set_item("stream", a.stream)?;
            e.set_item("state", if a.freeing { "freeing" } else { "live" })?;
            e.set_item("stitched", a.stitched)?;
            e.set_item("movable", a.movable)?;
            al.append(e)?;
        }
        d.set_item("pages", pl)?;
        d.set_item("allocations", al)?;
        Ok(d)
    }

    /// Recomputes every counter and checks every invariant; raises on the first broken one.
    fn validate(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |p| p.validate())
            .map_err(|m| Error::InvalidState(format!("pool invariant broken: {m}")))
            .py_err(py)
    }

    /// Frees everything, gives every page back, and refuses all later calls. Returns how many
    /// allocations were still live. Refused while an allocation has a live view.
    fn close(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |p| p.close()).py_err(py)
    }

    /// Opens a scope on this thread (see `MemoryPool.scope`).
    fn _enter_scope(&self, py: Python<'_>) -> PyResult<u32> {
        let s = self.with(py, |p| p.open_scope()).py_err(py)?;
        SCOPES.with(|v| v.borrow_mut().push((self.id, s)));
        OPEN_SCOPES.fetch_add(1, Ordering::Relaxed);
        Ok(s)
    }

    /// The live allocations made in an open scope, as new handles.
    fn _scope_allocations(&self, py: Python<'_>, scope: u32) -> PyResult<Vec<PyAllocation>> {
        let infos = self.with(py, |p| p.scope_allocations(scope)).py_err(py)?;
        Ok(infos.iter().map(|i| self.allocation(py, i)).collect())
    }

    /// Closes a scope: frees what it made that is still live; returns (allocations made,
    /// freed, [(ptr, size)] of those freed).
    fn _exit_scope(&self, py: Python<'_>, scope: u32) -> PyResult<ScopeResult> {
        SCOPES.with(|v| {
            let mut v = v.borrow_mut();
            if let Some(i) = v.iter().rposition(|&x| x == (self.id, scope)) {
                v.remove(i);
                OPEN_SCOPES.fetch_sub(1, Ordering::Relaxed);
            }
        });
        let r = self.with(py, |p| p.close_scope(scope)).py_err(py)?;
        let leaked = r.leaked.iter().map(|a| (a.ptr, a.size)).collect();
        Ok((r.allocs, r.freed, leaked))
    }

    fn __repr__(&self) -> String {
        let p = self.inner.lock();
        let s = p.stats();
        format!(
            "<gpumm.MemoryPool {} page_size={} live={} reserved={}{}>",
            p.device().backend.name(),
            format_size(s.page_size),
            format_size(s.live_bytes),
            format_size(s.reserved_bytes),
            if p.is_closed() { " closed" } else { "" }
        )
    }
}

/// Runs a free under the GIL when the pool lock is free and frees are quick (no scrub, no
/// pages to give back), else with the GIL released.
fn quick_or_detached<T: Send>(
    py: Python<'_>,
    core: &Core,
    op: impl FnOnce(&mut Pool) -> T + Send,
) -> T {
    let mut op = Some(op);
    let quick = core.quick(py, |p| {
        p.frees_are_quick().then(|| (op.take().expect("once"))(p))
    });
    match quick.flatten() {
        Some(r) => r,
        None => core.detached(py, op.take().expect("not run")),
    }
}

fn as_bytes(v: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding and every byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// A contiguous buffer of 64-bit integers (or a sequence of ints) as u64s; negatives refused.
pub(super) fn u64_buffer(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    use pyo3::buffer::PyUntypedBuffer;
    // One buffer request, its element type read from the format (asking for u64 and then
    // for i64 made a second request and an error object for every int64 array: about 1 µs
    // of a 1,024-size batch).
    if let Ok(b) = PyUntypedBuffer::get(obj) {
        let code = b.format().to_bytes().last().copied();
        match code {
            Some(b'Q' | b'L' | b'N') if b.item_size() == 8 => {
                return b.as_typed::<u64>()?.to_vec(py);
            }
            Some(b'q' | b'l' | b'n') if b.item_size() == 8 => {
                let v = b.as_typed::<i64>()?.to_vec(py)?;
                if let Some(&n) = v.iter().find(|&&x| x < 0) {
                    return Err(to_pyerr(
                        py,
                        Error::InvalidSize(format!("{what} holds a negative value {n}")),
                    ));
                }
                return Ok(v.into_iter().map(|x| x as u64).collect());
            }
            _ => {}
        }
    }
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        let mut out = Vec::new();
        for item in obj.try_iter()? {
            out.push(size_arg(py, &item?, what)?);
        }
        return Ok(out);
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be a contiguous int64/uint64 array or a list of ints, not {}",
        obj.get_type().name()?
    )))
}

// ------------------------------------------------------------------------------------------
// Allocation

/// Memory from a `MemoryPool`: `ptr`, `size`, `free()`; a context manager that frees on exit.
/// On the host backend its bytes are reachable without copies through the buffer protocol
/// (`memoryview(a)`, `numpy.asarray(a)`), `__array_interface__` and `__dlpack__`.
#[pyclass(module = "gpumm._core", name = "Allocation", frozen, weakref)]
pub struct PyAllocation {
    pool: CoreRef,
    pool_id: u64,
    has_bytes: bool,
    /// DLPack device type: kDLCUDA for device memory of a CUDA backend (exported with
    /// `__cuda_array_interface__`), kDLCUDAHost for pinned host memory, else kDLCPU.
    dl: i32,
    id: AllocId,
    ptr: AtomicU64,
    #[pyo3(get)]
    size: u64,
    #[pyo3(get)]
    stream: u64,
    #[pyo3(get)]
    movable: bool,
}

impl Recycled for PyAllocation {
    fn recycler() -> &'static Recycler {
        static KEPT: Recycler = Recycler::new();
        &KEPT
    }
}

impl PyAllocation {
    /// Another handle to the same allocation (same pool, id and address).
    fn clone_handle(&self, py: Python<'_>) -> PyAllocation {
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

    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T + Send) -> T {
        self.pool.detached(py, f)
    }

    /// The current address (a movable allocation may have been moved by `defrag`).
    fn current_ptr(&self, py: Python<'_>) -> PyResult<u64> {
        if self.movable {
            let info = self.with(py, |p| p.info(self.id)).py_err(py)?;
            self.ptr.store(info.ptr, Ordering::Relaxed);
        }
        Ok(self.ptr.load(Ordering::Relaxed))
    }

    fn bytes_or_raise(&self, py: Python<'_>) -> PyResult<u64> {
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

    fn pin(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |p| p.pin(self.id)).py_err(py)
    }

    fn unpin(&self) {
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
        self.with(py, |p| p.info(self.id).map(|i| i.freeing).unwrap_or(true))
    }

    /// Frees now, or stream-ordered on `stream` (returns the fence).
    #[pyo3(signature = (stream = None))]
    fn free(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
        let stream = stream.map(stream_arg).transpose()?;
        let op = |p: &mut Pool| match stream {
            None => p.free(self.id).map(|_| None),
            Some(s) => p.free_async(self.id, s).map(Some),
        };
        quick_or_detached(py, &self.pool, op).py_err(py)
    }

    /// Frees once the work queued on `stream` so far has finished (a CUDA event the pool
    /// polls, on the CUDA backend; at once elsewhere). `stream` may reuse the memory at once.
    fn free_when_done(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = stream_arg(stream)?;
        quick_or_detached(py, &self.pool, |p: &mut Pool| p.free_when_done(self.id, s)).py_err(py)
    }

    /// Writes zeros over the allocation (a no-op on a simulated device).
    fn zero(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |p| p.zero(self.id)).py_err(py)
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
        let r = self.with(py, |p| match p.info(self.id) {
            Ok(i) if !i.freeing => p.free(self.id),
            _ => Ok(()),
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
        let py = slf.py();
        let _ = (stream, max_version);
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

// ------------------------------------------------------------------------------------------
// DLPack (v0.8 layout, unversioned capsule "dltensor")

const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;
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
    let owner = ctx.owner;
    // The unpin and the reference's drop need the GIL (a quick call works on the core with
    // the GIL alone). A consumer may call this from any thread, and the interpreter may be
    // ending (a capsule or a numpy array in a module's globals is dropped then, with the GIL
    // held but the interpreter marked uninitialized: `Python::attach` panics there). Where
    // the GIL cannot be had, the allocation stays pinned and referenced: its memory stays
    // valid until the process ends.
    let mut owner = Some(owner);
    let release = |py: Python<'_>, o: Py<PyAllocation>| {
        o.get().unpin();
        o.drop_ref(py);
    };
    // SAFETY: PyGILState_Check may be called at any time, from any thread.
    if unsafe { ffi::PyGILState_Check() } == 1 {
        // SAFETY: this thread holds the GIL.
        let py = unsafe { Python::assume_attached() };
        release(py, owner.take().expect("once"));
    } else if Python::try_attach(|py| release(py, owner.take().expect("once"))).is_none() {
        std::mem::forget(owner.take());
    }
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBackend>()?;
    m.add_class::<PyPool>()?;
    m.add_class::<PyAllocation>()?;
    recycle::install::<PyAllocation>(m.py());
    m.add("GRANULE", alloc::GRANULE)?;
    m.add("DEFAULT_SMALL_THRESHOLD", alloc::DEFAULT_SMALL_THRESHOLD)?;
    Ok(())
}
