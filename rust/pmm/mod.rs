//! The physical memory manager (PMM): vidmem as 2 MiB root chunks, split into power-of-two
//! chunks, with per-size free lists, eager merge, root LRU lists and eviction.
//!
//! Modelled on `kernel-open/nvidia-uvm/uvm_pmm_gpu.c`. The facts it follows are listed in
//! `docs/design.md`; where it departs from the driver it says so at the place.
//!
//! # Layout
//! All metadata lives out of band in an index arena (`nodes`), never in the memory it manages.
//! Nodes `0..num_roots` are the root chunks themselves (root `i` covers
//! `[i * 2 MiB, (i + 1) * 2 MiB)`); the children of a split chunk take a contiguous run of
//! node slots, so child `k` of a parent is node `first_child + k`, at address
//! `parent.addr + k * child_size`.
//!
//! # Invariants (checked by [`Pmm::validate`])
//! - A chunk's address is aligned to its size; a chunk with no parent is a 2 MiB root.
//! - Child `k` of a parent sits at `parent.addr + k * child_size`, child size being the next
//!   smaller size in the type's size mask.
//! - A chunk is `IsSplit` iff it has children, and then `0 < allocated <= num_children`, where
//!   `allocated` counts the children that are not `Free` (merge is eager).
//! - A `Free` chunk is on the free list `[type][size][is_zero]` iff its root is not in
//!   eviction; no other chunk is on a free list.
//! - A root is on an LRU list iff it is a USER root that is split or allocated, holds no
//!   `TempPinned` chunk and is not in eviction.
//! - `PmaOwned` roots (still the device's) have no children and sit in the `unowned` set.
//! - Every counter equals what a walk of the trees recomputes.

#![deny(unsafe_code)]

mod stats;
mod validate;

pub use stats::PmmStats;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::units::format_size;

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

