//! The records the pool keeps: handles, requests and reports; blocks, slots, layouts and
//! counters.

use super::*;

/// A handle to an allocation: its slot and the generation of the allocation it names.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllocId {
    pub(super) index: u32,
    pub(super) generation: u32,
}

impl AllocId {
    pub fn to_bits(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }
    pub fn from_bits(bits: u64) -> Self {
        AllocId {
            index: bits as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

/// What a caller may ask for.
#[derive(Copy, Clone, Debug, Default)]
pub struct Request {
    /// Bytes, at least 1.
    pub size: u64,
    pub stream: u64,
    /// The allocation may be moved by `defrag` (its pointer changes).
    pub movable: bool,
    /// A scope from `open_scope` (0: none).
    pub scope: u32,
}

/// What a caller learns about an allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocInfo {
    pub id: AllocId,
    pub ptr: u64,
    pub size: u64,
    pub rounded: u64,
    pub stream: u64,
    pub freeing: bool,
    pub movable: bool,
    pub stitched: bool,
    pub pins: u32,
    pub scope: u32,
}

/// What `defrag` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefragReport {
    /// Allocations that changed address (each counted once).
    pub moved_allocs: u64,
    /// Bytes copied (an allocation that moved twice counts twice).
    pub moved_bytes: u64,
    /// Heap pages emptied (the pages a large segment's compaction frees are in
    /// `bytes_released`).
    pub pages_emptied: u64,
    /// Free pages given back to the device at the end.
    pub bytes_released: u64,
    /// (allocation, old pointer, new pointer), one per allocation moved, in the order they
    /// first moved.
    pub moves: Vec<(AllocId, u64, u64)>,
}

impl DefragReport {
    /// One move per allocation: an allocation slid inside its page and then moved out of it
    /// keeps its first old pointer and takes its last new one.
    pub(super) fn merge_moves(&mut self) {
        let mut first: FxHashMap<AllocId, usize> = FxHashMap::default();
        let mut merged: Vec<(AllocId, u64, u64)> = Vec::with_capacity(self.moves.len());
        for &(id, old, new) in &self.moves {
            match first.get(&id) {
                Some(&i) => merged[i].2 = new,
                None => {
                    first.insert(id, merged.len());
                    merged.push((id, old, new));
                }
            }
        }
        self.moves = merged;
        self.moved_allocs = self.moves.len() as u64;
    }
}

/// What closing a scope did: the allocations made inside it that were still live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeReport {
    pub allocs: u64,
    pub freed: u64,
    pub leaked: Vec<AllocInfo>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum PageKind {
    /// Not held by the pool.
    Absent,
    /// Held, and either free (in a free run) or a middle page of a stitched allocation; which
    /// one is not written per page (a 64 MiB allocation would touch 32 pages twice): the free
    /// runs and the stitches say it, and the on-demand walks read them there.
    Owned,
    Heap,
    /// The first page of a large *segment*: one or more consecutive pages covered by one
    /// list of blocks, which may cross page boundaries (a large allocation placed in it is
    /// contiguous in the direct map).
    Large,
    /// A later page of a large segment; its blocks are listed from the segment's first page.
    Covered,
}

/// A piece of a heap page or a large segment. Its primary bin links live in it, and it knows
/// its page kind, so the hot paths touch one cache line per block (the page table is not
/// read); 32 bytes, stored 32-aligned (`Blocks`), so two share a cache line and none
/// straddles one. A used block is in no bin, so its links hold its allocation instead
/// (`owner`); the secondary links (suffix and prefix bins, only ever used by free large
/// blocks at a segment's ends) live beside the blocks, in `Pool::sec_links`.
#[derive(Copy, Clone, Debug)]
pub(super) struct Block {
    /// The page the block starts in, and its offset there in granules.
    pub(super) page: u32,
    pub(super) off: u32,
    /// Length in granules; a block may run on into the next pages of its segment (a heap
    /// segment spans pages once `extend_heap` ran it on).
    pub(super) len: u32,
    /// Neighbours in the page or segment (NIL at its ends).
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) free: bool,
    /// In a heap page (else a large segment).
    pub(super) heap: bool,
    /// Free and binned: its primary bin and secondary bins (`SUFFIX`, `PREFIX` or 0), as
    /// computed when it went in, so that taking it out does not compute them again.
    pub(super) binsec: u16,
    /// What the links mean depends on the block, and only these helpers read or write them
    /// for anything but a bin: free and binned, links in the primary bins (heap or large);
    /// used, `Link::owned_by` its allocation (`owner`); freed by `free_batch` and not yet
    /// merged, `Link::PENDING` (`is_pending`), and the first block of a run `merge_pending`
    /// has merged, `Link::MERGED`.
    pub(super) links: Link,
}

