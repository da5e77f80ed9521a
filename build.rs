//! Makes PyO3's `#[cfg]`s (the Python version, `Py_GIL_DISABLED` on a free-threaded
//! interpreter) visible in this crate when it is built for Python.

fn main() {
    #[cfg(feature = "python")]
    pyo3_build_config::use_pyo3_cfgs();
}
