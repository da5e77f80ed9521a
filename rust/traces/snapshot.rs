//! One device's trace out of a loaded snapshot: the final segments and live blocks, the
//! history in order, and the state at its start rebuilt by rewinding the history from the
//! final state (`python/gpumm/traces/snapshot.py` says what each entry means).

use rustc_hash::FxHashMap;

use super::entries::{self, Row, A_FREE_REQUESTED, A_OOM};
use super::log::{self, Log, Start};
use super::pickle::{Loaded, Value};
use super::TraceError;

mod history;
use history::{history_log, moved_log, History};

/// Block states that hold memory: allocated, or freed by the program but waiting for the
/// streams that used it (`record_stream`). PyTorch writes `active_pending_free`; its
/// documentation of the layout names it `active_awaiting_free`.
const LIVE_STATES: &[&str] = &[
    "active_allocated",
    "active_pending_free",
    "active_awaiting_free",
];

/// One device's trace.
pub struct DeviceTrace {
    pub device: u64,
    pub log: Log,
    pub start: Start,
    /// "file:line:function" of each stack the events refer to
    pub frames: Stacks,
    /// indices into the segments list of this device's segments
    pub final_segments: Vec<usize>,
    pub has_history: bool,
    /// the first event's `time_us`: event times are counted from it
    pub t0: i64,
}

type Dict = [(Value, Value)];

fn fail<T>(msg: String) -> Result<T, TraceError> {
    Err(TraceError(msg))
}

/// The root's dict (a bare list of segments, as `torch.cuda.memory_snapshot()` returns,
/// reads as a snapshot of that state with no history).
pub fn root_dict(l: &Loaded) -> Option<&Dict> {
    match &l.root {
        Value::Dict(d) => Some(d),
        _ => None,
    }
}

/// The segments list: the root's `segments`, or the root itself when it is a list.
pub fn segments<'a>(l: &'a Loaded, name: &str) -> Result<&'a [Value], TraceError> {
    match &l.root {
        Value::List(s) if s.iter().all(|x| matches!(x, Value::Dict(_))) => Ok(s),
        Value::Dict(d) => match l.get(d, "segments") {
            Some(Value::List(s)) => Ok(s),
            Some(_) => fail(format!("{name}: 'segments' must be a list")),
            None => fail(format!(
                "{name}: not a PyTorch memory snapshot (no 'segments' key)"
            )),
        },
        _ => fail(format!(
            "{name}: not a PyTorch memory snapshot (no 'segments' key)"
        )),
    }
}

/// Python's truthiness of a value, for `x or []`.
fn truthy(v: &Value) -> bool {
    match v {
        Value::None => false,
        Value::Bool(b) => *b,
        Value::Int(n) => *n != 0,
        Value::Float(f) => *f != 0.0,
        Value::List(l) | Value::Tuple(l) | Value::Set(l, _) => !l.is_empty(),
        Value::EntryList(r) => !r.is_empty(),
        Value::Dict(d) => !d.is_empty(),
        _ => true,
    }
}

fn device_traces(l: &Loaded) -> Option<&Value> {
    root_dict(l)
        .and_then(|d| l.get(d, "device_traces"))
        .filter(|v| truthy(v))
}

fn is_oom(l: &Loaded, v: &Value) -> bool {
    match v {
        Value::Entry(r) => l.entries.action.get(*r as usize) == Some(&A_OOM),
        Value::Dict(d) => l.as_str(l.get(d, "action").unwrap_or(&Value::None)) == Some("oom"),
        _ => false,
    }
}

