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
use crate::dot4::Stacking;
use crate::error::{invalid, Error, Result};
use crate::linear::{Held, Linear, Weights};
use crate::packed::{refuses, Packed};

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

impl Checkpoint {
    // --8<-- [start:held]
    /// A linear layer `[out, in]` on like's device, held as `held` says: a packed matrix kept 4-bit in the int4
    /// kernel's layout (`Weights::Int4`), or unpacked once into the compute dtype as in step 03. A dense
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

    /// The linears `modules`, each `(name, out)` of `[out, inp]`, as one, stacked in that order as `stacking` says,
    /// where they are packed and kept 4-bit on one of this step's kernels (`Held::stacking_kernel`); else None, and
    /// the caller holds each as `held_linear` does.
    pub fn held_stacked(
        &self,
        modules: &[(&str, i64)],
        inp: i64,
        stacking: Stacking,
        held: &Held,
    ) -> Result<Option<Linear>> {
        let Some(kernel) = held.stacking_kernel() else { return Ok(None) };
        let packed = modules.iter().all(|(m, _)| self.has(&format!("{m}.weight_packed")));
        let group = self.config.group_size.unwrap_or(0);
        if !packed || modules.iter().any(|&(_, out)| refuses(out, inp, group).is_some()) {
            return Ok(None);
        }
        let parts = modules.iter().map(|&(m, out)| self.packed(m, out, inp)).collect::<Result<Vec<_>>>()?;
        let names = modules.iter().map(|(m, _)| self.where_(m)).collect::<Vec<_>>().join(" and ");
        Ok(Some(held.own(&names, &parts.iter().collect::<Vec<_>>(), stacking, kernel)?))
    }
}

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
mod tests {
    use super::*;
    use crate::packed::tests::word;

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
