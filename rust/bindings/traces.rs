//! Trace readers for Python: files parsed in Rust with the GIL released, events handed back
//! as a column log (`TraceLog`) rather than one object per event, and `prepare` over it.
//! A reader that fails returns `TraceFormatError`; a panic (a bug, never expected) becomes one
//! too, naming the file, rather than reaching Python.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFrozenSet, PyList, PySet, PyString, PyTuple};

use crate::traces::log::{self, Log, Start};
use crate::traces::pickle::{Loaded, Value};
use crate::traces::{pickle_file, prepare, rmm, snapshot, TraceError};

fn format_error(py: Python<'_>, msg: String) -> PyErr {
    match py
        .import("gpumm.errors")
        .and_then(|m| m.getattr("TraceFormatError"))
        .and_then(|c| c.call1((msg,)))
    {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// Runs `f` with the GIL released; a panic inside becomes an error naming `name`.
fn guarded<T: Send>(
    py: Python<'_>,
    name: &str,
    f: impl FnOnce() -> Result<T, TraceError> + Send,
) -> PyResult<T> {
    let r = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format_error(py, e.0)),
        Err(_) => Err(format_error(
            py,
            format!("{name}: the reader failed on this file (an internal error; please report it)"),
        )),
    }
}

/// A pickle file loaded as it is read (its bytes are never held whole).
fn load_file(name: &str, compact: bool) -> Result<Loaded, TraceError> {
    pickle_file::load(name, compact)
}

/// A start state as Python passes it: (address, size, stream) of segments, (address,
/// requested, block size, stream) of blocks.
type StartColumns = (Vec<(u64, u64, u64)>, Vec<(u64, u64, u64, u64)>);

/// One device's events in columns, with its start state and stack table.
#[pyclass(module = "gpumm._core", name = "TraceLog", frozen)]
pub struct PyTraceLog {
    log: Log,
    start: Option<Start>,
}

fn u64s<'py>(py: Python<'py>, v: Vec<u64>) -> Bound<'py, PyArray1<u64>> {
    PyArray1::from_vec(py, v)
}

#[pymethods]
impl PyTraceLog {
    /// A log from columns (a trace built in Python): action codes in the order of
    /// `gpumm.traces.base.ACTIONS`, then pointers, sizes, streams, times, threads, frames.
    #[staticmethod]
    #[pyo3(signature = (actions, ptrs, sizes, streams, times, threads, frames, start = None))]
    #[allow(clippy::too_many_arguments)]
    fn from_columns(
        actions: Vec<u8>,
        ptrs: Vec<u64>,
        sizes: Vec<u64>,
        streams: Vec<u64>,
        times: Vec<i64>,
        threads: Vec<u64>,
        frames: Vec<i32>,
        start: Option<StartColumns>,
        py: Python<'_>,
    ) -> PyResult<Self> {
        let n = actions.len();
        if [ptrs.len(), sizes.len(), streams.len(), times.len()]
            .iter()
            .any(|&l| l != n)
            || (threads.len() != n && !threads.is_empty())
            || (frames.len() != n && !frames.is_empty())
            || actions.iter().any(|&a| a as usize >= log::ACTIONS.len())
        {
            return Err(format_error(
                py,
                "event columns differ in length or hold an unknown action".into(),
            ));
        }
        let log = Log {
            action: actions,
            ptr: ptrs,
            size: sizes,
            stream: streams,
            time_us: times,
            thread: threads,
            frames,
            device_free: Vec::new(),
        };
        Ok(PyTraceLog {
            log,
            start: start.map(|(segments, blocks)| Start { segments, blocks }),
        })
    }

    fn __len__(&self) -> usize {
        self.log.len()
    }

    /// Event `i` as (action, ptr, size, stream, time_us, thread, frames).
    fn event(&self, i: usize) -> Option<(&'static str, u64, u64, u64, i64, u64, i32)> {
        let l = &self.log;
        (i < l.len()).then(|| {
            (
                log::ACTIONS[l.action[i] as usize],
                l.ptr[i],
                l.size[i],
                l.stream[i],
                l.time_us[i],
                l.thread_of(i),
                l.frames_of(i),
            )
        })
    }

