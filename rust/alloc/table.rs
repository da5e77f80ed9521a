//! `Table<T>`: a `Vec<T>` whose `[i]` skips the bounds check in release builds.
//!
//! The pool's metadata (blocks, allocation slots, pages, links, page runs) lives in index
//! arenas whose indices only ever come from the pool's own structures: a handle a caller
//! passes in is looked up with `get` (checked) before any of its indices are used. Bounds checks on those
//! internal indices were about 100 of the 822 instructions of a mixed alloc + free pair
//! (cachegrind: 822 → 719 without them); debug builds, and so the tests and the property
//! test run with debug assertions, still check every index.
//!
//! What a table exposes is what that argument allows: reads as a slice, writes to an entry,
//! and `push`; nothing that removes an entry or shortens the table (no `DerefMut` to the
//! vector: no `truncate`, `clear`, `pop`, `remove`). `validate` checks the premise from the
//! other side: the indices the other structures hold into it name entries.

#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::{Deref, Index, IndexMut};

/// How a table stores an entry: as itself, or in a wider-aligned cell of the same size
/// (`Aligned32`), so that the table's buffer starts on that alignment while the entry type
/// keeps its own. (A 32-aligned block type made every hot function that held a copy of a
/// block realign its stack frame: 13 instructions a churn pair, callgrind.)
///
/// # Safety
/// A cell holds its `T` at offset 0 and has `T`'s size (checked where a table is read:
/// `Table::CELLS`), so that a run of cells is a `[T]`.
pub(crate) unsafe trait Cell<T> {
    fn new(v: T) -> Self;
}

// SAFETY: an entry is its own cell.
unsafe impl<T> Cell<T> for T {
    #[inline(always)]
    fn new(v: T) -> T {
        v
    }
}

/// A cell aligned to 32 bytes: with a 32-byte entry, two share a cache line and none
/// straddles one.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub(crate) struct Aligned32<T>(T);

// SAFETY: `repr(C)` puts the entry at offset 0; the size is the entry's where that is a
// multiple of 32 (`Table::CELLS` checks).
unsafe impl<T> Cell<T> for Aligned32<T> {
    #[inline(always)]
    fn new(v: T) -> Self {
        Aligned32(v)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Table<T, C: Cell<T> = T>(Vec<C>, PhantomData<T>);

impl<T, C: Cell<T>> Default for Table<T, C> {
    fn default() -> Self {
        Table::new()
    }
}

impl<T, C: Cell<T>> Table<T, C> {
    /// The cells are a `[T]` (see `Cell`): a compile-time check on each table type used.
    const CELLS: () = assert!(
        std::mem::size_of::<C>() == std::mem::size_of::<T>()
            && std::mem::align_of::<C>() >= std::mem::align_of::<T>()
    );

    pub(crate) const fn new() -> Self {
        Table(Vec::new(), PhantomData)
    }

    /// The entries as a mutable slice.
    #[inline(always)]
    fn entries_mut(&mut self) -> &mut [T] {
        let () = Self::CELLS;
        // SAFETY: the cells are a `[T]` (`Cell`'s contract, `CELLS`), borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<T>(), self.0.len()) }
    }
}

impl<T> From<Vec<T>> for Table<T> {
    fn from(v: Vec<T>) -> Self {
        Table(v, PhantomData)
    }
}

/// Read access is a slice's: `len`, `get`, `iter`, ... (nothing that removes an entry).
impl<T, C: Cell<T>> Deref for Table<T, C> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        let () = Self::CELLS;
        // SAFETY: the cells are a `[T]` (`Cell`'s contract, `CELLS`).
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<T>(), self.0.len()) }
    }
}

impl<T, C: Cell<T>> Table<T, C> {
    /// Appends an entry; its index is the old `len()`. (Entries are only ever added: no
    /// `truncate`, `clear`, `pop` or `remove`, which the unchecked `[i]` relies on.)
    #[inline(always)]
    pub(crate) fn push(&mut self, v: T) {
        self.0.push(C::new(v))
    }
}

