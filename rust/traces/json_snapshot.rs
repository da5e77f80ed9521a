//! A snapshot written as JSON (`json.dump(torch.cuda.memory._snapshot(), f)`): the same
//! dict as the pickle `_dump_snapshot` writes, in another notation. It is parsed as a stream
//! (`serde_json`, whose nesting limit of 128 refuses a hostile file's depth) and written
//! out as the pickle opcodes that build the same value, which the pickle reader then loads
//! as it loads any snapshot: one reader of what a snapshot holds, whatever its notation.

use std::io::Read;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::TraceError;

/// The pickle (protocol 2) of the JSON value read from `input`.
pub fn to_pickle(input: impl Read) -> Result<Vec<u8>, TraceError> {
    let mut out = vec![0x80, 2];
    let mut de = serde_json::Deserializer::from_reader(input);
    Emit(&mut out)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| TraceError(format!("not readable JSON: {e}")))?;
    out.push(b'.');
    Ok(out)
}

/// Writes the pickle opcodes of the value it is given to its buffer.
struct Emit<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Emit<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Emit<'_> {
    fn int(self, n: i128) {
        if let Ok(small) = i32::try_from(n) {
            self.0.push(b'J'); // BININT
            self.0.extend_from_slice(&small.to_le_bytes());
        } else {
            // LONG1: the shortest little-endian two's complement that holds it
            let bytes = n.to_le_bytes();
            let mut len = bytes.len();
            while len > 1 && {
                let (top, next) = (bytes[len - 1], bytes[len - 2]);
                (top == 0 && next < 0x80) || (top == 0xff && next >= 0x80)
            } {
                len -= 1;
            }
            self.0.extend_from_slice(&[0x8a, len as u8]);
            self.0.extend_from_slice(&bytes[..len]);
        }
    }
}

impl<'de> Visitor<'de> for Emit<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<(), E> {
        self.0.push(if b { 0x88 } else { 0x89 });
        Ok(())
    }

    fn visit_i64<E>(self, n: i64) -> Result<(), E> {
        self.int(n as i128);
        Ok(())
    }

    fn visit_u64<E>(self, n: u64) -> Result<(), E> {
        self.int(n as i128);
        Ok(())
    }

    fn visit_f64<E>(self, x: f64) -> Result<(), E> {
        self.0.push(b'G'); // BINFLOAT, big-endian
        self.0.extend_from_slice(&x.to_be_bytes());
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        let len = u32::try_from(s.len()).map_err(|_| E::custom("a string over 4 GiB"))?;
        self.0.push(b'X'); // BINUNICODE
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.push(b'N');
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.extend_from_slice(b"](");
        while seq.next_element_seed(Emit(self.0))?.is_some() {}
        self.0.push(b'e'); // APPENDS
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.extend_from_slice(b"}(");
        while map.next_key_seed(Emit(self.0))?.is_some() {
            map.next_value_seed(Emit(self.0))?;
        }
        self.0.push(b'u'); // SETITEMS
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traces::pickle::{self, Value};

    fn load(json: &str) -> Result<Value, TraceError> {
        let bytes = to_pickle(json.as_bytes())?;
        Ok(pickle::load(&bytes, false)?.root)
    }

    #[test]
    fn json_values_load_as_the_pickle_of_the_same_value() {
        let l = load(
            r#"{"a": [1, -2, 3000000000, -3000000000, 18446744073709551615, 1.5,
            true, false, null, "é\"x"], "b": {}}"#,
        )
        .unwrap();
        let Value::Dict(d) = l else { panic!("{l:?}") };
        assert_eq!(d.len(), 2);
        let Value::List(a) = &d[0].1 else {
            panic!("{:?}", d[0])
        };
        let ints: Vec<Option<i64>> = a[..4]
            .iter()
            .map(|v| match v {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(
            ints,
            [Some(1), Some(-2), Some(3_000_000_000), Some(-3_000_000_000)]
        );
        // u64::MAX: eight 0xff bytes and a 0 that keeps it positive
        assert!(
            matches!(&a[4], Value::BigInt(b) if b[..] == [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0])
        );
        assert!(matches!(a[5], Value::Float(x) if x == 1.5));
        assert!(matches!(
            a[6..9],
            [Value::Bool(true), Value::Bool(false), Value::None]
        ));
        assert!(matches!(&d[1].1, Value::Dict(e) if e.is_empty()));
    }

    #[test]
    fn bad_json_is_a_clear_error() {
        for bad in ["{", "{\"a\": }", "[1] 2", &"[".repeat(200)] {
            let e = load(bad).unwrap_err();
            assert!(e.0.starts_with("not readable JSON"), "{}", e.0);
        }
    }
}
