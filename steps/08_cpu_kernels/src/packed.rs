//! The checkpoint's W4A16 "pack-quantized" matrix, as stored, and the shapes this step's int4 kernels take.
//!
//! The bottom of step 08's int4 modules: `int4` (ATen's kernel) and `dot4` (this step's own two) repack a `Packed`
//! for their kernels; `linear` picks a kernel; `weights` reads a `Packed` from the checkpoint.
use tch::{Device, Kind, Tensor};

use crate::bridge::on;
use crate::error::Result;

/// The group sizes every int4 kernel here takes (ATen's, and this step's two, which share its limits).
pub const GROUPS: [i64; 4] = [32, 64, 128, 256];
/// Rows repacked at a time: a multiple of ATen's kernel's row block (64), so the blocks' bytes are the whole's, and
/// small enough that the int32 nibbles of a block (6 MB at E2B width) never add up to a whole head (1.6 GB).
pub const REPACK_ROWS: i64 = 1024;

// --8<-- [start:check]
/// Why the int4 kernels cannot take a `[rows, cols]` weight with groups of `group` columns, if they cannot.
pub fn refuses(rows: i64, cols: i64, group: i64) -> Option<String> {
    if !GROUPS.contains(&group) {
        Some(format!("group_size {group}: the int4 kernels take groups of 32, 64, 128 or 256 columns"))
    } else if cols % group != 0 {
        Some(format!("{cols} columns are not a multiple of group_size {group}"))
    } else if rows % 16 != 0 {
        Some(format!("{rows} rows: the kernels' layouts need a multiple of 16"))
    } else {
        None
    }
}
// --8<-- [end:check]

/// An int4 matrix kept packed: 8 values per int32 word, low nibble first, stored as `q + 8`, with one scale
/// per group of columns. Dequantized as compressed-tensors does: `q` times its scale, rounded once to the
/// scale's dtype (bf16, or f16 in the emb4 tables).
pub struct Packed {
    packed: Tensor, // int32 [rows, ceil(cols / 8)]
    scale: Tensor,  // bf16 or f16 [rows, cols / group]
    shifts: Tensor, // int32 [0, 4, …, 28]: where each nibble sits in a word
    cols: i64,
}

impl Packed {
    pub fn new(packed: Tensor, scale: Tensor, cols: i64) -> Result<Packed> {
        let shifts = Tensor::f_arange_start_step(0, 32, 4, (Kind::Int, Device::Cpu))?;
        Ok(Packed { packed, scale, shifts, cols })
    }

    /// The same matrix, still packed, on like's device.
    pub fn on(&self, like: &Tensor) -> Result<Packed> {
        let (packed, scale, shifts) = (on(&self.packed, like)?, on(&self.scale, like)?, on(&self.shifts, like)?);
        Ok(Packed { packed, scale, shifts, cols: self.cols })
    }

    pub(crate) fn unpack(packed: &Tensor, scale: &Tensor, shifts: &Tensor, cols: i64) -> Result<Tensor> {
        let nibbles = packed.f_unsqueeze(-1)?.f_bitwise_right_shift(shifts)?.f_bitwise_and(0xF)?;
        let q = nibbles.f_flatten(-2, -1)?.f_narrow(-1, 0, cols)?.f_sub_scalar(8)?; // offset binary -> [-8, 7]
        let groups = scale.size()[1];
        let w = q.f_to_kind(scale.kind())?.f_unflatten(-1, [groups, cols / groups])?.f_mul(&scale.f_unsqueeze(-1)?)?;
        Ok(w.f_flatten(-2, -1)?)
    }

    /// The whole matrix, in the scale dtype.
    pub fn dequantize(&self) -> Result<Tensor> {
        Self::unpack(&self.packed, &self.scale, &self.shifts, self.cols)
    }

    /// Bytes one row takes as stored: its packed words and its scales.
    pub fn row_bytes(&self) -> i64 {
        self.packed.size()[1] * 4 + self.scale.size()[1] * self.scale.kind().elt_size_in_bytes() as i64
    }

    /// Bytes the matrix holds: its packed words and its scales.
    pub fn bytes(&self) -> i64 {
        self.row_bytes() * self.out_rows()
    }

    pub fn out_rows(&self) -> i64 {
        self.packed.size()[0]
    }

    pub fn cols(&self) -> i64 {
        self.cols
    }

    pub fn groups(&self) -> i64 {
        self.scale.size()[1]
    }

    /// The scales `[rows, groups]` as stored (bf16 or f16).
    pub fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// The stored nibbles `q + 8` (0..15) of rows `start..start + n`, as int32 `[n, cols]`: what the int4 kernel's
    /// repack takes, unchanged.
    pub fn nibbles(&self, start: i64, n: i64) -> Result<Tensor> {
        let words = self.packed.f_narrow(0, start, n)?;
        let nibbles = words.f_unsqueeze(-1)?.f_bitwise_right_shift(&self.shifts)?.f_bitwise_and(0xF)?;
        Ok(nibbles.f_flatten(-2, -1)?.f_narrow(-1, 0, self.cols)?.f_contiguous()?)
    }

