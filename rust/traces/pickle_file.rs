//! A snapshot pickle as users keep it: the file `torch.cuda.memory._dump_snapshot` writes,
//! that file gzipped (to share it), or `torch.save`'s zip of `_snapshot()` (its
//! `<name>/data.pkl` entry is the pickle); or the same dict written as JSON, plain or
//! gzipped (`json_snapshot.rs`). Told apart by the first bytes; each is read as a stream,
//! never held whole, but for the pickle a JSON text is turned into (`json_snapshot::to_pickle`),
//! which is held whole while it loads.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek};

use super::json_snapshot;
use super::pickle::{self, Loaded};
use super::TraceError;

/// Deflate's greatest expansion: no gzip stream of `n` bytes inflates past about 1,032 × `n`.
/// The bound the pickle reader checks length fields against (a small file still cannot ask
/// for a large allocation).
const INFLATE_MAX: usize = 1032;

/// Loads the pickle in the file at `name` (see the module); `compact` as [`pickle::load`].
pub fn load(name: &str, compact: bool) -> Result<Loaded, TraceError> {
    let cannot = |e: std::io::Error| TraceError(format!("{name}: cannot read: {e}"));
    let mut f = File::open(name).map_err(cannot)?;
    let len = f.metadata().map_err(cannot)?.len() as usize;
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut f, &mut magic).map_err(cannot)?;
    f.rewind().map_err(cannot)?;
    match &magic[..n] {
        [0x1f, 0x8b, ..] => {
            let gz = flate2::read::MultiGzDecoder::new(buffered(f));
            load_stream(buffered(gz), len.saturating_mul(INFLATE_MAX), compact, name)
        }
        b"PK\x03\x04" => {
            let mut zip = zip::ZipArchive::new(buffered(f))
                .map_err(|e| TraceError(format!("{name}: not a readable zip: {e}")))?;
            let Some(i) = (0..zip.len()).find(|&i| {
                zip.name_for_index(i)
                    .is_some_and(|n| n == "data.pkl" || n.ends_with("/data.pkl"))
            }) else {
                return Err(TraceError(format!(
                    "{name}: a zip without a data.pkl (what torch.save writes a snapshot's \
                     pickle to)"
                )));
            };
            let entry = zip
                .by_index(i)
                .map_err(|e| TraceError(format!("{name}: cannot read its data.pkl: {e}")))?;
            let size = entry.size() as usize;
            pickle::load_from(buffered(entry), size, compact)
        }
        _ => load_stream(buffered(f), len, compact, name),
    }
}

/// A pickle, or a JSON text (its first byte past white space `{` or `[`), read from `input`
/// of at most `len` bytes.
fn load_stream(
    mut input: impl BufRead,
    len: usize,
    compact: bool,
    name: &str,
) -> Result<Loaded, TraceError> {
    let cannot = |e: std::io::Error| TraceError(format!("{name}: cannot read: {e}"));
    loop {
        let buf = input.fill_buf().map_err(cannot)?;
        let blank = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
        match buf.get(blank) {
            Some(b'{' | b'[') => {
                let bytes = json_snapshot::to_pickle(input)?;
                return pickle::load(&bytes, compact);
            }
            Some(_) => return pickle::load_from(input, len, compact),
            None if buf.is_empty() => return pickle::load_from(input, len, compact),
            None => input.consume(blank), // white space only so far
        }
    }
}

fn buffered<R: Read>(r: R) -> BufReader<R> {
    BufReader::with_capacity(1 << 16, r)
}

/// Reads into `buf` until it is full or the file ends; how many bytes were read.
fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
