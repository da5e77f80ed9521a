//! Frees (merging up the tree while parents empty), unpin, and split and merge of
//! allocated chunks in place.

use super::*;

impl Pmm {
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

    pub(super) fn resolve_for_free(&self, id: ChunkId) -> Result<u32> {
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

    pub(super) fn free_inner(&mut self, i: u32, release: bool) {
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

    pub(super) fn check_not_evicting(&self, i: u32) -> Result<()> {
        let r = self.root_of(i);
        if self.roots[r as usize].in_eviction {
            return Err(Error::InvalidState(format!(
                "root chunk {:#x} is being evicted",
                self.nodes[r as usize].addr
            )));
        }
        Ok(())
    }
}
