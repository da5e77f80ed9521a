//! The offline planner for Python (`crate::plan`): items or a prepared trace in, the plan's
//! peak and bound out, with the GIL released while it plans.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::pool::u64_buffer;
use super::replay::{events, StartArgs};
use super::{to_pyerr, IntoPy};
use crate::error::Error;
use crate::plan::{self, Item, Options};

fn options(budget: Option<u64>) -> Options {
    let mut o = Options::default();
    if let Some(b) = budget {
        o.budget = b;
    }
    o
}

/// Plans items given as parallel arrays of sizes, starts and ends (lifetimes `[start, end)`).
#[pyfunction]
#[pyo3(signature = (sizes, starts, ends, align = 512, *, budget = None))]
pub fn plan_items<'py>(
    py: Python<'py>,
    sizes: &Bound<'py, PyAny>,
    starts: &Bound<'py, PyAny>,
    ends: &Bound<'py, PyAny>,
    align: u64,
    budget: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let cols = [(sizes, "sizes"), (starts, "starts"), (ends, "ends")]
        .iter()
        .map(|(a, n)| u64_buffer(py, a, n))
        .collect::<PyResult<Vec<_>>>()?;
    if cols.iter().any(|c| c.len() != cols[0].len()) {
        return Err(to_pyerr(
            py,
            Error::InvalidArgument("item arrays differ in length".into()),
        ));
    }
    let items: Vec<Item> = (0..cols[0].len())
        .map(|i| Item {
            size: cols[0][i],
            start: cols[1][i],
            end: cols[2][i],
        })
        .collect();
    let opts = options(budget);
    let t0 = std::time::Instant::now();
    let p = py
        .detach(|| plan::try_plan(&items, align, &opts))
        .py_err(py)?;
    let d = PyDict::new(py);
    d.set_item("peak", p.peak)?;
    d.set_item("bound", p.bound)?;
    d.set_item("exhausted", p.exhausted)?;
    d.set_item("offsets", p.offsets)?;
    d.set_item("seconds", t0.elapsed().as_secs_f64())?;
    Ok(d)
}

/// Plans a prepared trace's allocations (the replay engine's arrays and start state): each
/// lives from its allocation event to its free event (`crate::plan::items_from_events`).
#[pyfunction]
#[pyo3(signature = (actions, ids, sizes, streams, addrs, start = None, *, align = 512,
    budget = None))]
#[allow(clippy::too_many_arguments)]
pub fn plan_trace<'py>(
    py: Python<'py>,
    actions: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    sizes: &Bound<'py, PyAny>,
    streams: &Bound<'py, PyAny>,
    addrs: &Bound<'py, PyAny>,
    start: Option<StartArgs>,
    align: u64,
    budget: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let ev = events(py, [actions, ids, sizes, streams, addrs])?;
    let blocks = start.map(|s| s.1).unwrap_or_default();
    let opts = options(budget);
    let t0 = std::time::Instant::now();
    let (n, p) = py
        .detach(|| {
            let t = plan::items_from_events(&ev, &blocks);
            plan::try_plan(&t.items, align, &opts).map(|p| (t.items.len(), p))
        })
        .py_err(py)?;
    let d = PyDict::new(py);
    d.set_item("peak", p.peak)?;
    d.set_item("bound", p.bound)?;
    d.set_item("exhausted", p.exhausted)?;
    d.set_item("items", n)?;
    d.set_item("seconds", t0.elapsed().as_secs_f64())?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_items, m)?)?;
    m.add_function(wrap_pyfunction!(plan_trace, m)?)?;
    Ok(())
}
