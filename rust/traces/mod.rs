//! Trace readers: PyTorch memory snapshots (a pickle reader of plain data only) and RMM logs
//! (CSV, plain or gzip), into events held in columns ([`log::Log`]), and `prepare`, which
//! turns a log into the replay engine's arrays. Free of PyO3; the Python glue is
//! `bindings/traces.rs`.

pub mod entries;
pub mod json_snapshot;
pub mod log;
pub mod pickle;
pub mod pickle_file;
pub mod prepare;
pub mod rmm;
pub mod snapshot;

#[cfg(test)]
mod tests;

/// A file that is not a trace of the format read: the message names the file and the place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError(pub String);

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}
