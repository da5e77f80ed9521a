//! LRU marks and eviction: picking a root, evicting it in one step or in two
//! (`begin_eviction`, the caller moves the data, `end_eviction`).

use super::*;

impl Pmm {
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
    pub(super) fn pick_root_to_evict(&self, free_first: bool) -> Option<u32> {
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

    pub(super) fn begin_eviction_inner(&mut self, free_first: bool) -> Option<Eviction> {
        let r = self.pick_root_to_evict(free_first)?;
        self.root_list_remove(r);
        self.roots[r as usize].in_eviction = true;
        self.in_eviction += 1;
        let mut chunks = Vec::new();
        for i in self.leaves(r) {
            match self.nodes[i as usize].state {
                s if s.is_allocated() => chunks.push(self.info_of(i)),
                ChunkState::Free => self.unlink(i),
                _ => {}
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

    pub(super) fn end_eviction_inner(&mut self, r: u32) {
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
}
