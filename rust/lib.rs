//! gpumm's core: a GPU memory manager modelled on the physical memory manager of NVIDIA's
//! UVM driver. The core is free of PyO3; the Python glue lives in `bindings`, behind the
//! default `python` feature, so `cargo test --no-default-features` tests the allocator alone.

pub mod alloc;
pub mod backend;
pub mod error;
pub mod plan;
pub mod pmm;
pub mod replay;
pub mod traces;
pub mod units;
pub mod uvm;
pub mod va;

#[cfg(feature = "python")]
mod bindings;

pub use error::{Error, Result};
