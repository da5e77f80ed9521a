//! A pickle reader for plain data only: the opcodes of protocols 0–5 that build `None`,
//! booleans, numbers, strings, bytes, lists, tuples, dicts and sets. Every opcode that imports
//! or calls (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`,
//! `NEWOBJ_EX`, `EXT1/2/4`, `PERSID`, `BINPERSID`) and out-of-band buffers are refused with
//! an error naming it (and, for the globals, the module and name asked for). No length field
//! may run past the end of the input and no memo index may exceed the opcodes read so far, so
//! a small file cannot ask for a large allocation (the memory bombs in tests/fuzz/regressions).
//!
//! Containers are built on the stack and frozen (`Rc`) when they are put into their parent,
//! so memo references share them as Python's unpickler does. With `compact` set, two shapes
//! are stored smaller as they complete: a frame dict (`filename`, `line`, `name`) becomes an
//! interned frame, a list of them an interned stack, and a trace entry dict (one with a string
//! `action`) one row of [`Entries`], a list of entries the rows' indices alone; everything
//! else stays a plain value. The memo holds 4 bytes a slot: an entry's row, or an index
//! into a table of the other values memoized.

use std::io::BufRead;
use std::io::Read;
use std::sync::Arc as Rc;

use rustc_hash::FxHashMap;

use super::entries::Entries;
use super::TraceError;

mod memo;
mod ops;

/// A value of the pickle. Strings are indices into [`Loaded::strings`].
#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside `i64`: its little-endian two's-complement bytes (pickle's LONG).
    BigInt(Rc<[u8]>),
    Float(f64),
    Str(u32),
    Bytes(Rc<[u8]>),
    List(Rc<Vec<Value>>),
    Tuple(Rc<Vec<Value>>),
    Dict(Rc<Vec<(Value, Value)>>),
    Set(Rc<Vec<Value>>, bool),
    /// A frame dict, interned: index into [`Loaded::frames`] (compact mode).
    Frame(u32),
    /// A list of frame dicts, interned: index into [`Loaded::stacks`] (compact mode).
    Stack(u32),
    /// A trace entry: a row of [`Loaded::entries`] (compact mode).
    Entry(u32),
    /// A list of trace entries (not empty): their rows (compact mode).
    EntryList(Rc<Vec<u32>>),
}

/// A list being built: its values, or, while every value is a trace entry, their rows.
enum ListBuf {
    Vals(Vec<Value>),
    Rows(Vec<u32>),
}

impl ListBuf {
    fn extend(&mut self, items: Vec<Value>) {
        if let ListBuf::Vals(v) = self {
            if v.is_empty() && items.first().is_some_and(|x| matches!(x, Value::Entry(_))) {
                *self = ListBuf::Rows(Vec::new());
            }
        }
        let mut it = items.into_iter();
        if let ListBuf::Rows(r) = self {
            for x in it.by_ref() {
                match x {
                    Value::Entry(i) => r.push(i),
                    other => {
                        let mut v: Vec<Value> = r.iter().map(|&i| Value::Entry(i)).collect();
                        v.push(other);
                        *self = ListBuf::Vals(v);
                        break;
                    }
                }
            }
        }
        if let ListBuf::Vals(v) = self {
            v.extend(it);
        }
    }
}

/// A loaded pickle: the root value and the tables its values refer to.
pub struct Loaded {
    pub root: Value,
    pub strings: Vec<Box<str>>,
    /// (filename, line, name) of each interned frame
    pub frames: Vec<(u32, i64, u32)>,
    /// frame indices of each interned stack
    pub stacks: Vec<Box<[u32]>>,
    pub entries: Entries,
}

impl Loaded {
    pub fn str(&self, i: u32) -> &str {
        &self.strings[i as usize]
    }

    /// The string value `v` holds, if it is one.
    pub fn as_str<'a>(&'a self, v: &Value) -> Option<&'a str> {
        match v {
            Value::Str(i) => Some(self.str(*i)),
            _ => None,
        }
    }

    /// `d[key]` of a dict value (the last entry with that key, as Python's dict keeps).
    pub fn get<'a>(&self, d: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
        d.iter()
            .rev()
            .find(|(k, _)| self.as_str(k) == Some(key))
            .map(|(_, v)| v)
    }
}

