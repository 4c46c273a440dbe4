//! Reading a checkpoint: memory-mapped safetensors (one file or a sharded index), every tensor checked
//! against the shape the config implies, and W4A16 "pack-quantized" weights unpacked bit for bit as
//! compressed-tensors does.
//!
//! Loading streams: each tensor is copied out of the mapped file, converted, moved to the device, and its
//! file pages are handed back to the kernel before the next one, so there is never a second copy of the
//! weights in memory. A table can instead stay in the file (`MappedTable`): its rows are copied out when
//! gathered, so only the rows a prompt uses are ever in memory.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, UncheckedAdvice};
use safetensors::tensor::TensorInfo;
use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use crate::bridge::on;
use crate::config::Config;
use crate::error::{invalid, Error, Result};
use crate::linear::{Held, Linear, Weights};

struct Shard {
    /// Shared with the tables that stay in the file, which outlive the checkpoint.
    map: Arc<Mmap>,
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
            shards.push(Shard { map: Arc::new(map), data_start: 8 + header });
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

    /// Where the tensor `name` (without the model prefix) lies: its shard, its bytes, its dtype — checked against
    /// the dtypes and shape the model expects.
    fn locate(&self, name: &str, dtypes: &[Dtype], shape: &[i64]) -> Result<(&Shard, usize, usize, Kind)> {
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
        Ok((shard, start, end, kind_of(info.dtype)))
    }

    /// The tensor `name` (without the model prefix) as a host tensor of its stored dtype, checked against
    /// the dtypes and shape the model expects.
    pub fn read(&self, name: &str, dtypes: &[Dtype], shape: &[i64]) -> Result<Tensor> {
        let (shard, start, end, kind) = self.locate(name, dtypes, shape)?;
        let host = Tensor::f_from_data_size(&shard.map[start..end], shape, kind)?;
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
        let group = self.packed_group(module, rows, cols)?;
        let packed = self.read(&format!("{module}.weight_packed"), &[Dtype::I32], &[rows, (cols + 7) / 8])?;
        let scale = self.read(&format!("{module}.weight_scale"), &[Dtype::BF16, Dtype::F16], &[rows, cols / group])?;
        Packed::new(packed, scale, cols)
    }

