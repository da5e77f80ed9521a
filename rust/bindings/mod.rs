//! The PyO3 boundary: argument conversion, the GIL, error mapping. Nothing here decides
//! anything about memory; every operation is one call into a core under its lock (or, on the
//! quick path, under the GIL alone).
//!
//! Which calls release the GIL (`gil.rs` says how each mode works): a pool's `alloc` and
//! `free`, an allocation's `free` and `free_when_done`, batches of up to 4,096 items, and a
//! PMM's `alloc_chunk` without eviction and `free` run *with the GIL held* when the core can
//! be had at once (`gil::Access::Quick` and kin); every other call, and these when the core
//! is busy, releases the GIL while it works (`gil::Access::Detached`). Getters, `__repr__`
//! and the release of a buffer view take the core's lock with the GIL held (short work).
//!
//! Files: `gil` (access modes, what the GIL guards, every `unsafe` block relying on it),
//! `errors` (the core's errors as `gpumm.errors` classes), `args` (argument conversion),
//! `backend`, `pool`, `allocation`, `dlpack`, `reports` (the core's reports as dicts), `pmm`,
//! `uvm`, `replay`, `recycle` (the objects made on every call, reused under the GIL), `capi`
//! (the C functions PyTorch loads).

use pyo3::prelude::*;

mod allocation;
mod args;
mod backend;
mod capi;
mod dlpack;
mod errors;
mod gil;
mod plan;
mod pmm;
mod pool;
mod recycle;
mod replay;
mod reports;
mod traces;
mod uvm;

// (the names the replay and trace bindings reach through `super::`)
use args::size_arg;
use errors::{to_pyerr, IntoPy};

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pmm::PyPmm>()?;
    m.add_class::<pmm::PyChunk>()?;
    recycle::install::<pmm::PyChunk>(m.py());
    m.add_class::<pmm::PyEviction>()?;
    pool::register(m)?;
    m.add_function(wrap_pyfunction!(capi::_set_c_pool, m)?)?;
    replay::register(m)?;
    plan::register(m)?;
    traces::register(m)?;
    uvm::register(m)?;
    m.add_function(wrap_pyfunction!(args::py_parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(args::py_format_size, m)?)?;
    m.add("ROOT_CHUNK_SIZE", crate::pmm::ROOT_CHUNK_SIZE)?;
    m.add("MAX_VIDMEM", crate::pmm::MAX_VIDMEM)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
