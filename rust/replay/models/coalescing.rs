//! rmm-pool and cupy: blocks in address order with free ones in a size-ordered set.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::{round_up, DeviceMem, Model};

#[derive(Copy, Clone, Debug)]
struct Blk {
    size: u64,
    /// The device allocation (first address) it belongs to: blocks merge only within one.
    chunk: u64,
    free: bool,
    stream: u64,
}

#[derive(Default)]
struct Coalescing {
    blocks: BTreeMap<u64, Blk>,
    /// (stream, size, addr) of free blocks; stream is 0 where streams are not kept apart.
    free: BTreeSet<(u64, u64, u64)>,
    by_id: FxHashMap<u32, u64>,
    /// device allocation -> its size
    chunks: FxHashMap<u64, u64>,
}

impl Coalescing {
    /// Adds a device allocation as one free block.
    fn add_chunk(&mut self, addr: u64, size: u64, stream: u64) {
        self.blocks.insert(
            addr,
            Blk {
                size,
                chunk: addr,
                free: true,
                stream,
            },
        );
        self.free.insert((stream, size, addr));
        self.chunks.insert(addr, size);
    }

    /// Best fit on `stream`: the smallest free block of at least `size`; the front is used,
    /// the rest stays free.
    fn take(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        let &(s, bsize, addr) = self.free.range((stream, size, 0)..).next()?;
        if s != stream {
            return None;
        }
        let b = self.blocks.get_mut(&addr)?;
        self.free.remove(&(s, bsize, addr));
        b.free = false;
        if bsize > size {
            b.size = size;
            let rest = Blk {
                size: bsize - size,
                chunk: b.chunk,
                free: true,
                stream,
            };
            self.blocks.insert(addr + size, rest);
            self.free.insert((stream, bsize - size, addr + size));
        }
        self.by_id.insert(id, addr);
        Some(addr)
    }

    /// Frees and merges with free neighbours of the same device allocation.
    fn give(&mut self, id: u32) {
        let Some(mut addr) = self.by_id.remove(&id) else {
            return;
        };
        let Some(mut b) = self.blocks.get(&addr).copied() else {
            return;
        };
        let next = addr + b.size;
        if let Some(n) = self.blocks.get(&next).copied() {
            if n.free && n.chunk == b.chunk {
                self.free.remove(&(n.stream, n.size, next));
                self.blocks.remove(&next);
                b.size += n.size;
            }
        }
        if let Some((&paddr, &p)) = self.blocks.range(..addr).next_back() {
            if p.free && p.chunk == b.chunk && paddr + p.size == addr {
                self.free.remove(&(p.stream, p.size, paddr));
                self.blocks.remove(&addr);
                addr = paddr;
                b.size += p.size;
            }
        }
        b.free = true;
        self.blocks.insert(addr, b);
        self.free.insert((b.stream, b.size, addr));
    }

    /// Removes device allocations that are one whole free block; returns the bytes released.
    fn release_free_chunks(&mut self) -> u64 {
        let whole: Vec<(u64, u64, u64)> = self
            .free
            .iter()
            .copied()
            .filter(|&(_, size, addr)| self.chunks.get(&addr) == Some(&size))
            .collect();
        for &(s, size, addr) in &whole {
            self.free.remove(&(s, size, addr));
            self.blocks.remove(&addr);
            self.chunks.remove(&addr);
        }
        whole.iter().map(|w| w.1).sum()
    }

    fn largest_free(&self) -> u64 {
        self.free.iter().map(|f| f.1).max().unwrap_or(0)
    }

    fn layout(&self) -> Vec<(u64, u64, bool)> {
        self.blocks
            .iter()
            .map(|(&a, b)| (a, b.size, !b.free))
            .collect()
    }

    fn free_bytes(&self) -> u64 {
        self.free.iter().map(|f| f.1).sum()
    }

    fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.by_id
            .values()
            .filter_map(|a| self.blocks.get(a).map(|b| (*a, b.size)))
            .collect()
    }

    /// Blocks tile their chunks, the free set is the free blocks, ids name used blocks, and
    /// the chunks add up to `reserved`.
    fn validate(&self, reserved: u64) -> Result<(), String> {
        let total: u64 = self.chunks.values().sum();
        if total != reserved {
            return Err(format!("chunks hold {total} B, reserved {reserved} B"));
        }
        let mut covered: FxHashMap<u64, u64> = FxHashMap::default();
        for (&a, b) in &self.blocks {
            let Some(&cs) = self.chunks.get(&b.chunk) else {
                return Err(format!("block {a:#x} of no chunk"));
            };
            if a < b.chunk || a + b.size > b.chunk + cs {
                return Err(format!("block {a:#x} outside its chunk"));
            }
            *covered.entry(b.chunk).or_insert(0) += b.size;
            if b.free != self.free.contains(&(b.stream, b.size, a)) {
                return Err(format!("block {a:#x}: free set out of step"));
            }
        }
        if covered.iter().any(|(c, &n)| self.chunks.get(c) != Some(&n))
            || covered.len() != self.chunks.len()
        {
            return Err("blocks do not tile their chunks".into());
        }
        if self.free.len() != self.blocks.values().filter(|b| b.free).count() {
            return Err("free set holds blocks that are not free".into());
        }
        for (id, a) in &self.by_id {
            if self.blocks.get(a).is_none_or(|b| b.free) {
                return Err(format!("id {id} names no used block"));
            }
        }
        Ok(())
    }
}

/// The `Model` methods of a model made of a device allocation counter `dev` and a coalescing
/// free list `c` (rmm-pool and cupy differ only in how they allocate).
macro_rules! coalescing_model {
    () => {
        fn free(&mut self, id: u32) {
            self.c.give(id);
        }
        fn reserved(&self) -> u64 {
            self.dev.reserved
        }
        fn largest_free(&self) -> u64 {
            self.c.largest_free()
        }
        fn free_bytes(&self) -> u64 {
            self.c.free_bytes()
        }
        fn layout(&self) -> Vec<(u64, u64, bool)> {
            self.c.layout()
        }
        fn live_blocks(&self) -> Vec<(u64, u64)> {
            self.c.live_blocks()
        }
        fn validate(&self) -> Result<(), String> {
            self.c.validate(self.dev.reserved)
        }
    };
}

/// RMM's `pool_memory_resource`: requests aligned to 256 B; a coalescing best fit over the
/// pool's free blocks (one list: the model treats streams as synchronized); on a miss the pool
/// grows by a device allocation of max(request, current pool size) (it doubles), or of the
/// request alone when that does not fit; it never gives memory back.
pub struct RmmPool {
    dev: DeviceMem,
    c: Coalescing,
}

impl RmmPool {
    pub fn new(capacity: u64) -> Self {
        RmmPool {
            dev: DeviceMem::new(capacity),
            c: Coalescing::default(),
        }
    }
}

impl Model for RmmPool {
    fn alloc(&mut self, id: u32, size: u64, _stream: u64) -> Option<u64> {
        self.c.give(id);
        let r = round_up(size.max(1), 256);
        if let Some(a) = self.c.take(id, r, 0) {
            return Some(a);
        }
        let grow = r.max(self.dev.reserved);
        let (addr, n) = match self.dev.take(grow) {
            Some(a) => (a, grow),
            None => (self.dev.take(r)?, r),
        };
        self.c.add_chunk(addr, n, 0);
        self.c.take(id, r, 0)
    }
    coalescing_model!();
}

/// CuPy's `MemoryPool`: requests rounded to 512 B; one arena per stream, best fit with the
/// remainder split off and merges with free neighbours on free; a miss allocates exactly the
/// rounded size from the device; when that fails, `free_all_blocks` (every wholly free device
/// allocation goes back) and one retry.
pub struct CuPy {
    dev: DeviceMem,
    c: Coalescing,
}

impl CuPy {
    pub fn new(capacity: u64) -> Self {
        CuPy {
            dev: DeviceMem::new(capacity),
            c: Coalescing::default(),
        }
    }
}

impl Model for CuPy {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        self.c.give(id);
        let r = round_up(size.max(1), 512);
        if let Some(a) = self.c.take(id, r, stream) {
            return Some(a);
        }
        if !self.dev.fits(r) {
            let n = self.c.release_free_chunks();
            self.dev.give(n);
        }
        let addr = self.dev.take(r)?;
        self.c.add_chunk(addr, r, stream);
        self.c.take(id, r, stream)
    }
    coalescing_model!();
}
