//! `Pool`, the core of `gpumm.MemoryPool`: one core `Pool` behind one lock (`gil::Core`),
//! reached through `gil::run`. Allocations, frees and small batches take the quick path
//! (under the GIL, without releasing it, when that needs no wait); every other call
//! releases the GIL while it works (see `gil.rs`). Scopes are kept per thread.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use numpy::PyArray1;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::allocation::PyAllocation;
use super::args::{as_bytes, opt_size, size_arg, stream_arg};
// (the replay binding reads its arrays with it)
pub(super) use super::args::u64_buffer;
use super::backend::PyBackend;
use super::dlpack::{DL_CPU, DL_CUDA, DL_CUDA_HOST};
use super::errors::{to_pyerr, IntoPy};
use super::gil::{self, Access, Core, CoreRef, Guarded};
use super::pmm::PyPmm;
use super::recycle;
use super::reports;
use crate::alloc::{self, AllocId, AllocInfo, Device, Pool, PoolConfig, Request};
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

/// (allocations made, freed by the scope, [(ptr, size)] of those freed)
type ScopeResult = (u64, u64, Vec<(u64, u64)>);

/// The core of `gpumm.MemoryPool`: an allocator over the pages of one device.
#[pyclass(module = "gpumm._core", name = "Pool", subclass, frozen)]
pub struct PyPool {
    inner: Arc<Core>,
    id: u64,
    has_bytes: bool,
    /// DLPack device type of its memory: kDLCPU, kDLCUDA or kDLCUDAHost (pinned).
    dl: i32,
    on_failure: Option<Py<PyAny>>,
    tracking: AtomicBool,
}

