//! How a call from Python reaches a core, and what the GIL guards: the one place where the
//! bindings rely on the GIL for soundness (every `unsafe` block that does is here, with its
//! argument).
//!
//! Every call reaches its core through `run`, with an `Access`:
//! - `Access::Detached`: under the core's lock, the GIL released meanwhile (other Python
//!   threads run). Work that may be long (device calls, walks, eviction, simulation).
//! - `Access::Quick`: short, bounded work (one allocation, one free, one chunk) done at once
//!   *with the GIL held* when that needs no wait (see `Guarded::now`), else as `Detached`.
//!   Releasing and retaking the GIL costs more than such a call.
//! - `Access::Bounded(n)`: a batch of `n` items; `Quick` up to `QUICK_BATCH`, `Detached`
//!   above (a 1,024-size batch pair is about 17 µs through Python: less than a GIL hand-off
//!   and the wake-up of a thread that waits for it).
//! - `Access::QuickIf(ready)`: `Quick` when `ready` holds of the core (frees: no scrub, no
//!   pages to give back), else `Detached`.
//!
//! A pool's core (`Core`) can be served with the GIL alone, without its lock, when no other
//! thread can reach it without the GIL (see `Core`); a PMM's or a UVM's is a plain lock, taken
//! at once if free.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::alloc::Pool;

/// The most items of a batch call worked under the GIL (`Access::Bounded`).
pub(super) const QUICK_BATCH: usize = 4096;

/// How a call reaches its core (see the module).
pub(super) enum Access<P> {
    Detached,
    Quick,
    Bounded(usize),
    QuickIf(fn(&P) -> bool),
}

/// A core behind a lock, reachable from Python.
pub(super) trait Guarded: Sync {
    type Inner: Send;

    /// Runs `f` on the core now if that needs no wait (under the GIL, which stays held);
    /// None: it would. (`f` must not call into Python: the GIL could be handed on meanwhile.)
    fn now<T>(&self, py: Python<'_>, f: impl FnOnce(&mut Self::Inner) -> T) -> Option<T>;

    /// Runs `f` on the core under its lock with the GIL released.
    fn detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Self::Inner) -> T + Send) -> T;
}

/// Runs `f` on `core` as `access` says (see the module): the one path of every call.
#[inline]
pub(super) fn run<G: Guarded, T: Send>(
    py: Python<'_>,
    core: &G,
    access: Access<G::Inner>,
    f: impl FnOnce(&mut G::Inner) -> T + Send,
) -> T {
    let ready = match access {
        Access::Detached => return core.detached(py, f),
        Access::Bounded(n) if n > QUICK_BATCH => return core.detached(py, f),
        Access::Quick | Access::Bounded(_) => None,
        Access::QuickIf(ready) => Some(ready),
    };
    let mut f = Some(f);
    let done = core.now(py, |p| match ready {
        Some(ready) if !ready(p) => None,
        _ => Some((f.take().expect("once"))(p)),
    });
    match done.flatten() {
        Some(r) => r,
        None => core.detached(py, f.take().expect("not run")),
    }
}

/// A plain lock (a PMM's, a UVM's): taken at once if free.
impl<P: Send> Guarded for Mutex<P> {
    type Inner = P;

    #[inline]
    fn now<T>(&self, _py: Python<'_>, f: impl FnOnce(&mut P) -> T) -> Option<T> {
        self.try_lock().map(|mut p| f(&mut p))
    }

    fn detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut P) -> T + Send) -> T {
        py.detach(|| f(&mut self.lock()))
    }
}

/// Whether this extension is built for an interpreter with a GIL (a free-threaded build has
/// none, and there every access to a pool's core takes its lock; one whose GIL is enabled at
/// run time takes it too, which is always sound).
const GIL_BUILD: bool = cfg!(not(Py_GIL_DISABLED));

/// What the GIL guards in a `Core` (read and written only with it held, on a build with one).
#[derive(Default)]
struct GilState {
    /// `Allocation` objects that refer to the core (see `CoreRef`).
    handles: usize,
    /// Threads of Python working on the core with the GIL released (see `Core::detached`).
    detached: u32,
    /// The C functions of `capi` may use the core: they take its lock without the GIL.
    shared_with_c: bool,
}

/// A pool's core behind its lock, and what the GIL guards of it.
///
/// A quick call works on the core with the GIL alone when no other thread can reach the core
/// without the GIL: none works on it with the GIL released (each such thread is counted,
/// with the GIL held, before it releases it and after it takes it back) and the C functions
/// do not use it. The GIL then excludes every other thread, as the lock would, without the
/// lock's two atomic read-modify-writes each call; and the `Allocation` objects share one
/// strong count of the core's `Arc` (`CoreRef`) instead of an atomic clone and drop each
/// (benches/RESULTS.md, the alloc + free pair through Python).
#[repr(C)]
pub(super) struct Core {
    /// Used on a build with a GIL (`GIL_BUILD`); without one every access takes the lock,
    /// and each `Allocation` holds an `Arc` count of its own.
    gil: UnsafeCell<GilState>,
    pool: Mutex<Pool>,
}

// SAFETY: `pool` is behind its lock, or reached with the GIL alone under the rules above;
// `gil` is only read or written with the GIL held on a build with one (`GIL_BUILD`).
unsafe impl Sync for Core {}

impl std::ops::Deref for Core {
    type Target = Mutex<Pool>;
    fn deref(&self) -> &Mutex<Pool> {
        &self.pool
    }
}

impl Core {
    pub(super) fn new(pool: Pool) -> Core {
        Core {
            gil: UnsafeCell::new(GilState::default()),
            pool: Mutex::new(pool),
        }
    }