enum Item {
    Done(Value),
    List(ListBuf, Option<u32>),
    Dict(Vec<(Value, Value)>, Option<u32>),
    Set(Vec<Value>, Option<u32>),
    Mark,
}

/// A memo slot never stored, and one of a container still being built (its final value is
/// stored when it completes); below [`MEMO_ENTRY`], an index into `Vm::memo_vals`; from it,
/// an entry's row (`MEMO_ENTRY | row`).
const MEMO_EMPTY: u32 = u32::MAX;
const MEMO_PENDING: u32 = u32::MAX - 1;
const MEMO_ENTRY: u32 = 0x8000_0000;

struct Vm<R: BufRead> {
    input: R,
    /// bytes of input in all, and read so far
    len: usize,
    pos: usize,
    ops: usize,
    stack: Vec<Item>,
    memo: Vec<u32>,
    memo_vals: Vec<Value>,
    strings: Vec<Box<str>>,
    string_ids: FxHashMap<Box<str>, u32>,
    frames: Vec<(u32, i64, u32)>,
    frame_ids: FxHashMap<(u32, i64, u32), u32>,
    stacks: Vec<Box<[u32]>>,
    stack_ids: FxHashMap<Box<[u32]>, u32>,
    entries: Entries,
    compact: bool,
    /// the last two strings pushed, to name a STACK_GLOBAL's module and name
    last_strs: [Option<u32>; 2],
    keys: Keys,
    /// nesting depth of each container built (by address), to refuse deep nesting
    depths: FxHashMap<usize, u32>,
}

/// Interned ids of the keys the compact shapes are recognised by.
#[derive(Default)]
struct Keys {
    filename: u32,
    line: u32,
    name: u32,
}

/// Containers nest at most this deep (PyTorch's snapshots: 6).
const MAX_DEPTH: u32 = 200;

const SHARED: &str =
    "a container changed after it was referenced again (a structure that holds itself: not plain data)";

fn err<T>(msg: impl Into<String>) -> Result<T, TraceError> {
    Err(TraceError(msg.into()))
}

/// Loads `data`, a pickle of plain data. `compact`: store frames, stacks and trace entries
/// in their compact forms (for reading a snapshot); without it the value is exactly what
/// Python's unpickler would build.
pub fn load(data: &[u8], compact: bool) -> Result<Loaded, TraceError> {
    load_from(data, data.len(), compact)
}

/// [`load`] from a reader of `len` bytes (a file: its text is never held whole).
pub fn load_from(input: impl BufRead, len: usize, compact: bool) -> Result<Loaded, TraceError> {
    let mut vm = Vm {
        input,
        len,
        pos: 0,
        ops: 0,
        stack: Vec::new(),
        memo: Vec::new(),
        memo_vals: Vec::new(),
        strings: Vec::new(),
        string_ids: FxHashMap::default(),
        frames: Vec::new(),
        frame_ids: FxHashMap::default(),
        stacks: Vec::new(),
        stack_ids: FxHashMap::default(),
        entries: Entries::default(),
        compact,
        last_strs: [None, None],
        keys: Keys::default(),
        depths: FxHashMap::default(),
    };
    vm.keys = Keys {
        filename: vm.intern("filename"),
        line: vm.intern("line"),
        name: vm.intern("name"),
    };
    vm.entries
        .init_keys(&mut |s| vm_intern(&mut vm.strings, &mut vm.string_ids, s));
    let root = vm.run()?;
    Ok(Loaded {
        root,
        strings: vm.strings,
        frames: vm.frames,
        stacks: vm.stacks,
        entries: vm.entries,
    })
}

fn vm_intern(strings: &mut Vec<Box<str>>, ids: &mut FxHashMap<Box<str>, u32>, s: &str) -> u32 {
    if let Some(&i) = ids.get(s) {
        return i;
    }
    let i = strings.len() as u32;
    strings.push(s.into());
    ids.insert(s.into(), i);
    i
}

