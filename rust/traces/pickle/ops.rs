//! The opcode loop of the plain-data pickle reader (see the parent module for what it
//! accepts and refuses).

use std::io::BufRead;

use super::{err, Item, ListBuf, Rc, Value, Vm};
use crate::traces::TraceError;

/// The opcodes that import, call or reach outside the pickle, refused by name.
const REFUSED: &[(u8, &str)] = &[
    (b'c', "GLOBAL"),
    (0x93, "STACK_GLOBAL"),
    (b'i', "INST"),
    (b'o', "OBJ"),
    (b'R', "REDUCE"),
    (0x81, "NEWOBJ"),
    (0x92, "NEWOBJ_EX"),
    (0x82, "EXT1"),
    (0x83, "EXT2"),
    (0x84, "EXT4"),
    (b'b', "BUILD"),
    (b'P', "PERSID"),
    (b'Q', "BINPERSID"),
    (0x97, "NEXT_BUFFER"),
    (0x98, "READONLY_BUFFER"),
];

impl<R: BufRead> Vm<R> {
    pub(super) fn run(&mut self) -> Result<Value, TraceError> {
        loop {
            let op = self
                .u8()
                .map_err(|_| TraceError("the pickle ends before its STOP".into()))?;
            self.ops += 1;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return err(format!("unsupported pickle protocol {p}"));
                    }
                }
                0x95 => {
                    self.le(8)?; // FRAME: a length hint only
                }
                b'.' => {
                    let v = self.pop_value()?;
                    if !self.stack.is_empty() {
                        return err("values left on the stack at STOP");
                    }
                    return Ok(v);
                }
                b'(' => self.stack.push(Item::Mark),
                b'0' => {
                    self.pop_value()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = match self.stack.last() {
                        Some(Item::Done(v)) => v.clone(),
                        _ => return err("DUP of a container being built or of nothing"),
                    };
                    self.push(v);
                }
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.push(Value::Int(v as i64));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.u8()? as usize
                    } else {
                        self.le(4)? as usize
                    };
                    let b = self.take(n, "a LONG")?;
                    self.push(long(&b));
                }
                b'I' | b'L' => {
                    let t = String::from_utf8_lossy(&self.line()?).trim().to_string();
                    let t = t.strip_suffix('L').unwrap_or(&t);
                    let v = match t {
                        "01" if op == b'I' => Value::Bool(true),
                        "00" if op == b'I' => Value::Bool(false),
                        _ => match t.parse::<i64>() {
                            Ok(n) => Value::Int(n),
                            Err(_) => return err(format!("a bad integer {t:?}")),
                        },
                    };
                    self.push(v);
                }
                b'G' => {
                    let b = self.take(8, "a BINFLOAT")?;
                    let v = f64::from_be_bytes(b[..].try_into().expect("8 bytes"));
                    self.push(Value::Float(v));
                }
                b'F' => {
                    let t = String::from_utf8_lossy(&self.line()?).trim().to_string();
                    let v = t
                        .parse::<f64>()
                        .map_err(|_| TraceError(format!("a bad float {t:?}")))?;
                    self.push(Value::Float(v));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        0x8c => self.u8()? as usize,
                        b'X' => self.le(4)? as usize,
                        _ => usize::try_from(self.le(8)?).unwrap_or(usize::MAX),
                    };
                    let v = self.take_text(n)?;
                    self.push(v);
                }
                b'V' => {
                    let b = self.line()?;
                    let s = raw_unicode_escape(&b)?;
                    let v = Value::Str(self.intern(&s));
                    self.push(v);
                }
                b'T' | b'U' => {
                    // Python 2 str: Python 3 decodes it as ASCII by default
                    let n = if op == b'U' {
                        self.u8()? as usize
                    } else {
                        self.le(4)? as usize
                    };
                    let b = self.take(n, "a string")?;
                    if !b.is_ascii() {
                        return err("a Python 2 string that is not ASCII");
                    }
                    let v = self.text(&b)?;
                    self.push(v);
                }
                b'S' => {
                    let b = self.line()?;
                    let t = String::from_utf8_lossy(&b);
                    let t = t.trim();
                    let inner = t
                        .strip_prefix('\'')
                        .and_then(|s| s.strip_suffix('\''))
                        .or_else(|| t.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                        .ok_or_else(|| TraceError("a STRING without quotes".into()))?;
                    if inner.contains('\\') || !inner.is_ascii() {
                        return err("a STRING with escapes (not read)");
                    }
                    let v = Value::Str(self.intern(inner));
                    self.push(v);
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'C' => self.u8()? as usize,
                        b'B' => self.le(4)? as usize,
                        _ => usize::try_from(self.le(8)?).unwrap_or(usize::MAX),
                    };
                    let b: Rc<[u8]> = self.take(n, "a bytes object")?.into();
                    self.push(Value::Bytes(b));
                }
                b']' => self.stack.push(Item::List(ListBuf::Vals(Vec::new()), None)),
                b'l' => {
                    let items = self.pop_mark()?;
                    let mut l = ListBuf::Vals(Vec::new());
                    l.extend(items);
                    self.stack.push(Item::List(l, None));
                }
                b'a' => {
                    let v = self.pop_value()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                b')' => self.push(Value::Tuple(Rc::new(Vec::new()))),
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.frozen(items, false)?;
                    self.push(v);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return err("a TUPLE of more values than the stack holds");
                    }
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop_value()?);
                    }
                    items.reverse();
                    let v = self.frozen(items, false)?;
                    self.push(v);
                }
                b'}' => self.stack.push(Item::Dict(Vec::new(), None)),
                b'd' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Item::Dict(Vec::new(), None));
                    self.setitems(items)?;
                }
                b's' => {
                    let v = self.pop_value()?;
                    let k = self.pop_value()?;
                    self.setitems(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.setitems(items)?;
                }
                0x8f => self.stack.push(Item::Set(Vec::new(), None)),
                0x90 => {
                    let items = self.pop_mark()?;
                    match self.stack.last_mut() {
                        Some(Item::Set(s, _)) => s.extend(items),
                        _ => return err("ADDITEMS to something that is not a set"),
                    }
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    let v = self.frozen(items, true)?;
                    self.push(v);
                }
                b'p' | b'q' | b'r' | 0x94 => {
                    let i = self.memo_index(op)?;
                    self.memo_put(i)?;
                }
                b'g' | b'h' | b'j' => {
                    let i = self.memo_index(op)?;
                    self.memo_get(i)?;
                }
                _ => {
                    // the refused opcodes have no arm above
                    if let Some(&(_, name)) = REFUSED.iter().find(|(c, _)| *c == op) {
                        return self.refuse(op, name);
                    }
                    return err(format!(
                        "unknown pickle opcode {op:#04x} at offset {}",
                        self.pos - 1
                    ));
                }
            }
        }
    }
}

/// A LONG1/LONG4 payload (little-endian two's complement) as a value.
fn long(b: &[u8]) -> Value {
    if b.is_empty() {
        return Value::Int(0);
    }
    if b.len() <= 8 {
        let neg = b[b.len() - 1] & 0x80 != 0;
        let mut buf = [if neg { 0xff } else { 0 }; 8];
        buf[..b.len()].copy_from_slice(b);
        return Value::Int(i64::from_le_bytes(buf));
    }
    Value::BigInt(b.into())
}

/// Decodes pickle's raw-unicode-escape text (protocol 0's UNICODE): `\uXXXX` and
/// `\UXXXXXXXX` escapes, every other byte a Latin-1 character.
fn raw_unicode_escape(b: &[u8]) -> Result<String, TraceError> {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' && i + 1 < b.len() && (b[i + 1] == b'u' || b[i + 1] == b'U') {
            let n = if b[i + 1] == b'u' { 4 } else { 8 };
            let hex = b
                .get(i + 2..i + 2 + n)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
                .ok_or_else(|| TraceError("a bad \\u escape in a UNICODE string".into()))?;
            out.push(hex);
            i += 2 + n;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    Ok(out)
}
