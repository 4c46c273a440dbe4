//! Step 02: build against exactly the torch that tch was generated for, and reach a device that
//! `tch::Device` has no name for.
//!
//! `tch::Device` knows the CPU, CUDA, MPS and Vulkan, not a TPU. But a tensor that Python created on
//! `tpu:0` carries its device with it, and libtorch's `type_as` moves a tensor to another tensor's device
//! and dtype. So Rust never names the device: it follows a tensor that already lives there.
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tch::{Device, Kind, TchError, Tensor};

// Step 01's bridge, copied forward unchanged.
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

// --8<-- [start:on]
/// `t` moved to `like`'s device, keeping its own dtype.
///
/// `type_as` alone would also convert `t` to like's dtype, so `like` is first given t's dtype. When `t`
/// already is there, libtorch returns it as it is: no copy.
pub fn on(t: &Tensor, like: &Tensor) -> Result<Tensor, TchError> {
    t.f_type_as(&like.f_to_kind(t.kind())?)
}
// --8<-- [end:on]

/// The tch `Kind` for a torch dtype name such as `"bfloat16"`; the error names the value and the choices.
pub fn kind_from_name(name: &str) -> PyResult<Kind> {
    Ok(match name {
        "float32" => Kind::Float,
        "bfloat16" => Kind::BFloat16,
        "float16" => Kind::Half,
        "float64" => Kind::Double,
        "int64" => Kind::Int64,
        "int32" => Kind::Int,
        "uint8" => Kind::Uint8,
        "bool" => Kind::Bool,
        _ => {
            return Err(PyValueError::new_err(format!(
                "dtype={name:?} is not supported: use float32, bfloat16, float16, float64, int64, int32, uint8 or bool"
            )))
        }
    })
}

/// on(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor
///
/// `t` on `like`'s device with t's own dtype, moved by Rust (`t.type_as(like.to(t.dtype))`).
#[pyfunction(name = "on")]
fn py_on<'py>(py: Python<'py>, t: &Bound<'py, PyAny>, like: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let moved = on(&take(t, "on(t)")?, &take(like, "on(like)")?).map_err(torch_error)?;
    give(py, &moved)
}

// --8<-- [start:arange_on]
/// arange_on(n: int, like: torch.Tensor, dtype: str = "float32") -> torch.Tensor
///
/// `0, 1, …, n-1` built in Rust on the host, then moved to like's device: the way the engine loads weights.
#[pyfunction]
#[pyo3(signature = (n, like, dtype = "float32"))]
fn arange_on<'py>(py: Python<'py>, n: i64, like: &Bound<'py, PyAny>, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
    if n < 0 {
        return Err(PyValueError::new_err(format!("arange_on(n): n must be >= 0, got {n}")));
    }
    let host = Tensor::f_arange(n, (kind_from_name(dtype)?, Device::Cpu)).map_err(torch_error)?;
    give(py, &on(&host, &take(like, "arange_on(like)")?).map_err(torch_error)?)
}
// --8<-- [end:arange_on]

/// Rust half of step 02: `on`, `arange_on`, and the torch release this build is tied to.
#[pymodule]
fn pin_torch_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // torch must be loaded first: it owns libtorch_python, which `give` uses to build Python tensors.
    m.py().import("torch")?;
    m.add_function(wrap_pyfunction!(py_on, m)?)?;
    m.add_function(wrap_pyfunction!(arange_on, m)?)?;
    m.add("BUILT_WITH_TORCH", env!("BUILT_WITH_TORCH"))?;
    m.add("TCH_VERSION", env!("TCH_VERSION"))?;
    m.add("RUSTC_VERSION", env!("RUSTC_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_keeps_dtype_and_does_not_copy_in_place() {
        let like = Tensor::zeros([1], (Kind::Float, Device::Cpu));
        for kind in [Kind::Float, Kind::BFloat16, Kind::Half, Kind::Int64, Kind::Int, Kind::Uint8, Kind::Bool] {
            let t = Tensor::ones([3], (kind, Device::Cpu));
            let moved = on(&t, &like).unwrap();
            assert_eq!(moved.kind(), kind);
            assert_eq!(moved.data_ptr(), t.data_ptr(), "{kind:?}: already on the device, so no copy");
        }
    }
}