/// The devices with history or segments: those with a recorded `oom` first, then by index.
pub fn devices(l: &Loaded) -> Vec<u64> {
    let mut found = std::collections::BTreeSet::new();
    let traces: &[Value] = match device_traces(l) {
        Some(Value::List(t)) => t,
        _ => &[],
    };
    for (d, h) in traces.iter().enumerate() {
        if matches!(h, Value::List(x) if !x.is_empty()) || matches!(h, Value::EntryList(_)) {
            found.insert(d as u64);
        }
    }
    let segs: &[Value] = match &l.root {
        Value::List(s) => s,
        Value::Dict(d) => match l.get(d, "segments") {
            Some(Value::List(s)) => s,
            _ => &[],
        },
        _ => &[],
    };
    for seg in segs {
        if let Value::Dict(sd) = seg {
            match l.get(sd, "device") {
                None => {
                    found.insert(0);
                }
                Some(Value::Int(d)) if *d >= 0 => {
                    found.insert(*d as u64);
                }
                _ => {}
            }
        }
    }
    if found.is_empty() {
        found.insert(0);
    }
    let had_oom = |d: u64| match traces.get(d as usize) {
        Some(Value::List(h)) => h.iter().any(|e| is_oom(l, e)),
        Some(Value::EntryList(h)) => h.iter().any(|&r| is_oom(l, &Value::Entry(r))),
        _ => false,
    };
    let mut v: Vec<u64> = found.into_iter().collect();
    v.sort_by_key(|&d| (!had_oom(d), d));
    v
}

/// Python's `repr` of a value, for error messages.
pub fn repr(l: &Loaded, v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Int(n) => n.to_string(),
        Value::BigInt(_) => "<a large int>".into(),
        Value::Float(f) => format!("{f:?}"),
        Value::Str(s) => format!("{:?}", l.str(*s)).replace('"', "'"),
        Value::Bytes(_) => "b'...'".into(),
        Value::List(_) | Value::Stack(_) | Value::EntryList(_) => "[...]".into(),
        Value::Tuple(_) => "(...)".into(),
        Value::Dict(_) | Value::Frame(_) | Value::Entry(_) => "{...}".into(),
        Value::Set(..) => "{...}".into(),
    }
}

/// Python's `str` of a frame field.
fn text(l: &Loaded, v: &Value) -> String {
    match v {
        Value::Str(s) => l.str(*s).to_string(),
        _ => repr(l, v),
    }
}

fn uint(l: &Loaded, d: &Dict, key: &str, at: &dyn Fn() -> String) -> Result<u64, TraceError> {
    match l.get(d, key) {
        Some(Value::Int(n)) if *n >= 0 => Ok(*n as u64),
        v => fail(format!(
            "{}: '{key}' must be a non-negative int, got {}",
            at(),
            v.map(|v| repr(l, v)).unwrap_or_else(|| "None".into())
        )),
    }
}

fn stream_of(l: &Loaded, d: &Dict) -> u64 {
    match l.get(d, "stream") {
        Some(Value::Int(n)) if *n >= 0 => *n as u64,
        Some(Value::Bool(b)) => *b as u64,
        _ => 0,
    }
}

/// Segments in insertion order with removal, as the Python reader's dict behaved (the order
/// decides which segment `containing` finds when two touch).
#[derive(Default)]
struct Segs {
    order: Vec<(u64, u64, u64, bool)>,
    at: FxHashMap<u64, usize>,
}

impl Segs {
    fn insert(&mut self, addr: u64, size: u64, stream: u64) {
        if let Some(&i) = self.at.get(&addr) {
            self.order[i].1 = size;
            self.order[i].2 = stream;
            return;
        }
        self.at.insert(addr, self.order.len());
        self.order.push((addr, size, stream, true));
    }

    fn pop(&mut self, addr: u64) -> Option<(u64, u64)> {
        let i = self.at.remove(&addr)?;
        self.order[i].3 = false;
        Some((self.order[i].1, self.order[i].2))
    }

    fn get(&self, addr: u64) -> Option<(u64, u64)> {
        self.at
            .get(&addr)
            .map(|&i| (self.order[i].1, self.order[i].2))
    }

    /// The start of the segment holding `addr` (or ending at it).
    fn containing(&self, addr: u64) -> Option<u64> {
        self.order
            .iter()
            .find(|s| s.3 && s.0 <= addr && addr as u128 <= s.0 as u128 + s.1 as u128)
            .map(|s| s.0)
    }

