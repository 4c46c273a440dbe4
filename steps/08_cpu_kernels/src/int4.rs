//! ATen's int4 kernel, as step 07 holds its linears: kept 4-bit in the kernel's layout and multiplied by it
//! (dot4.rs has this step's own kernels; linear.rs picks one).
//!
//! The checkpoint stores each weight as the nibble `q + 8` (q in -8..7), eight to an int32 word, low nibble first,
//! with one scale per group of columns. ATen's weight-only kernel (`aten::_weight_int4pack_mm_for_cpu`, torch
//! 2.13) takes exactly those unsigned nibbles and computes `(nibble - 8) · scale + zero` in float32: with every
//! zero point 0 the repack is a re-layout of the same bits, not a requantization. What the kernel takes (ATen's
//! `LinearAlgebra.cpp` and `cpu/int4mm_kernel.cpp`, checked by this step's tests):
//!
//! * the weight: int32 `[N, K]` of values 0..15, N a multiple of 16, K even; `_convert_weight_to_int4pack_for_cpu`
//!   turns it into uint8 `[N, K/2]`, two nibbles a byte, in blocks of 64 rows (AVX-512) or 32 (AVX2 and the
//!   scalar code): the layout depends on the CPU it is made on, so it is made at load and never saved;
//! * the activations: 2-D, contiguous, bfloat16, float16 or float32 — on x86 only bfloat16 has a vector kernel,
//!   the other two take a scalar loop;
//! * the group size: 32, 64, 128 or 256, dividing K;
//! * scales and zeros: `[K / group, N, 2]` in the activation dtype. ATen checks only its last two sizes: a
//!   shorter first one is read past its end, and a non-contiguous one is read as if it were contiguous, so this
//!   module makes and checks them itself.
use tch::{Device, Kind, Tensor};

use crate::bridge::on;
use crate::error::{invalid, Error, Result};
use crate::packed::{refuses, Packed, REPACK_ROWS};

/// The op that multiplies (named in every error about it).
pub const KERNEL: &str = "aten::_weight_int4pack_mm_for_cpu";

// --8<-- [start:int4]
/// A linear layer kept 4-bit: `y = x · Wᵀ` with `W[n, k] = (nibble - 8) · scale[n, k / group]`.
pub struct Int4Linear {
    /// uint8 `[out, in / 2]` in the kernel's layout.
    packed: Tensor,
    /// `[in / group, out, 2]`: (scale, 0) for each group and output row, in the activation dtype.
    scale_zeros: Tensor,
    group: i64,
    /// The activation dtype the scales were made for.
    act: Kind,
}

impl Int4Linear {
    /// Repacks the checkpoint's matrix `name` for the kernel, in blocks of `REPACK_ROWS` rows, on the host, then
    /// moves it to like's device. `act` is the activation dtype: the scales are cast to it (a bf16 scale stays
    /// exact; an f16 one is rounded to bf16 in bfloat16 mode, and stays exact in float32).
    pub fn new(name: &str, w: &Packed, act: Kind, like: &Tensor) -> Result<Int4Linear> {
        let (rows, cols) = (w.out_rows(), w.cols());
        let group = cols / w.groups();
        if let Some(why) = refuses(rows, cols, group) {
            return Err(Error::Unsupported(format!("{name}: {why}; load it with weights=\"bf16\"")));
        }
        let packed = Tensor::f_empty([rows, cols / 2], (Kind::Uint8, Device::Cpu))?;
        let mut start = 0;
        while start < rows {
            let n = REPACK_ROWS.min(rows - start);
            let nibbles = w.nibbles(start, n)?; // int32 [n, cols], 0..15: the stored q + 8, as it is
            let block = nibbles.f_internal_convert_weight_to_int4pack_for_cpu(1)?;
            packed.f_narrow(0, start, n)?.f_copy_(&block)?;
            start += n;
        }
        let scale = w.scale().f_to_kind(act)?.f_transpose(0, 1)?; // [groups, rows]
        let scale_zeros = Tensor::f_stack(&[&scale, &scale.f_zeros_like()?], -1)?.f_contiguous()?;
        Ok(Int4Linear { packed: on(&packed, like)?, scale_zeros: on(&scale_zeros, like)?, group, act })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.kind() != self.act || x.dim() != 2 {
            return Err(invalid!(
                "{KERNEL}: activations {:?} of shape {:?}, need 2-D {:?}",
                x.kind(),
                x.size(),
                self.act
            ));
        }
        Ok(x.f_contiguous()?.f_internal_weight_int4pack_mm_for_cpu(&self.packed, self.group, &self.scale_zeros)?)
    }

    /// The kernel's operands: the repacked nibbles and the scales with their zero points.
    pub fn parts(&self) -> (&Tensor, &Tensor) {
        (&self.packed, &self.scale_zeros)
    }

