//! Runs of free units over a fixed index space: the pool's free pages (units are pages of the
//! device) and its stitching window (units are pages of virtual address space).
//!
//! Free runs are kept maximal: two free runs never touch. Boundary tags give O(1) merging:
//! `start_len` of unit `i` is the length of the free run that starts at `i` (0 if none does),
//! and `end_start` is the start of the free run that ends at `i` (NIL if none does). Runs sit
//! in [`Bins`] by length, linked through the unit at their start. The tags and links of a unit
//! share one 16-byte record, so touching a run touches one cache line at each end.

#![deny(unsafe_code)]

use smallvec::SmallVec;

use super::bins::{bin_of, Bins, Link, LinkRead, LinkWrite, NIL};
use super::table::Table;

/// Runs taken by `alloc_scattered`, as (start, len), in the order taken.
pub type Taken = SmallVec<[(u32, u32); 4]>;

#[derive(Copy, Clone, Debug)]
#[repr(align(16))]
struct Unit {
    start_len: u32,
    end_start: u32,
    link: Link,
}

struct Units<'a>(&'a mut Table<Unit>);
struct UnitsRef<'a>(&'a Table<Unit>);

impl LinkRead for Units<'_> {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self.0[i as usize].link
    }
}

impl LinkWrite for Units<'_> {
    #[inline]
    fn link_mut(&mut self, i: u32) -> &mut Link {
        &mut self.0[i as usize].link
    }
}

impl LinkRead for UnitsRef<'_> {
    #[inline]
    fn link(&self, i: u32) -> Link {
        self.0[i as usize].link
    }
}

#[derive(Clone, Debug)]
pub struct Runs {
    units: Table<Unit>,
    /// (branches, not selects: a run's neighbours follow the pages, which repeat)
    bins: Bins<false>,
    free_units: u64,
}

impl Runs {
    /// An index space of `units` units, none of them free.
    pub fn new(units: u32) -> Self {
        Runs {
            units: vec![
                Unit {
                    start_len: 0,
                    end_start: NIL,
                    link: Link::UNLINKED,
                };
                units as usize
            ]
            .into(),
            bins: Bins::default(),
            free_units: 0,
        }
    }

    pub fn capacity(&self) -> u32 {
        self.units.len() as u32
    }

    pub fn free_units(&self) -> u64 {
        self.free_units
    }

    #[inline]
    fn len_at(&self, start: u32) -> u32 {
        self.units[start as usize].start_len
    }

    #[inline]
    fn link(&mut self, start: u32, len: u32) {
        self.units[start as usize].start_len = len;
        self.units[(start + len - 1) as usize].end_start = start;
        self.bins
            .push(&mut Units(&mut self.units), start, bin_of(len));
    }

    #[inline]
    fn unlink(&mut self, start: u32) -> u32 {
        let len = self.len_at(start);
        self.bins
            .remove(&mut Units(&mut self.units), start, bin_of(len));
        self.units[start as usize].start_len = 0;
        self.units[(start + len - 1) as usize].end_start = NIL;
        len
    }

    /// Frees `[start, start + len)`, merging with the free runs on either side. The caller
    /// guarantees the range is in bounds and not free (checked in debug builds).
    pub fn free(&mut self, start: u32, len: u32) {
        debug_assert!(len > 0 && start as u64 + len as u64 <= self.capacity() as u64);
        let (mut s, mut l) = (start, len);
        if s > 0 {
            let left = self.units[(s - 1) as usize].end_start;
            if left != NIL {
                let ll = self.unlink(left);
                s = left;
                l += ll;
            }
        }
        let right = start + len;
        if right < self.capacity() && self.len_at(right) != 0 {
            l += self.unlink(right);
        }
        self.link(s, l);
        self.free_units += len as u64;
    }

    /// Takes `n` contiguous units, good fit; `None` if no run holds `n`.
    #[inline]
    pub fn alloc(&mut self, n: u32) -> Option<u32> {
        let start = self
            .bins
            .find_fit(&UnitsRef(&self.units), n, 4, |i| self.len_at(i))?;
        self.take_front(start, n);
        Some(start)
    }

    /// Takes `n` units from the front of the free run starting at `start` (which holds `n`).
    fn take_front(&mut self, start: u32, n: u32) {
        let len = self.unlink(start);
        debug_assert!(len >= n);
        if len > n {
            self.link(start + n, len - n);
        }
        self.free_units -= n as u64;
    }

    /// The length of the free run starting at `start` (0 if none starts there).
    #[inline]
    pub fn run_at(&self, start: u32) -> u32 {
        if start < self.capacity() {
            self.len_at(start)
        } else {
            0
        }
    }

    /// Takes `n` units starting exactly at `start` if a free run starts there and holds them.
    pub fn alloc_at(&mut self, start: u32, n: u32) -> bool {
        if start < self.capacity() && self.len_at(start) >= n {
            self.take_front(start, n);
            true
        } else {
            false
        }
    }

