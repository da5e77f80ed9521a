//! Lookups by pointer: the pointer index, built on first use, and moving batch records into it.

use super::*;

impl Pool {
    /// Frees the allocation at `ptr` now. A pointer inside an allocation or outside every one
    /// is refused.
    pub fn free_ptr(&mut self, ptr: u64) -> Result<()> {
        let a = self.slot_of_ptr(ptr)?;
        self.free(self.id(a))
    }

    /// The handle of the live allocation at `ptr` (interior and foreign pointers refused).
    pub fn id_of(&mut self, ptr: u64) -> Result<AllocId> {
        self.slot_of_ptr(ptr).map(|a| self.id(a))
    }

    /// The pointer index, built now if this is the first lookup by pointer.
    /// (Served allocations stay out of it: `step_slot_at` finds them.)
    pub(super) fn ptr_index(&mut self) -> &PtrMap {
        if self.by_ptr.is_none() {
            let mut m = PtrMap::default();
            for (a, x) in self.allocs.iter().enumerate() {
                if matches!(x.state, State::Live | State::Freeing) && !self.step_prepared(a as u32)
                {
                    m.insert(x.ptr, a as u32);
                }
            }
            self.by_ptr = Some(m);
        }
        self.by_ptr.as_ref().expect("built")
    }

    pub(super) fn slot_of_ptr(&mut self, ptr: u64) -> Result<u32> {
        self.open()?;
        self.ptr_lookup();
        self.slot_of_indexed_ptr(ptr)
    }

    /// `slot_of_ptr` once the pool is known open and the pointer index built.
    #[inline]
    pub(super) fn slot_of_indexed_ptr(&self, ptr: u64) -> Result<u32> {
        let index = self.by_ptr.as_ref().expect("the pointer index is built");
        if let Some(a) = index.get(ptr).or_else(|| self.step_slot_at(ptr)) {
            return match self.allocs[a as usize].state {
                State::Freeing => Err(Error::InvalidFree(format!(
                    "{ptr:#x} was already freed on stream {}",
                    self.allocs[a as usize].stream
                ))),
                _ => Ok(a),
            };
        }
        let inside = self.allocs.iter().find(|x| {
            matches!(x.state, State::Live | State::Freeing)
                && ptr > x.ptr
                && ptr < x.ptr + x.units() * GRANULE
        });
        Err(match inside {
            Some(x) => Error::InvalidFree(format!(
                "{ptr:#x} points inside the allocation at {:#x} (interior pointer)",
                x.ptr
            )),
            None => Error::InvalidFree(format!(
                "{ptr:#x} is not an allocation of this pool (foreign pointer or double free)"
            )),
        })
    }

    /// Whether the entry of a batch record names a live or freeing allocation (always, by the
    /// invariant: checked by `validate`).
    #[inline]
    pub(super) fn batch_entry_valid(&self, (ptr, a): (u64, u32)) -> bool {
        let x = &self.allocs[a as usize];
        x.ptr == ptr && matches!(x.state, State::Live | State::Freeing)
    }

    /// The pointer index with every pending batch member in it: for a lookup by pointer.
    /// The blocks of uncut records are cut first (each member then has a block of its own).
    pub(super) fn ptr_lookup(&mut self) {
        self.ptr_index();
        let records = std::mem::take(&mut self.batches);
        for rec in &records {
            if let Record::Uncut(b) = rec.shape {
                self.cut_uncut(b, &rec.members);
            }
        }
        let index = self.by_ptr.as_mut().expect("built");
        for (p, a) in records.into_iter().flat_map(|r| r.members) {
            index.insert(p, a);
        }
    }

    /// The allocation at `ptr` leaves the pointer index (it is being freed or moved). One that
    /// was not in it is served from a plan (never in it), or a batch member waiting in its
    /// record: the records go into the index first (so that no record ever names memory that went back by another path).
    #[inline]
    pub(super) fn unindex(&mut self, ptr: u64) {
        if let Some(m) = &mut self.by_ptr {
            if m.remove(ptr).is_none() && !self.batches.is_empty() {
                self.unindex_unlisted(ptr);
            }
        }
    }

    /// `unindex` of a pointer the index did not hold, with batch records pending.
    #[cold]
    #[inline(never)]
    fn unindex_unlisted(&mut self, ptr: u64) {
        if self.step_slot_at(ptr).is_none() {
            self.ptr_lookup();
            self.by_ptr.as_mut().expect("built").remove(ptr);
        }
    }
}
