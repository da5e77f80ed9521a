//! Backends for Python: where a device's bytes live.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::size_arg;
use super::errors::{to_pyerr, IntoPy};
use crate::backend::{self, Backend};
use crate::error::Error;
use crate::units::format_size;

/// Where a device's bytes live: "simulated" (accounting only), "host" (a memfd, really
/// mapped), "pinned" (host memory page-locked for a GPU) or "cuda" (GPU memory).
#[pyclass(module = "gpumm._core", name = "Backend", frozen)]
pub struct PyBackend {
    pub(super) inner: Arc<dyn Backend>,
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
