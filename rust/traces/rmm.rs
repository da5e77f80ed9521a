//! Reader of RMM log CSV (`rmm::mr::logging_resource_adaptor`), plain or gzip, on the `csv`
//! and `flate2` crates.
//!
//! Layout: a header `Thread,Time,Action,Pointer,Size,Stream`, then one row per event. Time is
//! `HH:MM:SS.ffffff` (what RMM's logger pattern writes: the time of day, so a log that runs
//! past midnight is read on into the next day) or a plain number: seconds when it has
//! a fraction or is below 10^11, microseconds below 10^17, nanoseconds above. Action is
//! `allocate`, `free` (`deallocate` is read as `free`) or `allocate failure`. Pointer and
//! Stream are hex with `0x` (fmt's `{}` of a pointer, RMM before rapids-logger) or without it
//! (printf's `%llx`, RMM on rapids-logger): in a column with no `0x` and a letter a–f somewhere,
//! every value is hex, digits alone too; otherwise digits alone are decimal. A failure's null
//! pointer may be `(nil)` (glibc's `%p`) or empty.

use std::io::Read;

use super::log::{Log, ALLOC, ALLOC_FAILED, FREE};
use super::TraceError;

pub const HEADER: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

/// Half a day in microseconds: a time of day that falls back by more than this is of the
/// next day (threads' rows may be a little out of order, never by hours).
const HALF_DAY_US: i64 = 12 * 3_600 * 1_000_000;

/// Reads the file at `path` (gunzipped as it is read when it starts with gzip's magic),
/// without holding its text.
pub fn read_file(path: &str) -> Result<Log, TraceError> {
    let open =
        || std::fs::File::open(path).map_err(|e| TraceError(format!("{path}: cannot read: {e}")));
    let mut magic = [0u8; 2];
    let n = open()?
        .read(&mut magic)
        .map_err(|e| TraceError(format!("{path}: cannot read: {e}")))?;
    let len = std::fs::metadata(path)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    let f = std::io::BufReader::with_capacity(1 << 16, open()?);
    if n == 2 && magic == [0x1f, 0x8b] {
        // about 8 rows to a compressed kilobyte... 48 B a row: a first guess of the rows
        read(flate2::bufread::MultiGzDecoder::new(f), path, len / 7)
    } else {
        read(f, path, len / 48)
    }
}

/// An unsigned number written as hex (`0x`, or with a letter a–f) or decimal.
pub fn number(t: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(t).ok()?;
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    if s.is_empty() || s.starts_with('+') {
        return None;
    }
    if s.bytes().all(|c| c.is_ascii_digit()) {
        return s.parse().ok();
    }
    u64::from_str_radix(s, 16).ok()
}

/// How one column (Pointer or Stream) writes its numbers, learnt as it is read: whether any
/// value has `0x` or a letter a–f, and the rows whose value was digits alone (read as
/// decimal until the column shows it is hex without `0x`).
#[derive(Default)]
struct Radix {
    prefixed: bool,
    lettered: bool,
    digits_only: Vec<usize>,
}

impl Radix {
    fn read(&mut self, t: &[u8], row: usize) -> Option<u64> {
        let v = number(t)?;
        if t.len() > 1 && t[0] == b'0' && (t[1] | 0x20) == b'x' {
            self.prefixed = true;
            self.digits_only = Vec::new(); // digits alone are decimal in this column
        } else if t.iter().all(u8::is_ascii_digit) {
            if !self.prefixed {
                self.digits_only.push(row);
            }
        } else {
            self.lettered = true;
        }
        Some(v)
    }

    /// Reads again as hex the values read as decimal, where the column is hex without `0x`.
    /// A value's decimal digits are the text it was read from, bar leading zeros, which hex
    /// reading ignores too.
    fn settle(self, column: &mut [u64]) {
        if self.prefixed || !self.lettered {
            return;
        }
        for row in self.digits_only {
            let v = &mut column[row];
            // at most 16 hex digits to fit: more were not a pointer written as hex anyway
            if let Ok(h) = u64::from_str_radix(&v.to_string(), 16) {
                *v = h;
            }
        }
    }
}

/// Digits only, as a number (None: empty, another character, or more than 18 digits).
fn digits(t: &[u8]) -> Option<i64> {
    if t.is_empty() || t.len() > 18 {
        return None;
    }
    let mut n = 0i64;
    for &c in t {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + (c - b'0') as i64;
    }
    Some(n)
}

