//! Reading a checkpoint: memory-mapped safetensors (one file or a sharded index), every tensor checked
//! against the shape the config implies, and W4A16 "pack-quantized" weights unpacked bit for bit as
//! compressed-tensors does.
//!
//! Loading streams: each tensor is copied out of the mapped file, converted, moved to the device, and its
//! file pages are handed back to the kernel before the next one, so there is never a second copy of the
//! weights in memory.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};
use safetensors::tensor::TensorInfo;
use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use crate::bridge::on;
use crate::config::Config;
use crate::error::{invalid, Error, Result};

struct Shard {
    map: Mmap,
    /// Where the tensor data starts: after the 8-byte length and the JSON header.
    data_start: usize,
}

/// A checkpoint folder: `config.json` plus `model.safetensors` or `model.safetensors.index.json` + shards.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Config,
    shards: Vec<Shard>,
    tensors: HashMap<String, (usize, TensorInfo)>,
    /// `model.` (Gemma4ForCausalLM) or `model.language_model.` (Gemma4ForConditionalGeneration).
    pub prefix: &'static str,
}

impl Checkpoint {
    /// Reads the folder's `config.json` and the safetensors headers; tensors are read when asked for.
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::not_found(dir, "no such checkpoint folder"));
        }
        let config = Config::from_file(&dir.join("config.json"))?;
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<String> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::reading(&index, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| invalid!("{}: not valid JSON: {e}", index.display()))?;
            let map = json["weight_map"].as_object().ok_or_else(|| invalid!("{}: no weight_map", index.display()))?;
            let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
            files.sort();
            files.dedup();
            files
        } else {
            vec!["model.safetensors".to_string()]
        };
        let mut shards = Vec::new();
        let mut tensors = HashMap::new();
        for name in files {
            let path = dir.join(&name);
            let file = File::open(&path).map_err(|e| Error::reading(&path, e))?;
            // SAFETY: the file is only read; a checkpoint changed on disk while mapped is outside our control.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| invalid!("{}: cannot map: {e}", path.display()))?;
            let (header, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| invalid!("{}: not a valid safetensors file ({e})", path.display()))?;
            for (tensor, info) in meta.tensors() {
                tensors.insert(tensor, (shards.len(), info.clone()));
            }
            shards.push(Shard { map, data_start: 8 + header });
        }
        let prefix = if tensors.keys().any(|k| k.starts_with("model.language_model.")) {
            "model.language_model."
        } else {
            "model."
        };
        Ok(Checkpoint { dir: dir.to_path_buf(), config, shards, tensors, prefix })
    }

    fn full_name(&self, name: &str) -> String {
        if name.starts_with("lm_head.") {
            name.to_string()
        } else {
            format!("{}{name}", self.prefix)
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(&self.full_name(name))
    }

    fn where_(&self, name: &str) -> String {
        format!("tensor {} in {}", self.full_name(name), self.dir.display())
    }

    /// The tensor `name` (without the model prefix) as a host tensor of its stored dtype, checked against
    /// the dtypes and shape the model expects.
    pub fn read(&self, name: &str, dtypes: &[Dtype], shape: &[i64]) -> Result<Tensor> {
        let full = self.full_name(name);
        let (shard, info) = self.tensors.get(&full).ok_or_else(|| invalid!("missing {}", self.where_(name)))?;
        if !dtypes.contains(&info.dtype) {
            return Err(invalid!("{}: dtype {:?}, expected one of {dtypes:?}", self.where_(name), info.dtype));
        }
        let found: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
        if found != shape {
            return Err(invalid!("{}: shape {found:?}, expected {shape:?}", self.where_(name)));
        }
        let shard = &self.shards[*shard];
        let (start, end) = (shard.data_start + info.data_offsets.0, shard.data_start + info.data_offsets.1);
        let host = Tensor::f_from_data_size(&shard.map[start..end], shape, kind_of(info.dtype))?;
        // The bytes are copied now: let the kernel drop the file pages instead of keeping a second copy.
        // SAFETY: the map is read-only and file-backed; dropped pages are simply read again if needed.
        let _ = unsafe { shard.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start) };
        Ok(host)
    }

    /// A dense tensor moved to `like`'s device as `dtype`.
    pub fn dense(&self, name: &str, shape: &[i64], dtype: Kind, like: &Tensor) -> Result<Tensor> {
        let host = self.read(name, &[Dtype::BF16, Dtype::F16, Dtype::F32], shape)?;
        Ok(on(&host.f_to_kind(dtype)?, like)?)
    }

    /// A packed int4 matrix `[rows, cols]` as stored, on the host: `weight_packed`, `weight_scale`,
    /// `weight_shape`.
    pub fn packed(&self, module: &str, rows: i64, cols: i64) -> Result<Packed> {
        let group = self
            .config
            .group_size
            .ok_or_else(|| invalid!("{} is packed but config.json has no quantization_config", self.where_(module)))?;
        if cols % group != 0 {
            return Err(invalid!("{}: {cols} columns are not a multiple of group_size {group}", self.where_(module)));
        }
        let shape_name = format!("{module}.weight_shape");
        let stored = self.read(&shape_name, &[Dtype::I64, Dtype::I32], &[2])?;
        let stored: Vec<i64> = Vec::<i64>::try_from(stored.f_to_kind(Kind::Int64)?)?;
        if stored != [rows, cols] {
            return Err(invalid!("{}: says {stored:?}, the config implies [{rows}, {cols}]", self.where_(&shape_name)));
        }
        let packed = self.read(&format!("{module}.weight_packed"), &[Dtype::I32], &[rows, (cols + 7) / 8])?;
        let scale = self.read(&format!("{module}.weight_scale"), &[Dtype::BF16, Dtype::F16], &[rows, cols / group])?;
        Packed::new(packed, scale, cols)
    }

    /// A linear layer's weight `[out, in]` in `dtype` on like's device: unpacked once, on the host, if stored
    /// packed.
    pub fn linear(&self, module: &str, out: i64, inp: i64, dtype: Kind, like: &Tensor) -> Result<Tensor> {
        let packed = format!("{module}.weight_packed");
        if self.has(&packed) {
            let w = self.packed(module, out, inp)?.dequantize()?;
            Ok(on(&w.f_to_kind(dtype)?, like)?)
        } else if self.has(&format!("{module}.weight")) {
            self.dense(&format!("{module}.weight"), &[out, inp], dtype, like)
        } else {
            Err(invalid!("missing {} (nor a dense .weight)", self.where_(&packed)))
        }
    }
}

