//! Running kernels: access patterns, fault batches, migration, zero-copy and CPU access.

use super::*;

impl Uvm {
    // ------------------------------------------------------------------------------------
    // Running kernels

    /// Checks a pattern against a range.
    pub(super) fn check_pattern(&self, pages: u64, pattern: &Pattern) -> Result<()> {
        if let Pattern::Explicit(v) = pattern {
            if let Some(&bad) = v.iter().find(|&&p| p >= pages) {
                return Err(Error::InvalidArgument(format!(
                    "page {bad} is outside the range's {pages} pages"
                )));
            }
        }
        Ok(())
    }

    /// The next up to `CHUNK` page indices of a pattern from position `*pos`, into `out`.
    /// False when the pattern is done.
    pub(super) fn pattern_chunk(
        &mut self,
        pages: u64,
        pattern: &Pattern,
        pos: &mut u64,
        out: &mut Vec<u64>,
    ) -> bool {
        out.clear();
        let len = match pattern {
            Pattern::Streaming => pages,
            Pattern::Strided { stride } => pages.div_ceil((*stride).max(1)),
            Pattern::BlockStreaming { chunks } => {
                let k = (*chunks as u64).clamp(1, pages);
                pages.div_ceil(k) * k
            }
            Pattern::RandomWarp { touches } => *touches,
            Pattern::Explicit(v) => v.len() as u64,
        };
        while *pos < len && out.len() < CHUNK {
            let i = *pos;
            *pos += 1;
            let p = match pattern {
                Pattern::Streaming => i,
                Pattern::Strided { stride } => i * (*stride).max(1),
                Pattern::BlockStreaming { chunks } => {
                    let k = (*chunks as u64).clamp(1, pages);
                    let per = pages.div_ceil(k);
                    (i % k) * per + i / k
                }
                Pattern::RandomWarp { .. } => splitmix(&mut self.rng) % pages,
                Pattern::Explicit(v) => v[i as usize],
            };
            if p < pages {
                out.push(p);
            }
        }
        !out.is_empty() || *pos < len
    }

    /// Stripes the range between GPU and CPU: `fraction` of its blocks, evenly spread, are
    /// prefetched to the GPU; the GPU reads the others in place over the link.
    pub fn stripe(&mut self, r: u32, fraction: f64) -> Result<Stats> {
        let range = self.range(r)?.clone();
        let f = fraction.clamp(0.0, 1.0);
        let nblocks = range.pages.div_ceil(PAGES_PER_BLOCK as u64) as u32;
        let mut st = Stats::default();
        for j in 0..nblocks {
            let b = range.first_block + j;
            let on_gpu = ((j + 1) as f64 * f).floor() > (j as f64 * f).floor();
            self.blocks[b as usize].remote = !on_gpu;
            if on_gpu {
                let want = full_mask(self.pages_in_block(b));
                self.migrate(b, &want, Processor::Gpu, false, &mut st);
            }
        }
        self.total.add(&st);
        Ok(st)
    }

    /// Moves the whole range to `to` ahead of use (cudaMemPrefetchAsync): bulk copies at link
    /// speed, evicting as needed; no faults.
    pub fn prefetch(&mut self, r: u32, to: Processor) -> Result<Stats> {
        let range = self.range(r)?.clone();
        let mut st = Stats::default();
        let nblocks = range.pages.div_ceil(PAGES_PER_BLOCK as u64) as u32;
        for b in range.first_block..range.first_block + nblocks {
            let want = full_mask(self.pages_in_block(b));
            self.migrate(b, &want, to, false, &mut st);
        }
        self.total.add(&st);
        Ok(st)
    }

