//! The PMM's vocabulary: sizes and orders, chunk types and states, root lists, size
//! masks, the configuration, handles and what calls return.

use super::*;

/// log2 of the root chunk size.
pub const ROOT_CHUNK_SHIFT: u32 = 21;
/// The root chunk size, 2 MiB: the unit in which the PMM takes vidmem from the device.
pub const ROOT_CHUNK_SIZE: u64 = 1 << ROOT_CHUNK_SHIFT;
/// log2 of the smallest chunk size, 256 B.
pub const MIN_CHUNK_SHIFT: u32 = 8;
/// Number of chunk sizes a mask can hold: 256 B (order 0) up to 2 MiB (order 13).
pub const NUM_ORDERS: usize = (ROOT_CHUNK_SHIFT - MIN_CHUNK_SHIFT + 1) as usize;
/// The largest vidmem a PMM manages (inclusive).
pub const MAX_VIDMEM: u64 = 1 << 40;

pub(super) const NIL: u32 = u32::MAX;

/// The two chunk types of the driver.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChunkType {
    /// Backs managed memory; may be evicted.
    User = 0,
    /// Pinned (page tables and the like); never evicted.
    Kernel = 1,
}

/// Number of chunk types.
pub const NUM_TYPES: usize = 2;

impl ChunkType {
    pub const ALL: [ChunkType; NUM_TYPES] = [ChunkType::User, ChunkType::Kernel];

    pub fn name(self) -> &'static str {
        match self {
            ChunkType::User => "user",
            ChunkType::Kernel => "kernel",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "user" => return Ok(ChunkType::User),
            "kernel" => return Ok(ChunkType::Kernel),
            _ => {}
        }
        match name.to_ascii_lowercase().as_str() {
            "user" => Ok(ChunkType::User),
            "kernel" => Ok(ChunkType::Kernel),
            _ => Err(Error::InvalidArgument(format!(
                "unknown chunk type {name:?}; known: 'user', 'kernel'"
            ))),
        }
    }

    pub(super) fn other(self) -> Self {
        match self {
            ChunkType::User => ChunkType::Kernel,
            ChunkType::Kernel => ChunkType::User,
        }
    }
}

/// Chunk states, named as in the driver.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChunkState {
    /// A root chunk still owned by the device (PMA); not taken by the PMM.
    PmaOwned = 0,
    /// On a free list (or held by an eviction in progress).
    Free = 1,
    /// Split into children of the next smaller size.
    IsSplit = 2,
    /// Allocated and pinned until `unpin`: a fresh USER chunk, not evictable.
    TempPinned = 3,
    /// Allocated.
    Allocated = 4,
}

/// Number of chunk states.
pub const NUM_STATES: usize = 5;

impl ChunkState {
    pub const ALL: [ChunkState; NUM_STATES] = [
        ChunkState::PmaOwned,
        ChunkState::Free,
        ChunkState::IsSplit,
        ChunkState::TempPinned,
        ChunkState::Allocated,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ChunkState::PmaOwned => "pma_owned",
            ChunkState::Free => "free",
            ChunkState::IsSplit => "is_split",
            ChunkState::TempPinned => "temp_pinned",
            ChunkState::Allocated => "allocated",
        }
    }

    pub(super) fn is_allocated(self) -> bool {
        matches!(self, ChunkState::TempPinned | ChunkState::Allocated)
    }
}

/// The root LRU lists, in the order eviction searches them.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RootList {
    Unused = 0,
    Discarded = 1,
    Used = 2,
}

/// Number of root LRU lists.
pub const NUM_ROOT_LISTS: usize = 3;

impl RootList {
    pub const ALL: [RootList; NUM_ROOT_LISTS] =
        [RootList::Unused, RootList::Discarded, RootList::Used];

    pub fn name(self) -> &'static str {
        match self {
            RootList::Unused => "unused",
            RootList::Discarded => "discarded",
            RootList::Used => "used",
        }
    }
}

/// The chunk sizes a type may use: bit `k` set means chunks of `2^k` bytes are allowed.
/// Sizes come from the architecture table (Python's `gpumm.arch`), never from constants here.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SizeMask(u32);

