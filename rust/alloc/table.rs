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

use std::ops::{Deref, Index, IndexMut};

#[derive(Clone, Debug, Default)]
pub(crate) struct Table<T>(Vec<T>);

impl<T> Table<T> {
    pub(crate) const fn new() -> Self {
        Table(Vec::new())
    }
}

impl<T> From<Vec<T>> for Table<T> {
    fn from(v: Vec<T>) -> Self {
        Table(v)
    }
}

/// Read access is a slice's: `len`, `get`, `iter`, ... (nothing that removes an entry).
impl<T> Deref for Table<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> Table<T> {
    /// Appends an entry; its index is the old `len()`. (Entries are only ever added: no
    /// `truncate`, `clear`, `pop` or `remove`, which the unchecked `[i]` relies on.)
    #[inline(always)]
    pub(crate) fn push(&mut self, v: T) {
        self.0.push(v)
    }
}

impl<T> Table<T> {
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

impl<T> Index<usize> for Table<T> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: usize) -> &T {
        debug_assert!(i < self.0.len(), "index {i} out of {}", self.0.len());
        // SAFETY: indices into a table come from the pool's own structures, which only hold
        // indices of entries that exist (entries are never removed, only reused); `validate`
        // and the debug-asserted builds the tests run check that invariant.
        unsafe { self.0.get_unchecked(i) }
    }
}

impl<T> IndexMut<usize> for Table<T> {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut T {
        debug_assert!(i < self.0.len(), "index {i} out of {}", self.0.len());
        // SAFETY: as in `index`.
        unsafe { self.0.get_unchecked_mut(i) }
    }
}

impl<'a, T> IntoIterator for &'a Table<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut Table<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut()
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
    use super::Table;

    #[test]
    fn indexes_like_a_vec() {
        let mut t: Table<u32> = vec![1, 2, 3].into();
        t[1] = 20;
        t.push(4);
        assert_eq!((t[0], t[1], t[3]), (1, 20, 4));
        assert_eq!(t.iter().sum::<u32>(), 28);
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