/// A Time field to microseconds.
pub fn time_us(t: &[u8]) -> Option<i64> {
    let (whole, frac) = match t.iter().position(|&c| c == b'.') {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let frac_us = match frac {
        None => 0,
        Some(f) => {
            // the first six digits are microseconds; the rest must still be digits
            if f.is_empty() || !f.iter().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let mut us = 0i64;
            for k in 0..6 {
                us = us * 10 + f.get(k).map(|&c| (c - b'0') as i64).unwrap_or(0);
            }
            us
        }
    };
    if whole.contains(&b':') {
        let mut parts = whole.split(|&c| c == b':');
        let (h, m, sec) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (h, m, sec) = (digits(h)?, digits(m)?, digits(sec)?);
        return h
            .checked_mul(60)?
            .checked_add(m)?
            .checked_mul(60)?
            .checked_add(sec)?
            .checked_mul(1_000_000)?
            .checked_add(frac_us);
    }
    let n = if whole.len() == 19 {
        // nanoseconds since the epoch have 19 digits
        digits(&whole[..18])?
            .checked_mul(10)?
            .checked_add(digits(&whole[18..])?)?
    } else {
        digits(whole)?
    };
    if frac.is_some() || n < 100_000_000_000 {
        return n.checked_mul(1_000_000)?.checked_add(frac_us);
    }
    if n < 100_000_000_000_000_000 {
        return Some(n);
    }
    Some(n / 1000)
}

/// Reads an RMM log's text into columns; `rows` guesses how many rows it holds.
pub fn read(data: impl Read, name: &str, rows: usize) -> Result<Log, TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .buffer_capacity(1 << 16)
        .from_reader(data);
    let mut rec = csv::ByteRecord::new();
    let line = |rec: &csv::ByteRecord| rec.position().map(|p| p.line()).unwrap_or(0);
    let read_err = |e: csv::Error| match e.kind() {
        csv::ErrorKind::Io(io) => TraceError(format!(
            "{name}: corrupt gzip data or unreadable file: {io}"
        )),
        _ => TraceError(format!("{name}: cannot read as an RMM log ({e})")),
    };
    if !rdr.read_byte_record(&mut rec).map_err(read_err)?
        || rec.len() != 6
        || rec
            .iter()
            .zip(HEADER)
            .any(|(a, b)| a.trim_ascii() != b.as_bytes())
    {
        return Err(TraceError(format!(
            "{name}: line 1: expected the header {}",
            HEADER.join(",")
        )));
    }
    let mut log = Log::default();
    // grown from a guess: capacity not yet written costs no resident memory
    let guess = rows.min(1 << 28);
    for c in [
        &mut log.ptr,
        &mut log.size,
        &mut log.stream,
        &mut log.thread,
    ] {
        c.reserve(guess);
    }
    log.action.reserve(guess);
    log.time_us.reserve(guess);
    let (mut ptrs, mut streams) = (Radix::default(), Radix::default());
    // a time of day (`HH:MM:SS`) that falls back by over half a day: midnight has passed
    let (mut day, mut last_clock) = (0i64, None::<i64>);
    while rdr.read_byte_record(&mut rec).map_err(read_err)? {
        let at = line(&rec);
        if rec.len() == 1 && rec[0].trim_ascii().is_empty() {
            continue;
        }
        if rec.len() != 6 {
            return Err(TraceError(format!(
                "{name}: line {at}: expected 6 fields, got {}",
                rec.len()
            )));
        }
        let bad = |what: &str, v: &[u8]| {
            TraceError(format!(
                "{name}: line {at}: bad {what} {:?}",
                String::from_utf8_lossy(v)
            ))
        };
        let f = |i: usize| rec[i].trim_ascii();
        let action = match f(2) {
            b"allocate" => ALLOC,
            b"free" | b"deallocate" => FREE,
            b"allocate failure" => ALLOC_FAILED,
            a => {
                return Err(TraceError(format!(
                    "{name}: line {at}: unknown action {:?}; expected one of allocate, free, allocate failure",
                    String::from_utf8_lossy(a)
                )))
            }
        };
        let ptr = match f(3) {
            b"(nil)" | b"" | b"nullptr" if action == ALLOC_FAILED => 0,
            p => ptrs
                .read(p, log.ptr.len())
                .ok_or_else(|| bad("pointer", p))?,
        };
        let thread = number_dec(f(0)).ok_or_else(|| bad("thread", f(0)))?;
        if f(4).starts_with(b"-") || f(3).starts_with(b"-") {
            return Err(TraceError(format!(
                "{name}: line {at}: negative size or pointer"
            )));
        }
        let size = std::str::from_utf8(f(4))
            .ok()
            .filter(|s| !s.starts_with('+'))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| bad("size", f(4)))?;
        let stream = streams
            .read(f(5), log.stream.len())
            .ok_or_else(|| bad("stream", f(5)))?;
        let mut t = time_us(f(1)).ok_or_else(|| bad("time", f(1)))?;
        if f(1).contains(&b':') {
            if last_clock.is_some_and(|last| t.saturating_add(day) < last - HALF_DAY_US) {
                day = day.saturating_add(2 * HALF_DAY_US);
            }
            t = t.saturating_add(day);
            last_clock = Some(t);
        }
        log.push(action, ptr, size, stream, t);
        log.thread.push(thread);
    }
    ptrs.settle(&mut log.ptr);
    streams.settle(&mut log.stream);
    if log.thread.iter().all(|&t| t == 0) {
        log.thread = Vec::new();
    }
    log.shrink();
    Ok(log)
}

/// A thread id: decimal (what RMM writes), or hex with `0x`.
fn number_dec(t: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(t).ok()?;
    if let Some(h) = s.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
