//! A VA space: where a layout of physical pages gets its virtual address.
//!
//! Every physical page is mapped once, in order, in the backend's *direct map*: a layout whose
//! pages are consecutive is addressed there ([`Va::direct`]). Any other list of pages is
//! mapped back to back into a *window* of reserved virtual space, allocated in page ranges
//! ([`Va::map`], [`Va::unmap`]). Freed ranges of up to `cache_len` pages are kept by length
//! for reuse as they are (a list of pages of a length seen before takes one in O(1), without
//! the ranges' merging) and given back to the ranges when they run short.
//!
//! The window's free ranges are any [`Ranges`] (the pool's `Runs`), so this layer depends on
//! nothing above it (`crate::backend` only).

#![deny(unsafe_code)]

use crate::backend::Backend;
use crate::error::{Error, Result};

/// Free ranges of units over a fixed index space: what the window allocates its pages from.
pub trait Ranges {
    /// The start of a free range of `n` units, taken; None if no free range holds `n`.
    fn alloc(&mut self, n: u32) -> Option<u32>;
    /// Gives `[start, start + n)` back.
    fn free(&mut self, start: u32, n: u32);
    /// Units in the index space.
    fn capacity(&self) -> u32;
    /// Units free.
    fn free_units(&self) -> u64;
    /// The structure's own invariants.
    fn validate(&self) -> std::result::Result<(), String>;
}

/// A VA space over pages of `1 << page_shift` bytes: the direct map and a window.
#[derive(Clone)]
pub struct Va<R> {
    direct_base: u64,
    page_shift: u32,
    base: u64,
    bytes: u64,
    ranges: R,
    /// Freed window ranges by length (index), up to `cache.len() - 1` pages.
    cache: Vec<Vec<u32>>,
    /// The backend maps (host, CUDA); a simulated one does not, and its calls are skipped.
    maps: bool,
}

impl<R: Ranges> Va<R> {
    /// A VA space on `backend`: a window of `ranges.capacity()` pages reserved, every unit of
    /// `ranges` free; freed ranges of up to `cache_len` pages are kept for reuse.
    pub fn new(
        backend: &dyn Backend,
        page_shift: u32,
        ranges: R,
        cache_len: usize,
    ) -> Result<Self> {
        let bytes = (ranges.capacity() as u64) << page_shift;
        let base = backend.reserve(bytes)?;
        Ok(Va {
            direct_base: backend.direct_base(),
            page_shift,
            base,
            bytes,
            ranges,
            cache: vec![Vec::new(); cache_len + 1],
            maps: backend.maps(),
        })
    }

    /// The address of byte `off` of physical page `page` in the direct map.
    #[inline(always)]
    pub fn direct(&self, page: u32, off: u64) -> u64 {
        self.direct_base + ((page as u64) << self.page_shift) + off
    }

    /// The address of window page `w`.
    #[inline(always)]
    pub fn translate(&self, w: u32) -> u64 {
        self.base + ((w as u64) << self.page_shift)
    }

    /// Whether `addr` lies in the window.
    pub fn in_window(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.bytes
    }

    /// Window pages for `n` pages: a cached range of that length, else from the ranges, else
    /// (the ranges being short) after giving every cached range back.
    #[inline]
    fn take(&mut self, n: u32) -> Option<u32> {
        if let Some(w) = self.cache.get_mut(n as usize).and_then(|v| v.pop()) {
            return Some(w);
        }
        self.ranges.alloc(n).or_else(|| {
            self.flush();
            self.ranges.alloc(n)
        })
    }

    #[inline]
    fn give(&mut self, w: u32, n: u32) {
        match self.cache.get_mut(n as usize) {
            Some(v) => v.push(w),
            None => self.ranges.free(w, n),
        }
    }

    /// Gives every cached range back to the ranges.
    pub fn flush(&mut self) {
        for n in 0..self.cache.len() {
            for w in std::mem::take(&mut self.cache[n]) {
                self.ranges.free(w, n as u32);
            }
        }
    }

    /// Whether the backend maps (a simulated one does not: `map` then only takes window
    /// pages, and its pieces may be left empty).
    #[inline(always)]
    pub fn maps(&self) -> bool {
        self.maps
    }

    /// Maps a list of `total` pages into the window, back to back: `pieces` are its
    /// physically consecutive parts as (first page, pages), in mapping order (read only when
    /// the backend maps). Returns the first window page; on an error nothing is left mapped
    /// or taken.
    #[inline]
    pub fn map(&mut self, backend: &dyn Backend, total: u32, pieces: &[(u32, u32)]) -> Result<u32> {
        let w = self
            .take(total)
            .ok_or_else(|| Error::OutOfMemory("the pool's stitching window is exhausted".into()))?;
        if self.maps {
            let base = self.translate(w);
            let mut va = base;
            for &(p, n) in pieces {
                let len = (n as u64) << self.page_shift;
                if let Err(e) = backend.map(va, (p as u64) << self.page_shift, len) {
                    let _ = backend.unmap(base, va - base);
                    self.give(w, total);
                    return Err(e);
                }
                va += len;
            }
        }
        Ok(w)
    }

    /// Unmaps the `n` window pages from `w` and gives them back.
    #[inline]
    pub fn unmap(&mut self, backend: &dyn Backend, w: u32, n: u32) {
        if self.maps {
            let r = backend.unmap(self.translate(w), (n as u64) << self.page_shift);
            debug_assert!(r.is_ok(), "unmap failed: {r:?}");
        }
        self.give(w, n);
    }

    /// Gives the window's reservation back to the backend.
    pub fn release(&self, backend: &dyn Backend) {
        backend.unreserve(self.base, self.bytes);
    }

    /// Window pages held in the range cache (free, not in the ranges).
    pub fn cached_pages(&self) -> u64 {
        self.cache
            .iter()
            .enumerate()
            .map(|(n, v)| n as u64 * v.len() as u64)
            .sum()
    }

    /// Window pages mapped: neither free in the ranges nor cached.
    pub fn used_pages(&self) -> u64 {
        self.ranges.capacity() as u64 - self.ranges.free_units() - self.cached_pages()
    }

    /// Pages of the window.
    pub fn capacity(&self) -> u32 {
        self.ranges.capacity()
    }

    /// The ranges' invariants, and that every cached range lies in the window, apart from
    /// every other.
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.ranges.validate()?;
        let cap = self.ranges.capacity() as u64;
        let mut held: Vec<(u64, u64)> = vec![];
        for (n, v) in self.cache.iter().enumerate() {
            for &w in v {
                if w as u64 + n as u64 > cap {
                    return Err(format!(
                        "cached range {w}+{n} beyond the window's {cap} pages"
                    ));
                }
                held.push((w as u64, n as u64));
            }
        }
        held.sort_unstable();
        if let Some(x) = held.windows(2).find(|x| x[0].0 + x[0].1 > x[1].0) {
            return Err(format!("cached ranges {:?} and {:?} overlap", x[0], x[1]));
        }
        Ok(())
    }
}
