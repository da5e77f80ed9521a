//! A device's history into its log: the rows' columns taken whole where the history is every
//! row of the file, else entry by entry.

use super::{fail, general_entry, Stacks};
use crate::traces::entries::{self, A_ALLOC, A_OOM};
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

/// The log of a snapshot's action code.
fn log_action(action: u8) -> u8 {
    match action {
        entries::A_ALLOC => log::ALLOC,
        entries::A_FREE_COMPLETED => log::FREE,
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
    if next != n {
        return None;
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

/// The log of a history read entry by entry (the rows copied, other dicts read as the
/// Python reader did).
pub(super) fn history_log(
    l: &Loaded,
    name: &str,
    device: u64,
    history: History<'_>,
    frames: &mut Stacks,
) -> Result<(Log, i64), TraceError> {
    let mut log = Log::default();
    let mut t0: Option<i64> = None;
    log.action.reserve(history.len());
    for i in 0..history.len() {
        let e = history.get(i);
        let e = e.as_ref();
        let row = match e {
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
                    None => continue,
                }
            }
            _ => {
                return fail(format!(
                    "{name}: device_traces[{device}][{i}]: must be a dict with an 'action'"
                ))
            }
        };
        if entries::frees_nothing(row.action) {
            continue; // memory is freed at free_completed
        }
        let t = *t0.get_or_insert(row.time_us);
        let stack = if row.action == A_ALLOC {
            frames.index(l, &row, e)
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
