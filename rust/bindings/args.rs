//! Argument conversion: sizes (ints, integers of other types, strings like "64KiB"), size
//! lists and buffers, stream handles. Each refusal is a `gpumm.errors` class or a
//! `TypeError` naming the argument.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::errors::{to_pyerr, IntoPy};
use crate::error::Error;
use crate::pmm::{self, ChunkType};
use crate::units;

/// A size given as a non-negative int (or an integer of another type, like numpy's: its
/// `__index__`) or a string like "64KiB".
pub(super) fn size_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
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

pub(super) fn chunk_type_arg(py: Python<'_>, name: &str) -> PyResult<ChunkType> {
    ChunkType::from_name(name).py_err(py)
}

#[pyfunction]
#[pyo3(name = "parse_size")]
pub(super) fn py_parse_size(py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<u64> {
    size_arg(py, size, "size")
}

#[pyfunction]
#[pyo3(name = "format_size")]
pub(super) fn py_format_size(nbytes: u64) -> String {
    units::format_size(nbytes)
}

pub(super) fn sizes_arg(
    py: Python<'_>,
    sizes: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<pmm::SizeMask> {
    let mut out = Vec::new();
    for item in sizes.try_iter()? {
        out.push(size_arg(py, &item?, what)?);
    }
    pmm::SizeMask::from_sizes(&out).py_err(py)
}

pub(super) fn stream_arg(stream: &Bound<'_, PyAny>) -> PyResult<u64> {
    if stream.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err("stream must be an int, not bool"));
    }
    stream
        .extract::<u64>()
        .map_err(|_| PyTypeError::new_err("stream must be a non-negative int (a stream handle)"))
}

pub(super) fn opt_size(
    py: Python<'_>,
    v: Option<&Bound<'_, PyAny>>,
    what: &str,
) -> PyResult<Option<u64>> {
    v.map(|v| size_arg(py, v, what)).transpose()
}

pub(super) fn as_bytes(v: &[u64]) -> &[u8] {
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
