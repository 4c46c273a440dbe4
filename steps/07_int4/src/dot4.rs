//! This step's own int4 matmul, for CPUs with AVX512-BF16 (an Intel Xeon with AMX; an AMD EPYC Zen 4): the kernel
//! is src/dot4.cpp, whose header draws its layout.
//!
//! Why a kernel of our own: ATen's (int4.rs) spends more instructions per weight than memory takes to deliver it
//! — per weight a table lookup, a dequantizing multiply-add and the product's — so on two cores a decode step
//! waits on its arithmetic, not on memory (step 05's bench times one E2B mat-vec through each kernel).
//! Here a shift and one logic instruction turn 8 stored nibbles into 4 bf16 pairs `128 + nibble`, and one
//! `vdpbf16ps` multiplies a pair by the activations' pair and adds both products into float32: the same W4A16
//! arithmetic, exact products, float32 sums, scales applied once per group. It reads the checkpoint's scales as
//! float32 (bf16 and f16 are both exact there), so the emb4 twin's f16 scales are kept exactly, where ATen's kernel
//! takes them rounded to bf16.
use tch::{Device, Kind, Tensor};

use crate::error::{invalid, Error, Result};
use crate::int4::{refuses, REPACK_ROWS};
use crate::weights::Packed;

extern "C" {
    fn torchtpu_dot4_runs() -> bool;
    fn torchtpu_dot4_mm(x: *const u16, w: *const i32, s: *const f32, y: *mut u16, m: i64, n: i64, k: i64, group: i64);
}

/// The kernel (named in every error about it).
pub const KERNEL: &str = "torchtpu_dot4_mm";

/// Whether this CPU has the instructions the kernel uses (AVX-512 F and BW, and AVX512-BF16's `vdpbf16ps`).
pub fn runs() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    unsafe { torchtpu_dot4_runs() }
}

/// Where the kernel wants nibble `j` of a checkpoint word (which holds it at bit `4j`): the nibbles of columns
/// `k + 2i` and `k + 2i + 1` at bits `4i` and `16 + 4i`, so one shift brings both to the bottom of a bf16 half.
fn bit(j: i64) -> i64 {
    4 * (j / 2) + 16 * (j % 2)
}

// --8<-- [start:dot4]
/// A linear layer kept 4-bit for `torchtpu_dot4_mm`: `y = x · Wᵀ`, `W[n, k] = (nibble - 8) · scale[n, k / group]`.
/// It takes the shapes ATen's kernel takes (`int4::refuses`), so either kernel loads the same checkpoints.
pub struct Dot4Linear {
    /// int32 `[out / 16, in / 8, 16]`: for each block of 16 output rows, the rows' words side by side, column
    /// octet after octet, so a block's weights are one stream.
    words: Tensor,
    /// float32 `[out / 16, in / group, 16]`: the 16 rows' scales of each group, side by side.
    scales: Tensor,
    group: i64,
}