impl PyPool {
    /// The core, shared (for the C functions of `capi`).
    pub(super) fn shared(&self) -> Arc<Core> {
        self.inner.clone()
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
        gil::run(py, &*self.inner, Access::Bounded(sizes.len()), |p| {
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
        let quick = this.inner.now(py, |p| p.try_alloc_quick(req)).flatten();
        match quick {
            Some(Ok((id, ptr))) => return made(id, ptr),
            Some(Err(e)) => return Err(to_pyerr(py, e)),
            None => {}
        }
        let mut tries = 0;
        loop {
            match gil::run(py, &*this.inner, Access::Detached, |p| p.alloc(req)) {
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
        gil::run(py, &*self.inner, Access::QuickIf(Pool::frees_are_quick), op).py_err(py)
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
        gil::run(py, &*self.inner, Access::Bounded(ptrs.len()), |p| {
            p.free_batch(&ptrs)
        })
        .py_err(py)
    }

    /// Fence `fence` completed: the stream-ordered frees before it are done. Returns how
    /// many allocations became free.
    fn complete(&self, py: Python<'_>, fence: u64) -> PyResult<u64> {
        gil::run(py, &*self.inner, Access::Detached, |p| p.complete(fence)).py_err(py)
    }

    /// Completes the stream-ordered frees whose CUDA event has been reached (the pool also
    /// does this before it grows). Returns how many allocations became free.
    fn poll(&self, py: Python<'_>) -> u64 {
        gil::run(py, &*self.inner, Access::Detached, |p| p.poll())
    }

    /// Completes every pending free on `stream` (every stream if None).
    #[pyo3(signature = (stream = None))]
    fn synchronize(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<u64> {
        gil::run(py, &*self.inner, Access::Detached, |p| {
            p.synchronize(stream)
        })
        .py_err(py)
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
        let r = gil::run(py, &*self.inner, Access::Detached, |p| p.defrag()).py_err(py)?;
        reports::defrag(py, &r)
    }

    /// What `defrag()` would do now, changing nothing: its report as it would be (the keys of
    /// `defrag()`), `pages_freed` (whole pages free afterwards that are not free now) and
    /// `movable_heap_pages` (heap pages whose every allocation may move).
    fn defrag_plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let plan = gil::run(py, &*self.inner, Access::Detached, |p| p.defrag_plan()).py_err(py)?;
        let d = reports::defrag(py, &plan.report)?;
        d.set_item("pages_freed", plan.pages_freed)?;
        d.set_item("movable_heap_pages", plan.movable_heap_pages)?;
        Ok(d)
    }

    /// Gives free pages back to the device until at most `keep` bytes of them stay.
    #[pyo3(signature = (keep = None))]
    fn trim(&self, py: Python<'_>, keep: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        let keep = opt_size(py, keep, "keep")?.unwrap_or(0);
        gil::run(py, &*self.inner, Access::Detached, |p| p.trim(keep)).py_err(py)
    }

    /// Live and freeing allocations as new `Allocation` handles.
    fn allocations(&self, py: Python<'_>) -> PyResult<Vec<PyAllocation>> {
        let infos = gil::run(py, &*self.inner, Access::Detached, |p| p.allocations());
        Ok(infos.iter().map(|i| self.allocation(py, i)).collect())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = gil::run(py, &*self.inner, Access::Detached, |p| p.stats());
        let d = reports::pool_stats(py, &s)?;
        // (steps served from a plan: rust/alloc/step.rs)
        for (k, v) in [
            ("plan_hits", s.plan_hits),
            ("plan_misses", s.plan_misses),
            ("plan_rebuilds", s.plan_rebuilds),
            ("plan_arena_bytes", s.plan_arena_bytes),
            ("plan_bound_bytes", s.plan_bound_bytes),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Opens a step (see `MemoryPool.step`): its requests are recorded, or served from the
    /// plan made from the recorded ones.
    fn _step_begin(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &*self.inner, Access::Quick, |p| p.step_begin()).py_err(py)
    }

    /// Closes the step; the last recorded step is planned here (its arena taken).
    fn _step_end(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &*self.inner, Access::Detached, |p| p.step_end()).py_err(py)
    }

    /// How many steps are recorded before the first plan (default 2; set before the first
    /// step).
    fn set_step_recording(&self, py: Python<'_>, steps: u32) -> PyResult<()> {
        gil::run(py, &*self.inner, Access::Quick, |p| {
            p.set_step_recording(steps)
        })
        .py_err(py)
    }

    /// `alloc` returning the int pointer, without an `Allocation` object (free it with
    /// `free_raw` or `free`): for hot loops, such as steps served from a plan, where making
    /// the object costs more than the allocation. No `on_failure` retry, no tag.
    #[pyo3(signature = (nbytes, stream = 0))]
    fn alloc_raw(&self, py: Python<'_>, nbytes: &Bound<'_, PyAny>, stream: u64) -> PyResult<u64> {
        let req = Request {
            size: size_arg(py, nbytes, "nbytes")?,
            stream,
            movable: false,
            scope: current_scope(self.id),
        };
        let r = match self.inner.now(py, |p| p.try_alloc_quick(req)).flatten() {
            Some(r) => r,
            None => gil::run(py, &*self.inner, Access::Detached, |p| p.alloc(req)),
        };
        r.map(|(_, ptr)| ptr).py_err(py)
    }

    /// Frees the allocation at int pointer `ptr` (from `alloc_raw`, or any other).
    fn free_raw(&self, py: Python<'_>, ptr: u64) -> PyResult<()> {
        let op = |p: &mut Pool| p.id_of(ptr).and_then(|id| p.free(id));
        gil::run(py, &*self.inner, Access::QuickIf(Pool::frees_are_quick), op).py_err(py)
    }

    /// Pages and allocations, for pictures of fragmentation and for trace writers.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (pages, allocs, direct) = gil::run(py, &*self.inner, Access::Detached, |p| {
            (
                p.page_snapshot(),
                p.allocations(),
                p.device().backend.direct_base(),
            )
        });
        reports::snapshot(py, &pages, &allocs, direct)
    }

    /// Recomputes every counter and checks every invariant; raises on the first broken one.
    fn validate(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &*self.inner, Access::Detached, |p| p.validate())
            .map_err(|m| Error::InvalidState(format!("pool invariant broken: {m}")))
            .py_err(py)
    }

    /// Frees everything, gives every page back, and refuses all later calls. Returns how many
    /// allocations were still live. Refused while an allocation has a live view.
    fn close(&self, py: Python<'_>) -> PyResult<u64> {
        gil::run(py, &*self.inner, Access::Detached, |p| p.close()).py_err(py)
    }

    /// Opens a scope on this thread (see `MemoryPool.scope`).
    fn _enter_scope(&self, py: Python<'_>) -> PyResult<u32> {
        let s = gil::run(py, &*self.inner, Access::Detached, |p| p.open_scope()).py_err(py)?;
        SCOPES.with(|v| v.borrow_mut().push((self.id, s)));
        OPEN_SCOPES.fetch_add(1, Ordering::Relaxed);
        Ok(s)
    }

    /// The live allocations made in an open scope, as new handles.
    fn _scope_allocations(&self, py: Python<'_>, scope: u32) -> PyResult<Vec<PyAllocation>> {
        let infos = gil::run(py, &*self.inner, Access::Detached, |p| {
            p.scope_allocations(scope)
        })
        .py_err(py)?;
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
        let r =
            gil::run(py, &*self.inner, Access::Detached, |p| p.close_scope(scope)).py_err(py)?;
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBackend>()?;
    m.add_class::<PyPool>()?;
    m.add_class::<PyAllocation>()?;
    recycle::install::<PyAllocation>(m.py());
    m.add("GRANULE", alloc::GRANULE)?;
    m.add("DEFAULT_SMALL_THRESHOLD", alloc::DEFAULT_SMALL_THRESHOLD)?;
    Ok(())
}