const _: () = assert!(std::mem::size_of::<Block>() == 32);

/// The pool's blocks: each in a 32-aligned cell, so that the table starts on a cache line's
/// half while `Block` itself keeps a 4-byte alignment (see `table::Cell`).
pub(super) type Blocks = Table<Block, Aligned32<Block>>;
const _: () = assert!(std::mem::align_of::<Aligned32<Block>>() == 32);
// `Block::binsec` holds a bin in its low 12 bits and the secondary bins above them
const _: () = assert!(NUM_BINS <= 1 << 12 && PREFIX < 1 << 4);
const _: () = assert!(std::mem::size_of::<Alloc>() == 64);

impl Block {
    /// A block slot not in use (`Pool::drop_block`'s mark: no page).
    pub(super) const VACANT: Block = Block {
        page: NIL,
        off: 0,
        len: 0,
        prev: NIL,
        next: NIL,
        free: false,
        heap: false,
        binsec: 0,
        links: Link::UNLINKED,
    };

    /// The primary bin it was filed under (free and binned).
    #[inline(always)]
    pub(super) fn bin(&self) -> usize {
        (self.binsec & 0xfff) as usize
    }

    /// Its secondary bins (`SUFFIX`, `PREFIX` or 0).
    #[inline(always)]
    pub(super) fn sec(&self) -> usize {
        (self.binsec >> 12) as usize
    }
    /// The allocation a used block belongs to.
    #[inline]
    pub(super) fn owner(&self) -> u32 {
        debug_assert!(!self.free);
        self.links.prev
    }

    /// Freed by `free_batch` and waiting for `merge_pending` (in no bin).
    #[inline(always)]
    pub(super) fn is_pending(&self) -> bool {
        self.links.prev == PENDING
    }
}

impl Link {
    /// The links of a used block: its owner's slot (a used block is in no bin).
    #[inline(always)]
    pub(super) const fn owned_by(a: u32) -> Link {
        Link { prev: a, next: NIL }
    }
    /// A block freed by `free_batch`, not yet merged.
    pub(super) const PENDING: Link = Link {
        prev: PENDING,
        next: NIL,
    };
    /// The first block of a run `merge_pending` has merged already.
    pub(super) const MERGED: Link = Link {
        prev: PENDING,
        next: PENDING,
    };
}

#[inline(always)]
pub(super) fn bin_op<L: LinkWrite + ?Sized>(
    bins: &mut Bins,
    links: &mut L,
    item: u32,
    bin: usize,
    insert: bool,
) {
    if insert {
        bins.push(links, item, bin)
    } else {
        bins.remove(links, item, bin)
    }
}

/// The primary links of every block, for [`Bins`].
pub(super) struct BlockLinks<'a>(pub(super) &'a mut Blocks);
pub(super) struct BlockLinksRef<'a>(pub(super) &'a Blocks);

impl LinkRead for BlockLinks<'_> {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self.0[i as usize].links
    }
}

impl LinkWrite for BlockLinks<'_> {
    #[inline]
    fn link_mut(&mut self, i: u32) -> &mut Link {
        &mut self.0[i as usize].links
    }
}

impl LinkRead for BlockLinksRef<'_> {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self.0[i as usize].links
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum State {
    Vacant,
    Live,
    /// Freed on a stream; waits for that stream's fence.
    Freeing,
    /// The memory of an arena batch (`alloc_arena`): not an allocation a caller sees; its
    /// members point into it, and it goes back when the last of them is freed.
    Group,
    /// Freed, its block kept whole in the size cache (`cache.rs`) for a next request of its
    /// size: not an allocation a caller sees (its handle is stale), and its memory counts as
    /// free.
    Cached,
}

/// Where an allocation's memory is. Small and `Copy`: stitched layouts live in their own
/// arena (moving a large enum through every call cost a fifth of the allocation path).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    None,
    /// One block in a heap or large page.
    Block(u32),
    /// An entry of `Pool::stitches`.
    Stitched(u32),
    /// Part of the memory of the group (arena batch) in that slot.
    Member(u32),
}