    /// Bytes one product reads: the nibbles, the scales and their zero points.
    /// Rows × columns: two nibbles a byte of `packed`.
    pub fn weights(&self) -> i64 {
        self.packed.numel() as i64 * 2
    }

    pub fn bytes(&self) -> i64 {
        let bytes = |t: &Tensor| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64;
        bytes(&self.packed) + bytes(&self.scale_zeros)
    }
}
// --8<-- [end:int4]

/// Whether the int4 kernel runs on like's device, tried on a small matrix and checked against the dequantized
/// product; `Err` says why not (on a GPU or a TPU: the op has no kernel there).
pub fn probe(like: &Tensor) -> std::result::Result<(), String> {
    let attempt = || -> std::result::Result<bool, tch::TchError> {
        let device = Device::Cpu;
        let nibbles = Tensor::f_arange(16 * 64, (Kind::Int, device))?.f_remainder(16)?.f_view([16, 64])?;
        let scale = Tensor::f_full([64 / 32, 16], 0.5, (Kind::BFloat16, device))?;
        let sz = Tensor::f_stack(&[&scale, &scale.f_zeros_like()?], -1)?.f_contiguous()?;
        let x = Tensor::f_ones([1, 64], (Kind::BFloat16, device))?;
        let (nib, sz, x) = (on(&nibbles, like)?, on(&sz, like)?, on(&x, like)?);
        let packed = nib.f_internal_convert_weight_to_int4pack_for_cpu(1)?;
        let y =
            x.f_internal_weight_int4pack_mm_for_cpu(&packed, 32, &sz)?.f_to_device(device)?.f_to_kind(Kind::Float)?;
        let want = nibbles.f_sub_scalar(8)?.f_to_kind(Kind::Float)?.f_mul_scalar(0.5)?.f_sum_dim_intlist(
            1,
            false,
            Kind::Float,
        )?;
        y.f_view([-1])?.f_allclose(&want, 0.0, 0.0, false)
    };
    match attempt() {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{KERNEL} ran on {:?} but gave wrong numbers", like.device())),
        Err(e) => {
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or(&msg).to_string();
            Err(format!("{KERNEL} does not run on this device ({first})"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::random_matrix;

    fn cpu() -> Tensor {
        Tensor::zeros([0], (Kind::Float, Device::Cpu))
    }

    #[test]
    fn shapes_the_kernel_cannot_take_are_named() {
        assert_eq!(refuses(2048, 1536, 32), None); // E2B's q_proj
        assert_eq!(refuses(262144, 1536, 32), None); // its head
        assert!(refuses(40, 64, 32).unwrap().contains("40 rows"));
        assert!(refuses(32, 64, 16).unwrap().contains("group_size 16: the int4 kernels take"));
        assert!(refuses(32, 96, 64).unwrap().contains("96 columns are not a multiple of group_size 64"));
        let error = Int4Linear::new("model.layers.0.mlp.up_proj", &random_matrix(40, 64, 0), Kind::BFloat16, &cpu());
        let Err(Error::Unsupported(msg)) = error else { panic!("a 40-row matrix must be refused") };
        assert!(msg.starts_with("model.layers.0.mlp.up_proj: 40 rows") && msg.ends_with("weights=\"bf16\""), "{msg}");
    }

    #[test]
    fn the_kernel_runs_on_the_cpu() {
        assert_eq!(probe(&cpu()), Ok(()));
    }

    #[test]
    fn through_the_kernel_the_weights_are_the_dequantized_ones() {
        // Identity activations: y[k, n] = W[n, k], one product each, (q · scale) rounded once to bf16 — what
        // compressed-tensors' dequantization gives. 1,072 rows: a block of REPACK_ROWS and a remainder of 48.
        let (rows, cols) = (REPACK_ROWS + 48, 64);
        let w = random_matrix(rows, cols, 1);
        let linear = Int4Linear::new("w", &w, Kind::BFloat16, &cpu()).unwrap();
        let y = linear.forward(&Tensor::eye(cols, (Kind::BFloat16, Device::Cpu))).unwrap();
        assert_eq!(y.size(), [cols, rows]);
        assert!(y.tr().equal(&w.dequantize().unwrap()));
        assert_eq!(linear.bytes(), rows * cols / 2 + (cols / 32) * rows * 2 * 2);
        // the activations must be what the scales were made for
        let x = Tensor::ones([1, cols], (Kind::Float, Device::Cpu));
        assert!(matches!(linear.forward(&x), Err(Error::Invalid(_))));
        assert!(matches!(linear.forward(&x.to_kind(Kind::BFloat16).unsqueeze(0)), Err(Error::Invalid(_))));
    }
}
