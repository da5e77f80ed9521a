//! Trace entries of a snapshot's `device_traces`, stored as columns while the pickle loads
//! (one row per entry dict instead of a dict of boxed values). Entries that free nothing
//! (`free_requested`, `snapshot`, `annotate`: [`frees_nothing`]) hold no row: their value
//! names the action alone ([`skip_row`]).
//!
//! A `free_requested` read before any `free_completed` is kept aside instead
//! ([`Entries::requested`]): a history recorded with
//! `_record_memory_history(skip_actions=["free_completed"])` holds no `free_completed`, and its
//! memory is then freed at `free_requested` (`snapshot/history.rs`). Once a `free_completed`
//! is read the history frees at those, and later `free_requested` entries are skipped.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

use super::pickle::Value;

/// The actions of PyTorch's trace entries (`TraceEntry::Action` in CUDACachingAllocator.h).
pub const SNAP_ACTIONS: &[&str] = &[
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    // metadata attached to a live allocation (`_annotate_tensor`, recent PyTorch)
    "annotate",
];
pub const A_ALLOC: u8 = 0;
pub const A_FREE_REQUESTED: u8 = 1;
pub const A_FREE_COMPLETED: u8 = 2;
pub const A_OOM: u8 = 7;
pub const A_SNAPSHOT: u8 = 8;
pub const A_ANNOTATE: u8 = 9;

/// Whether entries of this action change no memory (no row is stored for them).
pub fn frees_nothing(action: u8) -> bool {
    matches!(action, A_FREE_REQUESTED | A_SNAPSHOT | A_ANNOTATE)
}

/// Row values from here up name the action of an entry that holds no row; rows below it.
const SKIP_BASE: u32 = 0x7FFF_FF00;

/// Row values from here up are `free_requested` entries kept aside: `REQUESTED_BASE + k` is
/// [`Entries::requested`]`[k]`.
const REQUESTED_BASE: u32 = SKIP_BASE + 0x100;

/// The row value of an entry of `action` that [`frees_nothing`] (no row is stored).
fn skip_row(action: u8) -> u32 {
    SKIP_BASE + action as u32
}

/// The action a row value names, if it is one of an entry that holds no row.
fn skip_action(row: u32) -> Option<u8> {
    match row.checked_sub(SKIP_BASE)? {
        k if k >= REQUESTED_BASE - SKIP_BASE => Some(A_FREE_REQUESTED),
        k => Some(k as u8),
    }
}

/// Whether a row value is one of an entry that holds no row.
pub fn skipped(row: u32) -> bool {
    skip_action(row).is_some()
}

/// One entry: its action (an index of [`SNAP_ACTIONS`]), address (None for an `oom`),
/// size, stream, `time_us`, interned stack (-1: none) and `device_free` (an `oom`'s).
#[derive(Clone, Copy, Debug, Default)]
pub struct Row {
    pub action: u8,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
    pub stack: i32,
    pub device_free: Option<u64>,
}

/// The columns of the rows but their action: a device's log may take them whole
/// ([`Entries::take_cols`]) rather than copy them.
#[derive(Default)]
pub struct Cols {
    pub addr: Vec<u64>,
    pub size: Vec<u64>,
    pub stream: Vec<u64>,
    pub time_us: Vec<i64>,
    pub stack: Vec<i32>,
}

#[derive(Default)]
pub struct Entries {
    pub action: Vec<u8>,
    cols: Mutex<Cols>,
    /// whether [`Entries::take_cols`] took the columns (rows then read as zeros)
    taken: std::sync::atomic::AtomicBool,
    /// (row, bytes free on the device) of each `oom` that recorded it
    pub device_free: Vec<(u32, u64)>,
    keys: [u32; 7],
    actions: FxHashMap<u32, u8>,
    /// the `free_requested` entries read before the first `free_completed` (their value:
    /// `REQUESTED_BASE` + index), for a history that holds no `free_completed`
    pub requested: Vec<Row>,
    /// whether a `free_completed` entry has been read
    completes: bool,
}

const K_ACTION: usize = 0;
const K_ADDR: usize = 1;
const K_SIZE: usize = 2;
const K_STREAM: usize = 3;
const K_TIME: usize = 4;
const K_FRAMES: usize = 5;
const K_DEVICE_FREE: usize = 6;

impl Entries {
    /// Interns the key and action names the rows are recognised by.
    pub fn init_keys(&mut self, intern: &mut dyn FnMut(&str) -> u32) {
        let names = [
            "action",
            "addr",
            "size",
            "stream",
            "time_us",
            "frames",
            "device_free",
        ];
        for (k, n) in self.keys.iter_mut().zip(names) {
            *k = intern(n);
        }
        for (code, a) in SNAP_ACTIONS.iter().enumerate() {
            self.actions.insert(intern(a), code as u8);
        }
    }

    pub fn len(&self) -> usize {
        self.action.len()
    }

    pub fn is_empty(&self) -> bool {
        self.action.is_empty()
    }

