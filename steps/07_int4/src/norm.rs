//! Gemma 4's RMSNorm on the CPU in one call (src/norm.cpp), with the residual add or the rotary embedding after it
//! when asked, bit for bit what ATen's ops give (gemma.rs' `RmsNorm::forward_in_ops` and `Rotation::rotate`, step 03's): a decode step runs 240 norms at E2B,
//! and ATen spends more dispatching their eight ops each than computing them — page 07's budget put the small ops
//! between the matrices at a sixth of a step. The only op whose bits depend on an order, the mean's float32 sum, is
//! summed in ATen's order (norm.cpp's header), so `weights="bf16"` stays step 03's engine bit for bit.
use std::ffi::c_void;

use tch::{Device, Kind, Tensor};

use crate::error::{invalid, Result};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn torchtpu_rms_norm(
        x: *const c_void,
        w: *const f32,
        residual: *const c_void,
        scale: *const c_void,
        cos: *const c_void,
        sin: *const c_void,
        heads: i64,
        y: *mut c_void,
        rows: i64,
        n: i64,
        eps: f32,
        bf16: bool,
    );
}

/// What the kernel does after the norm.
pub enum After<'a> {
    Nothing,
    /// `residual + norm(x)`: a residual branch's end; residual shaped as x.
    Added(&'a Tensor),
    /// `(residual + norm(x)) · scale`, scale one value of x's dtype: the decoder layer's last branch and its scalar.
    AddedScaled(&'a Tensor, &'a Tensor),
    /// `rotate(norm(x))` (gemma.rs' `Rotation::rotate`) for x `[tokens, heads, d]`, cos and sin `[tokens, 1, d]`.
    Rotated {
        cos: &'a Tensor,
        sin: &'a Tensor,
    },
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

/// `x · (mean(x²) + eps)^-0.5 · w` over the last dim of `x`, in float32, rounded to x's dtype, then `after` it (each
/// step rounded as ATen's op on tensors of x's dtype rounds): ATen's bits. `takes` must hold.
pub fn rms_norm(x: &Tensor, weight: Option<&Tensor>, eps: f64, after: After) -> Result<Tensor> {
    let size = x.size();
    let like_x = |t: &Tensor, shape: &[i64]| t.kind() == x.kind() && t.size() == shape && t.device() == x.device();
    let fits = takes(x, weight)
        && match &after {
            After::Nothing => true,
            After::Added(residual) => like_x(residual, &size),
            After::AddedScaled(residual, scale) => like_x(residual, &size) && like_x(scale, &[1]),
            After::Rotated { cos, sin } => {
                size.len() == 3 && size[2] % 2 == 0 && [cos, sin].iter().all(|t| like_x(t, &[size[0], 1, size[2]]))
            }
        };
    if !fits {
        let what = |t: &Tensor| (t.kind(), t.size());
        return Err(invalid!(
            "torchtpu_rms_norm: x {:?}, weight {:?}, then {}: need bf16 or float32 on the CPU, a float32 weight [last \
             dim], a residual like x, or cos and sin [tokens, 1, d] of x's dtype for x [tokens, heads, d]",
            what(x),
            weight.map(what),
            match &after {
                After::Nothing => "nothing".to_string(),
                After::Added(r) => format!("+ residual {:?}", what(r)),
                After::AddedScaled(r, s) => format!("+ residual {:?}, times {:?}", what(r), what(s)),
                After::Rotated { cos, sin } => format!("rotated by cos {:?}, sin {:?}", what(cos), what(sin)),
            }
        ));
    }
    let n = *size.last().expect("checked above");
    let x = x.f_contiguous()?;
    let contiguous = |t: &Tensor| t.f_contiguous();
    let (residual, scale, cos, sin) = match &after {
        After::Nothing => (None, None, None, None),
        After::Added(r) => (Some(contiguous(r)?), None, None, None),
        After::AddedScaled(r, s) => (Some(contiguous(r)?), Some(contiguous(s)?), None, None),
        After::Rotated { cos, sin } => (None, None, Some(contiguous(cos)?), Some(contiguous(sin)?)),
    };
    let heads = if cos.is_some() { size[1] } else { 1 };
    let y = x.f_empty_like()?;
    let pointer = |t: &Option<Tensor>| t.as_ref().map_or(std::ptr::null(), |t| t.data_ptr() as *const c_void);
    // SAFETY: x, residual and y contiguous [rows, n] of one dtype (bf16 or float32), cos and sin contiguous [rows /
    // heads, n] of it, weight contiguous float32 [n] or null, all on the host: checked above.
    unsafe {
        torchtpu_rms_norm(
            x.data_ptr(),
            weight.map_or(std::ptr::null(), |w| w.data_ptr() as *const f32),
            pointer(&residual),
            pointer(&scale),
            pointer(&cos),
            pointer(&sin),
            heads,
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
                        let ours = rms_norm(&x, weight, 1e-6, After::Nothing).unwrap();
                        assert!(ours.equal(&in_ops(&x, weight, 1e-6)), "{shape:?} {kind:?} x{scale}");
                        let added = rms_norm(&x, weight, 1e-6, After::Added(&residual)).unwrap();
                        assert!(added.equal(&(&residual + in_ops(&x, weight, 1e-6))), "{shape:?} {kind:?} + residual");
                        let scale = (Tensor::rand([1], (Kind::Float, Device::Cpu)) * 2.0).to_kind(kind);
                        let scaled = rms_norm(&x, weight, 1e-6, After::AddedScaled(&residual, &scale)).unwrap();
                        let theirs = (&residual + in_ops(&x, weight, 1e-6)) * &scale;
                        assert!(scaled.equal(&theirs), "{shape:?} {kind:?} + residual, scaled");
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 8 * 2 * 4 * 2);
    }

    /// Step 03's rotation (gemma.rs' `Rotation::rotate`) in ATen's ops.
    fn rotated_in_ops(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let half = x.size()[2] / 2;
        let turned = Tensor::cat(&[x.narrow(2, half, half).neg(), x.narrow(2, 0, half)], -1);
        x * cos + turned * sin
    }

    #[test]
    fn with_the_rotation_after_it_it_gives_atens_bits() {
        // E2B's q (8 heads of 256) and k (1 head of 512), a prompt chunk's tokens, the tiny model's heads
        for (tokens, heads, d) in [(1, 8, 256), (1, 1, 512), (5, 8, 256), (3, 4, 32)] {
            for kind in [Kind::BFloat16, Kind::Float] {
                tch::manual_seed(tokens * 1000 + d);
                let x = Tensor::randn([tokens, heads, d], (Kind::Float, Device::Cpu)).to_kind(kind);
                let w = Tensor::randn([d], (Kind::Float, Device::Cpu));
                let angles = Tensor::randn([tokens, 1, d], (Kind::Float, Device::Cpu)) * 100.0;
                let (cos, sin) = (angles.cos().to_kind(kind), angles.sin().to_kind(kind));
                let ours = rms_norm(&x, Some(&w), 1e-6, After::Rotated { cos: &cos, sin: &sin }).unwrap();
                let theirs = rotated_in_ops(&in_ops(&x, Some(&w), 1e-6), &cos, &sin);
                assert!(ours.equal(&theirs), "{tokens} tokens, {heads} heads of {d}, {kind:?}");
            }
        }
    }

    #[test]
    fn what_it_does_not_take_is_named() {
        let x = Tensor::ones([2, 8], (Kind::Half, Device::Cpu));
        let err = rms_norm(&x, None, 1e-6, After::Nothing).unwrap_err().to_string();
        assert!(err.contains("torchtpu_rms_norm") && err.contains("Half"), "{err}");
        let x = Tensor::ones([2, 8], (Kind::Float, Device::Cpu));
        assert!(rms_norm(&x, Some(&Tensor::ones([7], (Kind::Float, Device::Cpu))), 1e-6, After::Nothing).is_err());
        let cos = Tensor::ones([2, 1, 8], (Kind::Float, Device::Cpu));
        let err = rms_norm(&x, None, 1e-6, After::Rotated { cos: &cos, sin: &cos }).unwrap_err().to_string();
        assert!(err.contains("rotated by cos"), "{err}");
    }
}
