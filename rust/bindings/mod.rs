//! The PyO3 boundary: argument conversion, GIL release, error mapping. Nothing here decides
//! anything about memory; every operation is one call into the core under one lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use crate::error::Error;
use crate::pmm::{self, ChunkId, ChunkInfo, ChunkState, ChunkType, RootList};
use crate::units;

mod capi;
mod pool;
mod recycle;
mod replay;
mod traces;
mod uvm;

// ------------------------------------------------------------------------------------------
// Errors: one conversion, to the classes defined in python/gpumm/errors.py.

fn to_pyerr(py: Python<'_>, e: Error) -> PyErr {
    let class = py.import("gpumm.errors").and_then(|m| m.getattr(e.kind()));
    match class {
        Ok(cls) => match cls.call1((e.message(),)) {
            Ok(exc) => PyErr::from_value(exc),
            Err(err) => err,
        },
        Err(err) => err,
    }
}

trait IntoPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for crate::error::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e))
    }
}

// ------------------------------------------------------------------------------------------
// Argument conversion

/// A size given as a non-negative int (or an integer of another type, like numpy's: its
/// `__index__`) or a string like "64KiB".
fn size_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int or a size string, not bool"
        )));
    }
    if obj.is_instance_of::<PyInt>() {
        // the common case first: a non-negative int that fits (no 128-bit conversion)
        if let Ok(v) = obj.extract::<u64>() {
            return Ok(v);
        }
        let v: i128 = obj
            .extract()
            .map_err(|_| to_pyerr(py, Error::InvalidSize(format!("{what} is too large"))))?;
        if v < 0 {
            return Err(to_pyerr(
                py,
                Error::InvalidSize(format!("{what} must not be negative, got {v}")),
            ));
        }
        return u64::try_from(v)
            .map_err(|_| to_pyerr(py, Error::InvalidSize(format!("{what} {v} is too large"))));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return units::parse_size(&s.to_cow()?).py_err(py);
    }
    // an integer of another type (numpy's int64, ...): its `__index__`, as `operator.index`
    if !obj.is_instance_of::<PyFloat>() && obj.hasattr("__index__")? {
        let v = obj.call_method0("__index__")?;
        if v.is_instance_of::<PyInt>() {
            return size_arg(py, &v, what);
        }
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be an int or a size string like '64KiB', not {}",
        obj.get_type().name()?
    )))
}

fn chunk_type_arg(py: Python<'_>, name: &str) -> PyResult<ChunkType> {
    ChunkType::from_name(name).py_err(py)
}

#[pyfunction]
#[pyo3(name = "parse_size")]
fn py_parse_size(py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<u64> {
    size_arg(py, size, "size")
}

#[pyfunction]
#[pyo3(name = "format_size")]
fn py_format_size(nbytes: u64) -> String {
    units::format_size(nbytes)
}

// ------------------------------------------------------------------------------------------
// Pmm

static NEXT_PMM_ID: AtomicU64 = AtomicU64::new(1);

type Shared = Arc<Mutex<pmm::Pmm>>;

/// The physical memory manager of one simulated device. See `gpumm.Pmm` for the Python
/// constructor that reads the architecture table.
#[pyclass(module = "gpumm._core", name = "Pmm", subclass, frozen)]
pub struct PyPmm {
    inner: Shared,
    id: u64,
}

/// A chunk handed out by a `Pmm`: its address, size and type never change; its state is read
/// from the PMM each time.
#[pyclass(module = "gpumm._core", name = "Chunk", frozen)]
pub struct PyChunk {
    pmm: Shared,
    pmm_id: u64,
    id: ChunkId,
    #[pyo3(get)]
    address: u64,
    #[pyo3(get)]
    size: u64,
    ctype: ChunkType,
}

impl recycle::Recycled for PyChunk {
    fn recycler() -> &'static recycle::Recycler {
        static KEPT: recycle::Recycler = recycle::Recycler::new();
        &KEPT
    }
}

/// A root chunk in eviction: the chunks whose data must move before `end_eviction`.
#[pyclass(module = "gpumm._core", name = "Eviction", frozen)]
pub struct PyEviction {
    #[pyo3(get)]
    root_index: u32,
    #[pyo3(get)]
    root_address: u64,
    #[pyo3(get)]
    chunks: Vec<Py<PyChunk>>,
}