impl SizeMask {
    /// Builds a mask from sizes in bytes. Each must be a power of two from 256 B to 2 MiB, and
    /// 2 MiB must be present (every tree starts at a root chunk).
    pub fn from_sizes(sizes: &[u64]) -> Result<Self> {
        let mut bits = 0u32;
        for &size in sizes {
            if !size.is_power_of_two()
                || !((1 << MIN_CHUNK_SHIFT)..=ROOT_CHUNK_SIZE).contains(&size)
            {
                return Err(Error::InvalidSize(format!(
                    "chunk size {size} is not a power of two from 256 B to 2 MiB"
                )));
            }
            bits |= size as u32;
        }
        if bits & (ROOT_CHUNK_SIZE as u32) == 0 {
            return Err(Error::InvalidSize(
                "a size mask must contain the 2 MiB root chunk size".into(),
            ));
        }
        Ok(SizeMask(bits))
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn contains(self, size: u64) -> bool {
        size.is_power_of_two() && size <= ROOT_CHUNK_SIZE && (self.0 as u64) & size != 0
    }

    /// Sizes in bytes, smallest first.
    pub fn sizes(self) -> Vec<u64> {
        (MIN_CHUNK_SHIFT..=ROOT_CHUNK_SHIFT)
            .filter(|s| self.0 & (1 << s) != 0)
            .map(|s| 1u64 << s)
            .collect()
    }

    /// The shift of the children of a chunk of `2^shift` bytes: the next smaller size in the
    /// mask. Example: USER {4K, 64K, 2M}, shift 21 → Some(16) (a 2 MiB chunk splits in 32 × 64 KiB).
    pub(super) fn child_shift(self, shift: u32) -> Option<u32> {
        let below = self.0 & ((1u32 << shift) - 1);
        (below != 0).then(|| 31 - below.leading_zeros())
    }

    pub(super) fn smallest_shift(self) -> u32 {
        self.0.trailing_zeros()
    }
}

/// How a PMM is set up.
#[derive(Clone, Debug)]
pub struct PmmConfig {
    /// Vidmem managed, a multiple of 2 MiB, at most [`MAX_VIDMEM`].
    pub vidmem: u64,
    pub user_sizes: SizeMask,
    pub kernel_sizes: SizeMask,
    /// After a free that empties a root chunk, give that root back to the device.
    pub release_free_roots: bool,
    /// Run [`Pmm::validate`] after every mutation (panics on a broken invariant). Meant for
    /// tests; on by default in debug builds.
    pub check: bool,
}

impl PmmConfig {
    pub fn new(vidmem: u64, user_sizes: SizeMask, kernel_sizes: SizeMask) -> Self {
        PmmConfig {
            vidmem,
            user_sizes,
            kernel_sizes,
            release_free_roots: false,
            check: cfg!(debug_assertions),
        }
    }
}

/// A handle to a chunk: its node slot and the generation of the allocation it names. A handle
/// kept after its chunk was freed (and the slot reused) no longer matches and is refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId {
    pub(super) index: u32,
    pub(super) generation: u32,
}

impl ChunkId {
    pub fn to_bits(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }

    pub fn from_bits(bits: u64) -> Self {
        ChunkId {
            index: bits as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

/// What a caller learns about a chunk.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    pub id: ChunkId,
    pub addr: u64,
    pub size: u64,
    pub ctype: ChunkType,
    pub state: ChunkState,
    pub is_zero: bool,
}

/// A root chunk being evicted: the allocated chunks whose data the caller must move away
/// before [`Pmm::end_eviction`] frees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub root_index: u32,
    pub root_addr: u64,
    pub chunks: Vec<ChunkInfo>,
}

/// Lifetime counters (monotonic).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PmmCounters {
    pub chunk_allocs: u64,
    pub chunk_frees: u64,
    pub splits: u64,
    pub merges: u64,
    pub roots_taken: u64,
    pub roots_released: u64,
    pub evictions: u64,
    pub failed_allocs: u64,
}
