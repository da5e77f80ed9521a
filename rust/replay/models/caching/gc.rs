//! `garbage_collection_threshold` (`garbage_collect_cached_blocks` in
//! CUDACachingAllocator.cpp): when a request finds no cached block and the allocator is about
//! to ask the device for more, and what it holds has passed the threshold's share of the
//! allowed maximum, the whole free segments of the large pool go back, oldest first, until
//! the excess has gone.
//!
//! Age is counted in requests: each request of the large pool ticks a clock, and a block's
//! age is the ticks since it last became free (or since its split left it free). Each round
//! frees every whole free segment at least as old as the round's average age, and the rounds
//! go on while the excess is not reclaimed and a round freed something. A round does not stop
//! at the target: it frees every block at or above the average, so the collection does not
//! run again at once. A segment in use in part is never freed; an expandable segment's block
//! counts toward the average when it spans its segment, and is never freed.

use super::Caching;

impl Caching {
    /// The collection's threshold in bytes: the threshold's share of the allowed maximum,
    /// rounded down as PyTorch converts it. None when the option is off.
    fn gc_threshold(&self) -> Option<u64> {
        let t = self.opts.garbage_collection_threshold;
        (t > 0.0).then_some((t * self.dev.capacity as f64) as u64)
    }

    /// The large pool's whole free segments: (address, size, age, plain).
    fn gc_candidates(&self) -> Vec<(u64, u64, u64, bool)> {
        self.b
            .free_set(false)
            .iter()
            .filter_map(|&(_, size, a)| {
                let b = self.b.get(a)?;
                let seg = self.b.segments.get(&b.seg)?;
                (b.seg == a && b.size == seg.size).then(|| {
                    let age = self.large_requests.saturating_sub(b.since);
                    (a, size, age, !seg.expandable)
                })
            })
            .collect()
    }

    /// `garbage_collect_cached_blocks`: frees whole free segments of the large pool, those
    /// at or above the average age first, until reserved is back under the threshold (see
    /// the module's docs). Nothing happens at or under the threshold.
    pub(super) fn garbage_collect(&mut self) {
        let Some(threshold) = self.gc_threshold() else {
            return;
        };
        let held = self.dev.reserved;
        if held <= threshold {
            return;
        }
        let target = held - threshold;
        let mut left = self.gc_candidates();
        let mut total_age: u64 = left.iter().map(|c| c.2).fold(0, u64::saturating_add);
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && !left.is_empty() {
            let average = total_age as f64 / left.len() as f64;
            freed = false;
            let mut kept = Vec::with_capacity(left.len());
            for c @ (addr, size, age, plain) in left {
                if plain && age as f64 >= average && self.release_if_whole(addr) {
                    freed = true;
                    reclaimed = reclaimed.saturating_add(size);
                    total_age = total_age.saturating_sub(age);
                } else {
                    kept.push(c);
                }
            }
            left = kept;
        }
    }
}
