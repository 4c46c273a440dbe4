//! Step 01: hand tensors between Python (`torch.Tensor`) and Rust (`tch::Tensor`) without copying them.
//!
//! Both sides are the same libtorch in the same process, so a tensor crosses the border as a pointer:
//! `take` unwraps the Python object, `give` wraps a Rust tensor back. Storage is shared, nothing is copied,
//! and the tensor stays on whatever device it lives on.
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use tch::{Kind, TchError, Tensor};

// --8<-- [start:bridge]
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
// --8<-- [end:bridge]

/// roundtrip(x: torch.Tensor) -> torch.Tensor
///
/// `x` into Rust and straight back: the result shares x's storage (writes to one show in the other).
#[pyfunction]
fn roundtrip<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    give(py, &take(x, "roundtrip(x)")?)
}

// --8<-- [start:matmul_sum]
/// `x @ x`, summed in float32: a 0-d tensor on x's device. The `f_` forms return libtorch's
/// errors (a non-square matrix, say) instead of panicking.
pub fn matmul_sum(x: &Tensor) -> Result<Tensor, TchError> {
    x.f_matmul(x)?.f_sum(Kind::Float)
}

/// matmul_sum(x: torch.Tensor) -> torch.Tensor
///
/// `(x @ x).sum()` computed in Rust, as a float32 scalar tensor on x's device.
#[pyfunction(name = "matmul_sum")]
fn py_matmul_sum<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let x = take(x, "matmul_sum(x)")?;
    give(py, &matmul_sum(&x).map_err(torch_error)?)
}
// --8<-- [end:matmul_sum]

/// Rust half of step 01: `matmul_sum`, `roundtrip` and the versions it was built with.
#[pymodule]
fn bridge_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // torch must be loaded first: it owns libtorch_python, which `give` uses to build Python tensors.
    m.py().import("torch")?;
    m.add_function(wrap_pyfunction!(py_matmul_sum, m)?)?;
    m.add_function(wrap_pyfunction!(roundtrip, m)?)?;
    m.add("TCH_VERSION", env!("TCH_VERSION"))?;
    m.add("RUSTC_VERSION", env!("RUSTC_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ones_give_n_cubed() {
        let x = Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu));
        assert_eq!(matmul_sum(&x).unwrap().double_value(&[]), 64.0);
    }

    #[test]
    fn non_square_is_an_error_not_a_panic() {
        let x = Tensor::ones([2, 3], (Kind::Float, tch::Device::Cpu));
        let err = matmul_sum(&x).unwrap_err().to_string();
        assert!(err.contains("cannot be multiplied"), "{err}");
    }
}
