//! gpumm: the pool of rust/alloc.

use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::{Model, KIB, MIB};
use crate::alloc::{AllocId, Device, Pool, PoolConfig, Request};
use crate::backend::Simulated;
use crate::error::Result;
use crate::pmm::{Pmm, PmmConfig, SizeMask, MAX_VIDMEM};

/// gpumm's pool (rust/alloc) on a simulated device of the capacity (in whole 2 MiB pages, at
/// most the PMM's largest vidmem), 2 MiB pages, defaults. Below one page it holds nothing.
pub struct Gpumm {
    pool: Option<Pool>,
    /// id -> (handle, address, requested size)
    ids: FxHashMap<u32, (AllocId, u64, u64)>,
}

impl Gpumm {
    pub fn new(capacity: u64) -> Result<Self> {
        let vidmem = (capacity.min(MAX_VIDMEM) / (2 * MIB)) * 2 * MIB;
        if vidmem == 0 {
            return Ok(Gpumm {
                pool: None,
                ids: FxHashMap::default(),
            });
        }
        let mut cfg = PmmConfig::new(
            vidmem,
            SizeMask::from_sizes(&[4 * KIB, 64 * KIB, 2 * MIB])?,
            SizeMask::from_sizes(&[256, 4 * KIB, 64 * KIB, 2 * MIB])?,
        );
        cfg.check = false;
        let dev = Arc::new(Device {
            pmm: Arc::new(Mutex::new(Pmm::new(cfg)?)),
            backend: Arc::new(Simulated::new(vidmem, 2 * MIB)?),
        });
        Ok(Gpumm {
            pool: Some(Pool::new(dev, PoolConfig::new(2 * MIB))?),
            ids: FxHashMap::default(),
        })
    }
}

impl Model for Gpumm {
    fn alloc(&mut self, id: u32, size: u64, stream: u64) -> Option<u64> {
        self.free(id);
        let req = Request {
            size: size.max(1),
            stream,
            ..Request::default()
        };
        let (aid, ptr) = self.pool.as_mut()?.alloc(req).ok()?;
        self.ids.insert(id, (aid, ptr, size));
        Some(ptr)
    }
    fn free(&mut self, id: u32) {
        if let (Some((aid, _, _)), Some(pool)) = (self.ids.remove(&id), self.pool.as_mut()) {
            let _ = pool.free(aid);
        }
    }
    fn reserved(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.reserved_bytes())
    }
    fn largest_free(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.stats().largest_free_run)
    }
    fn free_bytes(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.stats().free_bytes)
    }
    fn layout(&self) -> Vec<(u64, u64, bool)> {
        let mut v = Vec::new();
        for page in self.pool.iter().flat_map(|p| p.page_snapshot()) {
            for (off, size, owner) in page.blocks {
                v.push((page.addr + off, size, owner.is_some()));
            }
        }
        v
    }
    fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.ids.values().map(|&(_, a, s)| (a, s)).collect()
    }
}
