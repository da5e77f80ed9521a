//! driver: every request straight from the device.

use rustc_hash::FxHashMap;

use super::{round_up, DeviceMem, Model};

/// Every request is a device allocation of its size rounded to 512 B, freed at once: the
/// lower bound on what any allocator must hold.
pub struct Driver {
    dev: DeviceMem,
    /// id -> (address, rounded size)
    live: FxHashMap<u32, (u64, u64)>,
}

impl Driver {
    pub fn new(capacity: u64) -> Self {
        Driver {
            dev: DeviceMem::new(capacity),
            live: FxHashMap::default(),
        }
    }
}

impl Model for Driver {
    fn alloc(&mut self, id: u32, size: u64, _stream: u64) -> Option<u64> {
        let r = round_up(size, 512);
        let a = self.dev.take(r)?;
        if let Some((_, old)) = self.live.insert(id, (a, r)) {
            self.dev.give(old);
        }
        Some(a)
    }
    fn free(&mut self, id: u32) {
        if let Some((_, r)) = self.live.remove(&id) {
            self.dev.give(r);
        }
    }
    fn reserved(&self) -> u64 {
        self.dev.reserved
    }
    fn largest_free(&self) -> u64 {
        0
    }
    fn free_bytes(&self) -> u64 {
        0
    }
    fn live_blocks(&self) -> Vec<(u64, u64)> {
        self.live.values().copied().collect()
    }
    fn validate(&self) -> Result<(), String> {
        let held: u64 = self.live.values().map(|v| v.1).sum();
        if held != self.dev.reserved {
            return Err(format!(
                "driver: {held} B live, {} B reserved",
                self.dev.reserved
            ));
        }
        Ok(())
    }
}
