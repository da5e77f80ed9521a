//! The pickle reader's memo: 4 bytes a slot (see the parent module).

use std::io::BufRead;

use super::{err, Item, Value, Vm, MEMO_EMPTY, MEMO_ENTRY, MEMO_PENDING};
use crate::traces::TraceError;

impl<R: BufRead> Vm<R> {
    pub(super) fn memo_store(&mut self, i: usize, v: Value) {
        self.memo[i] = match v {
            Value::Entry(r) => MEMO_ENTRY | r,
            v => {
                self.memo_vals.push(v);
                (self.memo_vals.len() - 1) as u32
            }
        };
    }

    /// The memo index a PUT/GET opcode names: a text line (PUT, GET), one byte (BINPUT,
    /// BINGET), four (LONG_BINPUT, LONG_BINGET), or the next free slot (MEMOIZE).
    pub(super) fn memo_index(&mut self, op: u8) -> Result<u64, TraceError> {
        match op {
            b'p' | b'g' => {
                let t = String::from_utf8_lossy(&self.line()?).trim().to_string();
                t.parse::<u64>()
                    .map_err(|_| TraceError(format!("a bad memo index {t:?}")))
            }
            b'q' | b'h' => Ok(self.u8()? as u64),
            0x94 => Ok(self.memo.len() as u64),
            _ => self.le(4),
        }
    }

    pub(super) fn memo_put(&mut self, i: u64) -> Result<(), TraceError> {
        if i > self.ops as u64 || i >= MEMO_PENDING as u64 {
            return err(format!("memo index {i} after only {} opcodes", self.ops));
        }
        let i = i as usize;
        if i >= self.memo.len() {
            self.memo.resize(i + 1, MEMO_EMPTY);
        }
        match self.stack.last_mut() {
            Some(Item::Done(v)) => {
                let v = v.clone();
                self.memo_store(i, v);
            }
            Some(Item::List(_, slot) | Item::Dict(_, slot) | Item::Set(_, slot)) => {
                *slot = Some(i as u32);
                self.memo[i] = MEMO_PENDING;
            }
            _ => return err("a memo store with nothing to store"),
        }
        Ok(())
    }

    pub(super) fn memo_get(&mut self, i: u64) -> Result<(), TraceError> {
        match self.memo.get(i as usize).copied() {
            Some(c) if c < MEMO_ENTRY => {
                let v = self.memo_vals[c as usize].clone();
                self.push(v);
                Ok(())
            }
            Some(c) if c < MEMO_PENDING => {
                self.push(Value::Entry(c & !MEMO_ENTRY));
                Ok(())
            }
            Some(MEMO_PENDING) => {
                // a container referenced again before its parent took it (Python's pickler
                // writes `{"a": x, "b": x}` so): it is complete, so freeze it where it lies
                let k = self.stack.iter().rposition(|it| match it {
                    Item::List(_, s) | Item::Dict(_, s) | Item::Set(_, s) => *s == Some(i as u32),
                    _ => false,
                });
                let Some(k) = k else {
                    return err(format!("memo {i} was never stored"));
                };
                let item = std::mem::replace(&mut self.stack[k], Item::Mark);
                let v = self.finish(item)?;
                self.stack[k] = Item::Done(v.clone());
                self.push(v);
                Ok(())
            }
            _ => err(format!("memo {i} was never stored")),
        }
    }
}
