//! The driver's heuristics: thrashing detection (uvm_perf_thrashing.c) and the prefetch
//! bitmap tree (uvm_perf_prefetch.c).

use super::*;

impl Uvm {
    // ------------------------------------------------------------------------------------
    // Thrashing (uvm_perf_thrashing.c)

    /// Pages of block `b` are about to move `to` a processor: counts ping-pong (a change of
    /// direction within the lapse), throttles a thrashing block, pins it after
    /// `pin_threshold` throttles. True when the block is pinned: nothing moves, the access is
    /// served in place over the link.
    pub(super) fn note_migration(
        &mut self,
        b: u32,
        to: Processor,
        pages: u64,
        st: &mut Stats,
    ) -> bool {
        if !self.cfg.thrashing {
            return false;
        }
        let now = self.clock;
        let cfg = &self.cfg;
        let t = &mut self.blocks[b as usize].thrash;
        if t.pinned_until > now {
            return true;
        }
        let dir = if to == Processor::Gpu { 1 } else { 2 };
        if t.last_to != 0 && t.last_to != dir {
            if now - t.last_ns <= cfg.lapse_ns {
                t.burst += 1;
            } else {
                t.burst = 1;
            }
        }
        t.last_to = dir;
        t.last_ns = now;
        if t.burst < cfg.thrashing_threshold {
            return false;
        }
        if !t.counted {
            t.counted = true;
            st.thrashing_pages += pages;
        }
        t.throttles += 1;
        if t.throttles >= cfg.pin_threshold {
            t.pinned_until = now + cfg.lapse_ns * cfg.pin_lapses as f64;
            t.throttles = 0;
            t.burst = 0;
            st.pins += 1;
            return true;
        }
        st.throttles += 1;
        st.time_ns += cfg.costs.throttle_ns;
        self.clock += cfg.costs.throttle_ns;
        false
    }

    pub(super) fn pinned(&self, b: u32) -> bool {
        self.blocks[b as usize].thrash.pinned_until > self.clock
    }

    // ------------------------------------------------------------------------------------
    // Prefetch (uvm_perf_prefetch.c): the bitmap tree

    /// Pages to migrate with the faulted ones: every aligned subtree of the block (big page
    /// up to the whole block) that holds a faulted page and in which more than `threshold` %
    /// of the pages are resident on the GPU or faulted now.
    pub(super) fn prefetch_mask(&self, populated: &Mask, faulted: &Mask, n: usize) -> Mask {
        let mut out = [0u64; WORDS];
        let th = self.cfg.prefetch_threshold;
        let mut size = BIG;
        while size <= PAGES_PER_BLOCK {
            let mut lo = 0;
            while lo < n {
                let hi = (lo + size).min(n);
                // only subtrees holding a fault are counted (a test, then a count)
                if any_aligned(faulted, lo, size) {
                    let pop = if hi - lo == size {
                        count_aligned(populated, lo, size)
                    } else {
                        count_range(populated, lo, hi)
                    };
                    if pop * 100 > th * (hi - lo) as u32 {
                        set_range(&mut out, lo, hi);
                    }
                }
                lo += size;
            }
            size *= 2;
        }
        out
    }
}
