//! Reader of RMM log CSV (`rmm::mr::logging_resource_adaptor`), plain or gzip, on the `csv`
//! and `flate2` crates.
//!
//! Layout: a header `Thread,Time,Action,Pointer,Size,Stream`, then one row per event. Time is
//! `HH:MM:SS.ffffff` (what RMM's logger pattern writes) or a plain number: seconds when it has
//! a fraction or is below 10^11, microseconds below 10^17, nanoseconds above. Action is
//! `allocate`, `free` (`deallocate` is read as `free`) or `allocate failure`. Pointer and
//! Stream are hex with `0x`, hex without it when they hold a letter a–f, decimal otherwise;
//! a failure's null pointer may be `(nil)` (glibc's `%p`) or empty.

use std::io::Read;

use super::log::{Log, ALLOC, ALLOC_FAILED, FREE};
use super::TraceError;

pub const HEADER: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

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

/// A Time field to microseconds.
pub fn time_us(t: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(t).ok()?;
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (s, None),
    };
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
    }
    let frac_us = frac
        .map(|f| {
            let mut d: String = f.chars().take(6).collect();
            while d.len() < 6 {
                d.push('0');
            }
            d.parse::<i64>().ok()
        })
        .unwrap_or(Some(0))?;
    if whole.contains(':') {
        let mut parts = whole.split(':');
        let (h, m, sec) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let num = |x: &str| -> Option<i64> {
            if x.is_empty() || !x.bytes().all(|c| c.is_ascii_digit()) || x.len() > 12 {
                return None;
            }
            x.parse().ok()
        };
        return Some(((num(h)? * 60 + num(m)?) * 60 + num(sec)?) * 1_000_000 + frac_us);
    }
    if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) || whole.len() > 19 {
        return None;
    }
    let n: i64 = whole.parse().ok()?;
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
        .trim(csv::Trim::All)
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
        || rec.iter().zip(HEADER).any(|(a, b)| a != b.as_bytes())
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
    while rdr.read_byte_record(&mut rec).map_err(read_err)? {
        let at = line(&rec);
        if rec.len() == 1 && rec[0].is_empty() {
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
        let action = match &rec[2] {
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
        let ptr = match &rec[3] {
            b"(nil)" | b"" | b"nullptr" if action == ALLOC_FAILED => 0,
            p => number(p).ok_or_else(|| bad("pointer", p))?,
        };
        let thread = number_dec(&rec[0]).ok_or_else(|| bad("thread", &rec[0]))?;
        if rec[4].starts_with(b"-") || rec[3].starts_with(b"-") {
            return Err(TraceError(format!(
                "{name}: line {at}: negative size or pointer"
            )));
        }
        let size = std::str::from_utf8(&rec[4])
            .ok()
            .filter(|s| !s.starts_with('+'))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| bad("size", &rec[4]))?;
        let stream = number(&rec[5]).ok_or_else(|| bad("stream", &rec[5]))?;
        let t = time_us(&rec[1]).ok_or_else(|| bad("time", &rec[1]))?;
        log.push(action, ptr, size, stream, t);
        log.thread.push(thread);
    }
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
