//! The `Backend` operations on CUDA memory: committing and discarding physical chunks,
//! windows, mapping, copies, scrubbing and stream-ordered fences.

use std::ffi::c_void;

use super::driver::{check, prop};
use super::Cuda;
use crate::backend::{disjoint_pieces, Backend};
use crate::error::Result;

impl Backend for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn granularity(&self) -> u64 {
        self.info.granularity
    }
    fn has_bytes(&self) -> bool {
        false // device memory: not readable from the host through the buffer protocol
    }
    fn direct_base(&self) -> u64 {
        self.direct
    }
    fn commit(&self, phys: u64, len: u64) -> Result<()> {
        self.current();
        let g = self.info.granularity;
        let p = prop(self.device);
        let mut made = Vec::new();
        let mut off = phys;
        while off < phys + len {
            let idx = off / g;
            if !self.handles.lock().contains_key(&idx) {
                let mut h = 0;
                // SAFETY: `h` and `p` are valid locals.
                let r = unsafe { (self.f.mem_create)(&mut h, g as usize, &p, 0) };
                let r = check("cuMemCreate", r).and_then(|_| {
                    self.handles.lock().insert(idx, h);
                    self.map_chunks(self.direct + off, off, g)
                });
                if let Err(e) = r {
                    if let Some(h) = self.handles.lock().remove(&idx) {
                        // SAFETY: the handle was just made and is mapped nowhere.
                        unsafe { (self.f.mem_release)(h) };
                    }
                    for idx in made {
                        self.discard(idx * g, g);
                    }
                    return Err(e);
                }
                made.push(idx);
            }
            off += g;
        }
        Ok(())
    }
    fn reserve(&self, len: u64) -> Result<u64> {
        let mut base = 0;
        let g = self.info.granularity;
        // SAFETY: reserves virtual space only.
        check("cuMemAddressReserve", unsafe {
            (self.f.address_reserve)(&mut base, len as usize, g as usize, 0, 0)
        })?;
        self.windows.lock().push((base, len));
        Ok(base)
    }
    fn unreserve(&self, base: u64, len: u64) {
        let mut w = self.windows.lock();
        if let Some(i) = w.iter().position(|&x| x == (base, len)) {
            w.swap_remove(i);
            // SAFETY: our own reservation, emptied by the pool.
            unsafe { (self.f.address_free)(base, len as usize) };
        }
    }
    fn map(&self, va: u64, phys: u64, len: u64) -> Result<()> {
        self.current();
        self.map_chunks(va, phys, len)
    }
    fn unmap(&self, va: u64, len: u64) -> Result<()> {
        // SAFETY: a range the pool mapped in one of our windows.
        check("cuMemUnmap", unsafe {
            (self.f.mem_unmap)(va, len as usize)
        })
    }
    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.current();
        // The driver's copy of overlapping ranges is undefined (a large allocation slid down
        // over a smaller hole by `defrag` overlaps itself): disjoint pieces, in order.
        // SAFETY: both ranges are mapped device memory of this backend (the pool's own); the
        // copies are queued on the null stream, in order, which is then waited for.
        unsafe {
            let null = std::ptr::null_mut();
            for (d, s, l) in disjoint_pieces(dst, src, len) {
                check(
                    "cuMemcpyAsync",
                    (self.f.memcpy_async)(d, s, l as usize, null),
                )?;
            }
            check("cuStreamSynchronize", (self.f.stream_synchronize)(null))
        }
    }
    fn zero(&self, va: u64, len: u64) -> Result<()> {
        self.current();
        // SAFETY: a mapped device range of the pool's; queued on the null stream, waited for.
        unsafe {
            let null = std::ptr::null_mut();
            check(
                "cuMemsetD8Async",
                (self.f.memset_d8_async)(va, 0, len as usize, null),
            )?;
            check("cuStreamSynchronize", (self.f.stream_synchronize)(null))
        }
    }
    /// A CUDA event recorded on `stream` (a `CUstream` handle; 0 is the null stream). Events
    /// are recycled: one that was reached goes back to a free list, not to the driver.
    fn fence(&self, stream: u64) -> Option<u64> {
        self.current();
        let mut ev = self.spare_events.lock().pop().unwrap_or(0) as *mut c_void;
        // SAFETY: `ev` is a live event of ours or a local to create one into; the stream
        // handle is the caller's (PyTorch's, CuPy's).
        unsafe {
            if ev.is_null() && (self.f.event_create)(&mut ev, 2 /* DISABLE_TIMING */) != 0 {
                return None;
            }
            if (self.f.event_record)(ev, stream as *mut c_void) != 0 {
                (self.f.event_destroy)(ev);
                return None;
            }
        }
        Some(ev as u64)
    }
    fn fence_done(&self, fence: u64) -> bool {
        self.current();
        // SAFETY: an event made by `fence` and not yet dropped. Only CUDA_ERROR_NOT_READY
        // means "still running"; any other error cannot be waited out, so the free completes
        // rather than holding its memory forever.
        unsafe { (self.f.event_query)(fence as *mut c_void) != 600 }
    }
    fn fence_drop(&self, fence: u64) {
        let mut spare = self.spare_events.lock();
        if spare.len() < 1024 {
            spare.push(fence);
        } else {
            drop(spare);
            self.current();
            // SAFETY: an event made by `fence`, no longer used by the pool.
            unsafe { (self.f.event_destroy)(fence as *mut c_void) };
        }
    }
    fn discard(&self, phys: u64, len: u64) {
        self.current();
        let g = self.info.granularity;
        let mut off = phys / g * g;
        while off < phys + len {
            if let Some(h) = self.handles.lock().remove(&(off / g)) {
                // SAFETY: the chunk's direct mapping and handle are ours; the pool no longer
                // uses the page.
                unsafe {
                    (self.f.mem_unmap)(self.direct + off, g as usize);
                    (self.f.mem_release)(h);
                }
            }
            off += g;
        }
    }
}
