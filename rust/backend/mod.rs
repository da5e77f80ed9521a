//! Where the bytes live. The allocator decides which physical pages an allocation uses and
//! where it sits in virtual memory; a backend makes that real: it owns the physical memory
//! (addressed by offset, the PMM's addresses), a direct map of all of it, and windows of
//! virtual address space into which pages are mapped back to back ("stitched").
//!
//! - [`Simulated`]: accounting only, no bytes; any capacity. Addresses look like device ones.
//! - [`host::Host`] (Linux): physical memory is a memfd; the direct map is one shared mapping of
//!   it; stitching maps memfd pages into a reserved window with `MAP_FIXED | MAP_SHARED`, so a
//!   stitched allocation is really contiguous and a move is a real copy.
//! - A CUDA backend implements the same calls with the driver's VMM API (`cuMemCreate`,
//!   `cuMemAddressReserve`, `cuMemMap`, `cuMemcpyAsync`, `cuMemsetD8Async`, CUDA events).
//! - [`pinned::Pinned`]: host memory as [`host::Host`] has it, page-locked for a CUDA device
//!   with `cuMemHostRegister` while the pool uses it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

#[cfg(target_os = "linux")]
pub mod cuda;
#[cfg(target_os = "linux")]
pub mod host;
#[cfg(target_os = "linux")]
pub mod pinned;

/// The operations the allocator needs from the memory underneath. Physical addresses are
/// offsets in `[0, capacity)`; virtual addresses are process (or device) addresses. All
/// lengths and offsets are multiples of [`Backend::granularity`] except for `copy` and `zero`.
pub trait Backend: Send + Sync {
    /// "simulated", "host", "cuda".
    fn name(&self) -> &'static str;
    /// Bytes of physical memory.
    fn capacity(&self) -> u64;
    /// The smallest unit that can be mapped.
    fn granularity(&self) -> u64;
    /// The page size a pool uses when not told: the unit it stitches with. Smaller pages let
    /// more of a fragmented pool serve one large request, at more metadata per byte.
    fn default_page_size(&self) -> u64 {
        self.granularity()
    }
    /// Whether allocations have bytes a program can read and write.
    fn has_bytes(&self) -> bool;
    /// Whether `map` and `unmap` do anything (a pool skips the calls when they do not).
    fn maps(&self) -> bool {
        true
    }
    /// The virtual address of physical offset 0 in the direct map (every physical page is
    /// mapped once, in order, at `direct_base + offset`).
    fn direct_base(&self) -> u64;
    /// Physical `[phys, phys + len)` is about to be used (the pool took these pages from the
    /// PMM): a backend that makes physical memory on demand makes it here and maps it into
    /// the direct map. Default: nothing to do.
    fn commit(&self, _phys: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    /// Reserves `len` bytes of virtual address space for stitching; returns its base.
    fn reserve(&self, len: u64) -> Result<u64>;
    /// Gives back a window from [`Backend::reserve`] (everything in it must be unmapped).
    fn unreserve(&self, base: u64, len: u64);
    /// Maps physical `[phys, phys + len)` at `va` inside a reserved window.
    fn map(&self, va: u64, phys: u64, len: u64) -> Result<()>;
    /// Unmaps `[va, va + len)` inside a reserved window (the window stays reserved).
    fn unmap(&self, va: u64, len: u64) -> Result<()>;
    /// Copies `len` bytes between two mapped virtual ranges (they may overlap).
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()>;
    /// Writes zeros over a mapped virtual range.
    fn zero(&self, va: u64, len: u64) -> Result<()>;
    /// The pages `[phys, phys + len)` are no longer used: give their memory back.
    fn discard(&self, phys: u64, len: u64);
    /// Records a fence on `stream` (CUDA: an event); None when the backend has no streams of
    /// its own (the caller completes fences with `Pool::complete`).
    fn fence(&self, _stream: u64) -> Option<u64> {
        None
    }
    /// Whether a fence from `fence` has been reached.
    fn fence_done(&self, _fence: u64) -> bool {
        true
    }
    /// A fence is no longer needed.
    fn fence_drop(&self, _fence: u64) {}
}

/// Where simulated device memory appears: a CUDA-like unified virtual address.
pub const SIMULATED_BASE: u64 = 0x7f00_0000_0000;

/// Accounting only: no bytes behind the addresses, any capacity. No streams of its own
/// (its fences are None) unless made with [`Simulated::with_streams`].
#[derive(Debug)]
pub struct Simulated {
    capacity: u64,
    granularity: u64,
    next_window: AtomicU64,
    /// Streams of its own: fences are numbered from 1 and reached when `finish` says.
    streams: bool,
    last_fence: AtomicU64,
    reached: AtomicU64,
}

impl Simulated {
    pub fn new(capacity: u64, granularity: u64) -> Result<Self> {
        if !granularity.is_power_of_two() || granularity < 4096 {
            return Err(Error::InvalidArgument(format!(
                "granularity must be a power of two of at least 4 KiB, got {granularity}"
            )));
        }
        // Stitching windows start after the direct map and a 1 GiB gap, so a pointer says which
        // of the two it is in.
        let first = (SIMULATED_BASE + capacity).next_multiple_of(1 << 30) + (1 << 30);
        Ok(Simulated {
            capacity,
            granularity,
            next_window: AtomicU64::new(first),
            streams: false,
            last_fence: AtomicU64::new(0),
            reached: AtomicU64::new(0),
        })
    }

    /// As `new`, with streams of its own, as a CUDA device has: `fence` records a fence
    /// (numbered 1, 2, ...) that is reached only once [`Simulated::finish`] says so, so a
    /// pool's stream-ordered frees wait for its `poll`, as they do for CUDA events.
    pub fn with_streams(capacity: u64, granularity: u64) -> Result<Self> {
        Ok(Simulated {
            streams: true,
            ..Self::new(capacity, granularity)?
        })
    }