    /// Takes `n` units in as few runs as the free runs allow (one if a run holds `n`, else
    /// the largest runs first), or nothing if fewer than `n` are free.
    /// (Pushed one by one onto a concrete `SmallVec`: `Extend` with one-element arrays cost
    /// about 45 instructions a run.)
    pub fn alloc_scattered(&mut self, n: u32, out: &mut Taken) -> bool {
        if (n as u64) > self.free_units {
            return false;
        }
        if let Some(s) = self.alloc(n) {
            out.push((s, n));
            return true;
        }
        let mut left = n;
        while left > 0 {
            let b = self
                .bins
                .last_at_or_below(super::bins::NUM_BINS - 1)
                .expect("free_units counts the runs");
            let start = self.bins.head(b);
            let take = self.len_at(start).min(left);
            self.take_front(start, take);
            out.push((start, take));
            left -= take;
        }
        true
    }

    /// Every free run as (start, len), lowest start first.
    pub fn runs(&self) -> Vec<(u32, u32)> {
        let units = UnitsRef(&self.units);
        let mut v: Vec<(u32, u32)> = (0..super::bins::NUM_BINS)
            .flat_map(|b| self.bins.iter(&units, b))
            .map(|s| (s, self.len_at(s)))
            .collect();
        v.sort_unstable();
        v
    }

    /// Takes `[start, start + n)`, which must lie inside one free run (to undo a `free`):
    /// O(distance to that run's start). Nothing when `n` is 0.
    pub fn take_range(&mut self, start: u32, n: u32) {
        if n == 0 {
            return;
        }
        let mut s = start;
        while self.len_at(s) == 0 {
            debug_assert!(s > 0, "units {start}..+{n} are not free");
            s -= 1;
        }
        let len = self.unlink(s);
        debug_assert!(
            s + len >= start + n,
            "units {start}..+{n} are not in one free run"
        );
        if start > s {
            self.link(s, start - s);
        }
        if s + len > start + n {
            self.link(start + n, s + len - start - n);
        }
        self.free_units -= n as u64;
    }

    /// Takes the whole free run starting at `start`.
    pub fn take_run(&mut self, start: u32) -> u32 {
        let n = self.unlink(start);
        self.free_units -= n as u64;
        n
    }

    /// Checks every invariant; returns a description of the first broken one.
    pub fn validate(&self) -> Result<(), String> {
        let runs = self.runs();
        if runs.len() != self.bins.len() {
            return Err(format!(
                "{} runs listed, {} binned",
                runs.len(),
                self.bins.len()
            ));
        }
        let mut total = 0u64;
        let mut prev_end: Option<u32> = None;
        for &(s, l) in &runs {
            if l == 0 || s as u64 + l as u64 > self.capacity() as u64 {
                return Err(format!("run {s}+{l} out of bounds"));
            }
            if prev_end == Some(s) {
                return Err(format!("free runs touch at {s} (not merged)"));
            }
            if prev_end.is_some_and(|e| e > s) {
                return Err(format!("free runs overlap at {s}"));
            }
            if self.units[(s + l - 1) as usize].end_start != s {
                return Err(format!("end tag of run {s}+{l} is wrong"));
            }
            prev_end = Some(s + l);
            total += l as u64;
        }
        let starts = self.units.iter().filter(|u| u.start_len != 0).count();
        let ends = self.units.iter().filter(|u| u.end_start != NIL).count();
        if starts != runs.len() || ends != runs.len() {
            return Err(format!(
                "{starts} start tags and {ends} end tags for {} runs",
                runs.len()
            ));
        }
        if total != self.free_units {
            return Err(format!(
                "free_units {} but runs hold {total}",
                self.free_units
            ));
        }
        for b in 0..super::bins::NUM_BINS {
            for s in self.bins.iter(&UnitsRef(&self.units), b) {
                if bin_of(self.len_at(s)) != b {
                    return Err(format!("run at {s} in the wrong bin"));
                }
            }
        }
        Ok(())
    }
}

impl crate::va::Ranges for Runs {
    #[inline(always)]
    fn alloc(&mut self, n: u32) -> Option<u32> {
        Runs::alloc(self, n)
    }
    #[inline(always)]
    fn free(&mut self, start: u32, n: u32) {
        Runs::free(self, start, n)
    }
    fn capacity(&self) -> u32 {
        Runs::capacity(self)
    }
    fn free_units(&self) -> u64 {
        Runs::free_units(self)
    }
    fn validate(&self) -> Result<(), String> {
        Runs::validate(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_split() {
        let mut r = Runs::new(100);
        r.free(10, 5);
        r.free(20, 5);
        r.free(15, 5); // bridges the two
        r.validate().unwrap();
        assert_eq!(r.runs(), vec![(10, 15)]);
        assert_eq!(r.alloc(4), Some(10));
        assert_eq!(r.runs(), vec![(14, 11)]);
        assert!(!r.alloc_at(13, 1));
        assert!(r.alloc_at(14, 2));
        r.free(0, 3);
        let mut out = Taken::new();
        assert!(!r.alloc_scattered(13, &mut out));
        assert!(r.alloc_scattered(12, &mut out));
        assert_eq!(out.as_slice(), &[(16, 9), (0, 3)]);
        assert_eq!(r.free_units(), 0);
        r.validate().unwrap();
    }

    #[test]
    fn take_range_undoes_a_free() {
        let mut r = Runs::new(100);
        r.free(10, 30);
        r.take_range(20, 5); // from the middle
        assert_eq!(r.runs(), vec![(10, 10), (25, 15)]);
        r.take_range(10, 10); // a whole run
        r.take_range(35, 5); // its end
        assert_eq!((r.runs(), r.free_units()), (vec![(25, 10)], 10));
        r.validate().unwrap();
    }
}