    /// Every event as a tuple (for callers that want `Event` objects).
    fn tuples<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for i in 0..self.log.len() {
            out.append(self.event(i))?;
        }
        Ok(out)
    }

    /// A column as a numpy array: "action", "ptr", "size", "stream", "time_us".
    fn column<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let l = &self.log;
        Ok(match name {
            "action" => PyArray1::from_slice(py, &l.action).into_any(),
            "ptr" => PyArray1::from_slice(py, &l.ptr).into_any(),
            "size" => PyArray1::from_slice(py, &l.size).into_any(),
            "stream" => PyArray1::from_slice(py, &l.stream).into_any(),
            "time_us" => PyArray1::from_slice(py, &l.time_us).into_any(),
            _ => return Err(pyo3::exceptions::PyKeyError::new_err(name.to_string())),
        })
    }

    /// Bytes the columns hold.
    #[getter]
    fn nbytes(&self) -> usize {
        self.log.nbytes()
    }

    #[getter]
    fn num_allocs(&self) -> usize {
        self.log.num_allocs()
    }

    fn peak_live(&self, py: Python<'_>) -> PyResult<u64> {
        guarded(py, "a trace", || {
            Ok(self.log.peak_live(self.start.as_ref()))
        })
    }

    fn recorded_peak_reserved(&self) -> Option<i128> {
        self.start
            .as_ref()
            .map(|s| self.log.recorded_peak_reserved(s))
    }

    /// (index, size, time_us, frames, device_free) of each `oom` and `alloc_failed` event.
    fn ooms(&self) -> Vec<(usize, u64, i64, i32, Option<u64>)> {
        let l = &self.log;
        (0..l.len())
            .filter(|&i| l.action[i] == log::OOM || l.action[i] == log::ALLOC_FAILED)
            .map(|i| {
                let free = l
                    .device_free
                    .iter()
                    .find(|(k, _)| *k as usize == i)
                    .map(|&(_, f)| f);
                (i, l.size[i], l.time_us[i], l.frames_of(i), free)
            })
            .collect()
    }

    /// The engine's arrays: a dict of numpy uint64 arrays (actions, ids, sizes, streams,
    /// addrs, source) and start_blocks, peak_live, peak_event.
    fn prepare<'py>(&self, py: Python<'py>, keep_addr: bool) -> PyResult<Bound<'py, PyDict>> {
        let p = guarded(py, "a trace", || {
            Ok(prepare::prepare(&self.log, self.start.as_ref(), keep_addr))
        })?;
        let d = PyDict::new(py);
        d.set_item("start_blocks", p.start_blocks)?;
        d.set_item("peak_live", p.peak_live)?;
        d.set_item("peak_event", p.peak_event)?;
        d.set_item("actions", u64s(py, p.actions))?;
        d.set_item("ids", u64s(py, p.ids))?;
        d.set_item("sizes", u64s(py, p.sizes))?;
        d.set_item("streams", u64s(py, p.streams))?;
        d.set_item("addrs", u64s(py, p.addrs))?;
        d.set_item("source", u64s(py, p.source))?;
        Ok(d)
    }
}

/// A loaded snapshot: its devices' traces and, on demand, its plain data as Python objects.
#[pyclass(module = "gpumm._core", name = "Snapshot", frozen)]
pub struct PySnapshot {
    loaded: Arc<Loaded>,
    name: String,
    /// each device's answer once read (a log may have taken the rows' columns)
    read: std::sync::Mutex<HashMap<u64, Py<PyTuple>>>,
}

#[pymethods]
impl PySnapshot {
    /// Devices with history or segments, a recorded `oom`'s first.
    fn devices(&self) -> Vec<u64> {
        snapshot::devices(&self.loaded)
    }

