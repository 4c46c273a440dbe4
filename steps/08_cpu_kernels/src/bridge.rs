//! Steps 01 and 02, copied forward: tensors across the Python border without copies, and `on`, which moves a
//! tensor to the device of another (how Rust reaches a TPU that `tch::Device` cannot name).
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use tch::{TchError, Tensor};

/// The `torch.Tensor` passed as argument `arg` as a `tch::Tensor` sharing its storage.
pub fn take(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Tensor> {
    // SAFETY: `obj` is a live Python object for as long as we hold the `Bound`.
    let t = unsafe { Tensor::pyobject_unpack(obj.as_ptr().cast()) }.map_err(torch_error)?;
    t.ok_or_else(|| {
        let kind = obj.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string());
        PyTypeError::new_err(format!("{arg}: expected a torch.Tensor, got {kind}"))
    })
}

/// A `tch::Tensor` as a `torch.Tensor` for Python, sharing its storage.
pub fn give<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let ptr = t.pyobject_wrap().map_err(torch_error)?;
    // SAFETY: `pyobject_wrap` returns a new reference (or null, which becomes the pending Python error).
    unsafe { Bound::from_owned_ptr_or_err(py, ptr.cast()) }
}

/// libtorch's own message as a Python `RuntimeError`, without the C++ stack trace that follows it.
pub fn torch_error(e: TchError) -> PyErr {
    let msg = e.to_string();
    let msg = msg.split("\nException raised from").next().unwrap_or(&msg);
    PyRuntimeError::new_err(msg.trim().to_string())
}

/// `t` moved to `like`'s device, keeping its own dtype.
///
/// `type_as` alone would also convert `t` to like's dtype, so `like` is first given t's dtype. When `t`
/// already is there, libtorch returns it as it is: no copy.
pub fn on(t: &Tensor, like: &Tensor) -> Result<Tensor, TchError> {
    t.f_type_as(&like.f_to_kind(t.kind())?)
}