impl Dot4Linear {
    /// Re-lays the checkpoint's matrix `name` for the kernel, `REPACK_ROWS` rows at a time (a whole head's int32
    /// nibbles would be 1.6 GB): the same nibbles, moved within each word and gathered into blocks of 16 rows.
    pub fn new(name: &str, w: &Packed) -> Result<Dot4Linear> {
        let (rows, cols) = (w.out_rows(), w.cols());
        let group = cols / w.groups();
        if let Some(why) = refuses(rows, cols, group) {
            return Err(Error::Unsupported(format!("{name}: {why}; load it with weights=\"bf16\"")));
        }
        if !runs() {
            return Err(Error::Unsupported(format!("{name}: {KERNEL} needs a CPU with AVX512-BF16")));
        }
        let words = Tensor::f_empty([rows / 16, cols / 8, 16], (Kind::Int, Device::Cpu))?;
        let mut start = 0;
        while start < rows {
            let n = REPACK_ROWS.min(rows - start);
            let nibbles = w.nibbles(start, n)?.f_view([n, cols / 8, 8])?; // the stored q + 8, 0..15
            let mut moved = nibbles.f_select(2, 0)?; // nibble 0 stays at bit 0
            for j in 1..8 {
                moved =
                    moved.f_bitwise_or_tensor(&nibbles.f_select(2, j)?.f_bitwise_left_shift_tensor_scalar(bit(j))?)?;
            }
            let blocks = moved.f_view([n / 16, 16, cols / 8])?.f_transpose(1, 2)?;
            words.f_narrow(0, start / 16, n / 16)?.f_copy_(&blocks)?;
            start += n;
        }
        let scale = w.scale().f_to_kind(Kind::Float)?; // exact for bf16 and f16 alike
        let scales = scale.f_view([rows / 16, 16, cols / group])?.f_transpose(1, 2)?.f_contiguous()?;
        Ok(Dot4Linear { words, scales, group })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [blocks, octets, _] = self.words.size()[..] else { unreachable!("words are 3-D") };
        let (rows, cols) = (blocks * 16, octets * 8);
        if x.kind() != Kind::BFloat16 || x.dim() != 2 || x.size()[1] != cols || x.device() != Device::Cpu {
            return Err(invalid!(
                "{KERNEL}: activations {:?} of shape {:?} on {:?}, need 2-D bfloat16 [tokens, {cols}] on the CPU",
                x.kind(),
                x.size(),
                x.device()
            ));
        }
        let x = x.f_contiguous()?;
        let m = x.size()[0];
        let y = Tensor::f_empty([m, rows], (Kind::BFloat16, Device::Cpu))?;
        if m > 0 {
            // SAFETY: x is contiguous bf16 [m, cols], y bf16 [m, rows], words and scales contiguous in the layout
            // above (made in `new`), all on the host; shapes checked here and in `new` (rows % 16, cols % group,
            // group % 8), which is all the kernel assumes.
            unsafe {
                torchtpu_dot4_mm(
                    x.data_ptr() as *const u16,
                    self.words.data_ptr() as *const i32,
                    self.scales.data_ptr() as *const f32,
                    y.data_ptr() as *mut u16,
                    m,
                    rows,
                    cols,
                    self.group,
                );
            }
        }
        Ok(y)
    }

