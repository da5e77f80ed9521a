//! The unified-memory model for Python: one `Uvm` behind a lock, the GIL released while it
//! simulates.

use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::gil::{self, Access};
use super::{size_arg, to_pyerr, IntoPy};
use crate::error::Error;
use crate::uvm::{self, Advice, Costs, Kernel, Pattern, Processor, ReplayPolicy, Stats, UvmConfig};

fn processor(py: Python<'_>, name: &str) -> PyResult<Processor> {
    match name {
        "gpu" => Ok(Processor::Gpu),
        "cpu" => Ok(Processor::Cpu),
        other => Err(to_pyerr(
            py,
            Error::InvalidArgument(format!(
                "unknown processor {other:?}; expected 'gpu' or 'cpu'"
            )),
        )),
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("estimated_time_s", s.time_ns / 1e9)?;
    d.set_item("accesses", s.accesses)?;
    d.set_item("faults", s.faults)?;
    d.set_item("cpu_faults", s.cpu_faults)?;
    d.set_item("batches", s.batches)?;
    d.set_item("replays", s.replays)?;
    d.set_item("bytes_h2d", s.bytes_h2d)?;
    d.set_item("bytes_d2h", s.bytes_d2h)?;
    d.set_item("remote_bytes", s.remote_bytes)?;
    d.set_item("hbm_bytes", s.hbm_bytes)?;
    d.set_item("prefetched_pages", s.prefetched_pages)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("thrashing_pages", s.thrashing_pages)?;
    d.set_item("throttles", s.throttles)?;
    d.set_item("pins", s.pins)?;
    Ok(d)
}

/// The unified-memory model (see `gpumm.uvm` for the friendly front end).
#[pyclass(module = "gpumm._core", name = "Uvm", frozen)]
pub struct PyUvm {
    inner: Mutex<uvm::Uvm>,
}

#[pymethods]
impl PyUvm {
    /// `costs` overrides named costs (`hbm_bw`, `link_bw`, `fault_ns`...); `replay` is
    /// "batch" (default), "block" or "once".
    #[new]
    #[pyo3(signature = (vidmem, hbm_bw, link_bw, *, prefetch = true, thrashing = true,
        fault_batch = 256, replay = "batch", prefetch_threshold = 51, seed = 0, costs = None,
        check = false))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        vidmem: &Bound<'_, PyAny>,
        hbm_bw: f64,
        link_bw: f64,
        prefetch: bool,
        thrashing: bool,
        fault_batch: usize,
        replay: &str,
        prefetch_threshold: u32,
        seed: u64,
        costs: Option<&Bound<'_, PyDict>>,
        check: bool,
    ) -> PyResult<Self> {
        let vidmem = size_arg(py, vidmem, "vidmem")?;
        if hbm_bw <= 0.0 || link_bw <= 0.0 {
            return Err(to_pyerr(
                py,
                Error::InvalidArgument("bandwidths must be positive".into()),
            ));
        }
        let mut c = Costs::new(hbm_bw, link_bw);
        if let Some(d) = costs {
            for (k, v) in d.iter() {
                let key: String = k.extract()?;
                let val: f64 = v
                    .extract()
                    .map_err(|_| PyTypeError::new_err(format!("cost {key} must be a number")))?;
                if val < 0.0 {
                    return Err(to_pyerr(
                        py,
                        Error::InvalidArgument(format!("cost {key} must not be negative")),
                    ));
                }
                let slot = match key.as_str() {
                    "hbm_bw" => &mut c.hbm_bw,
                    "link_bw" => &mut c.link_bw,
                    "remote_efficiency" => &mut c.remote_efficiency,
                    "host_bw" => &mut c.host_bw,
                    "batch_ns" => &mut c.batch_ns,
                    "replay_ns" => &mut c.replay_ns,
                    "fault_ns" => &mut c.fault_ns,
                    "transfer_ns" => &mut c.transfer_ns,
                    "eviction_ns" => &mut c.eviction_ns,
                    "cpu_fault_ns" => &mut c.cpu_fault_ns,
                    "throttle_ns" => &mut c.throttle_ns,
                    other => {
                        return Err(to_pyerr(
                            py,
                            Error::InvalidArgument(format!("unknown cost {other:?}")),
                        ))
                    }
                };
                *slot = val;
            }
        }
        let mut cfg = UvmConfig::new(vidmem, c);
        cfg.prefetch = prefetch;
        cfg.thrashing = thrashing;
        cfg.fault_batch = fault_batch;
        cfg.prefetch_threshold = prefetch_threshold;
        cfg.seed = seed;
        cfg.check = check;
        cfg.replay = match replay {
            "batch" => ReplayPolicy::Batch,
            "block" => ReplayPolicy::Block,
            "once" => ReplayPolicy::Once,
            other => {
                return Err(to_pyerr(
                    py,
                    Error::InvalidArgument(format!(
                        "unknown replay policy {other:?}; expected 'batch', 'block' or 'once'"
                    )),
                ))
            }
        };
        let u = py.detach(|| uvm::Uvm::new(cfg)).py_err(py)?;
        Ok(PyUvm {
            inner: Mutex::new(u),
        })
    }

    /// A managed range of `size` bytes; returns its id.
    fn alloc_managed(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<u32> {
        let size = size_arg(py, size, "size")?;
        gil::run(py, &self.inner, Access::Detached, |u| u.alloc_managed(size)).py_err(py)
    }

    /// `advice`: "preferred_location" (with `processor`), "accessed_by" (with `processor`),
    /// "read_mostly", "zero_copy".
    #[pyo3(signature = (range, advice, processor = "gpu"))]
    fn advise(&self, py: Python<'_>, range: u32, advice: &str, processor: &str) -> PyResult<()> {
        let p = self::processor(py, processor)?;
        let a = match advice {
            "preferred_location" => Advice::PreferredLocation(p),
            "accessed_by" => Advice::AccessedBy(p),
            "read_mostly" => Advice::ReadMostly,
            "zero_copy" => Advice::ZeroCopy,
            other => return Err(to_pyerr(py, Error::InvalidArgument(format!(
                "unknown advice {other:?}; expected preferred_location, accessed_by, read_mostly or zero_copy"
            )))),
        };
        gil::run(py, &self.inner, Access::Detached, |u| u.advise(range, a)).py_err(py)
    }

    /// Moves a range to `processor` ahead of use (cudaMemPrefetchAsync).
    #[pyo3(signature = (range, processor = "gpu"))]
    fn prefetch<'py>(
        &self,
        py: Python<'py>,
        range: u32,
        processor: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self::processor(py, processor)?;
        let s = gil::run(py, &self.inner, Access::Detached, |u| u.prefetch(range, p)).py_err(py)?;
        stats_dict(py, &s)
    }

    /// Puts `fraction` of the range's blocks on the GPU, evenly spread; the GPU reads the rest
    /// in place.
    fn stripe<'py>(
        &self,
        py: Python<'py>,
        range: u32,
        fraction: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let s = gil::run(py, &self.inner, Access::Detached, |u| {
            u.stripe(range, fraction)
        })
        .py_err(py)?;
        stats_dict(py, &s)
    }

    /// Runs a kernel. `pattern`: "streaming", "block_streaming" (`chunks`), "random_warp"
    /// (`touches`), "strided" (`stride`), or "explicit" (`pages`, a list of page indices).
    #[pyo3(signature = (range, pattern = "streaming", *, processor = "gpu", write = false,
        chunks = 1024, touches = None, stride = 2, pages = None))]
    #[allow(clippy::too_many_arguments)]
    fn run_kernel<'py>(
        &self,
        py: Python<'py>,
        range: u32,
        pattern: &str,
        processor: &str,
        write: bool,
        chunks: u32,
        touches: Option<u64>,
        stride: u64,
        pages: Option<Vec<u64>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self::processor(py, processor)?;
        let pat = match pattern {
            "streaming" => Pattern::Streaming,
            "block_streaming" => Pattern::BlockStreaming { chunks },
            "random_warp" => Pattern::RandomWarp {
                touches: match touches {
                    Some(t) => t,
                    None => gil::run(py, &self.inner, Access::Detached, |u| u.range_pages(range)).py_err(py)?,
                },
            },
            "strided" => Pattern::Strided { stride },
            "explicit" => Pattern::Explicit(pages.ok_or_else(|| {
                to_pyerr(py, Error::InvalidArgument("pattern 'explicit' needs pages=[...]".into()))
            })?),
            other => return Err(to_pyerr(py, Error::InvalidArgument(format!(
                "unknown pattern {other:?}; expected streaming, block_streaming, random_warp, strided or explicit"
            )))),
        };
        let k = Kernel {
            processor: p,
            range,
            pattern: pat,
            write,
        };
        let s = gil::run(py, &self.inner, Access::Detached, |u| u.run_kernel(&k)).py_err(py)?;
        stats_dict(py, &s)
    }

    /// Totals over everything run so far.
    fn total<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = gil::run(py, &self.inner, Access::Detached, |u| u.total.clone());
        stats_dict(py, &s)
    }

    fn vidmem_used(&self, py: Python<'_>) -> u64 {
        gil::run(py, &self.inner, Access::Detached, |u| u.vidmem_used())
    }

    /// (bytes resident on the GPU, bytes resident on the CPU)
    fn resident(&self, py: Python<'_>) -> (u64, u64) {
        gil::run(py, &self.inner, Access::Detached, |u| u.resident())
    }

    fn validate(&self, py: Python<'_>) -> PyResult<()> {
        gil::run(py, &self.inner, Access::Detached, |u| u.validate())
            .map_err(|m| Error::InvalidState(format!("UVM model invariant broken: {m}")))
            .py_err(py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyUvm>()?;
    Ok(())
}
