//! The one undo: the journal of what placing a request (or a batch) changed, undone newest
//! first when it fails.
//!
//! A request that fails, or whose mapping the backend refuses, and a batch that fails, leave
//! the pool as it was (one failure counted). What they change that the failure does not give
//! back by itself goes into the journal as a [`Change`] while they place: whole free pages
//! given back from a segment (`Split`), free pages appended to a segment (`Extend`), pages
//! taken from the device (`Grow`: undone, the page goes back and the page counters are as
//! before it), each request of a batch (`Made`: undone, it is freed exactly as it was split)
//! and the counters when a batch began (`Begin`: undone, they are back but for the failure).
//! A failure gives back its own placement exactly (`abandon`: merged as it was split, nothing
//! cached, no whole page released) and then undoes the journal to the mark taken before it
//! placed (`undo_to`): one mechanism for a request and for a batch, which is the requests'
//! journals back to back. A request that succeeds alone clears the journal; one of a batch
//! leaves it for the batch, and so does a batch until it has succeeded.

use super::*;

impl Pool {
    /// Undoes the changes of the journal after its first `mark`, newest first. The memory
    /// the changes concern must be free again (the failed request given back: `abandon`).
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
                        self.page_to(orig.page, Self::segment_kind(&orig), b);
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
                Change::Grow { p, peak } => {
                    self.free_pages.take_range(p, 1);
                    self.give_back(&[p]);
                    // not a page taken and released: the page counters as before the grow
                    let c = &mut self.counters;
                    c.pages_released -= 1;
                    c.pages_taken -= 1;
                    c.peak_reserved = peak;
                }
                Change::Made { a } => {
                    // what `free` does, but merged exactly as it was split (and without
                    // `after_free`: no threshold release, and no cache flush at zero use,
                    // which cannot come: the batch began with the cache given back, and what
                    // a poll cached since leaves memory in use that the undo does not free)
                    let x = &self.allocs[a as usize];
                    self.counters.live_bytes -= x.size;
                    self.counters.frees += 1;
                    self.unindex(x.ptr);
                    self.release_slot_into(a, None, Settle::Exact);
                }
                Change::Retype { p } => self.retype(p, true),
                Change::HeapOpen { prev } => self.last_heap_open = prev,
                Change::Begin { counters } => {
                    let (failures, calls) = (self.counters.failures, self.counters.calls);
                    self.counters = *counters;
                    (self.counters.failures, self.counters.calls) = (failures, calls);
                }
            }
        }
    }

    /// Gives back a placement for slot `a` that will not be kept (merged exactly as it was
    /// split: nothing cached, no whole page released), the slot vacant again, and undoes the
    /// journal after `mark`.
    pub(super) fn abandon(&mut self, layout: Option<Layout>, a: u32, mark: usize) {
        if let Some(layout) = layout {
            self.unplace(layout, Settle::Exact);
        }
        self.vacant_allocs.push(a);
        self.undo_to(mark);
    }
}