    /// Device `device`'s trace: (log, start segments, start blocks, frames, final segment
    /// indices, has_history, t0). Asked again, the same log with fresh lists.
    fn device<'py>(&self, py: Python<'py>, device: u64) -> PyResult<Bound<'py, PyTuple>> {
        let seen = self
            .read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&device)
            .map(|t| t.clone_ref(py));
        if let Some(t) = seen {
            let t = t.into_bound(py);
            let items = t
                .iter()
                .map(|x| match x.cast::<PyList>() {
                    Ok(l) => Ok(PyList::new(py, l.iter())?.into_any()),
                    Err(_) => Ok(x),
                })
                .collect::<PyResult<Vec<_>>>()?;
            return PyTuple::new(py, items);
        }
        let t = self.device_once(py, device)?.into_pyobject(py)?;
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(device, t.clone().unbind());
        Ok(t)
    }
    /// The segments at `indices` as Python dicts.
    fn segments<'py>(&self, py: Python<'py>, indices: Vec<usize>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let segs =
            snapshot::segments(&self.loaded, &self.name).map_err(|e| format_error(py, e.0))?;
        let mut conv = Converter::new(&self.loaded);
        for i in indices {
            if let Some(s) = segs.get(i) {
                let v = conv.py(py, s).map_err(|e| not_plain(py, &self.name, e))?;
                out.append(v)?;
            }
        }
        Ok(out)
    }

    /// The root dict's value for `key` as Python data (None when absent).
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        let l = &self.loaded;
        match snapshot::root_dict(l).and_then(|d| l.get(d, key)) {
            Some(v) => Converter::new(l)
                .py(py, v)
                .map_err(|e| not_plain(py, &self.name, e)),
            None => Ok(py.None().into_bound(py)),
        }
    }
}

impl PySnapshot {
    #[allow(clippy::type_complexity)]
    fn device_once<'py>(
        &self,
        py: Python<'py>,
        device: u64,
    ) -> PyResult<(
        PyTraceLog,
        Vec<(u64, u64, u64)>,
        Vec<(u64, u64, u64, u64)>,
        Bound<'py, PyList>,
        Vec<usize>,
        bool,
        i64,
    )> {
        let loaded = self.loaded.clone();
        let name = self.name.clone();
        let t = guarded(py, &self.name, move || {
            snapshot::read_device(&loaded, &name, device)
        })?;
        let start = t.start.clone();
        // each frame's text one Python string, shared by every stack that holds it
        let texts: Vec<Bound<'py, PyString>> = t
            .frames
            .texts
            .iter()
            .map(|x| PyString::new(py, x))
            .collect();
        let frames = PyList::empty(py);
        for st in &t.frames.stacks {
            let items: Vec<&Bound<'py, PyString>> =
                st.iter().map(|&i| &texts[i as usize]).collect();
            frames.append(PyList::new(py, items)?)?;
        }
        Ok((
            PyTraceLog {
                log: t.log,
                start: Some(t.start),
            },
            start.segments,
            start.blocks,
            frames,
            t.final_segments,
            t.has_history,
            t.t0,
        ))
    }
}

/// Loads a snapshot pickle for reading its traces (trace entries and frames held compact).
#[pyfunction]
pub fn read_snapshot(py: Python<'_>, path: String) -> PyResult<PySnapshot> {
    let name = path.clone();
    let loaded = guarded(py, &path, move || {
        let l = load_file(&name, true)
            .map_err(|e| TraceError(format!("{name}: not a readable snapshot: {}", e.0)))?;
        snapshot::segments(&l, &name)?;
        Ok(l)
    })?;
    Ok(PySnapshot {
        loaded: Arc::new(loaded),
        name: path,
        read: Default::default(),
    })
}

/// Loads a pickle of plain data (refusing every global and call) as Python objects.
#[pyfunction]
pub fn load_pickle<'py>(py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
    let name = path.clone();
    let loaded = guarded(py, &path, move || {
        load_file(&name, false)
            .map_err(|e| TraceError(format!("{name}: not a readable snapshot: {}", e.0)))
    })?;
    let r = Converter::new(&loaded).py(py, &loaded.root);
    r.map_err(|e| not_plain(py, &path, e))
}

/// A value Python cannot build (a dict key that is not hashable...) as a format error.
fn not_plain(py: Python<'_>, name: &str, e: PyErr) -> PyErr {
    format_error(py, format!("{name}: not a readable snapshot: {e}"))
}

/// Reads an RMM log CSV (plain or gzip).
#[pyfunction]
pub fn read_rmm(py: Python<'_>, path: String) -> PyResult<PyTraceLog> {
    let name = path.clone();
    let log = guarded(py, &path, move || rmm::read_file(&name))?;
    Ok(PyTraceLog { log, start: None })
}

