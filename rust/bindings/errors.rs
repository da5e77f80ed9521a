//! Errors for Python: one conversion of the core's `Error`, to the classes defined in
//! python/gpumm/errors.py (named by `Error::kind`).

use pyo3::prelude::*;

use crate::error::Error;

pub(super) fn to_pyerr(py: Python<'_>, e: Error) -> PyErr {
    let class = py.import("gpumm.errors").and_then(|m| m.getattr(e.kind()));
    match class {
        Ok(cls) => match cls.call1((e.message(),)) {
            Ok(exc) => PyErr::from_value(exc),
            Err(err) => err,
        },
        Err(err) => err,
    }
}

pub(super) trait IntoPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for crate::error::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_pyerr(py, e))
    }
}