impl PyPmm {
    /// Runs `f` on the core under its lock with the GIL released: the one path every
    /// operation takes, so none forgets to let other Python threads run.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut pmm::Pmm) -> T + Send) -> T {
        let inner = &self.inner;
        py.detach(|| f(&mut inner.lock()))
    }

    /// `with` for a call whose work is bounded and short (one chunk, no eviction): under the
    /// GIL when the lock is free, since releasing and taking back the GIL costs more than the
    /// call (the pool's quick path; docs/design.md).
    fn quick<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut pmm::Pmm) -> T + Send) -> T {
        match self.inner.try_lock() {
            Some(mut p) => f(&mut p),
            None => self.with(py, f),
        }
    }

    fn chunk(&self, info: &ChunkInfo) -> PyChunk {
        PyChunk {
            pmm: self.inner.clone(),
            pmm_id: self.id,
            id: info.id,
            address: info.addr,
            size: info.size,
            ctype: info.ctype,
        }
    }

    fn chunks(&self, py: Python<'_>, infos: &[ChunkInfo]) -> PyResult<Vec<Py<PyChunk>>> {
        infos.iter().map(|i| Py::new(py, self.chunk(i))).collect()
    }

    fn own(&self, py: Python<'_>, chunk: &PyChunk, free: bool) -> PyResult<ChunkId> {
        if chunk.pmm_id != self.id {
            let msg = format!("chunk {:#x} belongs to another Pmm", chunk.address);
            let e = if free {
                Error::InvalidFree(msg)
            } else {
                Error::InvalidHandle(msg)
            };
            return Err(to_pyerr(py, e));
        }
        Ok(chunk.id)
    }

    fn eviction(&self, py: Python<'_>, ev: &pmm::Eviction) -> PyResult<PyEviction> {
        Ok(PyEviction {
            root_index: ev.root_index,
            root_address: ev.root_addr,
            chunks: self.chunks(py, &ev.chunks)?,
        })
    }
}

fn sizes_arg(py: Python<'_>, sizes: &Bound<'_, PyAny>, what: &str) -> PyResult<pmm::SizeMask> {
    let mut out = Vec::new();
    for item in sizes.try_iter()? {
        out.push(size_arg(py, &item?, what)?);
    }
    pmm::SizeMask::from_sizes(&out).py_err(py)
}