/// Values to Python objects; a container met twice becomes one object, as in Python.
struct Converter<'a> {
    l: &'a Loaded,
    seen: HashMap<usize, Py<PyAny>>,
}

impl<'a> Converter<'a> {
    fn new(l: &'a Loaded) -> Self {
        Converter {
            l,
            seen: HashMap::new(),
        }
    }

    fn frame<'py>(&self, py: Python<'py>, f: u32) -> PyResult<Bound<'py, PyAny>> {
        let (file, line, name) = self.l.frames[f as usize];
        let d = PyDict::new(py);
        d.set_item("filename", self.l.str(file))?;
        d.set_item("line", line)?;
        d.set_item("name", self.l.str(name))?;
        Ok(d.into_any())
    }

    fn py<'py>(&mut self, py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
        let key = match v {
            Value::List(a) | Value::Tuple(a) | Value::Set(a, _) => Some(Arc::as_ptr(a) as usize),
            Value::Dict(a) => Some(Arc::as_ptr(a) as *const u8 as usize),
            _ => None,
        };
        if let Some(k) = key {
            if let Some(o) = self.seen.get(&k) {
                return Ok(o.bind(py).clone());
            }
        }
        let o: Bound<'py, PyAny> = match v {
            Value::None => py.None().into_bound(py),
            Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
            Value::Int(n) => n.into_pyobject(py)?.into_any(),
            Value::BigInt(b) => {
                let kw = PyDict::new(py);
                kw.set_item("signed", true)?;
                py.import("builtins")?.getattr("int")?.call_method(
                    "from_bytes",
                    (PyBytes::new(py, b), "little"),
                    Some(&kw),
                )?
            }
            Value::Float(f) => f.into_pyobject(py)?.into_any(),
            Value::Str(s) => self.l.str(*s).into_pyobject(py)?.into_any(),
            Value::Bytes(b) => PyBytes::new(py, b).into_any(),
            Value::List(items) => {
                let out = PyList::empty(py);
                for x in items.iter() {
                    out.append(self.py(py, x)?)?;
                }
                out.into_any()
            }
            Value::Tuple(items) => {
                let xs = items
                    .iter()
                    .map(|x| self.py(py, x))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, xs)?.into_any()
            }
            Value::Set(items, frozen) => {
                let xs = items
                    .iter()
                    .map(|x| self.py(py, x))
                    .collect::<PyResult<Vec<_>>>()?;
                if *frozen {
                    PyFrozenSet::new(py, &xs)?.into_any()
                } else {
                    PySet::new(py, &xs)?.into_any()
                }
            }
            Value::Dict(items) => {
                let d = PyDict::new(py);
                for (k, x) in items.iter() {
                    d.set_item(self.py(py, k)?, self.py(py, x)?)?;
                }
                d.into_any()
            }
            Value::Frame(f) => self.frame(py, *f)?,
            Value::Stack(s) => {
                let out = PyList::empty(py);
                for &f in self.l.stacks[*s as usize].iter() {
                    out.append(self.frame(py, f)?)?;
                }
                out.into_any()
            }
            Value::EntryList(rows) => {
                let out = PyList::empty(py);
                for &r in rows.iter() {
                    out.append(self.py(py, &Value::Entry(r))?)?;
                }
                out.into_any()
            }
            Value::Entry(r) => {
                let row = self.l.entries.row(*r as usize);
                let d = PyDict::new(py);
                d.set_item(
                    "action",
                    crate::traces::entries::SNAP_ACTIONS[row.action as usize],
                )?;
                d.set_item("addr", row.addr)?;
                d.set_item("size", row.size)?;
                d.set_item("stream", row.stream)?;
                d.set_item("time_us", row.time_us)?;
                d.into_any()
            }
        };
        if let Some(k) = key {
            self.seen.insert(k, o.clone().unbind());
        }
        Ok(o)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTraceLog>()?;
    m.add_class::<PySnapshot>()?;
    m.add_function(wrap_pyfunction!(read_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(load_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(read_rmm, m)?)?;
    Ok(())
}
