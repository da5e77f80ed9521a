//! Roots taken from and given back to the device, and allocation of chunks (one or many,
//! all or none), with the out-of-memory report.

use super::*;

impl Pmm {
    // ----------------------------------------------------------------------------------
    // Roots

    /// Takes a root for `ctype`, in the driver's order: a root still owned by the device; else
    /// (a gpumm addition) a free root cached for the other type, retyped; else, when allowed and
    /// for USER chunks, an evicted root. The root comes back `Free` and off every list.
    pub(super) fn take_root(&mut self, ctype: ChunkType, evict: bool) -> Option<u32> {
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
    pub(super) fn evict_for_allocation(&mut self) -> Option<u32> {
        let ev = self.begin_eviction_inner(false)?;
        self.evicted.extend(ev.chunks.iter().copied());
        self.end_eviction_inner(ev.root_index);
        Some(ev.root_index)
    }

    /// Gives a free root back to the device.
    pub(super) fn release_root(&mut self, r: u32) {
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

    pub(super) fn check_size(&self, size: u64, ctype: ChunkType) -> Result<u32> {
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
    pub(super) fn alloc_one(&mut self, ctype: ChunkType, shift: u32, evict: bool) -> Option<u32> {
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

    pub(super) fn claim(&mut self, i: u32) {
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
    pub(super) fn capacity_for(&self, ctype: ChunkType, shift: u32) -> u64 {
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
    pub(super) fn eviction_capacity(&self, shift: u32) -> u64 {
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

    pub(super) fn oom(&mut self, size: u64, ctype: ChunkType, count: usize) -> Error {
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
}