    /// The group size of the packed matrix `module`, after checking it divides `cols` and that the stored
    /// `weight_shape` is `[rows, cols]`.
    fn packed_group(&self, module: &str, rows: i64, cols: i64) -> Result<i64> {
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
        Ok(group)
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

    // --8<-- [start:held]
    /// A linear layer `[out, in]` on like's device, held as `held` says: a packed matrix kept 4-bit in the int4
    /// kernel's layout (`Weights::Int4`), or unpacked once into the compute dtype as `linear` does. A dense
    /// checkpoint tensor stays dense either way. With `held.fallback` (`weights="auto"`), a matrix the kernel
    /// cannot take is unpacked instead, and its name kept in `held.kept_dense`.
    pub fn held_linear(&self, module: &str, out: i64, inp: i64, held: &Held, like: &Tensor) -> Result<Linear> {
        let group = self.config.group_size.unwrap_or(0);
        if held.weights == Weights::Int4
            && self.has(&format!("{module}.weight_packed"))
            && !held.falls_back(&self.full_name(module), out, inp, group)
        {
            return held.int4(&self.where_(module), &self.packed(module, out, inp)?, like);
        }
        Ok(Linear::Dense(self.linear(module, out, inp, held.dtype, like)?))
    }
    // --8<-- [end:held]

    /// The rows of a 2-D tensor `[rows, cols]`, left in the mapped file (see `MappedRows`).
    fn mapped_rows(&self, name: &str, dtypes: &[Dtype], rows: i64, cols: i64) -> Result<MappedRows> {
        let (shard, start, end, kind) = self.locate(name, dtypes, &[rows, cols])?;
        Ok(MappedRows {
            map: Arc::clone(&shard.map),
            start,
            row_bytes: (end - start) / rows.max(1) as usize,
            cols,
            kind,
        })
    }

    /// An embedding table `[rows, cols]` left in the mapped file, dense or packed as stored, checked as `read`
    /// and `packed` check it.
    pub fn mapped_table(&self, name: &str, rows: i64, cols: i64) -> Result<MappedTable> {
        let module = name;
        if !self.has(&format!("{module}.weight_packed")) {
            let dense =
                self.mapped_rows(&format!("{module}.weight"), &[Dtype::BF16, Dtype::F16, Dtype::F32], rows, cols)?;
            return Ok(MappedTable::Dense(dense));
        }
        let group = self.packed_group(module, rows, cols)?;
        let words = self.mapped_rows(&format!("{module}.weight_packed"), &[Dtype::I32], rows, (cols + 7) / 8)?;
        let scale =
            self.mapped_rows(&format!("{module}.weight_scale"), &[Dtype::BF16, Dtype::F16], rows, cols / group)?;
        let shifts = Tensor::f_arange_start_step(0, 32, 4, (Kind::Int, Device::Cpu))?;
        Ok(MappedTable::Packed { words, scale, shifts, cols })
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
// --8<-- [end:unpack]

// --8<-- [start:mapped]
/// The rows of one 2-D tensor `[rows, cols]` as they lie in the memory-mapped file: gathering copies out only
/// the rows asked for. The file's pages stay the kernel's to keep or drop (a reread costs a disk read, never a
/// second copy in this process).
pub struct MappedRows {
    map: Arc<Mmap>,
    /// Byte offset of row 0 in the map, and bytes per row.
    start: usize,
    row_bytes: usize,
    cols: i64,
    kind: Kind,
}

impl MappedRows {
    /// Rows `ids` (the Engine checks them against the vocabulary first) as a host tensor `[n, cols]`.
    fn gather(&self, ids: &[i64]) -> Result<Tensor> {
        let mut bytes = Vec::with_capacity(ids.len() * self.row_bytes);
        for &id in ids {
            let at = self.start + id as usize * self.row_bytes;
            let row =
                self.map.get(at..at + self.row_bytes).ok_or_else(|| invalid!("row {id}: past the table's end"))?;
            bytes.extend_from_slice(row);
        }
        Ok(Tensor::f_from_data_size(&bytes, &[ids.len() as i64, self.cols], self.kind)?)
    }
}

/// An embedding table left in the file: dense rows, or packed rows with their scales (unpacked when gathered,
/// as `Packed::rows` unpacks them).
pub enum MappedTable {
    Dense(MappedRows),
    Packed { words: MappedRows, scale: MappedRows, shifts: Tensor, cols: i64 },
}

impl MappedTable {
    /// Rows `ids` (a tensor on any device) on the host, in the stored dtype (packed: the scale dtype).
    pub fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        let ids = Vec::<i64>::try_from(ids.f_to_device(Device::Cpu)?)?;
        match self {
            MappedTable::Dense(rows) => rows.gather(&ids),
            MappedTable::Packed { words, scale, shifts, cols } => {
                Packed::unpack(&words.gather(&ids)?, &scale.gather(&ids)?, shifts, *cols)
            }
        }
    }

    /// Bytes one gathered row takes as stored.
    pub fn row_bytes(&self) -> i64 {
        match self {
            MappedTable::Dense(rows) => rows.row_bytes as i64,
            MappedTable::Packed { words, scale, .. } => (words.row_bytes + scale.row_bytes) as i64,
        }
    }
}
// --8<-- [end:mapped]

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
pub(crate) mod tests {
    use super::*;

    /// Eight 4-bit values per int32 word, low nibble first, each stored as `q + 8`.
    pub(crate) fn word(nibbles: [i64; 8]) -> i32 {
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

    /// `t`'s bytes in an anonymous map, read as a table left in a file: row 0 at offset 8, as after a header.
    fn mapped(t: &Tensor) -> MappedRows {
        let (rows, cols) = (t.size()[0], t.size()[1]);
        let row_bytes = cols as usize * t.kind().elt_size_in_bytes();
        let mut data = vec![0u8; rows as usize * row_bytes];
        t.copy_data_u8(&mut data, t.numel());
        let mut map = memmap2::MmapMut::map_anon(8 + data.len()).unwrap();
        map[8..].copy_from_slice(&data);
        MappedRows { map: Arc::new(map.make_read_only().unwrap()), start: 8, row_bytes, cols, kind: t.kind() }
    }

    #[test]
    fn a_mapped_table_gathers_what_the_table_in_memory_gathers() {
        let words = Tensor::from_slice(&[word([8; 8]), word([9; 8]), word([1, 2, 3, 4, 5, 6, 7, 15])]).view([3, 1]);
        let scale = Tensor::from_slice(&[0.5f32, 1.0, 0.25]).view([3, 1]).to_kind(Kind::Half);
        let in_memory = Packed::new(words.shallow_clone(), scale.shallow_clone(), 8).unwrap();
        let shifts = Tensor::arange_start_step(0, 32, 4, (Kind::Int, Device::Cpu));
        let table = MappedTable::Packed { words: mapped(&words), scale: mapped(&scale), shifts, cols: 8 };
        let ids = Tensor::from_slice(&[2i64, 0, 2]);
        assert!(table.rows(&ids).unwrap().equal(&in_memory.rows(&ids).unwrap()));
        assert_eq!(table.row_bytes(), in_memory.row_bytes());
        let dense = Tensor::arange(12, (Kind::Float, Device::Cpu)).view([4, 3]).to_kind(Kind::BFloat16);
        let rows = MappedTable::Dense(mapped(&dense)).rows(&Tensor::from_slice(&[3i64, 1])).unwrap();
        assert!(rows.equal(&dense.index_select(0, &Tensor::from_slice(&[3i64, 1]))));
        // a row past the end is an error, never a read outside the map
        assert!(MappedTable::Dense(mapped(&dense)).rows(&Tensor::from_slice(&[4i64])).is_err());
    }
}