impl<R: BufRead> Vm<R> {
    fn intern(&mut self, s: &str) -> u32 {
        vm_intern(&mut self.strings, &mut self.string_ids, s)
    }

    fn io<T>(&self, r: std::io::Result<T>) -> Result<T, TraceError> {
        r.map_err(|e| TraceError(format!("cannot read at offset {}: {e}", self.pos)))
    }

    /// The next `n` bytes; refused when they would run past the end of the input, before
    /// anything of that size is allocated.
    fn take(&mut self, n: usize, what: &str) -> Result<Vec<u8>, TraceError> {
        let left = self.len.saturating_sub(self.pos);
        if n > left {
            return err(format!(
                "{what} of {n} bytes at offset {} runs past the end of the file ({left} left)",
                self.pos
            ));
        }
        let mut v = Vec::with_capacity(n);
        let r = (&mut self.input).take(n as u64).read_to_end(&mut v);
        self.io(r)?;
        if v.len() < n {
            return err(format!(
                "{what} at offset {} runs past the end of the file",
                self.pos
            ));
        }
        self.pos += n;
        Ok(v)
    }

    fn u8(&mut self) -> Result<u8, TraceError> {
        let pos = self.pos;
        let b = match self.input.fill_buf() {
            Ok(buf) => match buf.first() {
                Some(&b) => b,
                None => return err("an opcode argument runs past the end of the file"),
            },
            Err(e) => return err(format!("cannot read at offset {pos}: {e}")),
        };
        self.input.consume(1);
        self.pos += 1;
        Ok(b)
    }

    fn le(&mut self, n: usize) -> Result<u64, TraceError> {
        let mut b = [0u8; 8];
        let r = self.input.read_exact(&mut b[..n]);
        if r.is_err() {
            return err(format!(
                "an opcode argument at offset {} runs past the end of the file",
                self.pos
            ));
        }
        self.pos += n;
        Ok(u64::from_le_bytes(b))
    }

    fn line(&mut self) -> Result<Vec<u8>, TraceError> {
        let mut v = Vec::new();
        let left = self.len.saturating_sub(self.pos) as u64;
        let r = (&mut self.input).take(left).read_until(b'\n', &mut v);
        self.io(r)?;
        self.pos += v.len();
        if v.pop() != Some(b'\n') {
            return err("a text argument without its newline at the end of the file");
        }
        Ok(v)
    }

    fn push(&mut self, v: Value) {
        if let Value::Str(i) = v {
            self.last_strs = [self.last_strs[1], Some(i)];
        }
        self.stack.push(Item::Done(v));
    }

    fn text(&mut self, bytes: &[u8]) -> Result<Value, TraceError> {
        let s = std::str::from_utf8(bytes)
            .map_err(|e| TraceError(format!("a string that is not UTF-8 ({e})")))?;
        Ok(Value::Str(self.intern(s)))
    }

    /// A string of the next `n` bytes, interned (read in place when the buffer holds them).
    fn take_text(&mut self, n: usize) -> Result<Value, TraceError> {
        let buf = match self.input.fill_buf() {
            Ok(b) if b.len() >= n && n <= self.len.saturating_sub(self.pos) => b,
            _ => {
                let b = self.take(n, "a string")?;
                return self.text(&b);
            }
        };
        let s = std::str::from_utf8(&buf[..n])
            .map_err(|e| TraceError(format!("a string that is not UTF-8 ({e})")))?;
        let v = vm_intern(&mut self.strings, &mut self.string_ids, s);
        self.input.consume(n);
        self.pos += n;
        Ok(Value::Str(v))
    }