    /// Moves the pages of `want` in block `b` to `to` (duplicating for reads of read-mostly
    /// ranges). Returns the number of pages that moved.
    pub(super) fn migrate(
        &mut self,
        b: u32,
        want: &Mask,
        to: Processor,
        read_dup: bool,
        st: &mut Stats,
    ) -> u64 {
        if to == Processor::Gpu && !self.back_block(b, st) {
            return 0;
        }
        let c = &self.cfg.costs;
        let blk = &mut self.blocks[b as usize];
        let (mut copied, mut moved) = (0u64, 0u64);
        for (w, &wanted) in want.iter().enumerate() {
            let (dst, src) = match to {
                Processor::Gpu => (blk.gpu[w], blk.cpu[w]),
                Processor::Cpu => (blk.cpu[w], blk.gpu[w]),
            };
            let new = wanted & !dst;
            if new == 0 {
                continue;
            }
            moved += new.count_ones() as u64;
            // a page resident nowhere is a first touch: zero-filled, nothing to copy
            copied += (new & src).count_ones() as u64;
            let (d, s) = (dst | new, if read_dup { src } else { src & !new });
            match to {
                Processor::Gpu => (blk.gpu[w], blk.cpu[w]) = (d, s),
                Processor::Cpu => (blk.cpu[w], blk.gpu[w]) = (d, s),
            }
            blk.touched[w] |= new;
        }
        if moved == 0 {
            return 0;
        }
        let bytes = copied * PAGE;
        match to {
            Processor::Gpu => st.bytes_h2d += bytes,
            Processor::Cpu => st.bytes_d2h += bytes,
        }
        let t = c.transfer_ns + bytes as f64 / c.link_bw * 1e9;
        st.time_ns += t;
        self.clock += t;
        if to == Processor::Cpu {
            self.unback_if_empty(b);
        } else if let Some(id) = self.blocks[b as usize].root {
            let _ = self.pmm.mark_root(id, crate::pmm::RootList::Used);
        }
        moved
    }

    /// Runs one kernel: every access in its pattern order, faults batched and serviced,
    /// migrations, prefetch, eviction and thrashing as the driver does them.
    pub fn run_kernel(&mut self, k: &Kernel) -> Result<Stats> {
        let range = self.range(k.range)?.clone();
        self.check_pattern(range.pages, &k.pattern)?;
        let mut st = Stats::default();
        let mut buf = Vec::with_capacity(CHUNK);
        let mut pos = 0u64;
        let mut batch = Batch::default();
        while self.pattern_chunk(range.pages, &k.pattern, &mut pos, &mut buf) {
            st.accesses += buf.len() as u64;
            match k.processor {
                Processor::Gpu => self.run_gpu(&range, &buf, k.write, &mut batch, &mut st),
                Processor::Cpu => self.run_cpu(&range, &buf, k.write, &mut st),
            }
        }
        if !batch.blocks.is_empty() {
            self.service_batch(&mut batch, &range, k.write, &mut st);
        }
        if k.processor == Processor::Gpu && self.cfg.replay == ReplayPolicy::Once && st.faults > 0 {
            st.replays += 1;
            st.time_ns += self.cfg.costs.replay_ns;
            self.clock += self.cfg.costs.replay_ns;
        }
        self.total.add(&st);
        Ok(st)
    }

    pub(super) fn access_cost(&mut self, remote: u64, hbm: u64, st: &mut Stats) {
        let c = &self.cfg.costs;
        let t =
            hbm as f64 / c.hbm_bw * 1e9 + remote as f64 / (c.link_bw * c.remote_efficiency) * 1e9;
        st.hbm_bytes += hbm;
        st.remote_bytes += remote;
        st.time_ns += t;
        self.clock += t;
    }

    pub(super) fn run_gpu(
        &mut self,
        range: &Range,
        pages: &[u64],
        write: bool,
        batch: &mut Batch,
        st: &mut Stats,
    ) {
        let remote_range =
            range.zero_copy || (range.accessed_by_gpu && range.preferred == Some(Processor::Cpu));
        if remote_range {
            self.access_cost(pages.len() as u64 * PAGE, 0, st);
            return;
        }
        // With the prefetcher on, faults on one big page coalesce (the whole big page moves).
        let big = self.cfg.prefetch;
        let (mut hbm, mut remote) = (0u64, 0u64);
        for &p in pages {
            let b = range.first_block + (p / PAGES_PER_BLOCK as u64) as u32;
            let i = (p % PAGES_PER_BLOCK as u64) as usize;
            let blk = &self.blocks[b as usize];
            if get(&blk.gpu, i) {
                hbm += PAGE;
                if write && range.read_mostly && get(&blk.cpu, i) {
                    // a write collapses the duplicate
                    clear(&mut self.blocks[b as usize].cpu, i);
                }
                continue;
            }
            if blk.remote || (range.accessed_by_gpu && get(&blk.cpu, i)) || self.pinned(b) {
                remote += PAGE;
                continue;
            }
            let slot = match self.pend_slot[b as usize] {
                NIL => {
                    self.pend_slot[b as usize] = batch.blocks.len() as u32;
                    batch.blocks.push((b, [0; WORDS]));
                    batch.blocks.len() - 1
                }
                s => s as usize,
            };
            let m = &mut batch.blocks[slot].1;
            let dup = if big {
                let g = i / BIG * BIG;
                count_range(m, g, (g + BIG).min(PAGES_PER_BLOCK)) > 0
            } else {
                get(m, i)
            };
            if !dup {
                set(m, i);
                batch.faults += 1;
                st.faults += 1;
            }
            hbm += PAGE; // served from vidmem once the fault is serviced
            if batch.faults >= self.cfg.fault_batch {
                self.access_cost(remote, hbm, st);
                (hbm, remote) = (0, 0);
                self.service_batch(batch, range, write, st);
            }
        }
        self.access_cost(remote, hbm, st);
    }

