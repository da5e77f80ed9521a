//! Objects of the classes made on every call (`Allocation`, `Chunk`) recycled under the GIL.
//!
//! Every `pool.alloc` makes an `Allocation` object and every free drops one, so their memory
//! is kept for reuse (as CPython does for its own small objects). PyO3's `freelist` option
//! guards its list with a `std::sync::Mutex` on every build, the GIL's included: two atomic
//! read-modify-writes for each object made and two for each dropped, which cost more than
//! the list saves (PyO3/pyo3#6133; benches/RESULTS.md, the alloc + free pair). With a GIL, the
//! interpreter only ever makes or frees an object with the GIL held, so here the GIL alone
//! guards each class's list, and the class's `tp_alloc` and `tp_free` are set to the
//! functions below once it is made. They do what PyO3's free list does (`PyObject_Init` on
//! reuse, the inverse of `PyType_GenericAlloc` beyond the list's length), without the mutex.
//! A free-threaded build keeps CPython's own allocation (nothing installed).

// (a free-threaded build keeps the lists' types but uses none of them)
#![cfg_attr(Py_GIL_DISABLED, allow(dead_code))]

use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::PyClass;

/// A class whose objects are recycled: `recycler` is its list (a `static`).
pub(super) trait Recycled: PyClass {
    fn recycler() -> &'static Recycler;
}

/// The kept objects of one class (see the module).
pub(super) struct Recycler {
    #[cfg(not(Py_GIL_DISABLED))]
    inner: gil::Kept,
}

impl Recycler {
    pub(super) const fn new() -> Recycler {
        Recycler {
            #[cfg(not(Py_GIL_DISABLED))]
            inner: gil::Kept::new(),
        }
    }
}

#[cfg(not(Py_GIL_DISABLED))]
mod gil {
    use std::cell::UnsafeCell;
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicPtr, Ordering};

    use pyo3::ffi;

    use super::Recycled;

    /// Objects kept at most, per class (each under 128 bytes).
    const KEEP: usize = 1024;

    struct List {
        objs: [*mut ffi::PyObject; KEEP],
        len: usize,
    }

    /// A class's kept objects; read and written only with the GIL held (in `alloc` and
    /// `free`, which the interpreter calls with it).
    pub(super) struct Kept {
        list: UnsafeCell<List>,
        /// The class (set once, with the GIL held).
        pub(super) ty: AtomicPtr<ffi::PyTypeObject>,
    }

    // SAFETY: `list` is only touched with the GIL held (see `Kept`): never by two threads at
    // once.
    unsafe impl Sync for Kept {}

    impl Kept {
        pub(super) const fn new() -> Kept {
            Kept {
                list: UnsafeCell::new(List {
                    objs: [std::ptr::null_mut(); KEEP],
                    len: 0,
                }),
                ty: AtomicPtr::new(std::ptr::null_mut()),
            }
        }
    }

    /// `tp_alloc`: a kept object when there is one, else CPython's allocation.
    ///
    /// # Safety
    /// Called by the interpreter with the GIL held, for `subtype` (a type object).
    pub(super) unsafe extern "C" fn alloc<T: Recycled>(
        subtype: *mut ffi::PyTypeObject,
        nitems: ffi::Py_ssize_t,
    ) -> *mut ffi::PyObject {
        let kept = &T::recycler().inner;
        if nitems == 0 && subtype == kept.ty.load(Ordering::Relaxed) {
            // SAFETY: the GIL is held (see `Kept`).
            let list = unsafe { &mut *kept.list.get() };
            if list.len > 0 {
                list.len -= 1;
                let obj = list.objs[list.len];
                // SAFETY: `obj` is the memory of a dropped object of this class (untracked by
                // the GC, its fields dropped); `PyObject_Init` gives it its type and a count.
                unsafe { ffi::PyObject_Init(obj, subtype) };
                return obj;
            }
        }
        // SAFETY: as the interpreter would call it.
        unsafe { ffi::PyType_GenericAlloc(subtype, nitems) }
    }

    /// `tp_free`: keeps the memory while fewer than `KEEP` objects are kept, else gives it
    /// back as `PyType_GenericAlloc`'s inverse (PyO3's classes are GC types; checked, as
    /// PyO3's own free list does).
    ///
    /// # Safety
    /// Called by the object's deallocation with the GIL held, for an object of the class (it
    /// has no subclasses) that is untracked and whose fields are dropped.
    pub(super) unsafe extern "C" fn free<T: Recycled>(obj: *mut c_void) {
        // SAFETY: the GIL is held (see `Kept`).
        let list = unsafe { &mut *T::recycler().inner.list.get() };
        if list.len < KEEP {
            list.objs[list.len] = obj.cast();
            list.len += 1;
            return;
        }
        // SAFETY: the object came from `PyType_GenericAlloc` of its type, which is alive (the
        // object's deallocation drops its count after this).
        unsafe {
            if ffi::PyType_IS_GC(ffi::Py_TYPE(obj.cast())) != 0 {
                ffi::PyObject_GC_Del(obj)
            } else {
                ffi::PyObject_Free(obj)
            }
        }
    }
}

/// Makes the objects of class `T` (which has no subclasses, and no object yet) recycled
/// under the GIL; nothing on a free-threaded build.
pub(super) fn install<T: Recycled>(py: Python<'_>) {
    let ty: Bound<'_, PyType> = py.get_type::<T>();
    #[cfg(not(Py_GIL_DISABLED))]
    {
        use std::sync::atomic::Ordering;
        let t = ty.as_type_ptr();
        T::recycler().inner.ty.store(t, Ordering::Relaxed);
        // SAFETY: the GIL is held (the module is being made), and no object of the class
        // exists yet, so none was made or will be freed by the functions being replaced.
        unsafe {
            (*t).tp_alloc = Some(gil::alloc::<T>);
            (*t).tp_free = Some(gil::free::<T>);
        }
    }
    #[cfg(Py_GIL_DISABLED)]
    let _ = ty;
}
