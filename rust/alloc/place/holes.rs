//! A small request that would take a heap page in a pool above `SMALL_POOL`: a free block
//! inside a large segment first (docs/design.md, "Model"; docs/replay.md, "Reserve on every
//! trace").

use super::*;

impl Pool {
    /// A free block of a large segment that holds `units` and does not end its segment, for a
    /// small request that would otherwise take a page for the heap: the good fit if it does
    /// not end its segment (used from its end if it starts its segment, else from its start,
    /// as `take_large_block` does), else the best fit among `TAIL_SCAN` free page starts
    /// (used from its end, so what is left stays a free page start). A block that ends its
    /// segment is left whole: it is the head a large request uses whole, and a small
    /// allocation in it pinned pages that page-multiple requests took whole (unet_train's
    /// peak 408 → 416 MiB).
    #[cold]
    #[inline(never)]
    pub(super) fn take_hole(&mut self, units: u32, a: u32) -> Option<Layout> {
        let links = BlockLinksRef(&self.blocks);
        let fit = self.primary[LARGE]
            .find_fit(&links, units, LARGE_SCAN, self.block_len())
            .filter(|&b| self.blocks[b as usize].next != NIL);
        let b = match fit {
            Some(b) => b,
            None => self.secondary[PREFIX].find_best(
                &self.sec_links,
                units,
                TAIL_SCAN,
                self.block_len(),
            )?,
        };
        self.remove_free(b);
        let blk = self.blocks[b as usize];
        let at = if blk.prev == NIL { blk.len - units } else { 0 };
        Some(Layout::Block(self.carve(b, at, units, a)))
    }
}
