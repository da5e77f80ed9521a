//! `Allocation` objects recycled under the GIL.
//!
//! Every `pool.alloc` makes an `Allocation` object and every free drops one, so their memory
//! is kept for reuse (as CPython does for its own small objects). PyO3's `freelist` option
//! guards its list with a `std::sync::Mutex` on every build, the GIL's included: two atomic
//! read-modify-writes for each object made and two for each dropped, which cost more than
//! the list saves (PyO3/pyo3#6133; benches/RESULTS.md, "Twelfth session"). With a GIL, the
//! interpreter only ever makes or frees an object with the GIL held, so here the GIL alone
//! guards the list, and the type's `tp_alloc` and `tp_free` are set to the functions below
//! once it is made. A free-threaded build keeps CPython's own allocation (nothing installed).

use pyo3::prelude::*;
use pyo3::types::PyType;

#[cfg(not(Py_GIL_DISABLED))]
mod gil {
    use std::cell::UnsafeCell;
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicPtr, Ordering};

    use pyo3::ffi;

    /// Objects kept at most (each is an `Allocation`'s memory, under 128 bytes).
    const KEEP: usize = 1024;

    struct Kept {
        objs: [*mut ffi::PyObject; KEEP],
        len: usize,
    }

    /// The kept objects; read and written only with the GIL held (in `alloc` and `free`,
    /// which the interpreter calls with it).
    struct GilGuarded(UnsafeCell<Kept>);

    // SAFETY: only touched with the GIL held (see `GilGuarded`): never by two threads at once.
    unsafe impl Sync for GilGuarded {}

    static KEPT: GilGuarded = GilGuarded(UnsafeCell::new(Kept {
        objs: [std::ptr::null_mut(); KEEP],
        len: 0,
    }));

    /// The type whose objects are recycled (set once, with the GIL held).
    pub(super) static TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

    /// `tp_alloc`: a kept object when there is one, else CPython's allocation.
    ///
    /// # Safety
    /// Called by the interpreter with the GIL held, for `subtype` (a type object).
    pub(super) unsafe extern "C" fn alloc(
        subtype: *mut ffi::PyTypeObject,
        nitems: ffi::Py_ssize_t,
    ) -> *mut ffi::PyObject {
        if nitems == 0 && subtype == TYPE.load(Ordering::Relaxed) {
            // SAFETY: the GIL is held (see `GilGuarded`).
            let kept = unsafe { &mut *KEPT.0.get() };
            if kept.len > 0 {
                kept.len -= 1;
                let obj = kept.objs[kept.len];
                // SAFETY: `obj` is the memory of a dropped object of this type (untracked by
                // the GC, its fields dropped); `PyObject_Init` gives it its type and a count.
                unsafe { ffi::PyObject_Init(obj, subtype) };
                return obj;
            }
        }
        // SAFETY: as the interpreter would call it.
        unsafe { ffi::PyType_GenericAlloc(subtype, nitems) }
    }

    /// `tp_free`: keeps the memory while fewer than `KEEP` objects are kept, else gives it
    /// back as `PyType_GenericAlloc`'s inverse for a GC type.
    ///
    /// # Safety
    /// Called by the object's deallocation with the GIL held, for an object of `TYPE` (it has
    /// no subclasses) that is untracked and whose fields are dropped.
    pub(super) unsafe extern "C" fn free(obj: *mut c_void) {
        // SAFETY: the GIL is held (see `GilGuarded`).
        let kept = unsafe { &mut *KEPT.0.get() };
        if kept.len < KEEP {
            kept.objs[kept.len] = obj.cast();
            kept.len += 1;
        } else {
            // SAFETY: the object came from `PyType_GenericAlloc` of a GC type.
            unsafe { ffi::PyObject_GC_Del(obj) };
        }
    }
}

/// Makes the objects of `ty` (a class with no subclasses, not made yet) recycled under the
/// GIL; nothing on a free-threaded build.
pub(super) fn install(ty: &Bound<'_, PyType>) {
    #[cfg(not(Py_GIL_DISABLED))]
    {
        use std::sync::atomic::Ordering;
        let t = ty.as_type_ptr();
        gil::TYPE.store(t, Ordering::Relaxed);
        // SAFETY: the GIL is held (the module is being made), and no object of the type exists
        // yet, so none was made or will be freed by the functions being replaced.
        unsafe {
            (*t).tp_alloc = Some(gil::alloc);
            (*t).tp_free = Some(gil::free);
        }
    }
    #[cfg(Py_GIL_DISABLED)]
    let _ = ty;
}
