//! The PMM for Python: `Pmm` (one core `Pmm` behind a lock), the `Chunk` handles it gives
//! out, and `Eviction`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::{chunk_type_arg, size_arg, sizes_arg};
use super::errors::{to_pyerr, IntoPy};
use super::gil::{self, Access};
use super::recycle;
use crate::error::Error;
use crate::pmm::{self, ChunkId, ChunkInfo, ChunkState, ChunkType, RootList};
use crate::units;

static NEXT_PMM_ID: AtomicU64 = AtomicU64::new(1);

type Shared = Arc<Mutex<pmm::Pmm>>;

/// The physical memory manager of one simulated device. See `gpumm.Pmm` for the Python
/// constructor that reads the architecture table.
#[pyclass(module = "gpumm._core", name = "Pmm", subclass, frozen)]
pub struct PyPmm {
    pub(super) inner: Shared,
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
        let access = if evict {
            Access::Detached
        } else {
            Access::Quick
        };
        let info = gil::run(py, &*self.inner, access, call).py_err(py)?;
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
        let infos = gil::run(py, &*self.inner, Access::Detached, |p| {
            let ids = p.alloc_chunks(count, size, t, evict)?;
            p.infos(&ids)
        })
        .py_err(py)?;
        self.chunks(py, &infos)
    }

    /// Frees a chunk (merging up the tree while parents empty).
    fn free(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        let id = self.own(py, chunk.get(), true)?;
        gil::run(py, &*self.inner, Access::Quick, |p| p.free(id)).py_err(py)
    }

    /// Frees several chunks in one call: all, or (if any cannot be freed) none.
    fn free_chunks(&self, py: Python<'_>, chunks: Vec<Bound<'_, PyChunk>>) -> PyResult<()> {
        let ids = chunks
            .iter()
            .map(|c| self.own(py, c.get(), true))
            .collect::<PyResult<Vec<_>>>()?;
        gil::run(py, &*self.inner, Access::Detached, |p| p.free_chunks(&ids)).py_err(py)
    }

    /// temp_pinned -> allocated: the chunk becomes evictable with its root.
    fn unpin(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        let id = self.own(py, chunk.get(), false)?;
        gil::run(py, &*self.inner, Access::Detached, |p| p.unpin(id)).py_err(py)
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
        let infos = gil::run(py, &*self.inner, Access::Detached, |p| {
            let kids = p.split(id, child_size)?;
            p.infos(&kids)
        })
        .py_err(py)?;
        self.chunks(py, &infos)
    }

    /// Merges a split chunk whose children are all allocated leaves in one state.
    fn merge(&self, py: Python<'_>, chunk: &Bound<'_, PyChunk>) -> PyResult<()> {
        let id = self.own(py, chunk.get(), false)?;
        gil::run(py, &*self.inner, Access::Detached, |p| p.merge(id)).py_err(py)
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
        let ev = gil::run(py, &*self.inner, Access::Detached, |p| p.evict_root()).py_err(py)?;
        self.eviction(py, &ev)
    }

    /// Starts evicting a root chunk; move the listed chunks' data, then `end_eviction`.
    fn begin_eviction(&self, py: Python<'_>) -> PyResult<PyEviction> {
        let ev = gil::run(py, &*self.inner, Access::Detached, |p| p.begin_eviction()).py_err(py)?;
        self.eviction(py, &ev)
    }

    fn end_eviction(&self, py: Python<'_>, eviction: &Bound<'_, PyEviction>) -> PyResult<()> {
        let r = eviction.get().root_index;
        let chunks = &eviction.get().chunks;
        if let Some(c) = chunks.first() {
            self.own(py, c.get(), false)?;
        }
        gil::run(py, &*self.inner, Access::Detached, |p| p.end_eviction(r)).py_err(py)
    }

    /// Chunks evicted by allocations made with `evict=True` since the last call.
    fn take_evicted(&self, py: Python<'_>) -> PyResult<Vec<Py<PyChunk>>> {
        let infos = gil::run(py, &*self.inner, Access::Detached, |p| p.take_evicted());
        self.chunks(py, &infos)
    }

    /// Gives every cached free root back to the device; returns how many.
    fn release_free_roots(&self, py: Python<'_>) -> u64 {
        gil::run(py, &*self.inner, Access::Detached, |p| {
            p.release_free_roots()
        })
    }

    /// Every allocated chunk, in address order.
    fn allocated_chunks(&self, py: Python<'_>) -> PyResult<Vec<Py<PyChunk>>> {
        let infos = gil::run(py, &*self.inner, Access::Detached, |p| p.allocated_chunks());
        self.chunks(py, &infos)
    }

    /// Recomputes every counter and cross-checks every list and tree; raises
    /// `InvalidStateError` naming the first broken invariant.
    fn validate(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &*self.inner, Access::Detached, |p| p.validate())
            .map_err(|m| Error::InvalidState(format!("PMM invariant broken: {m}")))
            .py_err(py)
    }

    /// Counters as a dict (cheap: no walk of the trees).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, user, kernel) = gil::run(py, &*self.inner, Access::Detached, |p| {
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
        gil::run(py, &*self.inner, Access::Detached, |p| {
            p.mark_root(id, list)
        })
        .py_err(py)
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