/// How the members of a batch record lie, for `free_batch` (see `vacate_record`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// Back to back in one used block, in their order (a batch placed in one block): the
    /// block is the first member's, and is cut into one block per member only when the
    /// record goes into the pointer index (`cut_uncut`), so a `free_batch` of the whole
    /// batch gives back one block that was never cut.
    Uncut(u32),
    /// All the members of arena (group) slot `g`.
    Group(u32),
}

/// The members of a batch not yet in the pointer index (see `Pool::batches`), as (pointer,
/// slot) in the order returned, and how they lie. The shape is set when the batch is made and
/// stays true while the record exists: a member's block or group changes only when that
/// member is freed or moved, and each of those paths first moves the records into the index
/// (`unindex`), which ends them (checked by `validate`). So `free_batch` need not walk the
/// blocks again to find it (a ninth of a batch pair's instructions), and a batch in one
/// block need not be cut into blocks unless a member is freed or looked up on its own.
#[derive(Clone, Debug)]
pub(super) struct BatchRecord {
    pub(super) shape: Record,
    pub(super) members: Vec<(u64, u32)>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Stitch {
    /// A free block that ended at its page's end (NIL: none).
    pub(super) head: u32,
    /// Whole pages, in mapping order.
    pub(super) runs: SmallVec<[(u32, u32); 4]>,
    /// A block that starts at its page's start (NIL: none).
    pub(super) tail: u32,
    /// Pages of the stitching window (NIL: addressed through the direct map).
    pub(super) window: u32,
    pub(super) window_len: u32,
}

/// A change made while placing a request or a batch, kept (in the journal) until it has
/// succeeded so that a failure can undo it exactly (`journal.rs`).
#[derive(Clone, Debug)]
pub(super) enum Change {
    /// `split_out` of free block `b`, which was `orig`, gave pages `[p0, p1)` back to the
    /// free pages; `right` is the free block it left at `p1` (NIL: none). (`cut_at_page`:
    /// no pages, `p0 == p1`, the boundary it cut `orig` at.)
    Split {
        b: u32,
        orig: Block,
        right: u32,
        p0: u32,
        p1: u32,
    },
    /// Free pages `[p, p + n)` were appended to the segment whose last block is `b`.
    Extend { b: u32, p: u32, n: u32 },
    /// Page `p` was taken from the device, when the peak reserve was `peak`.
    Grow { p: u32, peak: u64 },
    /// Slot `a` became a live allocation of the batch being made.
    Made { a: u32 },
    /// A batch began, with these counters.
    Begin { counters: Box<Counters> },
    /// The heap segment whose first page is `p` became a large one (`place_over_heap_ends`).
    Retype { p: u32 },
    /// A heap page opened; `Pool::last_heap_open` was `prev`.
    HeapOpen { prev: u32 },
}

/// One allocation slot: 64 bytes, one cache line (the rounded size is not stored: it is
/// `units()`; with it the slot took two lines, and the free path's first load missed on both).
#[derive(Clone, Debug)]
#[repr(align(64))]
pub(super) struct Alloc {
    pub(super) generation: u32,
    pub(super) state: State,
    pub(super) size: u64,
    pub(super) ptr: u64,
    pub(super) stream: u64,
    pub(super) movable: bool,
    pub(super) pins: u32,
    pub(super) scope: u32,
    /// The fence of a pending stream-ordered free.
    pub(super) fence: u64,
    pub(super) layout: Layout,
    /// A group: how many of its members are not yet freed. A slot prepared by a step's plan
    /// (rust/alloc/step.rs), live or freeing: the plan entry it serves.
    pub(super) members: u32,
}

impl Alloc {
    /// The size in granules (the size rounded up to `GRANULE`).
    #[inline]
    pub(super) fn units(&self) -> u64 {
        self.size.div_ceil(GRANULE)
    }