#[pymethods]
impl PyPmm {
    #[new]
    #[pyo3(signature = (vidmem, user_sizes, kernel_sizes, *, release_free_roots = false, check = false))]
    fn py_new(
        py: Python<'_>,
        vidmem: &Bound<'_, PyAny>,
        user_sizes: &Bound<'_, PyAny>,
        kernel_sizes: &Bound<'_, PyAny>,
        release_free_roots: bool,
        check: bool,
    ) -> PyResult<Self> {
        let vidmem = size_arg(py, vidmem, "vidmem")?;
        let mut config = pmm::PmmConfig::new(
            vidmem,
            sizes_arg(py, user_sizes, "user chunk size")?,
            sizes_arg(py, kernel_sizes, "kernel chunk size")?,
        );
        config.release_free_roots = release_free_roots;
        config.check = check;
        let core = py.detach(|| pmm::Pmm::new(config)).py_err(py)?;
        Ok(PyPmm {
            inner: Arc::new(Mutex::new(core)),
            id: NEXT_PMM_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Vidmem managed, in bytes.
    #[getter]
    fn vidmem(&self) -> u64 {
        self.inner.lock().config().vidmem
    }

    #[getter]
    fn num_roots(&self) -> u32 {
        self.inner.lock().num_roots()
    }

    #[getter]
    fn user_sizes(&self) -> Vec<u64> {
        self.inner.lock().config().user_sizes.sizes()
    }

    #[getter]
    fn kernel_sizes(&self) -> Vec<u64> {
        self.inner.lock().config().kernel_sizes.sizes()
    }

    /// Allocates one chunk of `size` bytes (a size in the type's mask).
    #[pyo3(signature = (size, r#type = "user", *, evict = false))]
    fn alloc_chunk(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        r#type: &str,
        evict: bool,
    ) -> PyResult<PyChunk> {
        let size = size_arg(py, size, "size")?;
        let t = chunk_type_arg(py, r#type)?;
        let call = |p: &mut pmm::Pmm| p.alloc_chunk(size, t, evict).and_then(|id| p.info(id));
        let info = if evict {
            self.with(py, call)
        } else {
            self.quick(py, call)
        }
        .py_err(py)?;
        Ok(self.chunk(&info))
    }

    /// Allocates `count` chunks of one size in one call: all, or none and nothing changed.
    #[pyo3(signature = (count, size, r#type = "user", *, evict = false))]
    fn alloc_chunks(
        &self,
        py: Python<'_>,
        count: usize,
        size: &Bound<'_, PyAny>,
        r#type: &str,
        evict: bool,
    ) -> PyResult<Vec<Py<PyChunk>>> {
        let size = size_arg(py, size, "size")?;
        let t = chunk_type_arg(py, r#type)?;
        let infos = self
            .with(py, |p| {
                let ids = p.alloc_chunks(count, size, t, evict)?;
                p.infos(&ids)
            })
            .py_err(py)?;
        self.chunks(py, &infos)
    }

    /// Frees a chunk (merging up the tree while parents empty).
    fn free(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        let id = self.own(py, chunk.get(), true)?;
        self.quick(py, |p| p.free(id)).py_err(py)
    }

    /// Frees several chunks in one call: all, or (if any cannot be freed) none.
    fn free_chunks(&self, py: Python<'_>, chunks: Vec<Bound<'_, PyChunk>>) -> PyResult<()> {
        let ids = chunks
            .iter()
            .map(|c| self.own(py, c.get(), true))
            .collect::<PyResult<Vec<_>>>()?;
        self.with(py, |p| p.free_chunks(&ids)).py_err(py)
    }

    /// temp_pinned -> allocated: the chunk becomes evictable with its root.
    fn unpin(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        let id = self.own(py, chunk.get(), false)?;
        self.with(py, |p| p.unpin(id)).py_err(py)
    }

    /// Splits an allocated chunk in place into children of `child_size` (default: the next
    /// smaller size in its mask); returns the children in address order.
    #[pyo3(signature = (chunk, child_size = None))]
    fn split(
        &self,
        py: Python<'_>,
        chunk: &Bound<'_, PyChunk>,
        child_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Py<PyChunk>>> {
        let id = self.own(py, chunk.get(), false)?;
        let child_size = child_size
            .map(|c| size_arg(py, c, "child_size"))
            .transpose()?;
        let infos = self
            .with(py, |p| {
                let kids = p.split(id, child_size)?;
                p.infos(&kids)
            })
            .py_err(py)?;
        self.chunks(py, &infos)
    }

    /// Merges a split chunk whose children are all allocated leaves in one state.
    fn merge(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        let id = self.own(py, chunk.get(), false)?;
        self.with(py, |p| p.merge(id)).py_err(py)
    }

    fn mark_root_used(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        self.mark(py, chunk, RootList::Used)
    }

    fn mark_root_unused(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        self.mark(py, chunk, RootList::Unused)
    }

    fn mark_root_discarded(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        self.mark(py, chunk, RootList::Discarded)
    }

    /// Evicts one root chunk in one step; returns what was evicted.
    fn evict_root(&self, py: Python<'_>) -> PyResult<PyEviction> {
        let ev = self.with(py, |p| p.evict_root()).py_err(py)?;
        self.eviction(py, &ev)
    }

    /// Starts evicting a root chunk; move the listed chunks' data, then `end_eviction`.
    fn begin_eviction(&self, py: Python<'_>) -> PyResult<PyEviction> {
        let ev = self.with(py, |p| p.begin_eviction()).py_err(py)?;
        self.eviction(py, &ev)
    }

    fn end_eviction(&self, py: Python<'_>, eviction: &Bound<'_, PyEviction>) -> PyResult<()> {
        let r = eviction.get().root_index;
        let chunks = &eviction.get().chunks;
        if let Some(c) = chunks.first() {
            self.own(py, c.get(), false)?;
        }
        self.with(py, |p| p.end_eviction(r)).py_err(py)
    }

    /// Chunks evicted by allocations made with `evict=True` since the last call.
    fn take_evicted(&self, py: Python<'_>) -> PyResult<Vec<Py<PyChunk>>> {
        let infos = self.with(py, |p| p.take_evicted());
        self.chunks(py, &infos)
    }

    /// Gives every cached free root back to the device; returns how many.
    fn release_free_roots(&self, py: Python<'_>) -> u64 {
        self.with(py, |p| p.release_free_roots())
    }

    /// Every allocated chunk, in address order.
    fn allocated_chunks(&self, py: Python<'_>) -> PyResult<Vec<Py<PyChunk>>> {
        let infos = self.with(py, |p| p.allocated_chunks());
        self.chunks(py, &infos)
    }

    /// Recomputes every counter and cross-checks every list and tree; raises
    /// `InvalidStateError` naming the first broken invariant.
    fn validate(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |p| p.validate())
            .map_err(|m| Error::InvalidState(format!("PMM invariant broken: {m}")))
            .py_err(py)
    }

    /// Counters as a dict (cheap: no walk of the trees).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, user, kernel) = self.with(py, |p| {
            (
                p.stats(),
                p.size_mask(ChunkType::User).sizes(),
                p.size_mask(ChunkType::Kernel).sizes(),
            )
        });
        stats_dict(py, &s, &user, &kernel)
    }

    fn __repr__(&self) -> String {
        let p = self.inner.lock();
        let s = p.stats();
        format!(
            "<gpumm.Pmm vidmem={} reserved={} allocated={} free={}>",
            units::format_size(s.vidmem),
            units::format_size(s.reserved_bytes()),
            units::format_size(s.allocated_bytes),
            units::format_size(s.free_bytes)
        )
    }
}

impl PyPmm {
    fn mark(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>, list: RootList) -> PyResult<()> {
        let id = self.own(py, chunk.get(), false)?;
        self.with(py, |p| p.mark_root(id, list)).py_err(py)
    }
}

fn stats_dict<'py>(
    py: Python<'py>,
    s: &pmm::PmmStats,
    user: &[u64],
    kernel: &[u64],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("vidmem", s.vidmem)?;
    d.set_item("num_roots", s.num_roots)?;
    d.set_item("roots_pma_owned", s.roots_pma_owned)?;
    d.set_item("roots_free", s.roots_free)?;
    d.set_item("reserved_bytes", s.reserved_bytes())?;
    d.set_item("free_bytes", s.free_bytes)?;
    d.set_item("allocated_bytes", s.allocated_bytes)?;
    d.set_item("pinned_bytes", s.pinned_bytes)?;
    d.set_item("pinned_chunks", s.pinned_chunks)?;
    d.set_item("largest_free_chunk", s.largest_free_chunk)?;
    d.set_item("roots_in_eviction", s.roots_in_eviction)?;
    let lists = PyDict::new(py);
    for l in RootList::ALL {
        lists.set_item(l.name(), s.root_list_len[l as usize])?;
    }
    d.set_item("root_lists", lists)?;
    let free_by_size = PyDict::new(py);
    for (o, &b) in s.free_bytes_by_order.iter().enumerate() {
        if b > 0 {
            free_by_size.set_item(1u64 << (o as u32 + pmm::MIN_CHUNK_SHIFT), b)?;
        }
    }
    d.set_item("free_bytes_by_size", free_by_size)?;
    let chunks = PyDict::new(py);
    for (t, sizes) in [(ChunkType::User, user), (ChunkType::Kernel, kernel)] {
        let by_size = PyDict::new(py);
        for &size in sizes {
            let o = (size.trailing_zeros() - pmm::MIN_CHUNK_SHIFT) as usize;
            let by_state = PyDict::new(py);
            for st in ChunkState::ALL.iter().skip(1) {
                by_state.set_item(st.name(), s.chunks[t as usize][o][*st as usize])?;
            }
            by_size.set_item(size, by_state)?;
        }
        chunks.set_item(t.name(), by_size)?;
    }
    d.set_item("chunks", chunks)?;
    let c = &s.counters;
    let counters = PyDict::new(py);
    for (k, v) in [
        ("chunk_allocs", c.chunk_allocs),
        ("chunk_frees", c.chunk_frees),
        ("splits", c.splits),
        ("merges", c.merges),
        ("roots_taken", c.roots_taken),
        ("roots_released", c.roots_released),
        ("evictions", c.evictions),
        ("failed_allocs", c.failed_allocs),
    ] {
        counters.set_item(k, v)?;
    }
    d.set_item("counters", counters)?;
    Ok(d)
}

#[pymethods]
impl PyChunk {
    /// "user" or "kernel".
    #[getter]
    fn r#type(&self) -> &'static str {
        self.ctype.name()
    }