    /// The work queued before every fence up to `fence` has finished.
    pub fn finish(&self, fence: u64) {
        self.reached.fetch_max(fence, Ordering::Relaxed);
    }
}

impl Backend for Simulated {
    fn name(&self) -> &'static str {
        "simulated"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn granularity(&self) -> u64 {
        self.granularity
    }
    fn has_bytes(&self) -> bool {
        false
    }
    fn maps(&self) -> bool {
        false
    }
    fn direct_base(&self) -> u64 {
        SIMULATED_BASE
    }
    fn reserve(&self, len: u64) -> Result<u64> {
        let len = len.next_multiple_of(1 << 30);
        let base = self
            .next_window
            .fetch_add(len + (1 << 30), Ordering::Relaxed);
        if base.checked_add(len).is_none_or(|end| end > 1 << 57) {
            return Err(Error::OutOfMemory("virtual address space exhausted".into()));
        }
        Ok(base)
    }
    fn unreserve(&self, _base: u64, _len: u64) {}
    fn map(&self, _va: u64, _phys: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    fn unmap(&self, _va: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    fn copy(&self, _dst: u64, _src: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    fn zero(&self, _va: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    fn discard(&self, _phys: u64, _len: u64) {}
    fn fence(&self, _stream: u64) -> Option<u64> {
        self.streams
            .then(|| self.last_fence.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn fence_done(&self, fence: u64) -> bool {
        fence <= self.reached.load(Ordering::Relaxed)
    }
}

/// A backend that fails on purpose: the `fail_at`-th call (counting from 1) of `reserve`,
/// `map` or `copy` returns an error, every other call goes to `inner`. For fault-injection
/// tests.
pub struct Faulty {
    pub inner: Box<dyn Backend>,
    pub fail_at: AtomicU64,
    pub calls: AtomicU64,
}

impl Faulty {
    pub fn new(inner: Box<dyn Backend>, fail_at: u64) -> Self {
        Faulty {
            inner,
            fail_at: AtomicU64::new(fail_at),
            calls: AtomicU64::new(0),
        }
    }

    fn trip(&self, what: &str) -> Result<()> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.fail_at.load(Ordering::Relaxed) {
            Err(Error::OutOfMemory(format!(
                "injected failure of {what} (call {n})"
            )))
        } else {
            Ok(())
        }
    }
}

impl Backend for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    fn has_bytes(&self) -> bool {
        self.inner.has_bytes()
    }
    fn direct_base(&self) -> u64 {
        self.inner.direct_base()
    }
    fn commit(&self, phys: u64, len: u64) -> Result<()> {
        self.inner.commit(phys, len)
    }
    fn reserve(&self, len: u64) -> Result<u64> {
        self.trip("reserve")?;
        self.inner.reserve(len)
    }
    fn unreserve(&self, base: u64, len: u64) {
        self.inner.unreserve(base, len)
    }
    fn map(&self, va: u64, phys: u64, len: u64) -> Result<()> {
        self.trip("map")?;
        self.inner.map(va, phys, len)
    }
    fn unmap(&self, va: u64, len: u64) -> Result<()> {
        self.inner.unmap(va, len)
    }
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.trip("copy")?;
        self.inner.copy(dst, src, len)
    }
    fn zero(&self, va: u64, len: u64) -> Result<()> {
        self.inner.zero(va, len)
    }
    fn discard(&self, phys: u64, len: u64) {
        self.inner.discard(phys, len)
    }
    fn fence(&self, stream: u64) -> Option<u64> {
        self.inner.fence(stream)
    }
    fn fence_done(&self, fence: u64) -> bool {
        self.inner.fence_done(fence)
    }
    fn fence_drop(&self, fence: u64) {
        self.inner.fence_drop(fence)
    }
}

/// A move of `len` bytes from `src` to `dst` as copies whose source and destination do not
/// overlap, in an order that reads every byte before it is overwritten: one copy when the
/// ranges are apart; when they overlap, pieces of `|dst - src|` bytes, from the low end for a
/// move down and from the high end for a move up. For copy engines whose copies of
/// overlapping ranges are undefined (CUDA's), under `Backend::copy`, which allows overlap.
pub fn disjoint_pieces(dst: u64, src: u64, len: u64) -> Vec<(u64, u64, u64)> {
    let step = dst.abs_diff(src);
    if step >= len || step == 0 {
        return if len == 0 || step == 0 {
            vec![]
        } else {
            vec![(dst, src, len)]
        };
    }
    let piece = |off: u64| (dst + off, src + off, step.min(len - off));
    let mut pieces: Vec<_> = (0..len.div_ceil(step)).map(|k| piece(k * step)).collect();
    if dst > src {
        pieces.reverse();
    }
    pieces
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::disjoint_pieces;

    proptest! {
        /// The pieces, each copied on its own without overlap, move the bytes as `memmove`.
        #[test]
        fn disjoint_pieces_move_as_memmove(dst in 0u64..64, src in 0u64..64, len in 0u64..64) {
            let start: Vec<u8> = (0..128u8).collect();
            let mut want = start.clone();
            want.copy_within(src as usize..(src + len) as usize, dst as usize);
            let mut got = start;
            for (d, s, l) in disjoint_pieces(dst, src, len) {
                prop_assert!(d + l <= s || s + l <= d, "piece ({d}, {s}, {l}) overlaps");
                let piece = got[s as usize..(s + l) as usize].to_vec();
                got[d as usize..(d + l) as usize].copy_from_slice(&piece);
            }
            prop_assert_eq!(got, want);
        }
    }
}
