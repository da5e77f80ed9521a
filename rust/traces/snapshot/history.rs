//! A device's history into its log: the rows' columns taken whole where the history is every
//! row of the file, else entry by entry.

use super::{fail, general_entry, Stacks};
use rustc_hash::FxHashSet;

use crate::traces::entries::{self, Row, A_ALLOC, A_FREE_REQUESTED, A_OOM};
use crate::traces::log::{self, Log};
use crate::traces::pickle::{Loaded, Value};
use crate::traces::TraceError;

/// A device's history list: its values, or the rows of its trace entries.
#[derive(Clone, Copy)]
pub(super) enum History<'a> {
    Values(&'a [Value]),
    Rows(&'a [u32]),
}

impl History<'_> {
    fn len(&self) -> usize {
        match self {
            History::Values(h) => h.len(),
            History::Rows(h) => h.len(),
        }
    }

    fn get(&self, i: usize) -> std::borrow::Cow<'_, Value> {
        match self {
            History::Values(h) => std::borrow::Cow::Borrowed(&h[i]),
            History::Rows(h) => std::borrow::Cow::Owned(Value::Entry(h[i])),
        }
    }
}

/// The log of a snapshot's action code (a `free_requested` reaches it only in a history
/// that frees there: [`frees_at_request`]).
fn log_action(action: u8) -> u8 {
    match action {
        entries::A_ALLOC => log::ALLOC,
        entries::A_FREE_COMPLETED | entries::A_FREE_REQUESTED => log::FREE,
        3 => log::SEGMENT_ALLOC,
        4 => log::SEGMENT_FREE,
        5 => log::SEGMENT_MAP,
        6 => log::SEGMENT_UNMAP,
        _ => log::OOM,
    }
}

/// The log of a history that is every row of the snapshot, in order (one device, each entry
/// of the types PyTorch writes): the rows' columns become the log's, moved, not copied.
/// None: another history, or the columns were taken already.
pub(super) fn moved_log(
    l: &Loaded,
    history: History<'_>,
    frames: &mut Stacks,
) -> Option<(Log, i64)> {
    let History::Rows(h) = history else {
        return None;
    };
    let n = l.entries.len();
    let mut next = 0usize;
    for &r in h {
        if entries::skipped(r) {
            continue;
        }
        if r as usize != next {
            return None;
        }
        next += 1;
    }
    if next != n || !l.entries.requested.is_empty() && frees_at_request(l, history) {
        return None; // freed at `free_requested`, kept aside: read entry by entry
    }
    let c = l.entries.take_cols()?;
    let action = &l.entries.action;
    let t0 = c.time_us.first().copied();
    let mut time_us = c.time_us;
    if let Some(t) = t0 {
        for x in time_us.iter_mut() {
            *x = x.wrapping_sub(t);
        }
    }
    let mut stack = c.stack;
    for (s, &a) in stack.iter_mut().zip(action) {
        *s = if a == A_ALLOC && *s >= 0 {
            frames.interned(l, *s as u32)
        } else {
            -1
        };
    }
    if stack.iter().all(|&f| f < 0) {
        stack = Vec::new();
    }
    let device_free = l
        .entries
        .device_free
        .iter()
        .filter(|&&(r, _)| action[r as usize] == A_OOM)
        .copied()
        .collect();
    let mut log = Log {
        action: action.iter().map(|&a| log_action(a)).collect(),
        ptr: c.addr,
        size: c.size,
        stream: c.stream,
        time_us,
        thread: Vec::new(),
        frames: stack,
        device_free,
    };
    log.shrink();
    Some((log, t0.unwrap_or(0)))
}

/// Whether any entry of `history` is of `action`.
fn action_in(l: &Loaded, history: History<'_>, action: u8) -> bool {
    let of_row = |r: u32| !entries::skipped(r) && l.entries.action.get(r as usize) == Some(&action);
    match history {
        History::Rows(h) => h.iter().any(|&r| of_row(r)),
        History::Values(h) => h.iter().any(|e| match e {
            Value::Entry(r) => of_row(*r),
            Value::Dict(d) => l
                .get(d, "action")
                .and_then(|a| l.as_str(a))
                .is_some_and(|a| a == entries::SNAP_ACTIONS[action as usize]),
            _ => false,
        }),
    }
}

