//! Undoing a failed request: the journal of page changes, and the counters saved before it.

use super::*;

impl Pool {
    /// Undoes the changes of the journal after its first `mark`, newest first. The memory
    /// the changes concern must be free again (the failed request or batch given back).
    pub(super) fn undo_to(&mut self, mark: usize) {
        while self.journal.len() > mark {
            match self.journal.pop().expect("not empty") {
                Change::Split {
                    b,
                    orig,
                    right,
                    p0,
                    p1,
                } => {
                    self.free_pages.take_range(p0, p1 - p0);
                    let pg = self.pg as u64;
                    let g0 = self.start_of(&orig);
                    let has_left = g0 < p0 as u64 * pg;
                    if has_left {
                        self.remove_free(b);
                    }
                    if right != NIL {
                        self.remove_free(right);
                        if right != b {
                            self.drop_block(right);
                        }
                    }
                    if !has_left && right == NIL {
                        // `b` was dropped: take its slot back
                        let i = self
                            .vacant_blocks
                            .iter()
                            .rposition(|&x| x == b)
                            .expect("the split block's slot is vacant");
                        self.vacant_blocks.swap_remove(i);
                    }
                    self.blocks[b as usize] = Block {
                        links: Link::UNLINKED,
                        ..orig
                    };
                    for q in p0..p1 {
                        self.page_to(q, PageKind::Covered, NIL);
                    }
                    if orig.prev != NIL {
                        self.blocks[orig.prev as usize].next = b;
                    } else {
                        self.page_to(orig.page, PageKind::Large, b);
                    }
                    self.link_to(orig.next, b);
                    if right != NIL || orig.next != NIL {
                        // p1 is inside the segment again
                        self.page_to(p1, PageKind::Covered, NIL);
                    }
                    self.insert_free(b);
                }
                Change::Extend { b, p, n } => {
                    debug_assert!(self.blocks[b as usize].free);
                    self.remove_free(b);
                    self.blocks[b as usize].len -= n << self.gshift;
                    self.pages_free(p, n);
                    self.insert_free(b);
                }
                Change::Grow { p } => {
                    self.free_pages.take_range(p, 1);
                    self.give_back(&[p]);
                }
            }
        }
    }

    /// The counters placing a request may change (pages taken); a refused request puts them
    /// back (not a clone of every counter: this is the hot path).
    #[inline]
    pub(super) fn page_counts(&self) -> [u64; 4] {
        let c = &self.counters;
        [
            c.reserved_bytes,
            c.peak_reserved,
            c.pages_taken,
            c.pages_released,
        ]
    }

    #[inline]
    pub(super) fn restore_page_counts(&mut self, saved: [u64; 4]) {
        let c = &mut self.counters;
        [
            c.reserved_bytes,
            c.peak_reserved,
            c.pages_taken,
            c.pages_released,
        ] = saved;
    }

    /// Undoes a placement for slot `a` that will not be kept: its memory goes back (merged
    /// exactly as it was split: no eager page release in between), the slot is vacant again,
    /// the page changes after `mark` are undone and the page counters are as `saved`.
    pub(super) fn abandon(&mut self, layout: Option<Layout>, a: u32, mark: usize, saved: [u64; 4]) {
        if let Some(layout) = layout {
            let eager = std::mem::replace(&mut self.eager, false);
            self.unplace(layout);
            self.eager = eager;
        }
        self.vacant_allocs.push(a);
        self.undo_to(mark);
        self.restore_page_counts(saved);
    }

    /// A refused request: its error waits in `alloc_error` for `alloc_req`.
    #[cold]
    pub(super) fn refuse(&mut self, e: Error) -> (u64, u64) {
        self.alloc_error = Some(e);
        (0, 0)
    }

    /// After a refused request (its pages given back by `undo_to`): counters as `saved` but
    /// for one more failure.
    pub(super) fn rollback(&mut self, saved: Counters) {
        let failures = self.counters.failures;
        let calls = self.counters.calls;
        self.counters = saved;
        self.counters.failures = failures + 1;
        self.counters.calls = calls;
    }
}