    /// Bytes one product reads: the words and the scales.
    pub fn bytes(&self) -> i64 {
        let bytes = |t: &Tensor| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64;
        bytes(&self.words) + bytes(&self.scales)
    }
}
// --8<-- [end:dot4]

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int4::tests::{random_matrix, random_matrix_scaled_in};

    #[test]
    fn each_nibble_lands_where_the_kernel_reads_it() {
        // columns k + 2i and k + 2i + 1 at bits 4i and 16 + 4i
        assert_eq!((0..8).map(bit).collect::<Vec<_>>(), [0, 16, 4, 20, 8, 24, 12, 28]);
    }

    /// y's difference from the exact product `x · Wᵀ` (W unrounded), in bf16 steps of the exact value (0.5 or
    /// less: exactly rounded), and whether every output is within what the kernel's float32 sums can miss by.
    /// Each group's sum runs over `128 + nibble`, about 136 · Σ|x| in size, before 136 · Σx is taken off: a
    /// handful of float32 roundings of that size per group (2^-19 of it allows 32), then the output's rounding to
    /// bf16. Where an output's terms nearly cancel, that is many steps of the small exact value.
    fn steps_off(y: &Tensor, x: &Tensor, w: &Packed) -> (Tensor, bool) {
        // (q - 8) · scale unrounded, as both int4 kernels take it (the bf16 path rounds it to bf16 first)
        let q = w.nibbles(0, w.out_rows()).unwrap().to_kind(Kind::Double) - 8.0;
        let scale = w.scale().to_kind(Kind::Double).repeat_interleave_self_int(w.cols() / w.groups(), 1, None);
        let x = x.to_kind(Kind::Double);
        let exact = x.matmul(&(q * &scale).tr());
        let step = exact.abs().clamp_min(1e-30).log2().floor().exp2() / 128.0; // a bf16 step at |exact|
        let err = (y.to_kind(Kind::Double) - &exact).abs();
        let x_per_group = x.abs().view([x.size()[0], w.groups(), -1]).sum_dim_intlist(-1, false, Kind::Double);
        let sums = x_per_group.matmul(&w.scale().to_kind(Kind::Double).tr()) * 136.0;
        let within = err.le_tensor(&(sums / 524288.0 + &step)).all().int64_value(&[]) == 1;
        (err / step, within)
    }

    #[test]
    fn the_product_is_the_exact_one_rounded_once() {
        if !runs() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        // 1,072 rows: a block of REPACK_ROWS and a remainder of 48, with 1 to 5 rows of x (every tile size, and
        // two tiles); E2B's q_proj [2048 × 1536] with a decode step's row and a few; f16 scales, as the emb4
        // twin's tables have them (exact in float32: nothing is rounded to bf16 first)
        let cases = [
            (REPACK_ROWS + 48, 192, Kind::BFloat16, 1..=5),
            (2048, 1536, Kind::BFloat16, 1..=4),
            (256, 1536, Kind::Half, 1..=2),
        ];
        for (rows, cols, scale_kind, ms) in cases {
            let w = random_matrix_scaled_in(rows, cols, 2, scale_kind);
            let linear = Dot4Linear::new("w", &w).unwrap();
            assert_eq!(linear.bytes(), rows * cols / 2 + rows * (cols / 32) * 4);
            for m in ms {
                let x = Tensor::randn([m, cols], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                let y = linear.forward(&x).unwrap();
                assert_eq!(y.size(), [m, rows]);
                let (off, within) = steps_off(&y, &x, &w);
                assert!(within, "[{rows} × {cols}], m={m}: {} steps off", off.max().double_value(&[]));
                let rounded = off.le(0.5 + 1e-6).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
                assert!(rounded > 0.99, "[{rows} × {cols}], m={m}: only {rounded} exactly rounded");
            }
        }
        // identity activations: one product each, (q - 8) · scale rounded once to bf16, the dequantized weight
        let w = random_matrix(REPACK_ROWS + 48, 192, 3);
        let linear = Dot4Linear::new("w", &w).unwrap();
        let y = linear.forward(&Tensor::eye(192, (Kind::BFloat16, Device::Cpu))).unwrap();
        assert!(y.tr().equal(&w.dequantize().unwrap()));
        // and no rows at all
        let none = linear.forward(&Tensor::zeros([0, 192], (Kind::BFloat16, Device::Cpu))).unwrap();
        assert_eq!(none.size(), [0, REPACK_ROWS + 48]);
    }

    #[test]
    fn what_the_kernel_cannot_take_is_named() {
        let error = Dot4Linear::new("model.layers.0.mlp.up_proj", &random_matrix(40, 64, 0));
        let Err(Error::Unsupported(msg)) = error else { panic!("a 40-row matrix must be refused") };
        assert!(msg.starts_with("model.layers.0.mlp.up_proj: 40 rows"), "{msg}");
        if !runs() {
            return;
        }
        let linear = Dot4Linear::new("w", &random_matrix(32, 64, 0)).unwrap();
        for x in [
            Tensor::ones([1, 64], (Kind::Float, Device::Cpu)),
            Tensor::ones([1, 1, 64], (Kind::BFloat16, Device::Cpu)),
            Tensor::ones([1, 32], (Kind::BFloat16, Device::Cpu)),
        ] {
            let Err(Error::Invalid(msg)) = linear.forward(&x) else { panic!("{:?} must be refused", x.size()) };
            assert!(msg.starts_with("torchtpu_dot4_mm: activations"), "{msg}");
        }
    }
}