    /// What the GIL guards (`_gil`: it is held; called only on a build with one).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    fn gil_state(&self, _gil: Python<'_>) -> &mut GilState {
        // SAFETY: the GIL is held, so no other thread reads or writes it, and no reference
        // from an earlier call is alive (each is used within one statement).
        unsafe { &mut *self.gil.get() }
    }

    /// From now on the C functions may use the core.
    pub(super) fn share_with_c(&self, py: Python<'_>) {
        if GIL_BUILD {
            self.gil_state(py).shared_with_c = true;
        }
    }
}

impl Guarded for Core {
    type Inner = Pool;

    /// With the GIL alone when no other thread can reach the core, else under its lock if
    /// that is free.
    #[inline]
    fn now<T>(&self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T) -> Option<T> {
        if GIL_BUILD {
            let g = self.gil_state(py);
            if g.detached == 0 && !g.shared_with_c {
                // SAFETY: the GIL is held and no thread works on the core without it (see
                // `Core`), and `f` keeps it: nothing else has the pool until `f` returns.
                return Some(f(unsafe { &mut *self.pool.data_ptr() }));
            }
        }
        self.pool.try_lock().map(|mut p| f(&mut p))
    }

    /// Under its lock with the GIL released, this thread counted as working without the GIL
    /// meanwhile.
    fn detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Pool) -> T + Send) -> T {
        let _away = Detached::new(py, self);
        py.detach(|| f(&mut self.pool.lock()))
    }
}

/// A thread of Python counted, with the GIL held, as working on a core without it (from
/// before it releases the GIL until after it takes it back: the count is dropped with the GIL
/// held, also when unwinding, `py.detach` having taken the GIL back first).
struct Detached<'a>(&'a Core);

impl<'a> Detached<'a> {
    fn new(py: Python<'_>, core: &'a Core) -> Self {
        if GIL_BUILD {
            core.gil_state(py).detached += 1;
        }
        Detached(core)
    }
}

impl Drop for Detached<'_> {
    fn drop(&mut self) {
        if GIL_BUILD {
            // SAFETY: dropped with the GIL held (see the type).
            unsafe { (*self.0.gil.get()).detached -= 1 };
        }
    }
}

/// An `Allocation`'s reference to its pool's core. With a GIL, the references are counted in
/// the core under it, and together hold one strong count of the core's `Arc` while there is
/// at least one; without, each holds one. The core outlives its `Pool` object while
/// allocations refer to it.
pub(super) struct CoreRef(NonNull<Core>);

// SAFETY: it points to a `Core` (which is `Sync`) kept alive by a strong count of its `Arc`;
// with a GIL it is made and dropped only with the GIL held (`new` and `clone_ref` take the
// token, and an `Allocation` is dropped by its object's deallocation, which holds the GIL).
unsafe impl Send for CoreRef {}
unsafe impl Sync for CoreRef {}

impl CoreRef {
    pub(super) fn new(py: Python<'_>, core: &Arc<Core>) -> CoreRef {
        let p = Arc::as_ptr(core);
        if GIL_BUILD {
            let g = core.gil_state(py);
            if g.handles == 0 {
                // SAFETY: `p` is a live `Arc`'s.
                unsafe { Arc::increment_strong_count(p) };
            }
            g.handles += 1;
        } else {
            // SAFETY: `p` is a live `Arc`'s.
            unsafe { Arc::increment_strong_count(p) };
        }
        CoreRef(NonNull::from(&**core))
    }

    pub(super) fn clone_ref(&self, py: Python<'_>) -> CoreRef {
        if GIL_BUILD {
            self.gil_state(py).handles += 1;
        } else {
            // SAFETY: this reference holds a strong count, so the `Arc` is live.
            unsafe { Arc::increment_strong_count(self.0.as_ptr()) };
        }
        CoreRef(self.0)
    }
}

impl std::ops::Deref for CoreRef {
    type Target = Core;
    fn deref(&self) -> &Core {
        // SAFETY: the strong count the references hold keeps the core alive.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for CoreRef {
    fn drop(&mut self) {
        let core = self.0.as_ptr();
        debug_assert!(!GIL_BUILD || unsafe { ffi::PyGILState_Check() } == 1);
        // SAFETY: with a GIL, dropped with it held (see the `Send` impl); the count is
        // written before the last strong count may free the core.
        unsafe {
            if GIL_BUILD {
                let n = &mut (*(*core).gil.get()).handles;
                *n -= 1;
                if *n > 0 {
                    return;
                }
            }
            Arc::decrement_strong_count(core);
        }
    }
}

/// Runs `f` with the GIL from a thread that may not hold it, at any point of the
/// interpreter's life (a DLPack consumer may release a tensor from any thread, and a capsule
/// or an array kept in a module's globals is dropped while the interpreter ends: it holds
/// the GIL then, but `Python::attach` refuses, and panics, once the interpreter is marked
/// uninitialized). Where the GIL cannot be had (another thread while the interpreter ends)
/// `f` is not run and `what` is leaked: what it keeps alive stays valid until the process
/// ends.
pub(super) fn with_gil_anywhere<W>(what: W, f: impl FnOnce(Python<'_>, W)) {
    // SAFETY: PyGILState_Check may be called at any time, from any thread.
    if unsafe { ffi::PyGILState_Check() } == 1 {
        // SAFETY: this thread holds the GIL.
        let py = unsafe { Python::assume_attached() };
        return f(py, what);
    }
    let mut what = Some(what);
    if Python::try_attach(|py| f(py, what.take().expect("once"))).is_none() {
        std::mem::forget(what.take());
    }
}
