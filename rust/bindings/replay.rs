//! The replay engine for Python: arrays of events in, a dict of measurements out, with the
//! GIL released while the engine runs.
//!
//! Defence in depth: a panic inside the engine or a model (a bug: the proptests in
//! rust/replay guard against every one found) is caught here and raised as
//! `InvalidStateError` naming the model and the event ("caching-expandable: internal error at
//! event 1234 of 5678: ..."). The panic hook stays quiet for panics caught here: it is
//! installed once, wraps the hook that was there, and is silent only while this thread is
//! inside a replay (a thread-local flag); every other panic reaches the previous hook as
//! before.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::pool::u64_buffer;
use super::{to_pyerr, IntoPy};
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::error::Error;
use crate::replay::{
    self as engine, Action, CachingOptions, Event, StartState, DIVISION_INTERVALS,
};

thread_local! {
    /// Set while this thread runs a replay whose panics are caught and reported.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, turning a panic into `InvalidStateError` naming `model` and the event reached
/// (`of` events in all).
fn guarded<T>(model: &str, of: usize, f: impl FnOnce() -> T) -> Result<T, Error> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let prev = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                prev(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let got = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    got.map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = match engine::current_event() {
            Some(i) => format!("at event {i} of {of}"),
            None => "while setting up the start state".into(),
        };
        Error::InvalidState(format!("{model}: internal error {at}: {msg}"))
    })
}

/// Events from parallel arrays (uint64 buffers or lists): action codes (0 alloc, 1 free,
/// 2 segment_alloc, 3 segment_free, 4 segment_map, 5 segment_unmap), ids, sizes, streams,
/// addresses.
pub(super) fn events(py: Python<'_>, arrays: [&Bound<'_, PyAny>; 5]) -> PyResult<Vec<Event>> {
    let names = ["actions", "ids", "sizes", "streams", "addrs"];
    let cols: Vec<Vec<u64>> = arrays
        .iter()
        .zip(names)
        .map(|(a, n)| u64_buffer(py, a, n))
        .collect::<PyResult<_>>()?;
    let n = cols[0].len();
    if cols.iter().any(|c| c.len() != n) {
        return Err(to_pyerr(
            py,
            Error::InvalidArgument("event arrays differ in length".into()),
        ));
    }
    (0..n)
        .map(|i| {
            let action = Action::from_code(cols[0][i]).ok_or_else(|| {
                to_pyerr(
                    py,
                    Error::InvalidArgument(format!(
                        "event {i}: unknown action code {}",
                        cols[0][i]
                    )),
                )
            })?;
            let id = u32::try_from(cols[1][i]).map_err(|_| {
                to_pyerr(
                    py,
                    Error::InvalidArgument(format!("event {i}: id too large")),
                )
            })?;
            Ok(Event {
                action,
                id,
                size: cols[2][i],
                stream: cols[3][i],
                addr: cols[4][i],
            })
        })
        .collect()
}

/// The caching model's options from a dict: `expandable_segments`, `max_split_size` (0 or
/// less: none), `roundup_power2_divisions` (one count, or a list of one per interval),
/// `garbage_collection_threshold` (0: off), `memory_fraction` (the allowed maximum's share of
/// the capacity). Values out of range are an `InvalidArgumentError`.
fn caching_options(py: Python<'_>, opts: Option<&Bound<'_, PyDict>>) -> PyResult<CachingOptions> {
    let mut o = CachingOptions::default();
    if let Some(d) = opts {
        if let Some(v) = d.get_item("expandable_segments")? {
            o.expandable_segments = v.extract()?;
            o.recorded_expandable = o.expandable_segments;
        }
        if let Some(v) = d.get_item("max_split_size")? {
            let v: i64 = v.extract()?;
            o.max_split_size = if v <= 0 { u64::MAX } else { v as u64 };
        }
        if let Some(v) = d.get_item("roundup_power2_divisions")? {
            if let Ok(n) = v.extract::<u64>() {
                o.roundup_power2_divisions = n;
            } else {
                let t: Vec<u64> = v.extract().map_err(|_| {
                    to_pyerr(
                        py,
                        Error::InvalidArgument(
                            "roundup_power2_divisions: a division count, or a list of one \
                             per interval (16)"
                                .into(),
                        ),
                    )
                })?;
                let t: [u64; DIVISION_INTERVALS] = t.try_into().map_err(|t: Vec<u64>| {
                    to_pyerr(
                        py,
                        Error::InvalidArgument(format!(
                            "roundup_power2_divisions: {} counts given, one per interval \
                             ({DIVISION_INTERVALS}) expected",
                            t.len()
                        )),
                    )
                })?;
                o.divisions_by_interval = Some(t);
            }
        }
        if let Some(v) = d.get_item("garbage_collection_threshold")? {
            o.garbage_collection_threshold = v.extract()?;
        }
        if let Some(v) = d.get_item("memory_fraction")? {
            o.memory_fraction = v.extract()?;
        }
    }
    o.check().map_err(|e| to_pyerr(py, e))?;
    Ok(o)
}

