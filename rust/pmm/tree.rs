//! The chunk trees: node slots (roots first, the children of a split chunk in one run of
//! slots), handles resolved to slots, and every change of a chunk's state (`set_state`, which
//! keeps the counters and the lists in step).

use super::*;

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) addr: u64,
    pub(super) generation: u32,
    pub(super) parent: u32,
    pub(super) first_child: u32,
    /// Free-list links (valid iff `linked`).
    pub(super) prev: u32,
    pub(super) next: u32,
    /// `IsSplit` only: number of children whose state is not `Free`.
    pub(super) allocated: u32,
    pub(super) shift: u8,
    /// `IsSplit` only: log2 of the number of children.
    pub(super) children_log2: u8,
    pub(super) ctype: ChunkType,
    pub(super) state: ChunkState,
    pub(super) is_zero: bool,
    /// The slot holds a chunk (root slots always do).
    pub(super) live: bool,
    /// On a free list.
    pub(super) linked: bool,
}

impl Node {
    pub(super) fn vacant() -> Self {
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

    pub(super) fn size(&self) -> u64 {
        1u64 << self.shift
    }

    pub(super) fn num_children(&self) -> u32 {
        1 << self.children_log2
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct Root {
    pub(super) list: Option<RootList>,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Number of `TempPinned` chunks in this root's tree.
    pub(super) pinned: u32,
    pub(super) in_eviction: bool,
}

pub(super) fn order_of(shift: u32) -> usize {
    (shift - MIN_CHUNK_SHIFT) as usize
}

impl Pmm {
    // ----------------------------------------------------------------------------------
    // Handles

    /// Resolves a handle to its node slot. On failure, returns the error a lookup gives and
    /// whether the handle names a chunk that was freed and merged away (a double free, when
    /// the caller is freeing).
    pub(super) fn lookup(&self, id: ChunkId) -> std::result::Result<u32, (Error, bool)> {
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

    pub(super) fn resolve(&self, id: ChunkId) -> Result<u32> {
        self.lookup(id).map_err(|(e, _)| e)
    }

    pub(super) fn id_of(&self, i: u32) -> ChunkId {
        ChunkId {
            index: i,
            generation: self.nodes[i as usize].generation,
        }
    }

    pub(super) fn info_of(&self, i: u32) -> ChunkInfo {
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
    pub(super) fn root_of(&self, i: u32) -> u32 {
        (self.nodes[i as usize].addr >> ROOT_CHUNK_SHIFT) as u32
    }

    // ----------------------------------------------------------------------------------
    // State transitions. Every change of a live chunk's state goes through `set_state`, which
    // keeps the counters, the pinned counts and the parent's `allocated` count right.

    pub(super) fn count(&mut self, i: u32, delta: i64) {
        let n = &self.nodes[i as usize];
        if n.state == ChunkState::PmaOwned {
            return;
        }
        let c = &mut self.counts[n.ctype as usize][order_of(n.shift as u32)][n.state as usize];
        *c = c.wrapping_add_signed(delta);
    }

    pub(super) fn set_state(&mut self, i: u32, new: ChunkState) {
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

    pub(super) fn take_vacant_run(&mut self, log2: u8) -> u32 {
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
    pub(super) fn make_children(&mut self, i: u32, state: ChunkState, keep_first: bool) -> u32 {
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
    pub(super) fn drop_children(&mut self, i: u32, state: ChunkState) {
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
}