    pub(super) fn service_batch(
        &mut self,
        batch: &mut Batch,
        range: &Range,
        write: bool,
        st: &mut Stats,
    ) {
        let c = self.cfg.costs.clone();
        let t = c.batch_ns + batch.faults as f64 * c.fault_ns;
        st.batches += 1;
        st.time_ns += t;
        self.clock += t;
        let dup = range.read_mostly && !write;
        let blocks = std::mem::take(&mut batch.blocks);
        for (b, faulted) in &blocks {
            self.pend_slot[*b as usize] = NIL;
            let np = self.pages_in_block(*b);
            // a thrashing block pinned where it is: the accesses go over the link
            if self.note_migration(*b, Processor::Gpu, count(faulted) as u64, st) {
                continue;
            }
            let mut want = *faulted;
            if self.cfg.prefetch {
                let blk = &self.blocks[*b as usize];
                // each fault's whole big page, then the tree rule over what that populates
                let grown = grow_to_big_pages(&want, np);
                let mut populated = blk.gpu;
                for w in 0..WORDS {
                    populated[w] |= grown[w];
                }
                let extra = self.prefetch_mask(&populated, &grown, np);
                let mut added = 0u64;
                for w in 0..WORDS {
                    let more = (extra[w] | grown[w]) & !want[w] & !blk.gpu[w];
                    added += more.count_ones() as u64;
                    want[w] |= more;
                }
                st.prefetched_pages += added;
            }
            self.migrate(*b, &want, Processor::Gpu, dup, st);
            if self.cfg.replay == ReplayPolicy::Block {
                st.replays += 1;
                st.time_ns += c.replay_ns;
                self.clock += c.replay_ns;
            }
        }
        batch.blocks = blocks;
        batch.blocks.clear();
        batch.faults = 0;
        if self.cfg.check {
            if let Err(e) = self.validate() {
                panic!("UVM invariant broken after a fault batch: {e}");
            }
        }
        if self.cfg.replay == ReplayPolicy::Batch {
            st.replays += 1;
            st.time_ns += c.replay_ns;
            self.clock += c.replay_ns;
        }
    }

    pub(super) fn run_cpu(&mut self, range: &Range, pages: &[u64], write: bool, st: &mut Stats) {
        let c = self.cfg.costs.clone();
        let mut local = 0u64;
        for &p in pages {
            let b = range.first_block + (p / PAGES_PER_BLOCK as u64) as u32;
            let i = (p % PAGES_PER_BLOCK as u64) as usize;
            let blk = &mut self.blocks[b as usize];
            let on_gpu = get(&blk.gpu, i);
            if get(&blk.cpu, i) || !on_gpu {
                if !get(&blk.cpu, i) {
                    // first touch on the CPU
                    set(&mut blk.cpu, i);
                    set(&mut blk.touched, i);
                }
                if write && on_gpu {
                    // writing a duplicated page invalidates the GPU copy
                    clear(&mut blk.gpu, i);
                    self.unback_if_empty(b);
                }
                local += PAGE;
                continue;
            }
            // GPU-resident only: a CPU fault
            st.cpu_faults += 1;
            st.faults += 1;
            st.time_ns += c.cpu_fault_ns;
            self.clock += c.cpu_fault_ns;
            if self.note_migration(b, Processor::Cpu, 1, st) {
                // pinned on the GPU: the CPU reads it over the link
                self.access_cost(PAGE, 0, st);
                continue;
            }
            let mut want = [0u64; WORDS];
            set(&mut want, i);
            self.migrate(b, &want, Processor::Cpu, range.read_mostly && !write, st);
            local += PAGE;
        }
        let t = local as f64 / c.host_bw * 1e9;
        st.time_ns += t;
        self.clock += t;
    }
}