    /// Freezes the stack item into a value (compacting it in compact mode) and records it
    /// in the memo slot it was memoized under.
    fn finish(&mut self, item: Item) -> Result<Value, TraceError> {
        let (v, slot) = match item {
            Item::Done(v) => return Ok(v),
            Item::Mark => return err("a MARK where a value was expected"),
            Item::List(ListBuf::Rows(r), slot) => (Value::EntryList(Rc::new(r)), slot),
            Item::List(ListBuf::Vals(l), slot) => {
                let d = self.depth(&l)?;
                {
                    let v = self.compact_list(l);
                    (self.record(v, d), slot)
                }
            }
            Item::Dict(d, slot) => {
                let depth = self.depth_refs(d.iter().flat_map(|(k, v)| [k, v]))?;
                {
                    let v = self.compact_dict(d);
                    (self.record(v, depth), slot)
                }
            }
            Item::Set(s, slot) => {
                let d = self.depth(&s)?;
                (self.record(Value::Set(Rc::new(s), false), d), slot)
            }
        };
        if let Some(i) = slot {
            self.memo_store(i as usize, v.clone());
        }
        Ok(v)
    }

    /// The nesting depth of a container of `items`; refused beyond [`MAX_DEPTH`] (deeper
    /// data would recurse deeply where it is converted or dropped).
    fn depth(&self, items: &[Value]) -> Result<u32, TraceError> {
        self.depth_refs(items.iter())
    }