pub(super) type StartArgs = (Vec<(u64, u64, u64)>, Vec<(u32, u64, u64, u64, u64)>);

/// Replays events through the allocator model `model` at `capacity` bytes.
#[pyfunction]
#[pyo3(signature = (model, capacity, actions, ids, sizes, streams, addrs, start = None, *,
    peak_event = None, timeline_points = 600, options = None))]
#[allow(clippy::too_many_arguments)]
pub fn replay<'py>(
    py: Python<'py>,
    model: &str,
    capacity: u64,
    actions: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    sizes: &Bound<'py, PyAny>,
    streams: &Bound<'py, PyAny>,
    addrs: &Bound<'py, PyAny>,
    start: Option<StartArgs>,
    peak_event: Option<usize>,
    timeline_points: usize,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let ev = events(py, [actions, ids, sizes, streams, addrs])?;
    let opts = caching_options(py, options)?;
    let start = start
        .map(|(segments, blocks)| StartState { segments, blocks })
        .unwrap_or_default();
    let mut m = engine::model_by_name(model, capacity, opts).py_err(py)?;
    let t0 = std::time::Instant::now();
    let r = py
        .detach(|| {
            guarded(model, ev.len(), || {
                engine::run(
                    m.as_mut(),
                    capacity,
                    &start,
                    &ev,
                    peak_event.unwrap_or(usize::MAX),
                    timeline_points,
                )
            })
        })
        .py_err(py)?;
    let wall = t0.elapsed().as_secs_f64();
    let d = PyDict::new(py);
    d.set_item("allocator", model)?;
    d.set_item("capacity", r.capacity)?;
    d.set_item("events", r.events)?;
    d.set_item("allocs", r.allocs)?;
    d.set_item("peak_live", r.peak_live)?;
    d.set_item("peak_reserved", r.peak_reserved)?;
    d.set_item("final_reserved", r.final_reserved)?;
    d.set_item("fragmentation_at_peak", r.fragmentation_at_peak())?;
    d.set_item("free_at_peak", r.free_at_peak)?;
    d.set_item("largest_free_at_peak", r.largest_free_at_peak)?;
    d.set_item("address_matches", r.address_matches)?;
    d.set_item("addressed_allocs", r.addressed_allocs)?;
    d.set_item("preload_failed", r.preload_failed)?;
    d.set_item("seconds", wall)?;
    d.set_item(
        "events_per_second",
        if wall > 0.0 {
            r.events as f64 / wall
        } else {
            0.0
        },
    )?;
    d.set_item(
        "op_ns_mean",
        if r.ops_timed > 0 {
            r.op_ns_total as f64 / r.ops_timed as f64
        } else {
            0.0
        },
    )?;
    let ooms = PyList::empty(py);
    for o in &r.ooms {
        let od = PyDict::new(py);
        od.set_item("event", o.event)?;
        od.set_item("size", o.size)?;
        od.set_item("live", o.live)?;
        od.set_item("reserved", o.reserved)?;
        od.set_item("largest_free", o.largest_free)?;
        ooms.append(od)?;
    }
    d.set_item("ooms", ooms)?;
    d.set_item("timeline", r.timeline)?;
    d.set_item("layout_at_peak", r.layout_at_peak)?;
    Ok(d)
}

