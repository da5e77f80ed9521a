//! Pointer → allocation slot, for frees by pointer. Open addressing with linear probing and
//! backward-shift deletion (no tombstones, so churn never degrades it), keys and values in
//! one array (one cache line per probe). Pointers are never 0, so 0 marks an empty bucket.
//!
//! A general hash map (hashbrown with FxHash) cost 30 ns of a 205 ns alloc + free pair on
//! the mixed churn benchmark; this one costs a third of that (benches/RESULTS.md).

#![deny(unsafe_code)]

#[derive(Clone, Debug)]
pub struct PtrMap {
    slots: Vec<(u64, u32)>,
    mask: usize,
    shift: u32,
    len: usize,
}

impl Default for PtrMap {
    fn default() -> Self {
        Self::with_buckets(64)
    }
}

impl PtrMap {
    fn with_buckets(n: usize) -> Self {
        debug_assert!(n.is_power_of_two());
        PtrMap {
            slots: vec![(0, 0); n],
            mask: n - 1,
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The home bucket of a pointer: Fibonacci hashing of the pointer without its low 8 bits
    /// (allocations are 256 B aligned), taking the top bits.
    #[inline]
    fn home(&self, key: u64) -> usize {
        ((key >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn find(&self, key: u64) -> Result<usize, usize> {
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Ok(i);
            }
            if k == 0 {
                return Err(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        self.find(key).ok().map(|i| self.slots[i].1)
    }

    /// Inserts or replaces.
    #[inline]
    pub fn insert(&mut self, key: u64, val: u32) {
        debug_assert!(key != 0);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        match self.find(key) {
            Ok(i) => self.slots[i].1 = val,
            Err(i) => {
                self.slots[i] = (key, val);
                self.len += 1;
            }
        }
    }

    #[inline]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let mut hole = self.find(key).ok()?;
        let val = self.slots[hole].1;
        // Backward shift: pull later entries of the probe run into the hole when the hole
        // lies between their home bucket and where they sit.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let k = self.slots[j].0;
            if k == 0 {
                break;
            }
            let home = self.home(k);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (0, 0);
        self.len -= 1;
        Some(val)
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        *self = Self::with_buckets(old.len() * 2);
        for (k, v) in old {
            if k != 0 {
                self.insert(k, v);
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots.iter().copied().filter(|&(k, _)| k != 0)
    }
}

impl PtrMap {
    /// The map's own invariants: a power-of-two bucket count that `mask` and `shift` match,
    /// at most half full, `len` the count of occupied buckets, and every key found from its
    /// home bucket (no empty bucket between them). Only for checks: it reads every bucket.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.slots.len();
        if !n.is_power_of_two() || self.mask != n - 1 || self.shift != 64 - n.trailing_zeros() {
            return Err(format!(
                "{n} buckets with mask {:#x} and shift {}",
                self.mask, self.shift
            ));
        }
        let held = self.iter().count();
        if held != self.len || self.len * 2 > n {
            return Err(format!(
                "{held} buckets occupied, {} counted, of {n}",
                self.len
            ));
        }
        for (i, &(k, _)) in self.slots.iter().enumerate() {
            if k != 0 && self.find(k) != Ok(i) {
                return Err(format!(
                    "key {k:#x} in bucket {i} is not found from its home"
                ));
            }
        }
        Ok(())
    }

    /// Mean number of buckets looked at to find a present key (tests and tuning).
    #[cfg(test)]
    pub fn mean_probe(&self) -> f64 {
        let mut total = 0usize;
        for (i, &(k, _)) in self.slots.iter().enumerate() {
            if k != 0 {
                total += (i.wrapping_sub(self.home(k)) & self.mask) + 1;
            }
        }
        total as f64 / self.len.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn validate_sees_a_corrupted_map() {
        let fresh = || {
            let mut m = PtrMap::default();
            for k in 1..20u64 {
                m.insert(k << 8, k as u32);
            }
            m
        };
        fresh().validate().unwrap();
        let mut m = fresh();
        m.len += 1;
        assert!(m.validate().unwrap_err().contains("counted"));
        // a key moved out of its probe run: a lookup would miss it
        let mut m = fresh();
        let i = m.slots.iter().position(|s| s.0 != 0).unwrap();
        let j = (i + 1..m.slots.len())
            .chain(0..i)
            .find(|&j| m.slots[j].0 == 0 && m.slots[(j + m.mask) & m.mask].0 == 0)
            .unwrap();
        m.slots.swap(i, j);
        assert!(m.validate().unwrap_err().contains("not found"));
        let mut m = fresh();
        m.shift += 1;
        assert!(m.validate().unwrap_err().contains("shift"));
    }

    proptest! {
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec((any::<bool>(), 1u64..300), 1..2000)) {
            let mut m = PtrMap::default();
            let mut shadow = HashMap::new();
            for (i, (insert, k)) in ops.into_iter().enumerate() {
                let key = k << 8;
                if insert {
                    m.insert(key, i as u32);
                    shadow.insert(key, i as u32);
                } else {
                    prop_assert_eq!(m.remove(key), shadow.remove(&key));
                }
                prop_assert_eq!(m.len(), shadow.len());
            }
            for (k, v) in &shadow {
                prop_assert_eq!(m.get(*k), Some(*v));
            }
            prop_assert_eq!(m.iter().count(), shadow.len());
            prop_assert!(m.mean_probe() < 4.0, "probe runs too long: {}", m.mean_probe());
        }
    }
}