    /// Rewinds a `segment_map`: the pages were not mapped before it.
    fn unmap(&mut self, addr: u64, size: u64) {
        let Some(a) = self.containing(addr) else {
            return;
        };
        let (total, stream) = self.pop(a).expect("found above");
        let before = addr - a;
        let after = (a as i128 + total as i128) - (addr as i128 + size as i128);
        if before > 0 {
            self.insert(a, before, stream);
        }
        if after > 0 {
            self.insert(addr.saturating_add(size), after as u64, stream);
        }
    }

    /// Rewinds a `segment_unmap`: the pages were mapped before it, joined to what they touch.
    fn map(&mut self, addr: u64, size: u64, stream: u64) {
        let a = self.containing(addr);
        match a {
            Some(a) if a.wrapping_add(self.get(a).expect("live").0) == addr => {
                let (total, st) = self.pop(a).expect("live");
                self.insert(a, total.saturating_add(size), st);
            }
            _ => self.insert(addr, size, stream),
        }
        let next = addr.saturating_add(size);
        if let (Some(a), Some(_)) = (a, self.get(next)) {
            let (more, _) = self.pop(next).expect("live");
            if let Some((total, st)) = self.pop(a) {
                self.insert(a, total.saturating_add(more), st);
            }
        }
    }
}

/// Reads `device`'s trace. `name` names the file in errors.
pub fn read_device(l: &Loaded, name: &str, device: u64) -> Result<DeviceTrace, TraceError> {
    let segments = segments(l, name)?;
    let traces: &[Value] = match device_traces(l) {
        None => &[],
        Some(Value::List(t)) => t,
        Some(_) => return fail(format!("{name}: no device_traces for device {device}")),
    };
    if !traces.is_empty() && device as usize >= traces.len() {
        return fail(format!("{name}: no device_traces for device {device}"));
    }
    let history = match traces.get(device as usize) {
        None => History::Values(&[]),
        Some(Value::List(h)) => History::Values(h),
        Some(Value::EntryList(h)) => History::Rows(h),
        Some(_) => return fail(format!("{name}: device_traces[{device}] must be a list")),
    };

    // the final state
    let mut segs = Segs::default();
    let mut live: FxHashMap<u64, (u64, u64, u64)> = FxHashMap::default();
    let mut final_segments = Vec::new();
    let mut budget = 1_000_000usize.saturating_add(16 * segments.len());
    for (i, seg) in segments.iter().enumerate() {
        let at = || format!("{name}: segments[{i}]");
        let Value::Dict(sd) = seg else {
            return fail(format!("{}: must be a dict", at()));
        };
        match l.get(sd, "device") {
            None => {}
            Some(Value::Int(d)) if *d >= 0 && *d as u64 == device => {}
            Some(Value::Bool(b)) if *b as u64 == device => {}
            _ => continue,
        }
        let addr = uint(l, sd, "address", &at)?;
        let total = uint(l, sd, "total_size", &at)?;
        let stream = stream_of(l, sd);
        segs.insert(addr, total, stream);
        final_segments.push(i);
        let mut cursor = addr as u128;
        let blocks: &[Value] = match l.get(sd, "blocks") {
            None => &[],
            Some(b) if !truthy(b) => &[],
            Some(Value::List(b)) => b,
            Some(_) => return fail(format!("{}: 'blocks' must be a list", at())),
        };
        budget = budget.checked_sub(blocks.len()).ok_or_else(|| {
            TraceError(format!(
                "{name}: more blocks than the file could hold (shared lists?)"
            ))
        })?;
        for (j, b) in blocks.iter().enumerate() {
            let bat = || format!("{name}: segments[{i}].blocks[{j}]");
            let Value::Dict(bd) = b else {
                return fail(format!("{}: must be a dict", bat()));
            };
            let size = uint(l, bd, "size", &bat)?;
            let baddr = if l.get(bd, "address").is_some() {
                uint(l, bd, "address", &bat)?
            } else {
                u64::try_from(cursor)
                    .map_err(|_| TraceError(format!("{}: address overflows", bat())))?
            };
            let state = l.get(bd, "state").and_then(|s| l.as_str(s));
            if state.is_some_and(|s| LIVE_STATES.contains(&s)) {
                let req = match l.get(bd, "requested_size") {
                    Some(Value::Int(r)) if *r >= 0 => *r as u64,
                    _ => size,
                };
                live.insert(baddr, (req, size, stream));
            }
            cursor = baddr as u128 + size as u128;
        }
        if cursor > addr as u128 + total as u128 {
            return fail(format!("{}: blocks overrun the segment", at()));
        }
    }

    // the history
    let mut frames = Stacks::default();
    // the rows may move into this log only when no other device's history holds any
    let shared = traces.iter().enumerate().any(|(j, h)| {
        j != device as usize
            && match h {
                Value::EntryList(_) => true,
                Value::List(x) => x.iter().any(|e| matches!(e, Value::Entry(_))),
                _ => false,
            }
    });
    let moved = if shared {
        None
    } else {
        moved_log(l, history, &mut frames)
    };
    let (log, t0) = match moved {
        Some(x) => x,
        None => history_log(l, name, device, history, &mut frames, &|a| {
            live.contains_key(&a)
        })?,
    };

    // rewound to the start
    let mut start_live = live;
    for k in (0..log.len()).rev() {
        let (ptr, size, stream) = (log.ptr[k], log.size[k], log.stream[k]);
        match log.action[k] {
            log::ALLOC => {
                start_live.remove(&ptr);
            }
            log::FREE => {
                start_live.insert(ptr, (size, block_size(size), stream));
            }
            log::SEGMENT_ALLOC => {
                segs.pop(ptr);
            }
            log::SEGMENT_FREE => segs.insert(ptr, size, stream),
            log::SEGMENT_MAP => segs.unmap(ptr, size),
            log::SEGMENT_UNMAP => segs.map(ptr, size, stream),
            _ => {}
        }
    }
    let mut start = Start {
        segments: segs
            .order
            .iter()
            .filter(|s| s.3)
            .map(|s| (s.0, s.1, s.2))
            .collect(),
        blocks: start_live
            .into_iter()
            .map(|(a, (r, b, s))| (a, r, b, s))
            .collect(),
    };
    start.segments.sort_unstable();
    start.blocks.sort_unstable();
    let has_history = log.action.contains(&log::ALLOC);
    Ok(DeviceTrace {
        device,
        log,
        start,
        frames,
        final_segments,
        has_history,
        t0,
    })
}