    /// The slot becomes a live allocation of `size` bytes on `stream`, unpinned: the one
    /// place a slot's request fields are written (`go_live`, `reuse`, `batch_member`).
    #[inline(always)]
    pub(super) fn make_live(&mut self, size: u64, stream: u64, movable: bool, scope: u32) {
        self.state = State::Live;
        self.size = size;
        self.stream = stream;
        self.movable = movable;
        self.pins = 0;
        self.scope = scope;
    }
}

#[derive(Clone, Default, Debug)]
pub(super) struct StreamState {
    /// Pending frees, oldest first: (fence, slot, generation).
    pub(super) pending: VecDeque<(u64, u32, u32)>,
    /// Pending frees by rounded size, for reuse on the same stream.
    pub(super) reuse: FxHashMap<u64, Vec<(u32, u32)>>,
}

/// Always-current counters (the cheap tier of the statistics).
#[derive(Clone, Debug, Default)]
pub(super) struct Counters {
    pub(super) live_bytes: u64,
    pub(super) used_bytes: u64,
    pub(super) freeing_bytes: u64,
    pub(super) reserved_bytes: u64,
    pub(super) peak_live: u64,
    pub(super) peak_used: u64,
    pub(super) peak_reserved: u64,
    pub(super) allocs: u64,
    pub(super) frees: u64,
    pub(super) failures: u64,
    pub(super) stitched: u64,
    pub(super) reused: u64,
    pub(super) cache_hits: u64,
    pub(super) calls: u64,
    pub(super) pages_taken: u64,
    pub(super) pages_released: u64,
}

/// How one request is served: arguments of `alloc_req`, not modes of the pool.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Ask {
    /// A pending free on the request's stream may serve it.
    pub(super) reuse: bool,
    /// Only from what the pool holds (`Reach::Held`): it does not grow or compact; when it
    /// would, it is refused with `Refusal::NoRoom` and nothing changed but the size cache's
    /// block given back, as any request of another size gives it (`try_alloc_quick`).
    pub(super) quick: bool,
    /// A request of `alloc_batch`: its changes stay in the journal for the batch, and it
    /// neither polls, compacts nor validates (the batch does, whole).
    pub(super) batch: bool,
}

impl Ask {
    /// `alloc`.
    pub(super) const ALLOC: Ask = Ask {
        reuse: true,
        quick: false,
        batch: false,
    };
    /// `try_alloc_quick`.
    pub(super) const QUICK: Ask = Ask {
        quick: true,
        ..Ask::ALLOC
    };
    /// One placement of memory that no pending free may serve (an arena, a plan's arena).
    pub(super) const FRESH: Ask = Ask {
        reuse: false,
        ..Ask::ALLOC
    };
    /// A request of `alloc_batch`.
    pub(super) const MEMBER: Ask = Ask {
        batch: true,
        ..Ask::FRESH
    };
}

/// What a placement may use (an argument of `place` and the paths under it).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Reach {
    /// The pages the pool holds as they are: no growing, no reclaiming whole pages from
    /// segments (the quick path; a miss changes nothing).
    Held,
    /// And pages from the device.
    Grow,
    /// And anything that holds it (on the way to out of memory: a free page start for a
    /// tail, a heap page's free block for a large request under a page).
    Any,
}

/// Why a request was not served. Eight bytes, so `alloc_inner`'s `Result` comes back in two
/// registers (a `Result` with the whole `Error` in it, 32 bytes, came back through memory and
/// was copied with loads wider than its stores: about 4 ns a request in perf); the message of
/// `NoRoom` is built on a cold path (`Pool::refusal_error`) from the request and the pool's
/// state, which a refusal leaves as it found them.
#[derive(Debug)]
pub(super) enum Refusal {
    /// No memory for it: out of memory, or (`Ask::quick`) not quick.
    NoRoom,
    /// Any other error, whole (a closed pool, a bad size, the backend refused a mapping).
    Error(Box<Error>),
}

// `alloc_inner`'s result fits two registers (see `Refusal`).
const _: () =
    assert!(std::mem::size_of::<std::result::Result<(u64, std::num::NonZeroU64), Refusal>>() == 16);

impl From<Error> for Refusal {
    #[cold]
    fn from(e: Error) -> Self {
        Refusal::Error(Box::new(e))
    }
}

impl Refusal {
    /// Whether it is out of memory (`NoRoom` of a request that was not quick, or an
    /// out-of-memory error such as an exhausted stitching window).
    pub(super) fn is_out_of_memory(&self) -> bool {
        match self {
            Refusal::NoRoom => true,
            Refusal::Error(e) => matches!(**e, Error::OutOfMemory(_)),
        }
    }
}

/// How freed memory settles (an argument of the free paths, not a mode of the pool).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Settle {
    /// As the pool's policy says: a heap block may be held in the size cache, and a
    /// pool with a release threshold gives a freed block's whole pages back at once.
    Policy,
    /// Back exactly as it was split, for an undo (`journal.rs`): nothing cached, no whole
    /// page taken out, so the journal's changes still name the blocks they made.
    Exact,
    /// Merged, but left out of the bins like the other free blocks of its heap page, which
    /// `defrag` is emptying (`evacuate_heap_pages`); once all of the page is free it goes
    /// back to the free pages.
    Unbinned,
}
