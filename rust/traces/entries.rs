//! Trace entries of a snapshot's `device_traces`, stored as columns while the pickle loads
//! (one row per entry dict instead of a dict of boxed values).

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
];
pub const A_ALLOC: u8 = 0;
pub const A_FREE_REQUESTED: u8 = 1;
pub const A_FREE_COMPLETED: u8 = 2;
pub const A_OOM: u8 = 7;
pub const A_SNAPSHOT: u8 = 8;

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

#[derive(Default)]
pub struct Entries {
    pub action: Vec<u8>,
    pub addr: Vec<u64>,
    pub size: Vec<u64>,
    pub stream: Vec<u64>,
    pub time_us: Vec<i64>,
    pub stack: Vec<i32>,
    /// (row, bytes free on the device) of each `oom` that recorded it
    pub device_free: Vec<(u32, u64)>,
    keys: [u32; 7],
    actions: FxHashMap<u32, u8>,
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

    pub fn row(&self, i: usize) -> Row {
        Row {
            action: self.action[i],
            addr: self.addr[i],
            size: self.size[i],
            stream: self.stream[i],
            time_us: self.time_us[i],
            stack: self.stack[i],
            device_free: None,
        }
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
        match r.action {
            A_FREE_REQUESTED | A_SNAPSHOT => {}
            A_OOM => r.size = size?,
            _ => {
                r.addr = addr?;
                r.size = size?;
            }
        }
        r.addr = addr.unwrap_or(0);
        r.size = size.unwrap_or(0);
        let i = self.len();
        if i >= u32::MAX as usize {
            return None;
        }
        self.action.push(r.action);
        self.addr.push(r.addr);
        self.size.push(r.size);
        self.stream.push(r.stream);
        self.time_us.push(r.time_us);
        self.stack.push(r.stack);
        if let Some(f) = r.device_free {
            self.device_free.push((i as u32, f));
        }
        Some(i as u32)
    }

    /// The `device_free` of row `i`, if it recorded one.
    pub fn device_free_of(&self, i: u32) -> Option<u64> {
        self.device_free
            .binary_search_by_key(&i, |&(r, _)| r)
            .ok()
            .map(|k| self.device_free[k].1)
    }
}