/// The caching allocator's block for a request (512 B steps): the block of a free whose
/// allocation the history does not hold.
fn block_size(requested: u64) -> u64 {
    requested.div_ceil(512).saturating_mul(512).max(512)
}

/// A trace entry that did not fit the compact row (a field of another type): read as the
/// Python reader did, refusing what it refused. None: an entry that frees nothing (a
/// `free_requested` is read where it can be, for a history that frees there).
fn general_entry(l: &Loaded, d: &Dict, at: &dyn Fn() -> String) -> Result<Option<Row>, TraceError> {
    let act = match l.get(d, "action").and_then(|a| l.as_str(a)) {
        Some(a) => a,
        None => return fail(format!("{}: must be a dict with an 'action'", at())),
    };
    let Some(code) = entries::SNAP_ACTIONS.iter().position(|a| *a == act) else {
        return fail(format!("{}: unknown action {act:?}", at()).replace('"', "'"));
    };
    let code = code as u8;
    if code == A_FREE_REQUESTED {
        return Ok(requested_entry(l, d, at));
    }
    if entries::frees_nothing(code) {
        return Ok(None);
    }
    let time_us = time_of(l, d);
    let addr = if code == A_OOM && matches!(l.get(d, "addr"), None | Some(Value::None)) {
        0
    } else {
        uint(l, d, "addr", at)?
    };
    let size = uint(l, d, "size", at)?;
    let device_free = match l.get(d, "device_free") {
        Some(Value::Int(f)) if *f >= 0 && code == A_OOM => Some(*f as u64),
        _ => None,
    };
    Ok(Some(Row {
        action: code,
        addr,
        size,
        stream: stream_of(l, d),
        time_us,
        stack: -1,
        device_free,
    }))
}

