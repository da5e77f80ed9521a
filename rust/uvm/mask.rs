//! Page masks of a 2 MiB VA block: one bit a 4 KiB page.

use super::*;

pub(super) type Mask = [u64; WORDS];

pub(super) fn get(m: &Mask, i: usize) -> bool {
    m[i / 64] >> (i % 64) & 1 == 1
}
pub(super) fn set(m: &mut Mask, i: usize) {
    m[i / 64] |= 1 << (i % 64);
}
pub(super) fn clear(m: &mut Mask, i: usize) {
    m[i / 64] &= !(1 << (i % 64));
}
pub(super) fn count(m: &Mask) -> u32 {
    m.iter().map(|w| w.count_ones()).sum()
}
pub(super) fn set_range(m: &mut Mask, lo: usize, hi: usize) {
    let mut i = lo;
    while i < hi {
        let w = i / 64;
        let end = ((w + 1) * 64).min(hi);
        let n = end - i;
        let bits = if n == 64 {
            !0
        } else {
            ((1u64 << n) - 1) << (i % 64)
        };
        m[w] |= bits;
        i = end;
    }
}

pub(super) fn full_mask(n: usize) -> Mask {
    let mut m = [0u64; WORDS];
    for (w, word) in m.iter_mut().enumerate() {
        let lo = w * 64;
        if n >= lo + 64 {
            *word = !0;
        } else if n > lo {
            *word = (1u64 << (n - lo)) - 1;
        }
    }
    m
}

/// Set bits in the aligned power-of-two region [lo, lo + size) (size ≤ 512).
#[inline]
pub(super) fn count_aligned(m: &Mask, lo: usize, size: usize) -> u32 {
    if size >= 64 {
        m[lo / 64..(lo + size) / 64]
            .iter()
            .map(|w| w.count_ones())
            .sum()
    } else {
        let bits = (m[lo / 64] >> (lo % 64)) & ((1u64 << size) - 1);
        bits.count_ones()
    }
}

/// Whether any bit is set in the aligned power-of-two region [lo, lo + size).
#[inline]
pub(super) fn any_aligned(m: &Mask, lo: usize, size: usize) -> bool {
    if size >= 64 {
        m[lo / 64..(lo + size).min(PAGES_PER_BLOCK) / 64]
            .iter()
            .any(|&w| w != 0)
    } else {
        (m[lo / 64] >> (lo % 64)) & ((1u64 << size) - 1) != 0
    }
}

/// Each big page (16 pages) that holds a set bit, whole, within the first `n` pages.
#[inline]
pub(super) fn grow_to_big_pages(m: &Mask, n: usize) -> Mask {
    let full = full_mask(n);
    let mut out = [0u64; WORDS];
    for w in 0..WORDS {
        let x = m[w];
        if x == 0 {
            continue;
        }
        for q in 0..4 {
            let big = 0xFFFFu64 << (16 * q);
            if x & big != 0 {
                out[w] |= big;
            }
        }
        out[w] &= full[w];
    }
    out
}

/// Set bits in pages [lo, hi).
pub(super) fn count_range(m: &Mask, lo: usize, hi: usize) -> u32 {
    (lo..hi)
        .step_by(64)
        .map(|s| {
            let e = (s + 64).min(hi);
            let w = m[s / 64];
            let bits = if e - s == 64 {
                w
            } else {
                (w >> (s % 64)) & ((1u64 << (e - s)) - 1)
            };
            bits.count_ones()
        })
        .sum()
}