    fn depth_refs<'v>(&self, items: impl Iterator<Item = &'v Value>) -> Result<u32, TraceError> {
        let mut d = 0;
        for v in items {
            let k = match v {
                Value::List(a) | Value::Tuple(a) | Value::Set(a, _) => Rc::as_ptr(a) as usize,
                Value::Dict(a) => Rc::as_ptr(a) as *const u8 as usize,
                Value::Frame(_) | Value::Entry(_) => {
                    d = d.max(1);
                    continue;
                }
                Value::Stack(_) | Value::EntryList(_) => {
                    d = d.max(2);
                    continue;
                }
                _ => continue,
            };
            d = d.max(self.depths.get(&k).copied().unwrap_or(1));
        }
        if d + 1 > MAX_DEPTH {
            return err(format!(
                "data nested deeper than {MAX_DEPTH} levels (not a snapshot)"
            ));
        }
        Ok(d + 1)
    }

    fn record(&mut self, v: Value, depth: u32) -> Value {
        let k = match &v {
            Value::List(a) | Value::Tuple(a) | Value::Set(a, _) => Rc::as_ptr(a) as usize,
            Value::Dict(a) => Rc::as_ptr(a) as *const u8 as usize,
            _ => return v,
        };
        if depth > 1 {
            self.depths.insert(k, depth);
        } else {
            self.depths.remove(&k);
        }
        v
    }

    /// A tuple or frozenset of `items`, its depth checked.
    fn frozen(&mut self, items: Vec<Value>, set: bool) -> Result<Value, TraceError> {
        let d = self.depth(&items)?;
        let v = if set {
            Value::Set(Rc::new(items), true)
        } else {
            Value::Tuple(Rc::new(items))
        };
        Ok(self.record(v, d))
    }

    fn compact_list(&mut self, l: Vec<Value>) -> Value {
        if self.compact && !l.is_empty() && l.iter().all(|v| matches!(v, Value::Frame(_))) {
            let ids: Box<[u32]> = l
                .iter()
                .map(|v| match v {
                    Value::Frame(f) => *f,
                    _ => unreachable!("checked above"),
                })
                .collect();
            if let Some(&i) = self.stack_ids.get(&ids) {
                return Value::Stack(i);
            }
            let i = self.stacks.len() as u32;
            self.stacks.push(ids.clone());
            self.stack_ids.insert(ids, i);
            return Value::Stack(i);
        }
        Value::List(Rc::new(l))
    }

    fn compact_dict(&mut self, d: Vec<(Value, Value)>) -> Value {
        if !self.compact {
            return Value::Dict(Rc::new(d));
        }
        if d.len() == 3 {
            let (mut file, mut line, mut name) = (None, None, None);
            for (k, v) in &d {
                match (k, v) {
                    (Value::Str(k), Value::Str(s)) if *k == self.keys.filename => file = Some(*s),
                    (Value::Str(k), Value::Int(n)) if *k == self.keys.line => line = Some(*n),
                    (Value::Str(k), Value::Str(s)) if *k == self.keys.name => name = Some(*s),
                    _ => {}
                }
            }
            if let (Some(f), Some(l), Some(n)) = (file, line, name) {
                let key = (f, l, n);
                let i = match self.frame_ids.get(&key) {
                    Some(&i) => i,
                    None => {
                        let i = self.frames.len() as u32;
                        self.frames.push(key);
                        self.frame_ids.insert(key, i);
                        i
                    }
                };
                return Value::Frame(i);
            }
        }
        if let Some(row) = self.entries.push_dict(&d) {
            return Value::Entry(row);
        }
        Value::Dict(Rc::new(d))
    }

    fn pop_value(&mut self) -> Result<Value, TraceError> {
        match self.stack.pop() {
            Some(item) => self.finish(item),
            None => err("an opcode that pops from an empty stack"),
        }
    }

    /// The values above the topmost MARK, and the MARK removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, TraceError> {
        let at = self
            .stack
            .iter()
            .rposition(|i| matches!(i, Item::Mark))
            .ok_or_else(|| TraceError("an opcode that needs a MARK without one".into()))?;
        let items: Vec<Item> = self.stack.drain(at + 1..).collect();
        self.stack.pop();
        items.into_iter().map(|i| self.finish(i)).collect()
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), TraceError> {
        match self.stack.last_mut() {
            Some(Item::List(l, _)) => {
                l.extend(items);
                Ok(())
            }
            Some(Item::Done(Value::EntryList(r))) => match Rc::get_mut(r) {
                Some(r) => {
                    let mut l = ListBuf::Rows(std::mem::take(r));
                    l.extend(items);
                    let v = match l {
                        ListBuf::Rows(r) => Value::EntryList(Rc::new(r)),
                        ListBuf::Vals(v) => Value::List(Rc::new(v)),
                    };
                    self.stack.pop();
                    self.stack.push(Item::Done(v));
                    Ok(())
                }
                None => err(SHARED),
            },
            Some(Item::Done(Value::List(l))) => match Rc::get_mut(l) {
                Some(l) => {
                    l.extend(items);
                    Ok(())
                }
                None => err(SHARED),
            },
            _ => err("APPEND to something that is not a list"),
        }
    }

    fn setitems(&mut self, items: Vec<Value>) -> Result<(), TraceError> {
        if items.len() % 2 != 0 {
            return err("SETITEMS with an odd number of values");
        }
        let top = self.stack.last_mut();
        let d = match top {
            Some(Item::Dict(d, _)) => Some(d),
            Some(Item::Done(Value::Dict(d))) => match Rc::get_mut(d) {
                Some(d) => Some(d),
                None => return err(SHARED),
            },
            _ => None,
        };
        match d {
            Some(d) => {
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    if matches!(
                        k,
                        Value::List(_)
                            | Value::Dict(_)
                            | Value::Set(_, false)
                            | Value::Stack(_)
                            | Value::EntryList(_)
                    ) {
                        return err("a dict key that is not hashable");
                    }
                    d.push((k, v));
                }
                Ok(())
            }
            _ => err("SETITEM on something that is not a dict"),
        }
    }

    fn refuse(&mut self, op: u8, name: &str) -> Result<Value, TraceError> {
        let what = match op {
            b'c' | b'i' => {
                // GLOBAL/INST: "module\nname\n" follow the opcode
                match (self.line(), self.line()) {
                    (Ok(m), Ok(n)) => format!(
                        " {}.{}",
                        String::from_utf8_lossy(&m),
                        String::from_utf8_lossy(&n)
                    ),
                    _ => String::new(),
                }
            }
            0x93 => match self.last_strs {
                [Some(m), Some(n)] => {
                    format!(" {}.{}", self.strings[m as usize], self.strings[n as usize])
                }
                _ => String::new(),
            },
            _ => String::new(),
        };
        err(format!(
            "refused to load the global{what} ({name}: snapshots are plain data; a pickle \
             that imports anything could run code)"
        ))
    }
}
