//! Stream-ordered frees: fences, completion and draining.

use super::*;

impl Pool {
    /// A request on `stream`: remembers whether requests have come on more than one stream.
    #[inline]
    pub(super) fn note_stream(&mut self, stream: u64) {
        match self.first_stream {
            Some(s) if s != stream => self.streams_mixed = true,
            None => self.first_stream = Some(stream),
            _ => {}
        }
    }

    /// Frees on `stream`: the memory stays "freeing" until the returned fence completes
    /// (`complete` or `synchronize`); until then only `stream` may reuse it.
    pub fn free_async(&mut self, id: AllocId, stream: u64) -> Result<u64> {
        self.open()?;
        let a = self.resolve(id)?;
        self.check_unpinned(a)?;
        // (a served plan entry is reused by the plan, in stream order: `step_freeing`)
        let reusable = !self.steps.watch || self.step_freeing(a);
        let fence = self.next_fence;
        self.next_fence += 1;
        let x = &mut self.allocs[a as usize];
        x.state = State::Freeing;
        x.stream = stream;
        x.fence = fence;
        let (g, units, size) = (x.generation, x.units(), x.size);
        let st = self.streams.entry(stream).or_default();
        st.pending.push_back((fence, a, g));
        if reusable {
            st.reuse.entry(units).or_default().push((a, g));
        }
        self.fence_stream.insert(fence, stream);
        if let Some(ev) = self.dev.backend.fence(stream) {
            self.events.insert(fence, ev);
        }
        self.counters.live_bytes -= size;
        self.counters.freeing_bytes += units * GRANULE;
        self.counters.frees += 1;
        self.check();
        Ok(fence)
    }

    /// Frees once the work queued on `stream` so far has finished: stream-ordered behind a
    /// backend fence (a CUDA event, polled by the pool) where the backend has streams, else
    /// at once. `stream` itself may reuse the memory right away. What frameworks' free hooks
    /// call: they free when the host drops a tensor, while kernels may still be using it.
    ///
    /// While every request the pool has served was on `stream` (one PyTorch stream, say), the
    /// free is immediate: whatever reuses the memory is queued on that stream after the work
    /// that used it, as in PyTorch's own allocator. Events start with the second stream.
    pub fn free_when_done(&mut self, id: AllocId, stream: u64) -> Result<()> {
        if !self.streams_mixed && self.first_stream == Some(stream) {
            let a = self.resolve(id)?;
            if self.allocs[a as usize].stream == stream {
                return self.free(id);
            }
        }
        let fence = self.free_async(id, stream)?;
        if !self.events.contains_key(&fence) {
            self.complete(fence)?;
        }
        Ok(())
    }

    /// Fence `fence` has completed: every free on its stream up to it is done. Returns the
    /// number of allocations whose memory became free. A fence that completed before is
    /// accepted and does nothing.
    pub fn complete(&mut self, fence: u64) -> Result<u64> {
        self.open()?;
        if fence == 0 || fence >= self.next_fence {
            return Err(Error::InvalidArgument(format!(
                "fence {fence} was never issued by this pool"
            )));
        }
        let Some(&stream) = self.fence_stream.get(&fence) else {
            return Ok(0);
        };
        let n = self.drain(stream, fence);
        self.after_free();
        self.check();
        Ok(n)
    }

    /// Completes every pending free on `stream` (all streams if None).
    pub fn synchronize(&mut self, stream: Option<u64>) -> Result<u64> {
        self.open()?;
        let streams: Vec<u64> = match stream {
            Some(s) => vec![s],
            None => self.streams.keys().copied().collect(),
        };
        let n = streams.into_iter().map(|s| self.drain(s, u64::MAX)).sum();
        self.after_free();
        self.check();
        Ok(n)
    }

    pub(super) fn drain(&mut self, stream: u64, upto: u64) -> u64 {
        let Some(mut st) = self.streams.remove(&stream) else {
            return 0;
        };
        let mut n = 0;
        while let Some(&(f, a, g)) = st.pending.front() {
            if f > upto {
                break;
            }
            st.pending.pop_front();
            self.fence_stream.remove(&f);
            if let Some(ev) = self.events.remove(&f) {
                self.dev.backend.fence_drop(ev);
            }
            let x = &self.allocs[a as usize];
            if x.generation == g && x.state == State::Freeing && x.fence == f {
                self.finish_free(a);
                n += 1;
            }
        }
        if !st.pending.is_empty() {
            self.streams.insert(stream, st);
        }
        n
    }

    /// Completes the stream-ordered frees whose backend fence (CUDA event) has been reached.
    /// Returns how many allocations became free. The pool calls it before it grows or fails.
    pub fn poll(&mut self) -> u64 {
        if self.events.is_empty() {
            return 0;
        }
        let mut done: Vec<u64> = self
            .events
            .iter()
            .filter(|&(_, &ev)| self.dev.backend.fence_done(ev))
            .map(|(&f, _)| f)
            .collect();
        done.sort_unstable();
        let mut n = 0;
        for f in done {
            if let Some(&stream) = self.fence_stream.get(&f) {
                n += self.drain(stream, f);
            }
        }
        if n > 0 {
            self.after_free();
        }
        n
    }

    /// Pending stream-ordered frees.
    pub fn pending_frees(&self) -> u64 {
        self.allocs
            .iter()
            .filter(|x| x.state == State::Freeing)
            .count() as u64
    }
}