const NIL: u32 = u32::MAX;

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

    fn other(self) -> Self {
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

    fn is_allocated(self) -> bool {
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
    fn child_shift(self, shift: u32) -> Option<u32> {
        let below = self.0 & ((1u32 << shift) - 1);
        (below != 0).then(|| 31 - below.leading_zeros())
    }

    fn smallest_shift(self) -> u32 {
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
    index: u32,
    generation: u32,
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

#[derive(Clone, Debug)]
struct Node {
    addr: u64,
    generation: u32,
    parent: u32,
    first_child: u32,
    /// Free-list links (valid iff `linked`).
    prev: u32,
    next: u32,
    /// `IsSplit` only: number of children whose state is not `Free`.
    allocated: u32,
    shift: u8,
    /// `IsSplit` only: log2 of the number of children.
    children_log2: u8,
    ctype: ChunkType,
    state: ChunkState,
    is_zero: bool,
    /// The slot holds a chunk (root slots always do).
    live: bool,
    /// On a free list.
    linked: bool,
}

impl Node {
    fn vacant() -> Self {
        Node {
            addr: 0,
            generation: 0,
            parent: NIL,
            first_child: NIL,
            prev: NIL,
            next: NIL,
            allocated: 0,
            shift: 0,
            children_log2: 0,
            ctype: ChunkType::User,
            state: ChunkState::PmaOwned,
            is_zero: false,
            live: false,
            linked: false,
        }
    }

    fn size(&self) -> u64 {
        1u64 << self.shift
    }

    fn num_children(&self) -> u32 {
        1 << self.children_log2
    }
}

#[derive(Clone, Debug, Default)]
struct Root {
    list: Option<RootList>,
    prev: u32,
    next: u32,
    /// Number of `TempPinned` chunks in this root's tree.
    pinned: u32,
    in_eviction: bool,
}

#[derive(Copy, Clone, Debug)]
struct ListHead {
    head: u32,
    tail: u32,
    len: u64,
}

impl ListHead {
    const EMPTY: ListHead = ListHead {
        head: NIL,
        tail: NIL,
        len: 0,
    };
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

/// The physical memory manager of one device.
pub struct Pmm {
    config: PmmConfig,
    nodes: Vec<Node>,
    roots: Vec<Root>,
    /// Vacant runs of child slots, by log2 of their length.
    vacant_runs: Vec<Vec<u32>>,
    /// Roots still owned by the device, lowest address first.
    unowned: BinaryHeap<Reverse<u32>>,
    free_lists: [[[ListHead; 2]; NUM_ORDERS]; NUM_TYPES],
    root_lists: [ListHead; NUM_ROOT_LISTS],
    /// Live chunks by [type][order][state] (PmaOwned roots are counted in `unowned`).
    counts: [[[u64; NUM_STATES]; NUM_ORDERS]; NUM_TYPES],
    pinned_total: u64,
    in_eviction: u64,
    counters: PmmCounters,
    /// Chunks evicted by allocations that were allowed to evict, until `take_evicted`.
    evicted: Vec<ChunkInfo>,
}

fn order_of(shift: u32) -> usize {
    (shift - MIN_CHUNK_SHIFT) as usize
}

impl Pmm {
    pub fn new(config: PmmConfig) -> Result<Self> {
        if config.vidmem == 0 || config.vidmem % ROOT_CHUNK_SIZE != 0 || config.vidmem > MAX_VIDMEM
        {
            return Err(Error::InvalidSize(format!(
                "vidmem must be a non-zero multiple of 2 MiB up to 1 TiB, got {} bytes",
                config.vidmem
            )));
        }
        let num_roots = (config.vidmem / ROOT_CHUNK_SIZE) as u32;
        let mut nodes = Vec::with_capacity(num_roots as usize);
        for i in 0..num_roots {
            let mut n = Node::vacant();
            n.addr = i as u64 * ROOT_CHUNK_SIZE;
            n.shift = ROOT_CHUNK_SHIFT as u8;
            n.live = true;
            nodes.push(n);
        }
        let roots = vec![
            Root {
                prev: NIL,
                next: NIL,
                ..Root::default()
            };
            num_roots as usize
        ];
        Ok(Pmm {
            config,
            nodes,
            roots,
            vacant_runs: vec![Vec::new(); 32],
            unowned: (0..num_roots).map(Reverse).collect(),
            free_lists: [[[ListHead::EMPTY; 2]; NUM_ORDERS]; NUM_TYPES],
            root_lists: [ListHead::EMPTY; NUM_ROOT_LISTS],
            counts: [[[0; NUM_STATES]; NUM_ORDERS]; NUM_TYPES],
            pinned_total: 0,
            in_eviction: 0,
            counters: PmmCounters::default(),
            evicted: Vec::new(),
        })
    }

    pub fn config(&self) -> &PmmConfig {
        &self.config
    }

    pub fn num_roots(&self) -> u32 {
        self.roots.len() as u32
    }

    pub fn size_mask(&self, ctype: ChunkType) -> SizeMask {
        match ctype {
            ChunkType::User => self.config.user_sizes,
            ChunkType::Kernel => self.config.kernel_sizes,
        }
    }

    // ----------------------------------------------------------------------------------
    // Handles

    /// Resolves a handle to its node slot. On failure, returns the error a lookup gives and
    /// whether the handle names a chunk that was freed and merged away (a double free, when
    /// the caller is freeing).
    fn lookup(&self, id: ChunkId) -> std::result::Result<u32, (Error, bool)> {
        let i = id.index;
        let Some(n) = self.nodes.get(i as usize) else {
            return Err((
                Error::InvalidHandle(format!("unknown chunk id {}", id.to_bits())),
                false,
            ));
        };
        let gone = !n.live || n.state == ChunkState::PmaOwned;
        match (n.generation == id.generation, gone) {
            (true, false) => Ok(i),
            (true, true) => Err((
                Error::InvalidHandle(format!(
                    "chunk {:#x} no longer exists: it was freed and merged into its parent",
                    n.addr
                )),
                true,
            )),
            (false, _) => Err((
                Error::InvalidHandle(
                    "stale chunk handle: the chunk was freed and its memory reused".into(),
                ),
                false,
            )),
        }
    }

    fn resolve(&self, id: ChunkId) -> Result<u32> {
        self.lookup(id).map_err(|(e, _)| e)
    }

    fn id_of(&self, i: u32) -> ChunkId {
        ChunkId {
            index: i,
            generation: self.nodes[i as usize].generation,
        }
    }

    fn info_of(&self, i: u32) -> ChunkInfo {
        let n = &self.nodes[i as usize];
        ChunkInfo {
            id: self.id_of(i),
            addr: n.addr,
            size: n.size(),
            ctype: n.ctype,
            state: n.state,
            is_zero: n.is_zero,
        }
    }

    /// The current state of several chunks.
    pub fn infos(&self, ids: &[ChunkId]) -> Result<Vec<ChunkInfo>> {
        ids.iter().map(|&id| self.info(id)).collect()
    }

    /// The current state of a chunk.
    pub fn info(&self, id: ChunkId) -> Result<ChunkInfo> {
        let i = self.resolve(id)?;
        Ok(self.info_of(i))
    }

    /// The root index of a node: address / 2 MiB.
    fn root_of(&self, i: u32) -> u32 {
        (self.nodes[i as usize].addr >> ROOT_CHUNK_SHIFT) as u32
    }

    // ----------------------------------------------------------------------------------
    // Free lists (intrusive, doubly linked through node slots)

    fn list_key(&self, i: u32) -> (usize, usize, usize) {
        let n = &self.nodes[i as usize];
        (
            n.ctype as usize,
            order_of(n.shift as u32),
            n.is_zero as usize,
        )
    }

    fn link(&mut self, i: u32) {
        debug_assert!(!self.nodes[i as usize].linked);
        let (t, o, z) = self.list_key(i);
        let head = self.free_lists[t][o][z].head;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = head;
            n.linked = true;
        }
        if head != NIL {
            self.nodes[head as usize].prev = i;
        } else {
            self.free_lists[t][o][z].tail = i;
        }
        let l = &mut self.free_lists[t][o][z];
        l.head = i;
        l.len += 1;
    }

    fn unlink(&mut self, i: u32) {
        if !self.nodes[i as usize].linked {
            return;
        }
        let (t, o, z) = self.list_key(i);
        let (prev, next) = {
            let n = &mut self.nodes[i as usize];
            n.linked = false;
            (
                std::mem::replace(&mut n.prev, NIL),
                std::mem::replace(&mut n.next, NIL),
            )
        };
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.free_lists[t][o][z].head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.free_lists[t][o][z].tail = prev;
        }
        self.free_lists[t][o][z].len -= 1;
    }

    /// Puts a free chunk on its list, unless its root is being evicted (then the eviction
    /// holds it until it ends).
    fn link_if_allowed(&mut self, i: u32) {
        let r = self.root_of(i);
        if !self.roots[r as usize].in_eviction {
            self.link(i);
        }
    }

    /// Takes a free chunk of exactly this type and size off its list, zeroed first.
    fn pop_free(&mut self, ctype: ChunkType, shift: u32, prefer_zero: bool) -> Option<u32> {
        let (t, o) = (ctype as usize, order_of(shift));
        let order = if prefer_zero { [1, 0] } else { [0, 1] };
        for z in order {
            let head = self.free_lists[t][o][z].head;
            if head != NIL {
                self.unlink(head);
                return Some(head);
            }
        }
        None
    }

    // ----------------------------------------------------------------------------------
    // Root LRU lists (intrusive, doubly linked through `roots`)

    fn root_list_remove(&mut self, r: u32) {
        let Some(list) = self.roots[r as usize].list.take() else {
            return;
        };
        let (prev, next) = {
            let root = &mut self.roots[r as usize];
            (
                std::mem::replace(&mut root.prev, NIL),
                std::mem::replace(&mut root.next, NIL),
            )
        };
        let l = list as usize;
        if prev != NIL {
            self.roots[prev as usize].next = next;
        } else {
            self.root_lists[l].head = next;
        }
        if next != NIL {
            self.roots[next as usize].prev = prev;
        } else {
            self.root_lists[l].tail = prev;
        }
        self.root_lists[l].len -= 1;
    }

    fn root_list_push_tail(&mut self, r: u32, list: RootList) {
        debug_assert!(self.roots[r as usize].list.is_none());
        let l = list as usize;
        let tail = self.root_lists[l].tail;
        {
            let root = &mut self.roots[r as usize];
            root.list = Some(list);
            root.prev = tail;
            root.next = NIL;
        }
        if tail != NIL {
            self.roots[tail as usize].next = r;
        } else {
            self.root_lists[l].head = r;
        }
        self.root_lists[l].tail = r;
        self.root_lists[l].len += 1;
    }

    /// Whether a root may sit on an LRU list (and so be chosen for eviction).
    fn root_evictable(&self, r: u32) -> bool {
        let node = &self.nodes[r as usize];
        let root = &self.roots[r as usize];
        node.ctype == ChunkType::User
            && matches!(node.state, ChunkState::IsSplit | ChunkState::Allocated)
            && root.pinned == 0
            && !root.in_eviction
    }

    /// Restores the LRU invariant for one root after its tree changed: an evictable root not
    /// on a list goes to the tail of USED (as the driver does on unpin); one that is no longer
    /// evictable leaves its list.
    fn update_root_lists(&mut self, r: u32) {
        let evictable = self.root_evictable(r);
        match (evictable, self.roots[r as usize].list.is_some()) {
            (true, false) => self.root_list_push_tail(r, RootList::Used),
            (false, true) => self.root_list_remove(r),
            _ => {}
        }
    }

    // ----------------------------------------------------------------------------------
    // State transitions. Every change of a live chunk's state goes through `set_state`, which
    // keeps the counters, the pinned counts and the parent's `allocated` count right.

    fn count(&mut self, i: u32, delta: i64) {
        let n = &self.nodes[i as usize];
        if n.state == ChunkState::PmaOwned {
            return;
        }
        let c = &mut self.counts[n.ctype as usize][order_of(n.shift as u32)][n.state as usize];
        *c = c.wrapping_add_signed(delta);
    }

    fn set_state(&mut self, i: u32, new: ChunkState) {
        let old = self.nodes[i as usize].state;
        if old == new {
            return;
        }
        self.count(i, -1);
        self.nodes[i as usize].state = new;
        self.count(i, 1);
        let r = self.root_of(i);
        if old == ChunkState::TempPinned {
            self.roots[r as usize].pinned -= 1;
            self.pinned_total -= 1;
        }
        if new == ChunkState::TempPinned {
            self.roots[r as usize].pinned += 1;
            self.pinned_total += 1;
        }
        let parent = self.nodes[i as usize].parent;
        if parent != NIL {
            let was_free = old == ChunkState::Free;
            let is_free = new == ChunkState::Free;
            if was_free && !is_free {
                self.nodes[parent as usize].allocated += 1;
            } else if !was_free && is_free {
                self.nodes[parent as usize].allocated -= 1;
            }
        }
    }

    fn take_vacant_run(&mut self, log2: u8) -> u32 {
        if let Some(first) = self.vacant_runs[log2 as usize].pop() {
            return first;
        }
        let first = self.nodes.len() as u32;
        self.nodes.extend((0..1u32 << log2).map(|_| Node::vacant()));
        first
    }

    /// Gives a chunk children of the next smaller size in its mask, each in `state` with the
    /// parent's `is_zero`. The parent becomes `IsSplit`. Free children are linked, except
    /// child 0 when `keep_first` (the caller takes it). Returns the first child's slot.
    fn make_children(&mut self, i: u32, state: ChunkState, keep_first: bool) -> u32 {
        let (addr, shift, ctype, is_zero) = {
            let n = &self.nodes[i as usize];
            (n.addr, n.shift as u32, n.ctype, n.is_zero)
        };
        let child_shift = self
            .size_mask(ctype)
            .child_shift(shift)
            .expect("caller checked that the chunk can split");
        let log2 = (shift - child_shift) as u8;
        let first = self.take_vacant_run(log2);
        let count = 1u32 << log2;
        for k in 0..count {
            let c = first + k;
            let n = &mut self.nodes[c as usize];
            n.addr = addr + ((k as u64) << child_shift);
            n.generation = n.generation.wrapping_add(1);
            n.parent = i;
            n.first_child = NIL;
            n.allocated = 0;
            n.shift = child_shift as u8;
            n.children_log2 = 0;
            n.ctype = ctype;
            n.state = state;
            n.is_zero = is_zero;
            n.live = true;
            n.linked = false;
            self.count(c, 1);
            if state == ChunkState::TempPinned {
                let r = self.root_of(c);
                self.roots[r as usize].pinned += 1;
                self.pinned_total += 1;
            }
        }
        // The parent's pin, if any, passes to the children (counted above); `set_state`
        // drops it. Its `allocated` is set just after, from the children.
        self.set_state(i, ChunkState::IsSplit);
        {
            let n = &mut self.nodes[i as usize];
            n.first_child = first;
            n.children_log2 = log2;
            n.allocated = if state == ChunkState::Free { 0 } else { count };
        }
        if state == ChunkState::Free {
            for k in (u32::from(keep_first)..count).rev() {
                self.link_if_allowed(first + k);
            }
        }
        self.counters.splits += 1;
        first
    }

    /// Drops a split chunk's children (all leaves in one state) and gives the parent `state`.
    fn drop_children(&mut self, i: u32, state: ChunkState) {
        let (first, log2) = {
            let n = &self.nodes[i as usize];
            (n.first_child, n.children_log2)
        };
        for k in 0..(1u32 << log2) {
            let c = first + k;
            self.unlink(c);
            if self.nodes[c as usize].state == ChunkState::TempPinned {
                let r = self.root_of(c);
                self.roots[r as usize].pinned -= 1;
                self.pinned_total -= 1;
            }
            self.count(c, -1);
            let n = &mut self.nodes[c as usize];
            n.live = false;
            n.linked = false;
            n.parent = NIL;
        }
        self.vacant_runs[log2 as usize].push(first);
        {
            let n = &mut self.nodes[i as usize];
            n.first_child = NIL;
            n.children_log2 = 0;
            n.allocated = 0;
        }
        // IsSplit -> state: a pin comes back to the parent; its own parent sees a change
        // only if `state` is Free.
        self.set_state(i, state);
        self.counters.merges += 1;
    }

    // ----------------------------------------------------------------------------------
    // Roots

    /// Takes a root for `ctype`, in the driver's order: a root still owned by the device; else
    /// (a gpumm addition) a free root cached for the other type, retyped; else, when allowed and
    /// for USER chunks, an evicted root. The root comes back `Free` and off every list.
    fn take_root(&mut self, ctype: ChunkType, evict: bool) -> Option<u32> {
        if let Some(Reverse(r)) = self.unowned.pop() {
            let n = &mut self.nodes[r as usize];
            n.ctype = ctype;
            n.is_zero = true; // the device hands out scrubbed memory
            n.generation = n.generation.wrapping_add(1);
            n.state = ChunkState::Free;
            self.count(r, 1);
            self.counters.roots_taken += 1;
            return Some(r);
        }
        if let Some(r) = self.pop_free(ctype.other(), ROOT_CHUNK_SHIFT, false) {
            self.count(r, -1);
            self.nodes[r as usize].ctype = ctype;
            self.count(r, 1);
            return Some(r);
        }
        if evict && ctype == ChunkType::User {
            let r = self.evict_for_allocation()?;
            self.unlink(r);
            return Some(r);
        }
        None
    }

    /// Evicts the first root of the LRU lists for an allocation; its chunks are recorded for
    /// `take_evicted` and the root is left free on its list.
    fn evict_for_allocation(&mut self) -> Option<u32> {
        let ev = self.begin_eviction_inner(false)?;
        self.evicted.extend(ev.chunks.iter().copied());
        self.end_eviction_inner(ev.root_index);
        Some(ev.root_index)
    }

    /// Gives a free root back to the device.
    fn release_root(&mut self, r: u32) {
        debug_assert_eq!(self.nodes[r as usize].state, ChunkState::Free);
        debug_assert!(self.nodes[r as usize].parent == NIL);
        self.unlink(r);
        self.count(r, -1);
        let n = &mut self.nodes[r as usize];
        n.state = ChunkState::PmaOwned;
        n.is_zero = false;
        self.unowned.push(Reverse(r));
        self.counters.roots_released += 1;
    }

    /// Gives every cached free root back to the device; returns how many.
    pub fn release_free_roots(&mut self) -> u64 {
        let mut released = 0;
        for t in ChunkType::ALL {
            while let Some(r) = self.pop_free(t, ROOT_CHUNK_SHIFT, false) {
                self.link(r);
                self.release_root(r);
                released += 1;
            }
        }
        self.check();
        released
    }

    // ----------------------------------------------------------------------------------
    // Allocation

    fn check_size(&self, size: u64, ctype: ChunkType) -> Result<u32> {
        let mask = self.size_mask(ctype);
        if !mask.contains(size) {
            let sizes: Vec<String> = mask.sizes().into_iter().map(format_size).collect();
            return Err(Error::InvalidSize(format!(
                "{} chunks come in {}; {} is not one of them",
                ctype.name(),
                sizes.join(", "),
                if size == 0 {
                    "0 B".to_string()
                } else {
                    format!("{size} B")
                }
            )));
        }
        Ok(size.trailing_zeros())
    }

    /// Finds a free chunk of exactly `shift` bytes: the exact list, else a split of the
    /// smallest larger free chunk one level at a time (child 0 kept), else a new root.
    fn alloc_one(&mut self, ctype: ChunkType, shift: u32, evict: bool) -> Option<u32> {
        if let Some(i) = self.pop_free(ctype, shift, true) {
            return Some(i);
        }
        let mask = self.size_mask(ctype);
        let mut found = None;
        for s in (shift + 1)..=ROOT_CHUNK_SHIFT {
            if mask.bits() & (1 << s) != 0 {
                if let Some(i) = self.pop_free(ctype, s, true) {
                    found = Some(i);
                    break;
                }
            }
        }
        let mut i = match found {
            Some(i) => i,
            None => self.take_root(ctype, evict)?,
        };
        while (self.nodes[i as usize].shift as u32) > shift {
            i = self.make_children(i, ChunkState::Free, true);
        }
        Some(i)
    }

    fn claim(&mut self, i: u32) {
        let state = match self.nodes[i as usize].ctype {
            ChunkType::User => ChunkState::TempPinned,
            ChunkType::Kernel => ChunkState::Allocated,
        };
        self.set_state(i, state);
        let n = &mut self.nodes[i as usize];
        n.generation = n.generation.wrapping_add(1);
        let r = self.root_of(i);
        self.update_root_lists(r);
        self.counters.chunk_allocs += 1;
    }

    /// How many chunks of `2^shift` bytes could be had without eviction.
    fn capacity_for(&self, ctype: ChunkType, shift: u32) -> u64 {
        let t = ctype as usize;
        let mut n: u64 = 0;
        for s in shift..=ROOT_CHUNK_SHIFT {
            let o = order_of(s);
            let per = 1u64 << (s - shift);
            n = n.saturating_add(
                (self.free_lists[t][o][0].len + self.free_lists[t][o][1].len) * per,
            );
        }
        let per_root = 1u64 << (ROOT_CHUNK_SHIFT - shift);
        let other = &self.free_lists[ctype.other() as usize][order_of(ROOT_CHUNK_SHIFT)];
        let roots = self.unowned.len() as u64 + other[0].len + other[1].len;
        n = n.saturating_add(roots * per_root);
        n
    }

    /// Chunks of `2^shift` bytes that evicting every evictable root would add to
    /// `capacity_for`: per root, what is not already counted as a free chunk of that size or
    /// larger. Walks those roots' trees, so it is only used when a batch needs eviction.
    fn eviction_capacity(&self, shift: u32) -> u64 {
        let mut extra = 0u64;
        for list in RootList::ALL {
            let mut r = self.root_lists[list as usize].head;
            while r != NIL {
                let mut counted = 0u64;
                let mut stack = vec![r];
                while let Some(i) = stack.pop() {
                    let n = &self.nodes[i as usize];
                    match n.state {
                        ChunkState::IsSplit => {
                            stack.extend(n.first_child..n.first_child + n.num_children())
                        }
                        ChunkState::Free if n.shift as u32 >= shift => counted += n.size(),
                        _ => {}
                    }
                }
                extra += (ROOT_CHUNK_SIZE - counted) >> shift;
                r = self.roots[r as usize].next;
            }
        }
        extra
    }

    fn oom(&mut self, size: u64, ctype: ChunkType, count: usize) -> Error {
        self.counters.failed_allocs += 1;
        let s = self.stats();
        Error::OutOfMemory(format!(
            "cannot allocate {count} {} chunk(s) of {}: {} free in taken roots (largest free \
             chunk {}), {} roots still owned by the device, {} allocated, {} roots evictable",
            ctype.name(),
            format_size(size),
            format_size(s.free_bytes),
            format_size(s.largest_free_chunk),
            s.roots_pma_owned,
            format_size(s.allocated_bytes),
            s.root_list_len.iter().sum::<u64>(),
        ))
    }

    /// Allocates one chunk. USER chunks come back `TempPinned`, KERNEL chunks `Allocated`.
    /// With `evict`, a USER allocation may evict a root chunk when nothing else is left; the
    /// evicted chunks are then listed by [`Pmm::take_evicted`].
    pub fn alloc_chunk(&mut self, size: u64, ctype: ChunkType, evict: bool) -> Result<ChunkId> {
        let shift = self.check_size(size, ctype)?;
        match self.alloc_one(ctype, shift, evict) {
            Some(i) => {
                self.claim(i);
                self.check();
                Ok(self.id_of(i))
            }
            None => Err(self.oom(size, ctype, 1)),
        }
    }

    /// Allocates `count` chunks of one size in one call: all of them, or (when they cannot all
    /// be had) none, with nothing changed.
    pub fn alloc_chunks(
        &mut self,
        count: usize,
        size: u64,
        ctype: ChunkType,
        evict: bool,
    ) -> Result<Vec<ChunkId>> {
        let shift = self.check_size(size, ctype)?;
        let count64 = count as u64;
        let mut available = self.capacity_for(ctype, shift);
        if count64 > available && evict && ctype == ChunkType::User {
            if count64 > available + self.eviction_capacity(shift) {
                return Err(self.oom(size, ctype, count));
            }
            // Evict first, while every candidate is still evictable: once the batch holds
            // pinned chunks in a root, that root can no longer be evicted.
            while available < count64 {
                self.evict_for_allocation()
                    .expect("eviction capacity was checked");
                available = self.capacity_for(ctype, shift);
            }
        }
        if count64 > available {
            return Err(self.oom(size, ctype, count));
        }
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let i = self
                .alloc_one(ctype, shift, false)
                .expect("capacity was checked before the first allocation");
            self.claim(i);
            out.push(self.id_of(i));
        }
        self.check();
        Ok(out)
    }

    /// Drains the list of chunks evicted by allocations made with `evict`.
    pub fn take_evicted(&mut self) -> Vec<ChunkInfo> {
        std::mem::take(&mut self.evicted)
    }

    /// `TempPinned` → `Allocated`: the chunk becomes evictable with its root.
    pub fn unpin(&mut self, id: ChunkId) -> Result<()> {
        let i = self.resolve(id)?;
        let state = self.nodes[i as usize].state;
        if state != ChunkState::TempPinned {
            return Err(Error::InvalidState(format!(
                "unpin needs a temp_pinned chunk; chunk {:#x} is {}",
                self.nodes[i as usize].addr,
                state.name()
            )));
        }
        self.set_state(i, ChunkState::Allocated);
        let r = self.root_of(i);
        self.update_root_lists(r);
        self.check();
        Ok(())
    }

    // ----------------------------------------------------------------------------------
    // Free and merge

    /// Frees an allocated chunk, merging up the tree while a parent has no allocated child
    /// left. A free clears `is_zero`. When the free empties a root and the PMM is configured
    /// to, the root goes back to the device.
    pub fn free(&mut self, id: ChunkId) -> Result<()> {
        let i = self.resolve_for_free(id)?;
        self.free_inner(i, self.config.release_free_roots);
        self.counters.chunk_frees += 1;
        self.check();
        Ok(())
    }

    /// Frees several chunks: all of them, or (if any cannot be freed, or one appears twice)
    /// none, with nothing changed.
    pub fn free_chunks(&mut self, ids: &[ChunkId]) -> Result<()> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        for &id in ids {
            self.resolve_for_free(id)?;
            if !seen.insert(id) {
                let addr = self.nodes[id.index as usize].addr;
                return Err(Error::InvalidFree(format!(
                    "chunk {addr:#x} appears twice in one free"
                )));
            }
        }
        for &id in ids {
            let i = self.resolve_for_free(id).expect("checked above");
            self.free_inner(i, self.config.release_free_roots);
            self.counters.chunk_frees += 1;
        }
        self.check();
        Ok(())
    }

    fn resolve_for_free(&self, id: ChunkId) -> Result<u32> {
        let i = match self.lookup(id) {
            Ok(i) => i,
            Err((e, true)) => {
                return Err(Error::InvalidFree(format!("double free: {}", e.message())))
            }
            Err((e, false)) => return Err(Error::InvalidFree(e.message().to_string())),
        };
        let n = &self.nodes[i as usize];
        match n.state {
            ChunkState::TempPinned | ChunkState::Allocated => Ok(i),
            ChunkState::Free => Err(Error::InvalidFree(format!(
                "double free of chunk {:#x}",
                n.addr
            ))),
            ChunkState::IsSplit => Err(Error::InvalidFree(format!(
                "chunk {:#x} is split: free its children, or merge it first",
                n.addr
            ))),
            ChunkState::PmaOwned => Err(Error::InvalidFree(format!(
                "chunk {:#x} is owned by the device, not allocated",
                n.addr
            ))),
        }
    }

    fn free_inner(&mut self, i: u32, release: bool) {
        self.set_state(i, ChunkState::Free);
        self.nodes[i as usize].is_zero = false;
        let mut top = i;
        loop {
            let parent = self.nodes[top as usize].parent;
            if parent == NIL || self.nodes[parent as usize].allocated != 0 {
                break;
            }
            self.drop_children(parent, ChunkState::Free);
            self.nodes[parent as usize].is_zero = false;
            top = parent;
        }
        let r = self.root_of(i);
        let root_free = self.nodes[r as usize].state == ChunkState::Free;
        if root_free && release && !self.roots[r as usize].in_eviction {
            self.link(top);
            self.release_root(r);
        } else {
            self.link_if_allowed(top);
        }
        self.update_root_lists(r);
    }

    // ----------------------------------------------------------------------------------
    // Split and merge of allocated chunks in place

    /// Splits an allocated chunk into children of `child_size` (default: the next smaller size
    /// in its mask), several levels at once if asked. The children take the chunk's state.
    /// Returns the leaves in address order.
    pub fn split(&mut self, id: ChunkId, child_size: Option<u64>) -> Result<Vec<ChunkId>> {
        let i = self.resolve(id)?;
        let (shift, ctype, state, addr) = {
            let n = &self.nodes[i as usize];
            (n.shift as u32, n.ctype, n.state, n.addr)
        };
        if !state.is_allocated() {
            return Err(Error::InvalidState(format!(
                "split needs an allocated chunk; chunk {addr:#x} is {}",
                state.name()
            )));
        }
        self.check_not_evicting(i)?;
        let mask = self.size_mask(ctype);
        let target = match child_size {
            None => mask.child_shift(shift).ok_or_else(|| {
                Error::InvalidSize(format!(
                    "chunk {addr:#x} is {}, the smallest {} size: it cannot split",
                    format_size(1 << shift),
                    ctype.name()
                ))
            })?,
            Some(cs) => {
                let s = self.check_size(cs, ctype)?;
                if s >= shift {
                    return Err(Error::InvalidSize(format!(
                        "split of a {} chunk needs a smaller child size, got {}",
                        format_size(1 << shift),
                        format_size(cs)
                    )));
                }
                s
            }
        };
        debug_assert!(target >= mask.smallest_shift());
        let mut level = vec![i];
        while (self.nodes[level[0] as usize].shift as u32) > target {
            let mut next = Vec::new();
            for p in level {
                let first = self.make_children(p, state, false);
                next.extend(first..first + self.nodes[p as usize].num_children());
            }
            level = next;
        }
        let r = self.root_of(i);
        self.update_root_lists(r);
        self.check();
        Ok(level.into_iter().map(|c| self.id_of(c)).collect())
    }

    /// Merges a split chunk whose children are all allocated leaves in one state back into
    /// one allocated chunk in that state. The children's handles stop being valid.
    pub fn merge(&mut self, id: ChunkId) -> Result<()> {
        let i = self.resolve(id)?;
        let n = &self.nodes[i as usize];
        let addr = n.addr;
        if n.state != ChunkState::IsSplit {
            return Err(Error::InvalidState(format!(
                "merge needs a split chunk; chunk {addr:#x} is {}",
                n.state.name()
            )));
        }
        self.check_not_evicting(i)?;
        let first = n.first_child;
        let state = self.nodes[first as usize].state;
        for c in first..first + n.num_children() {
            let cs = self.nodes[c as usize].state;
            if !cs.is_allocated() || cs != state {
                return Err(Error::InvalidState(format!(
                    "merge of chunk {addr:#x} needs every child allocated in one state; child {:#x} is {}",
                    self.nodes[c as usize].addr,
                    cs.name()
                )));
            }
        }
        self.drop_children(i, state);
        let r = self.root_of(i);
        self.update_root_lists(r);
        self.check();
        Ok(())
    }

    fn check_not_evicting(&self, i: u32) -> Result<()> {
        let r = self.root_of(i);
        if self.roots[r as usize].in_eviction {
            return Err(Error::InvalidState(format!(
                "root chunk {:#x} is being evicted",
                self.nodes[r as usize].addr
            )));
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------
    // LRU marks and eviction

    /// Moves the root of an allocated USER chunk to the tail of an LRU list. Like the driver,
    /// a root that is pinned or being evicted is left where it is.
    pub fn mark_root(&mut self, id: ChunkId, list: RootList) -> Result<()> {
        let i = self.resolve(id)?;
        let n = &self.nodes[i as usize];
        if n.ctype != ChunkType::User || !n.state.is_allocated() {
            return Err(Error::InvalidState(format!(
                "LRU marks take an allocated user chunk; chunk {:#x} is {} {}",
                n.addr,
                n.ctype.name(),
                n.state.name()
            )));
        }
        let r = self.root_of(i);
        if self.root_evictable(r) {
            self.root_list_remove(r);
            self.root_list_push_tail(r, list);
        }
        self.check();
        Ok(())
    }

    /// The driver's choice: a free USER root first (non-zeroed, then zeroed), else the head of
    /// the first non-empty LRU list. Allocations only get here once free roots are used up,
    /// so for them `free_first` changes nothing; a batch asks for LRU roots only.
    fn pick_root_to_evict(&self, free_first: bool) -> Option<u32> {
        let o = order_of(ROOT_CHUNK_SHIFT);
        let user = ChunkType::User as usize;
        for z in [0, 1] {
            let head = self.free_lists[user][o][z].head;
            if free_first && head != NIL {
                return Some(head);
            }
        }
        RootList::ALL
            .iter()
            .map(|&l| self.root_lists[l as usize].head)
            .find(|&h| h != NIL)
    }

    fn begin_eviction_inner(&mut self, free_first: bool) -> Option<Eviction> {
        let r = self.pick_root_to_evict(free_first)?;
        self.root_list_remove(r);
        self.roots[r as usize].in_eviction = true;
        self.in_eviction += 1;
        let mut chunks = Vec::new();
        let mut stack = vec![r];
        while let Some(i) = stack.pop() {
            let n = &self.nodes[i as usize];
            match n.state {
                ChunkState::IsSplit => {
                    stack.extend((n.first_child..n.first_child + n.num_children()).rev())
                }
                ChunkState::Allocated | ChunkState::TempPinned => chunks.push(self.info_of(i)),
                ChunkState::Free | ChunkState::PmaOwned => {}
            }
            if self.nodes[i as usize].state == ChunkState::Free {
                self.unlink(i);
            }
        }
        chunks.sort_by_key(|c| c.addr);
        Some(Eviction {
            root_index: r,
            root_addr: self.nodes[r as usize].addr,
            chunks,
        })
    }

    /// Starts evicting a root: a free USER root first, else the head of the first non-empty
    /// LRU list (UNUSED, DISCARDED, USED). Pinned roots and roots already in eviction are never
    /// on those lists, so never chosen. The root's free chunks leave the free lists; its
    /// allocated chunks are returned for the caller to move, then [`Pmm::end_eviction`].
    pub fn begin_eviction(&mut self) -> Result<Eviction> {
        let ev = self.begin_eviction_inner(true).ok_or_else(|| {
            Error::OutOfMemory(
                "no root chunk can be evicted: every user root is pinned, kernel, or in eviction"
                    .into(),
            )
        })?;
        self.check();
        Ok(ev)
    }

    fn end_eviction_inner(&mut self, r: u32) {
        let mut stack = vec![r];
        let mut leaves = Vec::new();
        while let Some(i) = stack.pop() {
            let n = &self.nodes[i as usize];
            match n.state {
                ChunkState::IsSplit => {
                    stack.extend(n.first_child..n.first_child + n.num_children())
                }
                ChunkState::Allocated | ChunkState::TempPinned => leaves.push(i),
                _ => {}
            }
        }
        for i in leaves {
            self.free_inner(i, false);
        }
        self.roots[r as usize].in_eviction = false;
        self.in_eviction -= 1;
        // The root is Free now, its children merged; it becomes allocatable again.
        self.link(r);
        self.counters.evictions += 1;
    }

    /// Ends an eviction: every chunk still allocated in the root is freed, the root merges
    /// back to one free 2 MiB chunk and is reusable.
    pub fn end_eviction(&mut self, root_index: u32) -> Result<()> {
        match self.roots.get(root_index as usize) {
            Some(root) if root.in_eviction => {}
            _ => {
                return Err(Error::InvalidState(format!(
                    "root {root_index} is not being evicted"
                )))
            }
        }
        self.end_eviction_inner(root_index);
        self.check();
        Ok(())
    }

    /// Evicts one root in one step (begin, then end) and returns what was evicted.
    pub fn evict_root(&mut self) -> Result<Eviction> {
        let ev = self.begin_eviction()?;
        self.end_eviction(ev.root_index)?;
        Ok(ev)
    }

    // ----------------------------------------------------------------------------------

    pub fn counters(&self) -> PmmCounters {
        self.counters
    }

    fn check(&self) {
        if self.config.check {
            if let Err(e) = self.validate() {
                panic!("PMM invariant broken: {e}");
            }
        }
    }

    /// Every chunk currently allocated (TempPinned or Allocated), in address order.
    pub fn allocated_chunks(&self) -> Vec<ChunkInfo> {
        let mut out = Vec::new();
        for r in 0..self.num_roots() {
            let mut stack = vec![r];
            while let Some(i) = stack.pop() {
                let n = &self.nodes[i as usize];
                match n.state {
                    ChunkState::IsSplit => {
                        stack.extend((n.first_child..n.first_child + n.num_children()).rev())
                    }
                    s if s.is_allocated() => out.push(self.info_of(i)),
                    _ => {}
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