/// A `free_requested` entry that did not fit the compact row, as a row where its address and
/// size read as they would in a `free_completed` (else None: skipped, as when a
/// `free_completed` frees the memory).
fn requested_entry(l: &Loaded, d: &Dict, at: &dyn Fn() -> String) -> Option<Row> {
    Some(Row {
        action: A_FREE_REQUESTED,
        addr: uint(l, d, "addr", at).ok()?,
        size: uint(l, d, "size", at).ok()?,
        stream: stream_of(l, d),
        time_us: time_of(l, d),
        stack: -1,
        device_free: None,
    })
}

/// An entry's `time_us` (0 where it has none).
fn time_of(l: &Loaded, d: &Dict) -> i64 {
    match l.get(d, "time_us") {
        Some(Value::Int(t)) => *t,
        Some(Value::Bool(b)) => *b as i64,
        _ => 0,
    }
}

/// A device's stack table: each frame's "file:line:function" text once, and each stack as
/// indices into those texts (stacks that read the same are one).
#[derive(Default)]
pub struct Stacks {
    pub texts: Vec<String>,
    pub stacks: Vec<Vec<u32>>,
    text_ids: FxHashMap<String, u32>,
    by_frame: FxHashMap<u32, u32>,
    by_texts: FxHashMap<Vec<u32>, i32>,
    by_stack: FxHashMap<u32, i32>,
}

impl Stacks {
    fn text(&mut self, t: String) -> u32 {
        if let Some(&i) = self.text_ids.get(&t) {
            return i;
        }
        let i = self.texts.len() as u32;
        self.texts.push(t.clone());
        self.text_ids.insert(t, i);
        i
    }

    fn frame(&mut self, l: &Loaded, f: u32) -> u32 {
        if let Some(&i) = self.by_frame.get(&f) {
            return i;
        }
        let (file, line, name) = l.frames[f as usize];
        let i = self.text(format!("{}:{line}:{}", l.str(file), l.str(name)));
        self.by_frame.insert(f, i);
        i
    }

    fn add(&mut self, ids: Vec<u32>) -> i32 {
        if ids.is_empty() {
            return -1;
        }
        if let Some(&i) = self.by_texts.get(&ids) {
            return i;
        }
        let i = self.stacks.len() as i32;
        self.stacks.push(ids.clone());
        self.by_texts.insert(ids, i);
        i
    }

    /// The table index of an allocation's frames (added on first sight), -1: none.
    fn index(&mut self, l: &Loaded, row: &Row, e: &Value) -> i32 {
        if row.stack >= 0 {
            return self.interned(l, row.stack as u32);
        }
        let Value::Dict(d) = e else { return -1 };
        let list: &[Value] = match l.get(d, "frames") {
            Some(Value::List(f)) => f,
            Some(Value::Stack(s)) => return self.interned(l, *s),
            _ => return -1,
        };
        let ids: Vec<u32> = list
            .iter()
            .filter_map(|f| match f {
                Value::Dict(fd) => {
                    let get = |k: &str, dflt: &str| {
                        l.get(fd, k)
                            .map(|v| text(l, v))
                            .unwrap_or_else(|| dflt.into())
                    };
                    let t = format!(
                        "{}:{}:{}",
                        get("filename", "?"),
                        get("line", "0"),
                        get("name", "?")
                    );
                    Some(self.text(t))
                }
                Value::Frame(fi) => Some(self.frame(l, *fi)),
                _ => None,
            })
            .collect();
        self.add(ids)
    }

    fn interned(&mut self, l: &Loaded, s: u32) -> i32 {
        if let Some(&i) = self.by_stack.get(&s) {
            return i;
        }
        let ids: Vec<u32> = l.stacks[s as usize]
            .iter()
            .map(|&f| self.frame(l, f))
            .collect();
        let i = self.add(ids);
        self.by_stack.insert(s, i);
        i
    }
}
