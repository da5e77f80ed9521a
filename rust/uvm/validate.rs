//! The model's invariants.

use super::*;

impl Uvm {
    /// Every invariant: each touched page resident somewhere, vidmem use within capacity and
    /// equal to the blocks holding GPU pages, roots owned consistently, PMM valid.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let mut backed = 0u64;
        for (b, blk) in self.blocks.iter().enumerate() {
            for w in 0..WORDS {
                if blk.touched[w] & !(blk.gpu[w] | blk.cpu[w]) != 0 {
                    return Err(format!("block {b}: a touched page is resident nowhere"));
                }
                if (blk.gpu[w] | blk.cpu[w]) & !blk.touched[w] != 0 {
                    return Err(format!("block {b}: a resident page was never touched"));
                }
            }
            if count(&blk.gpu) > 0 {
                let Some(id) = blk.root else {
                    return Err(format!("block {b} has GPU pages but no root"));
                };
                let addr = self.pmm.info(id).map_err(|e| e.to_string())?.addr;
                if self.root_owner.get(&addr) != Some(&(b as u32)) {
                    return Err(format!("block {b}'s root is not recorded as its own"));
                }
                backed += 1;
            }
        }
        if backed != self.root_owner.len() as u64 {
            return Err(format!(
                "{} roots owned, {backed} blocks backed",
                self.root_owner.len()
            ));
        }
        if self.vidmem_used() > self.cfg.vidmem {
            return Err("vidmem use above capacity".into());
        }
        let pmm = self.pmm.stats();
        if pmm.allocated_bytes != self.vidmem_used() {
            return Err(format!(
                "the PMM has {} allocated but {} back managed pages",
                pmm.allocated_bytes,
                self.vidmem_used()
            ));
        }
        let (g, _) = self.resident();
        if g > self.vidmem_used() {
            return Err("more GPU-resident bytes than vidmem backing them".into());
        }
        self.pmm.validate()
    }
}