// --8<-- [start:unpack]
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
    fn new(packed: Tensor, scale: Tensor, cols: i64) -> Result<Packed> {
        let shifts = Tensor::f_arange_start_step(0, 32, 4, (Kind::Int, Device::Cpu))?;
        Ok(Packed { packed, scale, shifts, cols })
    }

    /// The same matrix, still packed, on like's device.
    pub fn on(&self, like: &Tensor) -> Result<Packed> {
        let (packed, scale, shifts) = (on(&self.packed, like)?, on(&self.scale, like)?, on(&self.shifts, like)?);
        Ok(Packed { packed, scale, shifts, cols: self.cols })
    }

    fn unpack(packed: &Tensor, scale: &Tensor, shifts: &Tensor, cols: i64) -> Result<Tensor> {
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
        self.row_bytes() * self.packed.size()[0]
    }

    /// Only the rows `ids` (an embedding lookup), in the scale dtype: the table itself stays packed.
    pub fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        let packed = self.packed.f_index_select(0, ids)?;
        Self::unpack(&packed, &self.scale.f_index_select(0, ids)?, &self.shifts, self.cols)
    }
}
// --8<-- [end:unpack]

fn kind_of(dtype: Dtype) -> Kind {
    match dtype {
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        Dtype::F32 => Kind::Float,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
        other => unreachable!("read() admits only the dtypes it is asked for, never {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight 4-bit values per int32 word, low nibble first, each stored as `q + 8`.
    fn word(nibbles: [i64; 8]) -> i32 {
        nibbles.iter().rev().fold(0u32, |w, &n| (w << 4) | n as u32) as i32
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