    /// Row `i` (a skipped entry's value reads as its action alone; after
    /// [`Entries::take_cols`], every field but the action reads as zero).
    pub fn row(&self, i: usize) -> Row {
        if let Some(k) = (i as u32).checked_sub(REQUESTED_BASE) {
            return self.requested.get(k as usize).copied().unwrap_or(Row {
                action: A_FREE_REQUESTED,
                stack: -1,
                ..Row::default()
            });
        }
        if let Some(action) = skip_action(i as u32) {
            return Row {
                action,
                stack: -1,
                ..Row::default()
            };
        }
        let c = self.cols.lock().unwrap_or_else(|e| e.into_inner());
        Row {
            action: self.action[i],
            addr: c.addr.get(i).copied().unwrap_or(0),
            size: c.size.get(i).copied().unwrap_or(0),
            stream: c.stream.get(i).copied().unwrap_or(0),
            time_us: c.time_us.get(i).copied().unwrap_or(0),
            stack: c.stack.get(i).copied().unwrap_or(-1),
            device_free: None,
        }
    }

    /// Takes the columns (once: None after the first), leaving the actions.
    pub fn take_cols(&self) -> Option<Cols> {
        use std::sync::atomic::Ordering;
        let mut c = self.cols.lock().unwrap_or_else(|e| e.into_inner());
        if self.taken.swap(true, Ordering::SeqCst) {
            return None;
        }
        Some(std::mem::take(&mut *c))
    }

    /// Stores `d` as a row if it is a trace entry whose fields all have the types PyTorch
    /// writes (so reading it cannot fail later); None leaves it a plain dict, read (and
    /// refused, if malformed) by the general path.
    pub fn push_dict(&mut self, d: &[(Value, Value)]) -> Option<u32> {
        let mut r = Row {
            stack: -1,
            ..Row::default()
        };
        let (mut action, mut addr, mut size) = (None, None, None);
        for (k, v) in d {
            let Value::Str(k) = k else { return None };
            let slot = self.keys.iter().position(|x| x == k);
            match (slot, v) {
                (Some(K_ACTION), Value::Str(a)) => action = Some(*self.actions.get(a)?),
                (Some(K_ACTION), _) => return None,
                (Some(K_ADDR), Value::Int(n)) if *n >= 0 => addr = Some(*n as u64),
                (Some(K_ADDR), Value::None) => addr = None,
                (Some(K_ADDR), _) => return None,
                (Some(K_SIZE), Value::Int(n)) if *n >= 0 => size = Some(*n as u64),
                (Some(K_SIZE), _) => return None,
                (Some(K_STREAM), Value::Int(n)) if *n >= 0 => r.stream = *n as u64,
                (Some(K_STREAM), Value::Int(_)) => return None,
                (Some(K_STREAM), _) => r.stream = 0,
                (Some(K_TIME), Value::Int(n)) => r.time_us = *n,
                (Some(K_TIME), Value::Bool(_) | Value::BigInt(_)) => return None,
                (Some(K_TIME), _) => r.time_us = 0,
                (Some(K_FRAMES), Value::Stack(s)) => r.stack = *s as i32,
                (Some(K_FRAMES), Value::List(l)) if l.is_empty() => r.stack = -1,
                (Some(K_FRAMES), Value::None) => r.stack = -1,
                (Some(K_FRAMES), _) => return None,
                (Some(K_DEVICE_FREE), Value::Int(n)) if *n >= 0 => r.device_free = Some(*n as u64),
                (Some(K_DEVICE_FREE), _) => return None,
                _ => {}
            }
        }
        r.action = action?;
        self.completes |= r.action == A_FREE_COMPLETED;
        if r.action == A_FREE_REQUESTED && !self.completes {
            r.addr = addr?;
            r.size = size?;
            return self.keep_requested(r);
        }
        if frees_nothing(r.action) {
            return Some(skip_row(r.action));
        }
        match r.action {
            A_OOM => r.size = size?,
            _ => {
                r.addr = addr?;
                r.size = size?;
            }
        }
        r.addr = addr.unwrap_or(0);
        r.size = size.unwrap_or(0);
        let i = self.len();
        if i >= SKIP_BASE as usize {
            return None;
        }
        let c = self.cols.get_mut().unwrap_or_else(|e| e.into_inner());
        self.action.push(r.action);
        c.addr.push(r.addr);
        c.size.push(r.size);
        c.stream.push(r.stream);
        c.time_us.push(r.time_us);
        c.stack.push(r.stack);
        if let Some(f) = r.device_free {
            self.device_free.push((i as u32, f));
        }
        Some(i as u32)
    }

    /// Keeps `free_requested` entry `r` aside (None: too many to number).
    fn keep_requested(&mut self, r: Row) -> Option<u32> {
        let v = u32::try_from(self.requested.len())
            .ok()
            .and_then(|k| REQUESTED_BASE.checked_add(k))?;
        self.requested.push(r);
        Some(v)
    }

    /// The `device_free` of row `i`, if it recorded one.
    pub fn device_free_of(&self, i: u32) -> Option<u64> {
        self.device_free
            .binary_search_by_key(&i, |&(r, _)| r)
            .ok()
            .map(|k| self.device_free[k].1)
    }
}
