//! Real memory on the host. Physical memory is a memfd of the device's capacity (sparse: a
//! page costs RAM only once written); the direct map is one `MAP_SHARED` mapping of the whole
//! memfd; a stitching window is reserved `PROT_NONE` and pages of the memfd are mapped into
//! it with `MAP_FIXED | MAP_SHARED`, so the same physical page can appear at two addresses
//! and writes through one are seen through the other. Discarded pages are punched out of the
//! memfd (`FALLOC_FL_PUNCH_HOLE`), so their RAM really goes back to the system.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use parking_lot::Mutex;

use super::Backend;
use crate::error::{Error, Result};

pub struct Host {
    fd: OwnedFd,
    capacity: u64,
    direct: u64,
    /// Reserved stitching windows, (base, len): every address handed to `map`, `copy` and
    /// `zero` is checked to lie in the direct map or one of them.
    windows: Mutex<Vec<(u64, u64)>>,
}

fn os_error(what: &str) -> Error {
    Error::OutOfMemory(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl Host {
    pub fn new(capacity: u64) -> Result<Self> {
        if capacity == 0 || capacity % 4096 != 0 {
            return Err(Error::InvalidSize(format!(
                "host capacity must be a positive multiple of 4 KiB, got {capacity}"
            )));
        }
        let name: &CStr = c"gpumm-host";
        // SAFETY: `name` is a valid NUL-terminated string; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain system call on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), capacity as libc::off_t) } != 0 {
            return Err(os_error("ftruncate of the memfd"));
        }
        // SAFETY: a new shared mapping of our memfd at an address the kernel chooses.
        let direct = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if direct == libc::MAP_FAILED {
            return Err(os_error("mmap of the direct map"));
        }
        Ok(Host {
            fd,
            capacity,
            direct: direct as u64,
            windows: Mutex::new(Vec::new()),
        })
    }

    fn in_window(&self, va: u64, len: u64) -> bool {
        self.windows
            .lock()
            .iter()
            .any(|&(b, l)| va >= b && va.saturating_add(len) <= b + l)
    }

    fn mapped(&self, va: u64, len: u64) -> Result<()> {
        let in_direct = va >= self.direct && va.saturating_add(len) <= self.direct + self.capacity;
        if in_direct || self.in_window(va, len) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "range {va:#x}+{len} is not memory of this backend"
            )))
        }
    }

    fn check_page(&self, what: &str, v: u64) -> Result<()> {
        if v % 4096 != 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} {v:#x} is not page aligned"
            )));
        }
        Ok(())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for &(b, l) in self.windows.lock().iter() {
            // SAFETY: the window was mapped by `reserve` and nothing of ours uses it any more.
            unsafe { libc::munmap(b as *mut libc::c_void, l as usize) };
        }
        // SAFETY: the direct map was mapped by `new`; the backend is the last user.
        unsafe { libc::munmap(self.direct as *mut libc::c_void, self.capacity as usize) };
    }
}

impl Backend for Host {
    fn name(&self) -> &'static str {
        "host"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn granularity(&self) -> u64 {
        4096
    }
    /// 64 KiB (the GPUs' big page): pages 16 times finer than a device's 2 MiB, so free space
    /// inside partly used pages is mostly usable for stitching, with metadata of 48 B per
    /// 64 KiB. `page_size="4KiB"` stitches at the finest unit, at 16 times that metadata.
    fn default_page_size(&self) -> u64 {
        64 << 10
    }
    fn has_bytes(&self) -> bool {
        true
    }
    fn direct_base(&self) -> u64 {
        self.direct
    }

    fn reserve(&self, len: u64) -> Result<u64> {
        self.check_page("window length", len)?;
        // SAFETY: a new private, inaccessible reservation at an address the kernel chooses.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_error("mmap of a stitching window"));
        }
        self.windows.lock().push((base as u64, len));
        Ok(base as u64)
    }

    fn unreserve(&self, base: u64, len: u64) {
        let mut w = self.windows.lock();
        if let Some(i) = w.iter().position(|&x| x == (base, len)) {
            w.swap_remove(i);
            // SAFETY: the window was reserved by us and is no longer listed, so no allocation
            // lives in it.
            unsafe { libc::munmap(base as *mut libc::c_void, len as usize) };
        }
    }

    fn map(&self, va: u64, phys: u64, len: u64) -> Result<()> {
        self.check_page("address", va)?;
        self.check_page("offset", phys)?;
        if !self.in_window(va, len) || phys.saturating_add(len) > self.capacity {
            return Err(Error::InvalidArgument(format!(
                "cannot map {phys:#x}+{len} at {va:#x}: outside the window or the memfd"
            )));
        }
        // SAFETY: `[va, va + len)` lies inside a window we reserved, so MAP_FIXED replaces only
        // our own reservation; the memfd range is in bounds.
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd.as_raw_fd(),
                phys as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap of stitched pages"));
        }
        Ok(())
    }

    fn unmap(&self, va: u64, len: u64) -> Result<()> {
        self.check_page("address", va)?;
        if !self.in_window(va, len) {
            return Err(Error::InvalidArgument(format!(
                "cannot unmap {va:#x}+{len}: outside every window"
            )));
        }
        // SAFETY: the range lies in a window we reserved; it becomes inaccessible reserved
        // space again.
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap to unmap stitched pages"));
        }
        Ok(())
    }

    fn copy(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.mapped(dst, len)?;
        self.mapped(src, len)?;
        // SAFETY: both ranges are mapped read-write memory of this backend (checked above);
        // `copy` is memmove, so overlap is allowed.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    fn zero(&self, va: u64, len: u64) -> Result<()> {
        self.mapped(va, len)?;
        // SAFETY: the range is mapped read-write memory of this backend (checked above).
        unsafe { std::ptr::write_bytes(va as *mut u8, 0, len as usize) };
        Ok(())
    }

    fn discard(&self, phys: u64, len: u64) {
        // SAFETY: plain system call on our own descriptor; a failure only keeps the RAM.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                phys as libc::off_t,
                len as libc::off_t,
            )
        };
    }
}
