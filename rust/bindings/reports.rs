//! The core's reports as Python dicts: pool stats, page snapshots, defrag reports.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::alloc::{AllocInfo, DefragReport, PageSnapshot, PoolStats};

/// `Pool.defrag`'s report.
pub(super) fn defrag<'py>(py: Python<'py>, r: &DefragReport) -> PyResult<Bound<'py, PyDict>> {
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

/// `Pool.stats`'s dict.
pub(super) fn pool_stats<'py>(py: Python<'py>, s: &PoolStats) -> PyResult<Bound<'py, PyDict>> {
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

/// `Pool.snapshot`'s dict: pages (at their device addresses, `direct` the backend's direct
/// map) and allocations.
pub(super) fn snapshot<'py>(
    py: Python<'py>,
    pages: &[PageSnapshot],
    allocs: &[AllocInfo],
    direct: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let pl = PyList::empty(py);
    for pg in pages {
        let e = PyDict::new(py);
        e.set_item("address", direct + pg.addr)?;
        e.set_item("kind", pg.kind)?;
        e.set_item("blocks", &pg.blocks)?;
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