impl<T, C: Cell<T>> Table<T, C> {
    /// Checks that every index in `held` (the indices other structures hold into this
    /// table: the premise of `[i]`'s SAFETY argument) names an entry; returns the first that
    /// does not. (Unchecked reads of a table are sound only once this holds, so the pool's
    /// `validate` runs it before it walks the structures.)
    pub(crate) fn validate(&self, held: impl IntoIterator<Item = u32>) -> Result<(), String> {
        let n = self.0.len();
        match held.into_iter().find(|&i| i as usize >= n) {
            Some(i) => Err(format!("index {i} is held into a table of {n} entries")),
            None => Ok(()),
        }
    }
}

impl<T, C: Cell<T>> Index<usize> for Table<T, C> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: usize) -> &T {
        debug_assert!(i < self.0.len(), "index {i} out of {}", self.0.len());
        // SAFETY: indices into a table come from the pool's own structures, which only hold
        // indices of entries that exist (entries are never removed, only reused); `validate`
        // and the debug-asserted builds the tests run check that invariant.
        unsafe { self.deref().get_unchecked(i) }
    }
}

impl<T, C: Cell<T>> IndexMut<usize> for Table<T, C> {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut T {
        debug_assert!(i < self.0.len(), "index {i} out of {}", self.0.len());
        // SAFETY: as in `index`.
        unsafe { self.entries_mut().get_unchecked_mut(i) }
    }
}

impl<'a, T, C: Cell<T>> IntoIterator for &'a Table<T, C> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.deref().iter()
    }
}

impl<'a, T, C: Cell<T>> IntoIterator for &'a mut Table<T, C> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries_mut().iter_mut()
    }
}

impl super::bins::LinkRead for Table<super::bins::Link> {
    #[inline(always)]
    fn link(&self, i: u32) -> super::bins::Link {
        self[i as usize]
    }
}

impl super::bins::LinkWrite for Table<super::bins::Link> {
    #[inline(always)]
    fn link_mut(&mut self, i: u32) -> &mut super::bins::Link {
        &mut self[i as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::{Aligned32, Table};

    #[test]
    fn indexes_like_a_vec() {
        let mut t: Table<u32> = vec![1, 2, 3].into();
        t[1] = 20;
        t.push(4);
        assert_eq!((t[0], t[1], t[3]), (1, 20, 4));
        assert_eq!(t.iter().sum::<u32>(), 28);
    }

    #[test]
    fn entries_in_32_aligned_cells_read_and_write_as_a_slice_that_starts_aligned() {
        // (the cell's alignment is what guarantees the buffer's: an allocator may hand out a
        // 32-aligned buffer by chance, so the pointer checks below alone could pass without it)
        assert_eq!(std::mem::align_of::<Aligned32<[u32; 8]>>(), 32);
        let mut t: Table<[u32; 8], Aligned32<[u32; 8]>> = Table::new();
        for i in 0..100u32 {
            t.push([i; 8]);
            assert_eq!(t.as_ptr() as usize % 32, 0, "the buffer starts 32-aligned");
        }
        t[7][3] = 700;
        assert_eq!((t.len(), t[7][3], t[7][2], t[99][0]), (100, 700, 7, 99));
        for e in &mut t {
            e[0] += 1;
        }
        let firsts: Vec<u32> = t.iter().map(|e| e[0]).take(3).collect();
        assert_eq!(firsts, vec![1, 2, 3]);
        let c = t.clone();
        assert_eq!(c[50], t[50]);
        assert_eq!(t.validate([99]), Ok(()));
        assert!(t.validate([100]).is_err());
    }

    #[test]
    fn validate_names_an_index_held_past_the_end() {
        let mut t: Table<u32> = vec![7; 3].into();
        assert_eq!(t.validate([0, 2, 1]), Ok(()));
        let e = t.validate([0, 3]).unwrap_err();
        assert!(e.contains("index 3") && e.contains("3 entries"), "{e}");
        t.push(8);
        assert_eq!(t.validate([3]), Ok(()));
    }

    /// Debug builds (the tests, the property test) check every index.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "out of")]
    fn an_index_out_of_range_is_caught_in_debug_builds() {
        let t: Table<u32> = vec![1].into();
        let _ = t[1];
    }
}
