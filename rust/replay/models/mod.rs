//! Models of allocators, each following the stated rules of a real one (docs/replay.md has
//! them with their sources), one file a model. Every model holds device memory through a
//! capacity check: a request to the device fails when it would take the model past the
//! capacity. Every model keeps its bookkeeping whole under any event sequence: arithmetic on
//! trace sizes and addresses saturates or is checked, and state is looked up, never indexed.

mod buddy;
mod caching;
mod coalescing;
mod driver;
mod gpumm;

pub use buddy::Buddy;
pub use caching::Caching;
pub use coalescing::{CuPy, RmmPool};
pub use driver::Driver;
pub use gpumm::Gpumm;

use super::Model;
use crate::error::{Error, Result};

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;

/// The models `model_by_name` knows, in the order reports list them.
pub const MODEL_NAMES: [&str; 7] = [
    "gpumm",
    "caching",
    "caching-expandable",
    "rmm-pool",
    "cupy",
    "buddy",
    "driver",
];

/// How many intervals `roundup_power2_divisions` has per power of two: [1, 2) MiB (and every
/// size below), [2, 4) MiB, ... [32 GiB, and up) (PyTorch's `kRoundUpPowerOfTwoIntervals`).
pub const DIVISION_INTERVALS: usize = 16;

/// PyTorch caching-allocator options (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct CachingOptions {
    pub expandable_segments: bool,
    /// Blocks at or above this are never split (u64::MAX: unlimited, the default).
    pub max_split_size: u64,
    /// Round requests to this many steps between powers of two (0 or 1: off), every size.
    pub roundup_power2_divisions: u64,
    /// The per-interval form (`[256:1,512:2,>:8]`): the division count of each interval of
    /// `DIVISION_INTERVALS`; when set it takes the place of `roundup_power2_divisions`.
    pub divisions_by_interval: Option<[u64; DIVISION_INTERVALS]>,
    /// `garbage_collection_threshold` (0: off; else in (0, 1)): before asking the device for
    /// more, the oldest wholly free segments go back once reserved passes this share of the
    /// allowed maximum.
    pub garbage_collection_threshold: f64,
    /// The per-process memory fraction: the allowed maximum is this share of the capacity
    /// (in (0, 1]; 1: the capacity itself).
    pub memory_fraction: f64,
    /// Whether the trace was recorded with expandable segments: its start state's segments
    /// are then mapped ranges of expandable segments (the `caching-expandable` model keeps
    /// this from the trace while it sets `expandable_segments`).
    pub recorded_expandable: bool,
}

impl Default for CachingOptions {
    fn default() -> Self {
        CachingOptions {
            expandable_segments: false,
            max_split_size: u64::MAX,
            roundup_power2_divisions: 0,
            divisions_by_interval: None,
            garbage_collection_threshold: 0.0,
            memory_fraction: 1.0,
            recorded_expandable: false,
        }
    }
}

impl CachingOptions {
    /// What is wrong with these options, if anything: a division count that is not 0 or a
    /// power of two, a threshold outside [0, 1), a fraction outside (0, 1].
    pub fn check(&self) -> Result<()> {
        let bad_div = |d: u64| d != 0 && !d.is_power_of_two();
        if bad_div(self.roundup_power2_divisions) {
            return Err(Error::InvalidArgument(format!(
                "roundup_power2_divisions must be 0 or a power of 2, got {}",
                self.roundup_power2_divisions
            )));
        }
        if let Some(t) = self.divisions_by_interval {
            if let Some(d) = t.iter().find(|&&d| bad_div(d)) {
                return Err(Error::InvalidArgument(format!(
                    "roundup_power2_divisions: each interval's count must be 0 or a power \
                     of 2, got {d}"
                )));
            }
        }
        let t = self.garbage_collection_threshold;
        if !(0.0..1.0).contains(&t) {
            return Err(Error::InvalidArgument(format!(
                "garbage_collection_threshold must be in (0, 1) (0: off), got {t}"
            )));
        }
        let f = self.memory_fraction;
        if !(f > 0.0 && f <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "memory_fraction must be in (0, 1], got {f}"
            )));
        }
        Ok(())
    }

    /// The division count PyTorch rounds a request of `size` bytes with: its interval's
    /// (the interval of floor(log2 size), clamped to the first and the last), else the one
    /// count for every size.
    pub fn divisions(&self, size: u64) -> u64 {
        match &self.divisions_by_interval {
            Some(t) => {
                let log = 63 - size.max(1).leading_zeros() as usize;
                t[log.saturating_sub(20).min(DIVISION_INTERVALS - 1)]
            }
            None => self.roundup_power2_divisions,
        }
    }

    /// PyTorch's allowed maximum at `capacity` bytes: the memory fraction of it, in whole
    /// bytes (the capacity itself at a fraction of 1).
    pub fn allowed_maximum(&self, capacity: u64) -> u64 {
        if self.memory_fraction >= 1.0 {
            capacity
        } else {
            (self.memory_fraction * capacity as f64) as u64
        }
    }
}

/// A new model by name at `capacity` bytes of device memory.
pub fn model_by_name(name: &str, capacity: u64, opts: CachingOptions) -> Result<Box<dyn Model>> {
    opts.check()?;
    Ok(match name {
        "gpumm" => Box::new(Gpumm::new(capacity)?),
        "caching" => Box::new(Caching::new(capacity, opts)),
        "caching-expandable" => Box::new(Caching::new(
            capacity,
            CachingOptions {
                expandable_segments: true,
                ..opts
            },
        )),
        "rmm-pool" => Box::new(RmmPool::new(capacity)),
        "cupy" => Box::new(CuPy::new(capacity)),
        "buddy" => Box::new(Buddy::new(capacity)),
        "driver" => Box::new(Driver::new(capacity)),
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown allocator {other:?}; known: {}",
                MODEL_NAMES.join(", ")
            )))
        }
    })
}

/// `n` rounded up to a multiple of `to` (saturating: a size near 2^64 stays huge and fails
/// every capacity check).
pub(crate) fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to).saturating_mul(to)
}

/// Device memory handed out to a model: a capacity and a bump pointer for addresses. Each
/// device allocation is followed by a 2 MiB gap, so two of them are never adjacent (separate
/// `cudaMalloc`s are not, and models must not merge across them).
#[derive(Clone, Debug)]
pub(crate) struct DeviceMem {
    pub capacity: u64,
    pub reserved: u64,
    next: u64,
}

/// Where models put their own device allocations: far above any address a real trace
/// records, so that they rarely meet the trace's (the `caching` model also checks).
pub(crate) const FRESH_BASE: u64 = 1 << 56;

impl DeviceMem {
    pub fn new(capacity: u64) -> Self {
        DeviceMem {
            capacity,
            reserved: 0,
            next: FRESH_BASE,
        }
    }

    pub fn fits(&self, n: u64) -> bool {
        self.reserved
            .checked_add(n)
            .is_some_and(|t| t <= self.capacity)
    }

    /// Charges `n` bytes, or refuses (nothing changed).
    pub fn charge(&mut self, n: u64) -> bool {
        if !self.fits(n) {
            return false;
        }
        self.reserved += n;
        true
    }

    /// Charges `n` bytes at a fresh address.
    pub fn take(&mut self, n: u64) -> Option<u64> {
        let step = round_up(n, 2 * MIB).checked_add(2 * MIB)?;
        let after = self.next.checked_add(step)?;
        if !self.charge(n) {
            return None;
        }
        let a = self.next;
        self.next = after;
        Some(a)
    }

    pub fn give(&mut self, n: u64) {
        self.reserved = self.reserved.saturating_sub(n);
    }
}
