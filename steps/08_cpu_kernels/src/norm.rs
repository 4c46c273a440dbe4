//! Gemma 4's RMSNorm on the CPU in one call (src/norm.cpp), with the residual add or the rotary embedding after it
//! when asked, bit for bit what ATen's ops give (gemma.rs' `RmsNorm::forward_in_ops` and `Rotation::rotate`, step 03's): a decode step runs 240 norms at E2B,
//! and ATen spends more dispatching their eight ops each than computing them — the budget
//! (docs/steps/08_cpu_kernels/budget.md) put the small ops between the matrices at a sixth of a step. The only op whose bits depend on an order, the mean's float32 sum, is
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
        y_stride: i64,
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
    checked(x, weight, &after)?;
    let y = x.f_empty_like()?;
    let n = x.size().last().copied().expect("checked");
    // SAFETY: checked; y is a fresh tensor like x, contiguous: its rows n apart
    unsafe { run(x, weight, eps, &after, y.data_ptr(), n)? };
    Ok(y)
}

/// `rms_norm` of one token's heads `x [1, heads, n]`, each head's row written into `slot` of `cache [heads, slots, n]`
/// (contiguous, of x's dtype) in place of a new tensor: a decode step's keys or values straight into their cache,
/// with no copy of them to make. The other slots are left as they are.
pub fn rms_norm_into(
    x: &Tensor,
    weight: Option<&Tensor>,
    eps: f64,
    after: After,
    cache: &Tensor,
    slot: i64,
) -> Result<()> {
    let (size, slots) = (x.size(), cache.size().get(1).copied().unwrap_or(0));
    let fits = size.len() == 3
        && size[0] == 1
        && cache.size() == [size[1], slots, size[2]]
        && (0..slots).contains(&slot)
        && cache.kind() == x.kind()
        && cache.device() == x.device()
        && cache.is_contiguous();
    if !fits {
        return Err(invalid!(
            "torchtpu_rms_norm: x {:?} {:?} into slot {slot} of a cache {:?} {:?}: need one token's heads [1, heads, \
             n] and a contiguous cache [heads, slots, n] of x's dtype with 0 <= slot < slots",
            x.kind(),
            size,
            cache.kind(),
            cache.size()
        ));
    }
    checked(x, weight, &after)?;
    let n = size[2];
    // SAFETY: the cache is contiguous [heads, slots, n] of x's dtype on x's device (checked above, and `run` checks x
    // and the rest): head h's row at slot lies at (h · slots + slot) · n, so from the slot's first row on, rows are
    // slots · n apart and the last ends within the cache
    unsafe {
        let at = (cache.data_ptr() as *mut u8).add((slot * n) as usize * x.kind().elt_size_in_bytes());
        run(x, weight, eps, &after, at as *mut c_void, slots * n)
    }
}

/// Whether the kernel takes x, the weight and what follows the norm (`takes`, and what `after` holds shaped for x),
/// or an error naming each.
fn checked(x: &Tensor, weight: Option<&Tensor>, after: &After) -> Result<()> {
    let size = x.size();
    let like_x = |t: &Tensor, shape: &[i64]| t.kind() == x.kind() && t.size() == shape && t.device() == x.device();
    let fits = takes(x, weight)
        && match after {
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
            match after {
                After::Nothing => "nothing".to_string(),
                After::Added(r) => format!("+ residual {:?}", what(r)),
                After::AddedScaled(r, s) => format!("+ residual {:?}, times {:?}", what(r), what(s)),
                After::Rotated { cos, sin } => format!("rotated by cos {:?}, sin {:?}", what(cos), what(sin)),
            }
        ));
    }
    Ok(())
}

/// Runs the kernel on x into y, rows `y_stride` values apart.
///
/// # Safety
/// `checked(x, weight, after)` holds; y holds x's rows of its dtype, `y_stride` values apart, each of x's last dim.
unsafe fn run(
    x: &Tensor,
    weight: Option<&Tensor>,
    eps: f64,
    after: &After,
    y: *mut c_void,
    y_stride: i64,
) -> Result<()> {
    let size = x.size();
    let n = *size.last().expect("checked");
    let x = x.f_contiguous()?;
    let contiguous = |t: &Tensor| t.f_contiguous();
    let (residual, scale, cos, sin) = match after {
        After::Nothing => (None, None, None, None),
        After::Added(r) => (Some(contiguous(r)?), None, None, None),
        After::AddedScaled(r, s) => (Some(contiguous(r)?), Some(contiguous(s)?), None, None),
        After::Rotated { cos, sin } => (None, None, Some(contiguous(cos)?), Some(contiguous(sin)?)),
    };
    let heads = if cos.is_some() { size[1] } else { 1 };
    let pointer = |t: &Option<Tensor>| t.as_ref().map_or(std::ptr::null(), |t| t.data_ptr() as *const c_void);
    // SAFETY: x and residual contiguous [rows, n] of one dtype (bf16 or float32), cos and sin contiguous [rows /
    // heads, n] of it, weight contiguous float32 [n] or null, all on the host (`checked`); y as the caller says.
    unsafe {
        torchtpu_rms_norm(
            x.data_ptr(),
            weight.map_or(std::ptr::null(), |w| w.data_ptr() as *const f32),
            pointer(&residual),
            pointer(&scale),
            pointer(&cos),
            pointer(&sin),
            heads,
            y,
            y_stride,
            x.numel() as i64 / n,
            n,
            eps as f32,
            x.kind() == Kind::BFloat16,
        );
    }
    Ok(())
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
    fn into_a_cache_slot_it_writes_those_bits_there_and_nothing_else() {
        // E2B's k (1 head of 512, rotated) and v (1 head of 256, no weight), and two heads of 32
        for (heads, d, rotated) in [(1, 512, true), (1, 256, false), (2, 32, true)] {
            for kind in [Kind::BFloat16, Kind::Float] {
                tch::manual_seed(heads * 100 + d);
                let x = Tensor::randn([1, heads, d], (Kind::Float, Device::Cpu)).to_kind(kind);
                let w = Tensor::randn([d], (Kind::Float, Device::Cpu));
                let angles = Tensor::randn([1, 1, d], (Kind::Float, Device::Cpu)) * 100.0;
                let (cos, sin) = (angles.cos().to_kind(kind), angles.sin().to_kind(kind));
                let after = || if rotated { After::Rotated { cos: &cos, sin: &sin } } else { After::Nothing };
                let weight = rotated.then_some(&w);
                let cache = Tensor::randn([heads, 6, d], (Kind::Float, Device::Cpu)).to_kind(kind);
                let before = cache.copy();
                rms_norm_into(&x, weight, 1e-6, after(), &cache, 4).unwrap();
                let expected = before.copy();
                expected.narrow(1, 4, 1).copy_(&rms_norm(&x, weight, 1e-6, after()).unwrap().transpose(0, 1));
                assert!(cache.equal(&expected), "{heads} heads of {d}, {kind:?}");
                // a slot past the end, a cache of another dtype or head count: refused, the cache untouched
                let other = if kind == Kind::Float { Kind::BFloat16 } else { Kind::Float };
                for (bad, slot) in [
                    (&cache, 6),
                    (&cache.to_kind(other), 0),
                    (&Tensor::zeros([heads + 1, 6, d], (kind, Device::Cpu)), 0),
                ] {
                    let err = rms_norm_into(&x, weight, 1e-6, after(), bad, slot).unwrap_err().to_string();
                    assert!(err.contains("into slot"), "{err}");
                }
                assert!(cache.equal(&expected));
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