    /// Only the rows `ids` (an embedding lookup), in the scale dtype: the table itself stays packed.
    pub fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        let packed = self.packed.f_index_select(0, ids)?;
        Self::unpack(&packed, &self.scale.f_index_select(0, ids)?, &self.shifts, self.cols)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Eight 4-bit values per int32 word, low nibble first, each stored as `q + 8`.
    pub(crate) fn word(nibbles: [i64; 8]) -> i32 {
        nibbles.iter().rev().fold(0u32, |w, &n| (w << 4) | n as u32) as i32
    }

    /// A random packed matrix `[rows, cols]` in the checkpoint's format: nibbles `q + 8`, eight to an int32 word,
    /// low first, and bf16 scales for groups of 32 columns.
    pub(crate) fn random_matrix(rows: i64, cols: i64, seed: i64) -> Packed {
        random_matrix_scaled_in(rows, cols, seed, Kind::BFloat16)
    }

    /// The same with scales in `kind`: bf16 as in the -text checkpoints, or f16 as in the emb4 twin's tables.
    pub(crate) fn random_matrix_scaled_in(rows: i64, cols: i64, seed: i64, kind: Kind) -> Packed {
        tch::manual_seed(seed);
        let nibbles = Tensor::randint(16, [rows, cols / 8, 8], (Kind::Int, Device::Cpu));
        let mut words = Tensor::zeros([rows, cols / 8], (Kind::Int, Device::Cpu));
        for i in 0..8 {
            words = words.bitwise_or_tensor(&nibbles.select(2, i).bitwise_left_shift_tensor_scalar(4 * i));
        }
        let scale = (Tensor::rand([rows, cols / 32], (Kind::Float, Device::Cpu)) * 0.01 + 1e-3).to_kind(kind);
        Packed::new(words, scale, cols).unwrap()
    }

    #[test]
    fn words_unpack_low_nibble_first_as_offset_binary() {
        assert_eq!(word([0, 1, 2, 3, 4, 5, 6, 7]), 0x7654_3210);
        // the second word has its top bit set: the arithmetic right shift must not leak sign bits into a nibble
        let words = Tensor::from_slice(&[0x7654_3210, word([8, 9, 10, 11, 12, 13, 14, 15])]).view([1, 2]);
        let scale = Tensor::from_slice(&[1f32, 1.0]).view([1, 2]).to_kind(Kind::BFloat16);
        let w = Packed::new(words, scale, 16).unwrap().dequantize().unwrap();
        assert_eq!(w.kind(), Kind::BFloat16);
        let want: Vec<f32> = (-8..8).map(|q| q as f32).collect();
        assert_eq!(Vec::<f32>::try_from(w.view([-1]).to_kind(Kind::Float)).unwrap(), want);
    }

    #[test]
    fn each_group_takes_its_scale_and_padding_nibbles_are_dropped() {
        // 12 columns in 2 words (4 padding nibbles), groups of 4 columns, values 1 + 8 = 9 everywhere
        let words = Tensor::from_slice(&[word([9; 8]), word([9; 8])]).view([1, 2]);
        let scale = Tensor::from_slice(&[1f32, 2.0, -0.5]).view([1, 3]).to_kind(Kind::Half);
        let w = Packed::new(words, scale, 12).unwrap().dequantize().unwrap();
        assert_eq!((w.size(), w.kind()), (vec![1, 12], Kind::Half));
        let want = [1f32, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, -0.5, -0.5, -0.5, -0.5];
        assert_eq!(Vec::<f32>::try_from(w.view([-1]).to_kind(Kind::Float)).unwrap(), want);
    }

    #[test]
    fn a_weight_is_q_times_scale_rounded_once_to_the_scale_dtype() {
        // q = 7 and a bf16 scale of 0.1: the weight is their product rounded once to bf16, kept in bf16
        let words = Tensor::from_slice(&[word([15; 8])]).view([1, 1]);
        let scale = Tensor::from_slice(&[0.1f32]).view([1, 1]).to_kind(Kind::BFloat16);
        let w = Packed::new(words, scale.shallow_clone(), 8).unwrap().dequantize().unwrap();
        let want = scale.to_kind(Kind::Float).f_mul_scalar(7).unwrap().to_kind(Kind::BFloat16);
        assert!(w.equal(&want.expand([1, 8], false)));
    }

    #[test]
    fn rows_unpack_only_the_gathered_rows() {
        let words = Tensor::from_slice(&[word([8; 8]), word([9; 8]), word([10; 8])]).view([3, 1]);
        let scale = Tensor::from_slice(&[1f32, 1.0, 1.0]).view([3, 1]).to_kind(Kind::BFloat16);
        let table = Packed::new(words, scale, 8).unwrap();
        let rows = table.rows(&Tensor::from_slice(&[2i64, 0])).unwrap();
        let want: Vec<f32> = [2f32; 8].into_iter().chain([0f32; 8]).collect();
        assert_eq!(Vec::<f32>::try_from(rows.view([-1]).to_kind(Kind::Float)).unwrap(), want);
        assert_eq!(table.row_bytes(), 4 + 2); // one word and one bf16 scale
    }
}