/// Whether `history` frees memory at `free_requested`: it holds no `free_completed`, as when
/// recorded with `_record_memory_history(skip_actions=["free_completed"])`. Where both are
/// recorded, memory is freed at `free_completed`, when the allocator gets the block back
/// (after the streams that used it are done with it).
fn frees_at_request(l: &Loaded, history: History<'_>) -> bool {
    !action_in(l, history, entries::A_FREE_COMPLETED)
}

/// Entry `i` of `history` as a row (None: an entry the general reader skips).
fn row_at(
    l: &Loaded,
    name: &str,
    device: u64,
    history: History<'_>,
    i: usize,
) -> Result<Option<Row>, TraceError> {
    let e = history.get(i);
    Ok(Some(match e.as_ref() {
        Value::Entry(r) => {
            let mut row = l.entries.row(*r as usize);
            if row.action == A_OOM {
                row.device_free = l.entries.device_free_of(*r);
            }
            row
        }
        Value::Dict(d) => {
            match general_entry(l, d, &|| format!("{name}: device_traces[{device}][{i}]"))? {
                Some(r) => r,
                None => return Ok(None),
            }
        }
        _ => {
            return fail(format!(
                "{name}: device_traces[{device}][{i}]: must be a dict with an 'action'"
            ))
        }
    }))
}

/// In a history that frees at `free_requested`, the entries of those never completed: an
/// address's last `free_requested`, with no `alloc` after it, of a block the final segments
/// still hold (`active_pending_free`: used on another stream, `record_stream`). `live_at_end`:
/// whether the final segments hold a live block at an address.
fn pending_requests(
    l: &Loaded,
    name: &str,
    device: u64,
    history: History<'_>,
    live_at_end: &dyn Fn(u64) -> bool,
) -> Result<FxHashSet<usize>, TraceError> {
    let (mut pending, mut decided) = (FxHashSet::default(), FxHashSet::default());
    for i in (0..history.len()).rev() {
        let Some(row) = row_at(l, name, device, history, i)? else {
            continue;
        };
        if matches!(row.action, A_ALLOC | A_FREE_REQUESTED)
            && decided.insert(row.addr)
            && row.action == A_FREE_REQUESTED
            && live_at_end(row.addr)
        {
            pending.insert(i);
        }
    }
    Ok(pending)
}

/// The log of a history read entry by entry (the rows copied, other dicts read as the
/// Python reader did).
pub(super) fn history_log(
    l: &Loaded,
    name: &str,
    device: u64,
    history: History<'_>,
    frames: &mut Stacks,
    live_at_end: &dyn Fn(u64) -> bool,
) -> Result<(Log, i64), TraceError> {
    let mut log = Log::default();
    let mut t0: Option<i64> = None;
    log.action.reserve(history.len());
    let at_request = frees_at_request(l, history);
    let pending = if at_request {
        pending_requests(l, name, device, history, live_at_end)?
    } else {
        FxHashSet::default()
    };
    for i in 0..history.len() {
        let Some(row) = row_at(l, name, device, history, i)? else {
            continue;
        };
        if pending.contains(&i) {
            continue; // never completed: live to the end
        }
        if entries::frees_nothing(row.action) && !(row.action == A_FREE_REQUESTED && at_request) {
            continue; // memory is freed at free_completed
        }
        let t = *t0.get_or_insert(row.time_us);
        let stack = if row.action == A_ALLOC {
            frames.index(l, &row, history.get(i).as_ref())
        } else {
            -1
        };
        if let Some(f) = row.device_free {
            log.device_free.push((log.len() as u32, f));
        }
        log.push(
            log_action(row.action),
            row.addr,
            row.size,
            row.stream,
            row.time_us.wrapping_sub(t),
        );
        log.frames.push(stack);
    }
    if log.frames.iter().all(|&f| f < 0) {
        log.frames = Vec::new();
    }
    log.shrink();
    Ok((log, t0.unwrap_or(0)))
}
