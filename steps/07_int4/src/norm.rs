//! Gemma 4's RMSNorm on the CPU in one call (src/norm.cpp), with the residual add after it when asked, bit for bit
//! what ATen's ops give (gemma.rs' `RmsNorm::forward_in_ops`, step 03's norm): a decode step runs 240 norms at E2B,
//! and ATen spends more dispatching their eight ops each than computing them — page 07's budget put the small ops
//! between the matrices at a sixth of a step. The only op whose bits depend on an order, the mean's float32 sum, is
//! summed in ATen's order (norm.cpp's header), so `weights="bf16"` stays step 03's engine bit for bit.
use tch::{Device, Kind, Tensor};

use crate::error::{invalid, Result};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn torchtpu_rms_norm(
        x: *const std::ffi::c_void,
        w: *const f32,
        residual: *const std::ffi::c_void,
        y: *mut std::ffi::c_void,
        rows: i64,
        n: i64,
        eps: f32,
        bf16: bool,
    );
}

/// Whether the kernel takes `x`: on the CPU, bf16 or float32 (as the compute dtype), a weight of float32 `[n]`.
pub fn takes(x: &Tensor, weight: Option<&Tensor>) -> bool {
    let n = x.size().last().copied().unwrap_or(0);
    x.device() == Device::Cpu
        && matches!(x.kind(), Kind::BFloat16 | Kind::Float)
        && n > 0
        && weight.is_none_or(|w| {
            w.kind() == Kind::Float && w.size() == [n] && w.is_contiguous() && w.device() == Device::Cpu
        })
}

/// `residual + x · (mean(x²) + eps)^-0.5 · w` over the last dim of `x` (no residual: the norm alone), in float32,
/// rounded to x's dtype (and the sum rounded again, as ATen's add of two bf16 tensors): ATen's bits. `takes` must
/// hold.
pub fn rms_norm(x: &Tensor, weight: Option<&Tensor>, eps: f64, residual: Option<&Tensor>) -> Result<Tensor> {
    if !takes(x, weight) || residual.is_some_and(|r| r.size() != x.size() || r.kind() != x.kind()) {
        return Err(invalid!(
            "torchtpu_rms_norm: x {:?} {:?}, weight {:?}, residual {:?}: need bf16 or float32 on the CPU, a float32 \
             weight [last dim], a residual like x",
            x.kind(),
            x.size(),
            weight.map(|w| (w.kind(), w.size())),
            residual.map(|r| (r.kind(), r.size()))
        ));
    }
    let x = x.f_contiguous()?;
    let residual = residual.map(Tensor::f_contiguous).transpose()?;
    let n = *x.size().last().expect("checked above");
    let y = x.f_empty_like()?;
    let null = std::ptr::null::<std::ffi::c_void>();
    // SAFETY: x, residual and y contiguous [rows, n] of one dtype (bf16 or float32), weight contiguous float32 [n]
    // (a parameter, made contiguous at load) or null, all on the host: checked above.
    unsafe {
        torchtpu_rms_norm(
            x.data_ptr(),
            weight.map_or(std::ptr::null(), |w| w.data_ptr() as *const f32),
            residual.as_ref().map_or(null, |r| r.data_ptr()),
            y.data_ptr(),
            x.numel() as i64 / n,
            n,
            eps as f32,
            x.kind() == Kind::BFloat16,
        );
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step 03's norm in ATen's ops (gemma.rs' `forward_in_ops`), the bits the kernel must give.
    fn in_ops(x: &Tensor, w: Option<&Tensor>, eps: f64) -> Tensor {
        let xf = x.to_kind(Kind::Float);
        let mean_square = xf.pow_tensor_scalar(2).mean_dim(-1, true, None::<Kind>);
        let mut y = &xf * mean_square.g_add_scalar(eps).pow_tensor_scalar(-0.5);
        if let Some(w) = w {
            y = y * w;
        }
        y.to_kind(x.kind())
    }

    #[test]
    fn it_gives_atens_bits_for_every_shape_dtype_and_scale() {
        let mut cases = 0;
        // E2B's hidden size, its heads (256, 512 wide) and per-layer inputs, the tiny model's, and rows whose length
        // is no multiple of a vector (a scalar tail) or shorter than one
        for shape in [[1, 1536], [8, 256], [1, 512], [35, 256], [4, 32], [3, 100], [2, 7], [1, 4100]] {
            for kind in [Kind::BFloat16, Kind::Float] {
                for (seed, scale) in [(0, 1.0), (1, 1e-3), (2, 300.0), (3, 1e-18)] {
                    tch::manual_seed(seed);
                    let x = (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * scale).to_kind(kind);
                    let w = Tensor::randn([shape[1]], (Kind::Float, Device::Cpu));
                    let residual = Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(kind);
                    for weight in [Some(&w), None] {
                        let ours = rms_norm(&x, weight, 1e-6, None).unwrap();
                        assert!(ours.equal(&in_ops(&x, weight, 1e-6)), "{shape:?} {kind:?} x{scale}");
                        let added = rms_norm(&x, weight, 1e-6, Some(&residual)).unwrap();
                        assert!(added.equal(&(&residual + in_ops(&x, weight, 1e-6))), "{shape:?} {kind:?} + residual");
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 8 * 2 * 4 * 2);
    }

    #[test]
    fn what_it_does_not_take_is_named() {
        let x = Tensor::ones([2, 8], (Kind::Half, Device::Cpu));
        let err = rms_norm(&x, None, 1e-6, None).unwrap_err().to_string();
        assert!(err.contains("torchtpu_rms_norm") && err.contains("Half"), "{err}");
        let x = Tensor::ones([2, 8], (Kind::Float, Device::Cpu));
        assert!(rms_norm(&x, Some(&Tensor::ones([7], (Kind::Float, Device::Cpu))), 1e-6, None).is_err());
    }
}