/// The smallest capacity (a multiple of `step`, at most `hi`) at which `model` replays the
/// events with no out-of-memory failure; None if even `hi` fails. `step` None: 1 % of
/// `peak_live` or 2 MiB, whichever is larger, in whole 2 MiB pages (`engine::auto_step`).
#[pyfunction]
#[pyo3(signature = (model, actions, ids, sizes, streams, addrs, start = None, *, peak_live,
    hi, step = None, options = None))]
#[allow(clippy::too_many_arguments)]
pub fn replay_min_capacity(
    py: Python<'_>,
    model: &str,
    actions: &Bound<'_, PyAny>,
    ids: &Bound<'_, PyAny>,
    sizes: &Bound<'_, PyAny>,
    streams: &Bound<'_, PyAny>,
    addrs: &Bound<'_, PyAny>,
    start: Option<StartArgs>,
    peak_live: u64,
    hi: u64,
    step: Option<u64>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<u64>> {
    let step = step.unwrap_or_else(|| engine::auto_step(peak_live));
    let ev = events(py, [actions, ids, sizes, streams, addrs])?;
    let opts = caching_options(py, options)?;
    engine::model_by_name(model, hi.max(step), opts).py_err(py)?; // a clear error for a bad name
    if step == 0 {
        return Err(to_pyerr(
            py,
            Error::InvalidArgument("step must be positive".into()),
        ));
    }
    let start = start
        .map(|(segments, blocks)| StartState { segments, blocks })
        .unwrap_or_default();
    let last_cap = AtomicU64::new(0);
    let make = |cap: u64| {
        last_cap.store(cap, Ordering::Relaxed);
        engine::model_by_name(model, cap, opts)
    };
    let got = py.detach(|| {
        let r = guarded(model, ev.len(), || {
            engine::min_capacity(&make, &start, &ev, peak_live, hi, step)
        });
        r.map_err(|e| {
            Error::InvalidState(format!(
                "{} (in the min_capacity search, at a capacity of {} bytes)",
                e.message(),
                last_cap.load(Ordering::Relaxed)
            ))
        })
    });
    got.and_then(|r| r).py_err(py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(replay_min_capacity, m)?)?;
    m.add("ALLOCATORS", engine::MODEL_NAMES.to_vec())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model with a bug: its third allocation panics.
    struct Buggy(u32);

    impl engine::Model for Buggy {
        fn alloc(&mut self, _id: u32, _size: u64, _stream: u64) -> Option<u64> {
            self.0 += 1;
            assert!(self.0 < 3, "boom");
            Some(u64::from(self.0) << 20)
        }
        fn free(&mut self, _id: u32) {}
        fn reserved(&self) -> u64 {
            0
        }
        fn largest_free(&self) -> u64 {
            0
        }
        fn free_bytes(&self) -> u64 {
            0
        }
        fn live_blocks(&self) -> Vec<(u64, u64)> {
            Vec::new()
        }
    }

    #[test]
    fn a_panic_becomes_an_error_naming_the_model_and_the_event() {
        let ev: Vec<Event> = (0..4)
            .map(|id| Event {
                action: Action::Alloc,
                id,
                size: 1,
                stream: 0,
                addr: 0,
            })
            .collect();
        let mut m = Buggy(0);
        let got = guarded("buggy", ev.len(), || {
            engine::run(&mut m, 1 << 30, &StartState::default(), &ev, usize::MAX, 1)
        });
        let e = got.unwrap_err();
        assert_eq!(e.kind(), "InvalidStateError");
        assert_eq!(e.message(), "buggy: internal error at event 2 of 4: boom");
        // and a replay that does not panic goes through
        let ok = guarded("driver", 0, || 7);
        assert_eq!(ok, Ok(7));
    }
}