    /// The chunk's state now: "free", "is_split", "temp_pinned", "allocated", or "freed" once
    /// the handle no longer names a live chunk.
    #[getter]
    fn state(&self) -> &'static str {
        match self.pmm.lock().info(self.id) {
            Ok(i) => i.state.name(),
            Err(_) => "freed",
        }
    }

    /// Whether the chunk's memory is known to be zero.
    #[getter]
    fn is_zero(&self) -> bool {
        self.pmm
            .lock()
            .info(self.id)
            .map(|i| i.is_zero)
            .unwrap_or(false)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyChunk>() {
            Ok(o) => {
                let o = o.get();
                o.pmm_id == self.pmm_id && o.id == self.id
            }
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        self.id.to_bits() ^ self.pmm_id.rotate_left(48)
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpumm.Chunk {} {} at {:#x} {}>",
            self.ctype.name(),
            units::format_size(self.size),
            self.address,
            self.state()
        )
    }
}

#[pymethods]
impl PyEviction {
    fn __repr__(&self) -> String {
        format!(
            "<gpumm.Eviction root {} at {:#x}, {} chunk(s)>",
            self.root_index,
            self.root_address,
            self.chunks.len()
        )
    }
}

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPmm>()?;
    m.add_class::<PyChunk>()?;
    recycle::install::<PyChunk>(m.py());
    m.add_class::<PyEviction>()?;
    pool::register(m)?;
    m.add_function(wrap_pyfunction!(capi::_set_c_pool, m)?)?;
    replay::register(m)?;
    traces::register(m)?;
    uvm::register(m)?;
    m.add_function(wrap_pyfunction!(py_parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(py_format_size, m)?)?;
    m.add("ROOT_CHUNK_SIZE", pmm::ROOT_CHUNK_SIZE)?;
    m.add("MAX_VIDMEM", pmm::MAX_VIDMEM)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
