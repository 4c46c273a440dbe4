//! Gemma 4 text model (the E-series: E2B, E4B), in the order the guide walks it (docs/steps/03_model.md): the
//! parts of a decoder layer (norm, rotary embedding, attention, MLP, per-layer input), the layer, the per-layer
//! inputs it takes in, the caches, then the model that reads a prompt and generates.
//!
//! One forward pass works on a chunk of consecutive tokens of one sequence. Keys and values go into fixed-size
//! caches — a ring of `window + chunk` slots for each sliding layer, `ctx` slots for each full layer — and
//! every layer attends over its cache, masking the slots it must not see. A prompt chunk or a decode step
//! attends over the part of a full cache that can hold what it sees, rounded up to one of a few bucket sizes:
//! few shapes, and no work on slots that are certainly empty. A decode step can instead attend over all of them
//! (`DecodeSlots::All`): the same program with the same shapes at every depth, what an accelerator that
//! compiles per shape wants.
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::attend::{attend_one, DecodeAttention};
use crate::bridge::on;
use crate::budget::{self, timed, timed_product, Budget, Part};
use crate::config::{AttentionKind, ByKind, TextConfig};
use crate::dot4::Stacking;
use crate::error::{invalid, Result};
use crate::linear::{Held, Int4Matmul, Linear, Weights};
use crate::norm::{self, After};
use crate::onednn::one_row_in_aten;
use crate::packed::Packed;
use crate::sampling::greedy;
use crate::tanh;
use crate::weights::{Checkpoint, MappedTable};

/// An embedding table: as stored (bf16), or packed int4 (the emb4 twin), gathering and unpacking rows; or left
/// in the memory-mapped file, its rows copied out when gathered.
enum Table {
    Dense(Tensor),
    Packed(Packed),
    Mapped(MappedTable),
}

impl Table {
    fn load(ckpt: &Checkpoint, name: &str, rows: i64, cols: i64, like: &Tensor) -> Result<Table> {
        if ckpt.has(&format!("{name}.weight_packed")) {
            Ok(Table::Packed(ckpt.packed(name, rows, cols)?.on(like)?))
        } else {
            let weight = format!("{name}.weight");
            let host = ckpt.read(
                &weight,
                &[safetensors::Dtype::BF16, safetensors::Dtype::F16, safetensors::Dtype::F32],
                &[rows, cols],
            )?;
            Ok(Table::Dense(on(&host, like)?)) // kept in its stored dtype: rows are cast when gathered
        }
    }

    fn rows(&self, ids: &Tensor, dtype: Kind) -> Result<Tensor> {
        timed(Part::Gathers, ids.numel() as i64 * self.row_bytes(), || self.gathered(ids, dtype))
    }

    fn gathered(&self, ids: &Tensor, dtype: Kind) -> Result<Tensor> {
        let rows = match self {
            Table::Dense(t) => t.f_index_select(0, ids)?,
            Table::Packed(p) => p.rows(ids)?,
            Table::Mapped(m) => on(&m.rows(ids)?, ids)?, // gathered on the host, moved to where the ids are
        };
        Ok(rows.f_to_kind(dtype)?)
    }

    /// Bytes one gathered row takes as stored.
    fn row_bytes(&self) -> i64 {
        match self {
            Table::Dense(t) => t.size()[1] * t.kind().elt_size_in_bytes() as i64,
            Table::Packed(p) => p.row_bytes(),
            Table::Mapped(m) => m.row_bytes(),
        }
    }

    /// Bytes the table holds in memory (a mapped one: none; its file pages are the kernel's).
    fn bytes(&self) -> i64 {
        match self {
            Table::Dense(t) => bytes(t),
            Table::Packed(p) => p.bytes(),
            Table::Mapped(_) => 0,
        }
    }

    /// The whole table as an output head tied to the embeddings: a packed table kept 4-bit when `held` says so
    /// (unless it falls back to dense, as a linear does), else a `dtype` matrix.
    fn head(&self, held: &Held, like: &Tensor) -> Result<Linear> {
        const NAME: &str = "the tied head (embed_tokens)";
        let four_bit = |p: &Packed| {
            held.weights == Weights::Int4 && !held.falls_back(NAME, p.out_rows(), p.cols(), p.cols() / p.groups())
        };
        Ok(match self {
            Table::Dense(t) => Linear::Dense(t.f_to_kind(held.dtype)?), // no copy when the dtypes already agree
            Table::Packed(p) if four_bit(p) => held.int4(NAME, p, like)?,
            Table::Packed(p) => Linear::Dense(p.dequantize()?.f_to_kind(held.dtype)?),
            // only the per-layer table is left in the file, and it is never a head: an error, should that change
            Table::Mapped(_) => return Err(invalid!("a table left in the file cannot be the tied head")),
        })
    }
}

/// Bytes a tensor holds.
fn bytes(t: &Tensor) -> i64 {
    t.numel() as i64 * t.kind().elt_size_in_bytes() as i64
}

/// The last `rows` rows of `t` (its first dimension is the tokens').
fn last_rows(t: &Tensor, rows: i64) -> Result<Tensor> {
    Ok(t.f_narrow(0, t.size()[0] - rows, rows)?)
}

/// `x · wᵀ`, timed as `part` of a decode step's budget (budget.rs), which reads the whole matrix and does a
/// multiply-add per weight and row of x.
fn linear(part: Part, x: &Tensor, w: &Linear) -> Result<Tensor> {
    timed_product(part, w.bytes(), || x.size()[0] * w.weights(), || w.forward(x))
}

/// `gelu_tanh(gate) · other`: in one call on the CPU (tanh.rs, the same bits), else in ATen's two ops.
fn gelu_times(gate: &Tensor, other: &Tensor) -> Result<Tensor> {
    timed(Part::Gelu, 0, || {
        if tanh::gelu_takes(gate, other) {
            return tanh::gelu_times(gate, other);
        }
        Ok(gate.f_gelu("tanh")?.f_mul(other)?)
    })
}

/// A python-style scalar rounded to the compute dtype first, as Transformers' `tensor(s).to(dtype)` does.
fn scalar_in(value: f64, dtype: Kind) -> Result<f64> {
    Ok(Tensor::from(value as f32).f_to_kind(dtype)?.f_double_value(&[])?)
}

// --8<-- [start:norm]
/// RMSNorm as Gemma 4 does it: in float32, `x * (mean(x²) + eps)^-0.5 * w` — no `(1 + w)` offset as in
/// Gemma 2 and 3, and `pow(…, -0.5)` rather than `rsqrt`, which rounds differently.
struct RmsNorm {
    /// float32, since the norm computes in float32; values are normed without one.
    weight: Option<Tensor>,
    eps: f64,
}

impl RmsNorm {
    fn load(ckpt: &Checkpoint, name: &str, size: i64, eps: f64, like: &Tensor) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: Some(ckpt.dense(&format!("{name}.weight"), &[size], Kind::Float, like)?), eps })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if norm::takes(x, self.weight.as_ref()) {
            // the same bits in one call (norm.rs)
            return timed(Part::Norms, 0, || norm::rms_norm(x, self.weight.as_ref(), self.eps, After::Nothing));
        }
        self.forward_in_ops(x)
    }

    /// `residual + forward(x)`: a residual branch's norm and add, in one call on the CPU (norm.rs).
    fn added_to(&self, residual: &Tensor, x: &Tensor) -> Result<Tensor> {
        if norm::takes(x, self.weight.as_ref()) {
            return timed(Part::Norms, 0, || norm::rms_norm(x, self.weight.as_ref(), self.eps, After::Added(residual)));
        }
        Ok(residual.f_add(&self.forward_in_ops(x)?)?)
    }

    /// `(residual + forward(x)) · scale`: the same, then the layer scalar, in one call on the CPU (norm.rs).
    fn added_to_then_scaled(&self, residual: &Tensor, x: &Tensor, scale: &Tensor) -> Result<Tensor> {
        if norm::takes(x, self.weight.as_ref()) && scale.kind() == x.kind() && scale.size() == [1] {
            let after = After::AddedScaled(residual, scale);
            return timed(Part::Norms, 0, || norm::rms_norm(x, self.weight.as_ref(), self.eps, after));
        }
        Ok(residual.f_add(&self.forward_in_ops(x)?)?.f_mul(scale)?)
    }

    /// `rotation.rotate(forward(x))`: q's or k's norm and rotary embedding, in one call on the CPU (norm.rs).
    fn rotated(&self, x: &Tensor, rotation: &Rotation) -> Result<Tensor> {
        if norm::takes(x, self.weight.as_ref()) {
            let after = After::Rotated { cos: &rotation.cos, sin: &rotation.sin };
            return timed(Part::Norms, 0, || norm::rms_norm(x, self.weight.as_ref(), self.eps, after));
        }
        rotation.rotate(&self.forward_in_ops(x)?)
    }

    /// `forward(x)`, or `rotated(x, rotation)`, of one token's heads written into `slot` of `cache [heads, slots, d]`
    /// in the same call (norm.rs); false where that call does not take them, and nothing written.
    fn write_into_slot(&self, x: &Tensor, rotation: Option<&Rotation>, cache: &Tensor, slot: i64) -> Result<bool> {
        if !norm::takes(x, self.weight.as_ref()) {
            return Ok(false);
        }
        let after = rotation.map_or(After::Nothing, |r| After::Rotated { cos: &r.cos, sin: &r.sin });
        timed(Part::Norms, 0, || norm::rms_norm_into(x, self.weight.as_ref(), self.eps, after, cache, slot))?;
        Ok(true)
    }

    /// Step 03's norm, in ATen's ops: what the CPU's kernel must equal, and what runs elsewhere.
    fn forward_in_ops(&self, x: &Tensor) -> Result<Tensor> {
        let xf = x.f_to_kind(Kind::Float)?;
        let mean_square = xf.f_pow_tensor_scalar(2)?.f_mean_dim(-1, true, None::<Kind>)?;
        let mut y = xf.f_mul(&mean_square.f_add_scalar(self.eps)?.f_pow_tensor_scalar(-0.5)?)?;
        if let Some(w) = &self.weight {
            y = y.f_mul(w)?;
        }
        Ok(y.f_to_kind(x.kind())?)
    }
}
// --8<-- [end:norm]

// --8<-- [start:rope]
/// Rotary position embedding for one attention kind, as inverse frequencies (float32). Sliding layers: the
/// usual `θ^(-2i/d)`. Full layers ("proportional", θ = 1e6): only the first `partial_rotary_factor · d/2`
/// pairs rotate, the rest get frequency 0 — so the rotated dims of a 512-wide head are 0–63 and 256–319, since
/// `rotate_half` pairs dim i with i + d/2.
struct Rotary {
    inv_freq: Tensor,
}

impl Rotary {
    fn new(cfg: &TextConfig, kind: AttentionKind, like: &Tensor) -> Result<Rotary> {
        let rope = cfg.rope(kind);
        let d = cfg.head_dim(kind);
        let pairs =
            if rope.rope_type == "proportional" { (rope.partial_rotary_factor * d as f64) as i64 / 2 } else { d / 2 };
        let exponents = Tensor::f_arange_start_step(0, 2 * pairs, 2, (Kind::Int64, Device::Cpu))?
            .f_to_kind(Kind::Float)?
            .f_div_scalar(d as f64)?;
        let mut freq = Tensor::f_pow_scalar(rope.rope_theta, &exponents)?.f_reciprocal()?;
        if rope.rope_type == "proportional" {
            freq = freq.f_div_scalar(rope.factor)?; // Transformers' `inv_freq /= factor` (after the zeros: same)
        }
        let still = Tensor::f_zeros([d / 2 - pairs], (Kind::Float, Device::Cpu))?;
        Ok(Rotary { inv_freq: on(&Tensor::f_cat(&[freq, still], 0)?, like)? })
    }

    /// The rotation at positions `pos`: angles in float32, cos and sin cast to the compute dtype.
    fn at(&self, pos: &Tensor, dtype: Kind) -> Result<Rotation> {
        let freqs = pos.f_to_kind(Kind::Float)?.f_unsqueeze(1)?.f_mul(&self.inv_freq.f_unsqueeze(0)?)?;
        let angles = Tensor::f_cat(&[&freqs, &freqs], -1)?.f_unsqueeze(1)?;
        Ok(Rotation { cos: angles.f_cos()?.f_to_kind(dtype)?, sin: angles.f_sin()?.f_to_kind(dtype)? })
    }
}

/// cos and sin `[tokens, 1, d]` of one pass's positions.
struct Rotation {
    cos: Tensor,
    sin: Tensor,
}

impl Rotation {
    /// `x · cos + rotate_half(x) · sin` on `[tokens, heads, d]`, pairing dim i with i + d/2.
    fn rotate(&self, x: &Tensor) -> Result<Tensor> {
        let half = x.size()[2] / 2;
        let rotated = Tensor::f_cat(&[x.f_narrow(2, half, half)?.f_neg()?, x.f_narrow(2, 0, half)?], -1)?;
        Ok(x.f_mul(&self.cos)?.f_add(&rotated.f_mul(&self.sin)?)?)
    }

    /// The rotation of the last `rows` tokens only.
    fn last(&self, rows: i64) -> Result<Rotation> {
        Ok(Rotation { cos: last_rows(&self.cos, rows)?, sin: last_rows(&self.sin, rows)? })
    }
}
// --8<-- [end:rope]

// --8<-- [start:attend]
/// Attention of `q [tokens, heads, d]` over cache slots `k, v [kv_heads, slots, d]`; `masked [tokens, slots]`
/// marks the slots a query must not see. The query heads that share a KV head are stacked along the token
/// axis, so grouped-query attention needs no copies of K and V. Gemma 4's scaling is 1.0 (q and k are
/// RMS-normed), and the softmax computes in float32 over scores masked with the dtype's lowest value.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, masked: &Tensor) -> Result<Tensor> {
    let (tokens, heads, d) = q.size3()?;
    let kv_heads = k.size()[0];
    let group = heads / kv_heads;
    let q = q.f_permute([1, 0, 2])?.f_reshape([kv_heads, group * tokens, d])?;
    // A decode step computes the scores as (k · qᵀ)ᵀ: the cache is the left operand and is read where it lies;
    // written q · kᵀ, the CPU's batched matmul first copies the transposed cache — every slot, every layer,
    // every step. A prompt chunk computes q · kᵀ: that copy is shared by the chunk's tokens, and the scores come
    // out in the layout the mask and the softmax read fast (transposed, each pass over [heads, chunk, slots]
    // floats is a strided copy).
    let mut scores = if tokens == 1 {
        k.f_matmul(&q.f_transpose(1, 2)?)?.f_transpose(1, 2)?
    } else {
        q.f_matmul(&k.f_transpose(1, 2)?)?
    }
    .f_unflatten(1, [group, tokens])?;
    let dtype = q.kind();
    let lowest = if dtype == Kind::BFloat16 { -3.3895313892515355e38 } else { f32::MIN as f64 };
    // Transformers takes the softmax in float32 and rounds it to bf16; PyTorch's softmax of a bf16 input does the
    // same inside one kernel (float32 arithmetic, one rounding: the same bits) without two passes to convert.
    let probs = scores.f_masked_fill_(masked, lowest)?.f_softmax(-1, dtype)?;
    let out = probs.f_reshape([kv_heads, group * tokens, -1])?.f_matmul(v)?;
    Ok(out.f_view([heads, tokens, d])?.f_permute([1, 0, 2])?.f_reshape([tokens, heads * d])?)
}
// --8<-- [end:attend]

/// The attention's input projections.
enum Projections {
    /// A KV-shared layer's: q alone (it reads the cache its source layer wrote).
    Query(Linear),
    /// Dense, or on ATen's int4 kernel: apart, as step 03 holds them.
    Apart { q: Linear, k: Linear, v: Linear },
    /// On this step's kernels: `[q; k; v]` stacked, one call instead of three (`Held::own`: the same bits row for
    /// row), its first `q_rows` outputs q's, then `kv_rows` of k's and of v's.
    Stacked { qkv: Linear, q_rows: i64, kv_rows: i64 },
}

impl Projections {
    fn linears(&self) -> Vec<&Linear> {
        match self {
            Projections::Query(q) => vec![q],
            Projections::Apart { q, k, v } => vec![q, k, v],
            Projections::Stacked { qkv, .. } => vec![qkv],
        }
    }
}

// --8<-- [start:attention]
/// Self-attention: q/k/v projections, q and k RMS-normed (v without a weight), RoPE after the norms.
struct Attention {
    /// This layer's index: where it writes its keys and values.
    layer: usize,
    /// Whose cache it attends over: its own, or the one a KV-shared layer borrows.
    kv_source: usize,
    head_dim: i64,
    projections: Projections,
    q_norm: RmsNorm,
    /// None on KV-shared layers, which project no k: stray k/v projections in a file are ignored.
    k_norm: Option<RmsNorm>,
    v_norm: RmsNorm,
    o_proj: Linear,
}

impl Attention {
    fn load(ckpt: &Checkpoint, cfg: &TextConfig, i: i64, held: &Held, like: &Tensor) -> Result<Attention> {
        let kind = cfg.attention(i);
        let (d, heads, kv_heads) = (cfg.head_dim(kind), cfg.num_attention_heads, cfg.kv_heads(kind));
        let (size, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let name = |s: &str| format!("layers.{i}.self_attn.{s}");
        let lin = |s: &str, out: i64, inp: i64| ckpt.held_linear(&name(s), out, inp, held, like);
        let (kv_source, q_rows, kv_rows) = (cfg.kv_source(i), heads * d, kv_heads * d);
        let owner = kv_source == i;
        let (q, k, v) = (name("q_proj"), name("k_proj"), name("v_proj"));
        let projections = if !owner {
            Projections::Query(lin("q_proj", q_rows, size)?)
        } else if let Some(qkv) =
            ckpt.held_stacked(&[(&q, q_rows), (&k, kv_rows), (&v, kv_rows)], size, Stacking::Rows, held)?
        {
            Projections::Stacked { qkv, q_rows, kv_rows }
        } else {
            Projections::Apart {
                q: lin("q_proj", q_rows, size)?,
                k: lin("k_proj", kv_rows, size)?,
                v: lin("v_proj", kv_rows, size)?,
            }
        };
        Ok(Attention {
            layer: i as usize,
            kv_source: kv_source as usize,
            head_dim: d,
            projections,
            q_norm: RmsNorm::load(ckpt, &name("q_norm"), d, eps, like)?,
            k_norm: if owner { Some(RmsNorm::load(ckpt, &name("k_norm"), d, eps, like)?) } else { None },
            v_norm: RmsNorm { weight: None, eps },
            o_proj: lin("o_proj", size, heads * d)?,
        })
    }

    fn forward(&self, x: &Tensor, rotation: &Rotation, slots: &Slots, cache: &mut Cache) -> Result<Tensor> {
        let project = |w: &Linear| linear(Part::QkvProjections, x, w);
        let (q, kv) = match &self.projections {
            Projections::Query(q) => (project(q)?, None),
            Projections::Apart { q, k, v } => (project(q)?, Some((project(k)?, project(v)?))),
            Projections::Stacked { qkv, q_rows, kv_rows } => {
                let all = project(qkv)?;
                let rows = |start: i64, n: i64| all.f_narrow(-1, start, n);
                (rows(0, *q_rows)?, Some((rows(*q_rows, *kv_rows)?, rows(q_rows + kv_rows, *kv_rows)?)))
            }
        };
        let heads = |t: &Tensor| t.f_view([x.size()[0], -1, self.head_dim]);
        let q = self.q_norm.rotated(&heads(&q)?, rotation)?;
        if let (Some((k, v)), Some(k_norm)) = (kv, &self.k_norm) {
            let (k, v) = (heads(&k)?, heads(&v)?);
            // a decode step's key and value normed straight into their slot where the norm's one call can (norm.rs)
            let written = match cache.slot_for_one(self.layer, slots, k.kind()) {
                Some((keys, values, slot)) => {
                    k_norm.write_into_slot(&k, Some(rotation), keys, slot)?
                        && self.v_norm.write_into_slot(&v, None, values, slot)?
                }
                None => false,
            };
            if !written {
                let (k, v) = (k_norm.rotated(&k, rotation)?, self.v_norm.forward(&v)?);
                timed(Part::CacheWrite, 0, || cache.write(self.layer, slots, &k, &v))?;
            }
        }
        // A KV-shared layer reads the cache its source layer wrote earlier in this same pass.
        let seen = cache.seen(self.kv_source, slots)?;
        // Attention runs in its dtype: the compute dtype, or float32 where bf16 matmul is slow (see
        // `Gemma::new_cache`). ATen's ops take the cache's slots in it (the same dtype costs nothing: `to_kind`
        // then returns the tensor itself); the own call widens a bf16 cache's values as it loads them.
        let own = cache.decode_attention == DecodeAttention::Own && q.size()[0] == 1;
        // ATen's ops read every slot attended over (narrowed views), the own call only those the query sees: counted
        // only while a budget is taken, so a decode step does not pay for the count
        let read = if !budget::taking() {
            0
        } else if own {
            let visible = slots.masked.f_logical_not()?.f_sum(Kind::Int64)?.f_int64_value(&[])?;
            (bytes(&seen.keys) + bytes(&seen.values)) * visible / slots.seen.max(1)
        } else {
            bytes(&seen.keys) + bytes(&seen.values)
        };
        let out = timed(Part::Attention, read, || {
            if own {
                attend_one(&q, &seen.keys, &seen.values, &slots.masked, cache.attention)
            } else {
                let to = |t: &Tensor| t.f_to_kind(cache.attention);
                attend(&to(&q)?, &to(&seen.keys)?, &to(&seen.values)?, &slots.masked)
            }
        })?;
        linear(Part::OProjection, &out.f_to_kind(x.kind())?, &self.o_proj)
    }
}
// --8<-- [end:attention]

/// The feed-forward block: `down(gelu_tanh(gate(x)) · up(x))`, double-wide on KV-shared layers when the
/// config says so.
struct Mlp {
    gate_up: GateUp,
    down_proj: Linear,
}

/// The feed-forward block's two products of one input.
enum GateUp {
    /// Dense, or on ATen's int4 kernel: apart, as step 03 holds them.
    Apart { gate: Linear, up: Linear },
    /// On this step's kernels: `[gate; up]` held in pairs of blocks, one call instead of three that returns
    /// `gelu_tanh(gate) · up` (`Linear::gelu_of_halves`: the same bits as the products and the gelu apart).
    Stacked(Linear),
}

impl Mlp {
    fn load(ckpt: &Checkpoint, cfg: &TextConfig, i: i64, held: &Held, like: &Tensor) -> Result<Mlp> {
        let (size, ff) = (cfg.hidden_size, cfg.intermediate(i));
        let name = |s: &str| format!("layers.{i}.mlp.{s}");
        let lin = |s: &str, out: i64, inp: i64| ckpt.held_linear(&name(s), out, inp, held, like);
        let (gate, up) = (name("gate_proj"), name("up_proj"));
        // paired where the gelu on the kernel's way out has ATen's bits (rows in ATen's whole vector steps)
        let paired = if tanh::whole_steps(ff) {
            ckpt.held_stacked(&[(&gate, ff), (&up, ff)], size, Stacking::Pairs, held)?
        } else {
            None
        };
        let gate_up = match paired {
            Some(both) => GateUp::Stacked(both),
            None => GateUp::Apart { gate: lin("gate_proj", ff, size)?, up: lin("up_proj", ff, size)? },
        };
        Ok(Mlp { gate_up, down_proj: lin("down_proj", size, ff)? })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mixed = match &self.gate_up {
            GateUp::Apart { gate, up } => {
                let (gate, up) = (linear(Part::GateUpProjections, x, gate)?, linear(Part::GateUpProjections, x, up)?);
                gelu_times(&gate, &up)?
            }
            // the gelu on the kernel's way out: timed with the product
            GateUp::Stacked(both) => {
                let (bytes, multiply_adds) = (both.bytes(), || x.size()[0] * both.weights());
                timed_product(Part::GateUpProjections, bytes, multiply_adds, || both.gelu_of_halves(x))?
            }
        };
        linear(Part::DownProjection, &mixed, &self.down_proj)
    }

    fn linears(&self) -> Vec<&Linear> {
        match &self.gate_up {
            GateUp::Apart { gate, up } => vec![gate, up, &self.down_proj],
            GateUp::Stacked(both) => vec![both, &self.down_proj],
        }
    }
}

/// How a layer takes in its per-layer input (see `PerLayerInputs`): a gate computed from the residual stream,
/// times the layer's slice of the per-layer inputs, projected back to the hidden size.
struct PerLayerInput {
    gate: Linear,
    projection: Linear,
}

impl PerLayerInput {
    fn load(ckpt: &Checkpoint, cfg: &TextConfig, i: i64, held: &Held, like: &Tensor) -> Result<PerLayerInput> {
        let (size, p) = (cfg.hidden_size, cfg.hidden_size_per_layer_input);
        let lin = |s: &str, out: i64, inp: i64| ckpt.held_linear(&format!("layers.{i}.{s}"), out, inp, held, like);
        Ok(PerLayerInput {
            gate: lin("per_layer_input_gate", p, size)?,
            projection: lin("per_layer_projection", size, p)?,
        })
    }

    fn forward(&self, x: &Tensor, input: &Tensor) -> Result<Tensor> {
        let mixed = match &self.gate {
            // on this step's kernels the gelu on the gate's way out, where its bits are ATen's (as Mlp's)
            Linear::Own(gate) if tanh::whole_steps(gate.out_rows()) => {
                let (bytes, multiply_adds) = (gate.bytes(), || x.size()[0] * gate.weights());
                timed_product(Part::PerLayerInput, bytes, multiply_adds, || gate.gelu_times(x, input))?
            }
            gate => gelu_times(&linear(Part::PerLayerInput, x, gate)?, input)?,
        };
        linear(Part::PerLayerInput, &mixed, &self.projection)
    }
}

// --8<-- [start:layer]
/// One decoder layer: three residual branches — attention, feed-forward, per-layer input — each normed before
/// it is added, then the layer scalar.
struct DecoderLayer {
    kind: AttentionKind,
    input_norm: RmsNorm,
    attention: Attention,
    post_attention_norm: RmsNorm,
    pre_feedforward_norm: RmsNorm,
    mlp: Mlp,
    post_feedforward_norm: RmsNorm,
    per_layer_input: PerLayerInput,
    post_per_layer_input_norm: RmsNorm,
    layer_scalar: Tensor,
}

impl DecoderLayer {
    fn load(ckpt: &Checkpoint, cfg: &TextConfig, i: i64, held: &Held, like: &Tensor) -> Result<DecoderLayer> {
        let norm = |s: &str| RmsNorm::load(ckpt, &format!("layers.{i}.{s}"), cfg.hidden_size, cfg.rms_norm_eps, like);
        Ok(DecoderLayer {
            kind: cfg.attention(i),
            input_norm: norm("input_layernorm")?,
            attention: Attention::load(ckpt, cfg, i, held, like)?,
            post_attention_norm: norm("post_attention_layernorm")?,
            pre_feedforward_norm: norm("pre_feedforward_layernorm")?,
            mlp: Mlp::load(ckpt, cfg, i, held, like)?,
            post_feedforward_norm: norm("post_feedforward_layernorm")?,
            per_layer_input: PerLayerInput::load(ckpt, cfg, i, held, like)?,
            post_per_layer_input_norm: norm("post_per_layer_input_norm")?,
            layer_scalar: ckpt.dense(&format!("layers.{i}.layer_scalar"), &[1], held.dtype, like)?,
        })
    }

    /// `input`: this layer's slice of the per-layer inputs, `[tokens, hidden_size_per_layer_input]`.
    fn forward(
        &self,
        x: &Tensor,
        input: &Tensor,
        rotation: &Rotation,
        slots: &Slots,
        cache: &mut Cache,
    ) -> Result<Tensor> {
        let attn = self.attention.forward(&self.input_norm.forward(x)?, rotation, slots, cache)?;
        let x = self.post_attention_norm.added_to(x, &attn)?;
        let ff = self.mlp.forward(&self.pre_feedforward_norm.forward(&x)?)?;
        let x = self.post_feedforward_norm.added_to(&x, &ff)?;
        let mixed = self.per_layer_input.forward(&x, input)?;
        // the layer scalar scales the whole residual stream
        self.post_per_layer_input_norm.added_to_then_scaled(&x, &mixed, &self.layer_scalar)
    }
}
// --8<-- [end:layer]

/// Gemma's E-series signature: each token brings every layer an input of its own, a token-identity part (a
/// second, huge embedding table) plus a context part (a projection of the embeddings), made once per pass.
struct PerLayerInputs {
    table: Table,
    /// sqrt(hidden_size_per_layer_input), rounded to the compute dtype.
    table_scale: f64,
    model_projection: Linear,
    projection_norm: RmsNorm,
    hidden_size: i64,
    layers: i64,
    size: i64,
}

impl PerLayerInputs {
    fn load(table: &Checkpoint, model: &Checkpoint, cfg: &TextConfig, held: &Held, like: &Tensor) -> Result<Self> {
        let (hidden_size, layers, size) = (cfg.hidden_size, cfg.num_hidden_layers, cfg.hidden_size_per_layer_input);
        let rows = cfg.vocab_size_per_layer_input;
        // The largest table (4.7 GB in bf16 at E2B, 1.3 GB packed), of which a token reads one row: with int4
        // linears it stays in the file, so the engine holds only what every token reads (see docs/steps/07_int4.md).
        let name = "embed_tokens_per_layer";
        let table = match held.weights {
            Weights::Int4 => Table::Mapped(table.mapped_table(name, rows, layers * size)?),
            Weights::Bf16 => Table::load(table, name, rows, layers * size, like)?,
        };
        Ok(PerLayerInputs {
            table,
            table_scale: scalar_in((size as f64).sqrt(), held.dtype)?,
            model_projection: model.held_linear(
                "per_layer_model_projection",
                layers * size,
                hidden_size,
                held,
                like,
            )?,
            projection_norm: RmsNorm::load(model, "per_layer_projection_norm", size, cfg.rms_norm_eps, like)?,
            hidden_size,
            layers,
            size,
        })
    }

    /// `[tokens, layers, size]` for the tokens `ids`, whose scaled embeddings are `embeds`.
    fn forward(&self, ids: &Tensor, embeds: &Tensor) -> Result<Tensor> {
        let shape = [ids.size()[0], self.layers, self.size];
        let identity = self.table.rows(ids, embeds.kind())?.f_mul_scalar(self.table_scale)?;
        let context = linear(Part::PerLayerModelProjection, embeds, &self.model_projection)?
            .f_mul_scalar((self.hidden_size as f64).powf(-0.5))?;
        let context = self.projection_norm.forward(&context.f_view(shape)?)?;
        Ok(context.f_add(&identity.f_view(shape)?)?.f_mul_scalar(2f64.powf(-0.5))?)
    }
}

// --8<-- [start:cache]
/// The keys and values of every cache-owning layer, and the bookkeeping: which position each slot holds.
pub struct Cache {
    /// Per layer; None for a KV-shared layer, which reads another layer's.
    layers: Vec<Option<KeyValues>>,
    /// int64 `[slots]`, -1 = empty: a sliding ring, and a full cache (`ctx` slots).
    positions: ByKind<Tensor>,
    pub ctx: i64,
    window: i64,
    /// The dtype the keys and values are held in: attention's, or bf16 where attention computes in float32 over
    /// bf16 keys and values (`Gemma::new_cache`).
    pub dtype: Kind,
    /// The dtype attention computes in.
    pub attention: Kind,
    /// How many full-cache slots a decode step attends over (see `decode_slots_at`).
    pub decode_slots: DecodeSlots,
    /// What runs a one-token pass's attention over it (attend.rs); longer prompt chunks always run `attend`.
    pub decode_attention: DecodeAttention,
}

/// What a decode step's full layers attend over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeSlots {
    /// The visible bucket: the slots up to the step's position, rounded up as a prompt chunk's are
    /// (`full_slots_for`). A few shapes (eleven at E2B), and no work on empty slots: the CPU and CUDA default.
    Bucket,
    /// All `ctx` slots: one shape, so one compiled program at every position — the TPU default.
    All,
}

/// The fewest slots a prompt chunk or decode step attends over (`Cache::full_slots_for`). Step 03 started the
/// buckets at the chunk length, 512 at E2B, so a 19-token prompt scored 512 slots in every layer; from 64, three more
/// shapes for a TPU to compile (64, 128 and 256), and E2B's 19-token read on an AMX Xeon kept from AMX spent 8.7 ms
/// in attention instead of 27.8 (`budget.py --read`, 2026-12-06; 62.7 tok/s instead of 52.4).
pub const SMALLEST_BUCKET: i64 = 64;

/// One layer's cache, `[kv_heads, slots, head_dim]` each.
struct KeyValues {
    keys: Tensor,
    values: Tensor,
}

/// Where one pass's tokens go in the caches of one attention kind, and what its queries may see.
struct Slots {
    /// int64 `[tokens]`: the slot each token's key and value is written to.
    written: Tensor,
    /// The queries attend over the first `seen` slots of a cache.
    seen: i64,
    /// bool `[tokens, seen]`: true where a query must not see a slot (empty, in its future, or out of window).
    masked: Tensor,
    /// A one-token pass's slot (a decode step's), known on the host where its position is: its key and value can go
    /// straight there (`Cache::slot_for_one`).
    one: Option<i64>,
}

impl Slots {
    /// The slots and masks of the last `rows` tokens only, for layers that write no cache: they see the same slots.
    fn last(&self, rows: i64) -> Result<Slots> {
        let (written, masked) = (last_rows(&self.written, rows)?, last_rows(&self.masked, rows)?);
        Ok(Slots { written, seen: self.seen, masked, one: None })
    }
}

impl Cache {
    fn new(cfg: &TextConfig, ctx: i64, dtype: Kind, attention: Kind, like: &Tensor) -> Result<Cache> {
        let slots = |kind| if kind == AttentionKind::Full { ctx } else { cfg.ring_len() };
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let kind = cfg.attention(i);
            layers.push(if cfg.kv_source(i) == i {
                let shape = [cfg.kv_heads(kind), slots(kind), cfg.head_dim(kind)];
                // zeros, never NaN: masked slots still get multiplied by 0. Two allocations: on the CPU `on`
                // returns its input, and keys and values must not share storage.
                let zeros = || -> Result<Tensor> { Ok(on(&Tensor::f_zeros(shape, (dtype, Device::Cpu))?, like)?) };
                Some(KeyValues { keys: zeros()?, values: zeros()? })
            } else {
                None
            });
        }
        let empty =
            |kind| -> Result<Tensor> { Ok(on(&Tensor::f_full([slots(kind)], -1, (Kind::Int64, Device::Cpu))?, like)?) };
        let (positions, window) = (ByKind::try_new(empty)?, cfg.sliding_window);
        let (decode_slots, decode_attention) = (DecodeSlots::Bucket, DecodeAttention::Aten);
        Ok(Cache { layers, positions, ctx, window, dtype, attention, decode_slots, decode_attention })
    }

    /// Bytes the caches hold: keys, values and the slot positions.
    pub fn bytes(&self) -> i64 {
        let kv: i64 = self.layers.iter().flatten().map(|kv| bytes(&kv.keys) + bytes(&kv.values)).sum();
        kv + bytes(&self.positions.sliding) + bytes(&self.positions.full)
    }

    /// Every slot empty; the stale keys and values stay, masked.
    fn clear(&mut self) -> Result<()> {
        for positions in [&mut self.positions.sliding, &mut self.positions.full] {
            let _ = positions.f_fill_(-1)?;
        }
        Ok(())
    }

    /// Prompt tokens per forward pass: one window, so that a ring of `window + chunk` slots always still holds
    /// the window before a chunk.
    pub fn chunk_len(&self) -> i64 {
        self.window
    }

    // --8<-- [start:full_slots]
    /// How many slots of a full cache a prompt chunk ending at position `end` (exclusive) attends over. A prompt
    /// fills a full cache from slot 0 and never wraps it (it is at most `ctx` long), so all the chunk can see lies
    /// in slots `0..end`. That is rounded up to `SMALLEST_BUCKET` (or the chunk length, if shorter) times a power of
    /// two, capped at `ctx`: a handful of shapes to compile (eleven for E2B's 512-token chunks in a 33,024-token
    /// context), and a chunk near the start of a long context does not score thousands of empty slots, nor a short
    /// prompt hundreds. The rounding adds only masked slots, whose probabilities are exactly 0, so the result does
    /// not change.
    pub fn full_slots_for(&self, end: i64) -> i64 {
        let mut slots = self.chunk_len().min(SMALLEST_BUCKET);
        while slots < end {
            slots *= 2;
        }
        slots.min(self.ctx)
    }
    // --8<-- [end:full_slots]

    // --8<-- [start:decode_slots]
    /// How many slots of a full cache a decode step at position `pos` attends over. A full cache holds position p
    /// in slot p and a decode step never passes `ctx`, so what the step sees lies in slots `0..=pos`: with
    /// `DecodeSlots::Bucket` that is rounded up exactly as a prompt chunk's (the added slots are masked and
    /// change nothing, bit for bit); with `DecodeSlots::All` it is every slot.
    pub fn decode_slots_at(&self, pos: i64) -> i64 {
        match self.decode_slots {
            DecodeSlots::Bucket => self.full_slots_for(pos + 1),
            DecodeSlots::All => self.ctx,
        }
    }
    // --8<-- [end:decode_slots]

    /// Records that the tokens at positions `pos` (int64 `[tokens]`) now occupy their slots — position p in slot
    /// p mod the cache's length — and returns, for each attention kind, those slots and what each token may
    /// see. Full layers attend over the first `full_slots` slots; sliding layers over as many of their ring's
    /// (step 03: the whole ring). A ring fills from slot 0 as a full cache does, so until it wraps all it holds
    /// lies in the slots a full cache's bucket covers, and once it wraps the bucket covers the whole ring: a short
    /// context's decode step no longer scores 1,024 slots of which a few dozen hold anything. With
    /// `DecodeSlots::All` that is the whole ring, as before: one shape.
    fn place(&mut self, pos: &Tensor, full_slots: i64) -> Result<ByKind<Slots>> {
        let window = self.window;
        let query = pos.f_unsqueeze(1)?;
        let one = if pos.numel() == 1 && pos.device() == Device::Cpu { Some(pos.f_int64_value(&[0])?) } else { None };
        ByKind::try_new(|kind| {
            let positions = self.positions.get_mut(kind);
            let written = pos.f_remainder(positions.size()[0])?;
            let _ = positions.f_index_copy_(0, &written, pos)?;
            let seen = if kind == AttentionKind::Full { full_slots } else { full_slots.min(positions.size()[0]) };
            let key = positions.f_narrow(0, 0, seen)?.f_unsqueeze(0)?;
            let mut visible = key.f_ge(0)?.f_logical_and(&key.f_le_tensor(&query)?)?;
            if kind == AttentionKind::Sliding {
                // key k is visible to query q iff q - window < k <= q
                visible = visible.f_logical_and(&key.f_gt_tensor(&query.f_sub_scalar(window)?)?)?;
            }
            let one = one.map(|p| p % positions.size()[0]);
            Ok(Slots { written, seen, masked: visible.f_logical_not()?, one })
        })
    }

    /// Writes a cache owner's keys and values `[tokens, kv_heads, head_dim]` into its slots.
    fn write(&mut self, layer: usize, slots: &Slots, k: &Tensor, v: &Tensor) -> Result<()> {
        let dtype = self.dtype;
        let cache = self.layers[layer].as_mut().expect("a layer with k/v projections owns a cache");
        let _ = cache.keys.f_index_copy_(1, &slots.written, &k.f_transpose(0, 1)?.f_to_kind(dtype)?)?;
        let _ = cache.values.f_index_copy_(1, &slots.written, &v.f_transpose(0, 1)?.f_to_kind(dtype)?)?;
        Ok(())
    }

    /// For a one-token pass on the CPU, `layer`'s keys and values and the slot its token goes to, where they hold
    /// `kind` (the compute dtype): its norms can write them there. None otherwise: `write` copies them in.
    fn slot_for_one(&self, layer: usize, slots: &Slots, kind: Kind) -> Option<(&Tensor, &Tensor, i64)> {
        let cache = self.layers[layer].as_ref()?;
        let slot = slots.one?;
        (self.dtype == kind && cache.keys.device() == Device::Cpu).then_some((&cache.keys, &cache.values, slot))
    }

    /// The slots of `layer`'s cache its queries attend over.
    fn seen(&self, layer: usize, slots: &Slots) -> Result<KeyValues> {
        let cache = self.layers[layer].as_ref().expect("a KV source owns a cache");
        Ok(KeyValues { keys: cache.keys.f_narrow(1, 0, slots.seen)?, values: cache.values.f_narrow(1, 0, slots.seen)? })
    }
}
// --8<-- [end:cache]

// --8<-- [start:wanted]
/// Which final hidden states a prompt read gives back.
#[derive(Clone, Copy, PartialEq)]
pub enum Wanted {
    /// The prompt's last token's only (generate, prefill): the rows before it skip the KV-shared layers.
    LastRow,
    /// Every token's (logits at any position).
    EveryRow,
    /// Every token's, and every layer's input (hidden states).
    EveryLayer,
}
// --8<-- [end:wanted]

/// What `generate` made, and how long it took.
pub struct Generation {
    pub tokens: Vec<i64>,
    /// Seconds for the prompt read, which also yields the first token.
    pub read_s: f64,
    /// Seconds for the decode steps made after it.
    pub decode_s: f64,
}

/// Bytes of the weights a decode step reads whole (not a row of a table), as held: what `held_bytes` and
/// `weight_bytes_per_token` are made of.
struct ReadWhole {
    /// every layer's matrices and the per-layer projection
    linears: i64,
    head: i64,
    /// the norms' weights and the layer scalars
    norms: i64,
}

pub struct Gemma {
    pub cfg: TextConfig,
    /// The compute dtype; weights are what the checkpoint holds, cast to it.
    pub dtype: Kind,
    /// A tensor on the target device: new tensors are moved next to it (`tch::Device` cannot name a TPU).
    like: Tensor,
    embed_tokens: Table,
    /// sqrt(hidden_size), rounded to the compute dtype (39.19 -> 39.25 in bf16).
    embed_scale: f64,
    per_layer_inputs: PerLayerInputs,
    rotary: ByKind<Rotary>,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// How the linears are held.
    pub weights: Weights,
    /// The kernel for the matrices kept 4-bit (with `Weights::Int4`).
    pub matmul: Int4Matmul,
    /// With `weights="auto"`: the packed matrices the int4 kernel could not take, held dense instead.
    pub kept_dense: Vec<String>,
    /// Whether a decode step's dense linears run on ATen's mat-vec or on oneDNN's, as Transformers' do (see
    /// onednn.rs; the default depends on the CPU: lib.rs' `matvec_in_aten_arg`). The 4-bit linears run on
    /// `matmul`'s kernel either way.
    pub matvec_in_aten: bool,
}

impl Gemma {
    // --8<-- [start:load]
    /// Loads the checkpoint `model` (a -text checkpoint) onto like's device, its linears held as `held` says, in
    /// `held.dtype`; with the `twin` (-text-emb4), every table it holds packed (`embed_tokens_per_layer`,
    /// `embed_tokens`, an untied `lm_head`) comes from it and stays packed.
    pub fn load(
        model: &Checkpoint,
        twin: Option<&Checkpoint>,
        like: &Tensor,
        held: Held,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Gemma> {
        let cfg = model.config.text.clone();
        let (dtype, held) = (held.dtype, &held);
        // an empty tensor on the device stands in for the caller's (which may be large) from here on
        let like = &on(&Tensor::f_empty([0], (dtype, Device::Cpu))?, like)?;
        let packed_in_twin = |name: &str| twin.filter(|t| t.has(&format!("{name}.weight_packed")));
        let table_source = |name: &str| packed_in_twin(name).unwrap_or(model);

        let embed_tokens =
            Table::load(table_source("embed_tokens"), "embed_tokens", cfg.vocab_size, cfg.hidden_size, like)?;
        let per_layer_inputs = PerLayerInputs::load(table_source("embed_tokens_per_layer"), model, &cfg, held, like)?;
        // The output head reads every row every token: kept 4-bit, or dequantized once (in the compute dtype)
        // rather than unpacked, 262144 × 1536 values, at every step. As Transformers: tied (the default), it is
        // the embedding table, whatever else the checkpoint ships; untied, the checkpoint's `lm_head`. With the twin,
        // its config says (the -text-emb4 repack unties the head to ship it packed), as Transformers reads the twin.
        let tied = twin.map_or(cfg.tie_word_embeddings, |t| t.config.text.tie_word_embeddings);
        let has_head = |c: &&Checkpoint| c.has("lm_head.weight_packed") || c.has("lm_head.weight");
        let lm_head = match packed_in_twin("lm_head").or(Some(model).filter(has_head)) {
            _ if tied => embed_tokens.head(held, like)?,
            Some(ckpt) => ckpt.held_linear("lm_head", cfg.vocab_size, cfg.hidden_size, held, like)?,
            None => {
                return Err(invalid!(
                    "{}: tie_word_embeddings is false but no lm_head tensor is in the checkpoint{}",
                    model.dir.display(),
                    if twin.is_some() { " or its twin" } else { "" }
                ))
            }
        };
        let n = cfg.num_hidden_layers as usize;
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            progress(i as usize, n);
            layers.push(DecoderLayer::load(model, &cfg, i, held, like)?);
        }
        progress(n, n);
        Ok(Gemma {
            embed_scale: scalar_in((cfg.hidden_size as f64).sqrt(), dtype)?,
            rotary: ByKind::try_new(|kind| Rotary::new(&cfg, kind, like))?,
            norm: RmsNorm::load(model, "norm", cfg.hidden_size, cfg.rms_norm_eps, like)?,
            like: like.shallow_clone(),
            cfg,
            dtype,
            embed_tokens,
            per_layer_inputs,
            layers,
            lm_head,
            weights: held.weights,
            matmul: held.matmul,
            kept_dense: held.kept_dense.take(),
            matvec_in_aten: true,
        })
    }
    // --8<-- [end:load]

    // --8<-- [start:new_cache]
    /// Empty caches for a context of `ctx` tokens, held in `kv_dtype`, for attention computed in `attention_dtype`.
    /// The compute dtype keeps every bit Transformers' bf16 gives; float32 attention (keys and values rounded
    /// to bf16 by their projections, then scores and probabilities kept in float32) is several times faster on
    /// a CPU whose bf16 matmul has no fast path, where attention over a long cache dominates a decode step. Its
    /// keys and values are still bf16 values, so a bf16 cache holds them exactly in half a float32 cache's bytes:
    /// attention widens them as it reads them, and gives a float32 cache's bits.
    pub fn new_cache(&self, ctx: i64, kv_dtype: Kind, attention_dtype: Kind) -> Result<Cache> {
        Cache::new(&self.cfg, ctx, kv_dtype, attention_dtype, &self.like)
    }
    // --8<-- [end:new_cache]

    /// Bytes of the parts a decode step reads whole, as held.
    fn read_whole(&self) -> ReadWhole {
        let norm = |n: &RmsNorm| n.weight.as_ref().map_or(0, bytes);
        let inputs = &self.per_layer_inputs;
        let mut linears = inputs.model_projection.bytes();
        let mut norms = norm(&inputs.projection_norm) + norm(&self.norm);
        for l in &self.layers {
            let (a, mlp, pli) = (&l.attention, &l.mlp, &l.per_layer_input);
            let all = a.projections.linears().into_iter().chain([&a.o_proj, &pli.gate, &pli.projection]);
            linears += all.chain(mlp.linears()).map(Linear::bytes).sum::<i64>();
            let layer_norms = [&l.input_norm, &a.q_norm, &l.post_attention_norm, &l.pre_feedforward_norm];
            let more = [&l.post_feedforward_norm, &l.post_per_layer_input_norm];
            norms += layer_norms.into_iter().chain(more).map(norm).sum::<i64>() + bytes(&l.layer_scalar);
            norms += a.k_norm.as_ref().map_or(0, norm);
        }
        ReadWhole { linears, head: self.lm_head.bytes(), norms }
    }

    /// Bytes of weights one decode step reads, as held (the benchmark's bandwidth figure): every layer's matrices,
    /// norms and scalar, the per-layer projection, the final norm and head, one row of each embedding table.
    pub fn weight_bytes_per_token(&self) -> i64 {
        let whole = self.read_whole();
        whole.linears
            + whole.head
            + whole.norms
            + self.embed_tokens.row_bytes()
            + self.per_layer_inputs.table.row_bytes()
    }

    /// Bytes of weights held in memory, by part. A tied head that is the embedding table itself counts once.
    pub fn held_bytes(&self) -> Vec<(&'static str, i64)> {
        let whole = self.read_whole();
        let shared = match (&self.lm_head, &self.embed_tokens) {
            (Linear::Dense(w), Table::Dense(t)) => w.data_ptr() == t.data_ptr(),
            _ => false,
        };
        vec![
            ("linears", whole.linears),
            ("head", if shared { 0 } else { whole.head }),
            ("embed_tokens", self.embed_tokens.bytes()),
            ("embed_tokens_per_layer", self.per_layer_inputs.table.bytes()),
            ("norms and scalars", whole.norms),
        ]
    }

    /// Ids as a device tensor.
    pub fn to_device(&self, values: &[i64]) -> Result<Tensor> {
        Ok(on(&Tensor::f_from_slice(values)?, &self.like)?)
    }

    // --8<-- [start:forward]
    /// One forward pass over `ids` at positions `pos` (int64 device tensors `[tokens]`), writing their keys
    /// and values into `cache`; full layers attend over the cache's first `full_slots` slots (a bucket for a
    /// prompt chunk, `cache.decode_slots_at(pos)` for a decode step). Returns the final-norm hidden states of the
    /// last `keep` tokens, `[keep, hidden]`; with `states` (and `keep` all of them), also collects each layer's
    /// input (Transformers' `output_hidden_states` convention).
    pub fn forward(
        &self,
        ids: &Tensor,
        pos: &Tensor,
        full_slots: i64,
        cache: &mut Cache,
        mut states: Option<&mut Vec<Tensor>>,
        keep: i64,
    ) -> Result<Tensor> {
        let mut x = self.embed_tokens.rows(ids, self.dtype)?.f_mul_scalar(self.embed_scale)?;
        let mut per_layer_inputs = self.per_layer_inputs.forward(ids, &x)?;
        let mut slots = timed(Part::CacheWrite, 0, || cache.place(pos, full_slots))?;
        let mut rotations = ByKind::try_new(|kind| self.rotary.get(kind).at(pos, self.dtype))?;
        let tokens = ids.size()[0];
        for (i, layer) in self.layers.iter().enumerate() {
            // --8<-- [start:shared_rows]
            if i as i64 == self.cfg.first_shared() && keep < tokens {
                // From here on every layer reads the caches of earlier layers and writes none: a row whose
                // output nobody wants has nothing more to give, so only the last `keep` rows go on.
                if keep == 0 {
                    return last_rows(&x, 0);
                }
                (x, per_layer_inputs) = (last_rows(&x, keep)?, last_rows(&per_layer_inputs, keep)?);
                slots = ByKind::try_new(|kind| slots.get(kind).last(keep))?;
                rotations = ByKind::try_new(|kind| rotations.get(kind).last(keep))?;
            }
            // --8<-- [end:shared_rows]
            if let Some(states) = states.as_deref_mut() {
                states.push(x.shallow_clone());
            }
            let (input, kind) = (per_layer_inputs.f_select(1, i as i64)?, layer.kind);
            x = layer.forward(&x, &input, rotations.get(kind), slots.get(kind), cache)?;
        }
        if x.size()[0] > keep {
            // a model with no KV-shared layers: every layer wrote a cache, and only now are rows left out
            x = last_rows(&x, keep)?;
        }
        let out = self.norm.forward(&x)?;
        if let Some(states) = states {
            states.push(out.shallow_clone());
        }
        Ok(out)
    }
    // --8<-- [end:forward]

    /// Logits `[tokens, vocab]` from final hidden states: the output head, then `tanh(x / cap) * cap`.
    pub fn head(&self, out: &Tensor) -> Result<Tensor> {
        let logits = linear(Part::Head, out, &self.lm_head)?;
        Ok(match self.cfg.final_logit_softcapping {
            Some(cap) if tanh::softcap_takes(&logits) => tanh::softcap(logits, cap)?, // the same bits in one call
            Some(cap) => logits.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?,
            None => logits,
        })
    }

    // --8<-- [start:read]
    /// Reads a prompt into a fresh cache in chunks of `cache.chunk_len()` tokens, calling `each(start, out,
    /// states)` after each chunk with the final hidden states `wanted` asks for (those of its last rows: none or
    /// all of them) and, with `Wanted::EveryLayer`, every layer's input (else an empty list). `interrupted` is asked
    /// after each chunk (the Python engine checks for Ctrl-C there).
    pub fn read(
        &self,
        ids: &[i64],
        cache: &mut Cache,
        wanted: Wanted,
        interrupted: &mut dyn FnMut() -> Result<()>,
        mut each: impl FnMut(i64, Tensor, Vec<Tensor>) -> Result<()>,
    ) -> Result<()> {
        cache.clear()?;
        let chunk_len = cache.chunk_len();
        for (n, chunk) in ids.chunks(chunk_len as usize).enumerate() {
            let start = n as i64 * chunk_len;
            let end = start + chunk.len() as i64;
            let pos = self.to_device(&(start..end).collect::<Vec<_>>())?;
            let full_slots = cache.full_slots_for(end);
            let keep = match wanted {
                Wanted::LastRow => (end == ids.len() as i64) as i64,
                Wanted::EveryRow | Wanted::EveryLayer => chunk.len() as i64,
            };
            let mut states = Vec::new();
            let collect = (wanted == Wanted::EveryLayer).then_some(&mut states);
            let out = self.forward(&self.to_device(chunk)?, &pos, full_slots, cache, collect, keep)?;
            each(start, out, states)?;
            interrupted()?;
        }
        Ok(())
    }
    // --8<-- [end:read]

    // --8<-- [start:generate]
    /// Greedy decoding: read `ids`, then produce `max_new` tokens, or fewer when one of `stop` comes (it is the
    /// last token returned). The next token is picked on the device (argmax) and fed straight back; tokens are
    /// copied to the host every `read_every` steps, so a stop is seen only then: the steps made after it in
    /// the same batch are dropped (and timed).
    pub fn generate(
        &self,
        ids: &[i64],
        max_new: i64,
        read_every: i64,
        stop: &[i64],
        cache: &mut Cache,
        interrupted: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Generation> {
        let start = Instant::now();
        let last = self.read_last(ids, cache, interrupted)?;
        let mut tokens = Vec::new();
        if max_new == 0 {
            return Ok(Generation { tokens, read_s: start.elapsed().as_secs_f64(), decode_s: 0.0 });
        }
        let mut token = greedy(&self.head(&last)?)?;
        tokens.push(token.f_int64_value(&[0])?);
        let read_s = start.elapsed().as_secs_f64();

        let start = Instant::now();
        let mut stopped = stop.contains(&tokens[0]);
        let mut pos = self.to_device(&[ids.len() as i64])?;
        let mut pending = Vec::new();
        let mut made = 1;
        while made < max_new && !stopped {
            // the step's position, known on the host too: ids.len() for the first decode step
            let full_slots = cache.decode_slots_at(ids.len() as i64 + made - 1);
            token = greedy(&self.decode(&token, &pos, full_slots, cache)?)?;
            pos = pos.f_add_scalar(1)?;
            pending.push(token.shallow_clone());
            made += 1;
            interrupted()?;
            if pending.len() as i64 == read_every || made == max_new {
                let read = Vec::<i64>::try_from(Tensor::f_cat(&pending, 0)?)?;
                stopped = read.iter().any(|t| stop.contains(t));
                tokens.extend(read);
                pending.clear();
            }
        }
        let decode_s = start.elapsed().as_secs_f64();
        if let Some(end) = tokens.iter().position(|t| stop.contains(t)) {
            tokens.truncate(end + 1);
        }
        Ok(Generation { tokens, read_s, decode_s })
    }
    // --8<-- [end:generate]

    /// Reads `ids`, then makes `steps` greedy decode steps as `generate` does (reading each token back to the host)
    /// with a budget taken (budget.rs): the tokens (the first from the read), and what each part of those steps
    /// took and read, summed over them.
    pub fn decode_budget(
        &self,
        ids: &[i64],
        steps: i64,
        cache: &mut Cache,
        interrupted: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(Vec<i64>, Budget)> {
        let mut token = greedy(&self.prefill(ids, cache, interrupted)?)?;
        let mut tokens = vec![token.f_int64_value(&[0])?];
        let (done, budget) = budget::taken(|| -> Result<()> {
            for made in 0..steps {
                let pos = ids.len() as i64 + made;
                let logits = self.decode(&token, &self.to_device(&[pos])?, cache.decode_slots_at(pos), cache)?;
                token = timed(Part::Sampling, 0, || greedy(&logits))?;
                tokens.push(timed(Part::Sampling, 0, || token.f_int64_value(&[0]))?);
            }
            Ok(())
        });
        done?;
        interrupted()?;
        Ok((tokens, budget))
    }

    /// Reads the prompt `ids` as `generate` does — its chunks, the head on the last row, the first token — with a
    /// budget taken: the first token, and what each part of the read took and read.
    pub fn read_budget(
        &self,
        ids: &[i64],
        cache: &mut Cache,
        interrupted: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(i64, Budget)> {
        let (token, budget) = budget::taken(|| -> Result<i64> {
            let logits = self.prefill(ids, cache, interrupted)?;
            let token = timed(Part::Sampling, 0, || greedy(&logits))?;
            Ok(timed(Part::Sampling, 0, || token.f_int64_value(&[0]))?)
        });
        Ok((token?, budget))
    }

    // --8<-- [start:prefill]
    /// Reads the prompt `ids` into a fresh cache; returns the logits `[1, vocab]` after its last token.
    pub fn prefill(
        &self,
        ids: &[i64],
        cache: &mut Cache,
        interrupted: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Tensor> {
        self.head(&self.read_last(ids, cache, interrupted)?)
    }

    /// Reads the prompt `ids` into a fresh cache; returns the final hidden state of its last token, `[1, hidden]`.
    fn read_last(&self, ids: &[i64], cache: &mut Cache, interrupted: &mut dyn FnMut() -> Result<()>) -> Result<Tensor> {
        let mut last = None;
        self.read(ids, cache, Wanted::LastRow, interrupted, |_, out, _| {
            if out.size()[0] == 1 {
                last = Some(out);
            }
            Ok(())
        })?;
        last.ok_or_else(|| invalid!("read: the prompt is empty"))
    }

    /// One decode step: `token` (int64 `[1]` on the device) at position `pos` into the cache; returns the
    /// logits `[1, vocab]` for the token after it.
    pub fn step(&self, token: &Tensor, pos: i64, cache: &mut Cache) -> Result<Tensor> {
        self.decode(token, &self.to_device(&[pos])?, cache.decode_slots_at(pos), cache)
    }
    // --8<-- [end:prefill]

    // --8<-- [start:decode]
    /// A decode step's forward pass and head, its one-row dense linears on the kernel `matvec_in_aten` picks (see
    /// onednn.rs).
    fn decode(&self, token: &Tensor, pos: &Tensor, full_slots: i64, cache: &mut Cache) -> Result<Tensor> {
        one_row_in_aten(self.matvec_in_aten, || self.head(&self.forward(token, pos, full_slots, cache, None, 1)?))
    }
    // --8<-- [end:decode]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{e2b, parse};

    /// E2B's config with heads one wide, so that its caches are small enough for a test.
    fn narrow_e2b() -> TextConfig {
        let mut config = e2b();
        config["text_config"]["head_dim"] = 2.into();
        config["text_config"]["global_head_dim"] = 2.into();
        parse(&config).unwrap().text
    }

    fn cpu() -> Tensor {
        Tensor::zeros([1], (Kind::Float, Device::Cpu))
    }

    #[test]
    fn prompt_chunks_attend_over_power_of_two_buckets_of_the_full_cache() {
        let cache = Cache::new(&narrow_e2b(), 33024, Kind::Float, Kind::Float, &cpu()).unwrap();
        assert_eq!(cache.chunk_len(), 512);
        let buckets: Vec<i64> = [1, 512, 513, 4076, 16384, 16385, 32768, 32769, 33024]
            .into_iter()
            .map(|end| cache.full_slots_for(end))
            .collect();
        assert_eq!(buckets, [64, 512, 1024, 4096, 16384, 32768, 32768, 33024, 33024]);
        let buckets: Vec<i64> = [19, 64, 65, 200, 300].into_iter().map(|end| cache.full_slots_for(end)).collect();
        assert_eq!(buckets, [64, 64, 128, 256, 512]);
        let distinct: std::collections::BTreeSet<i64> = (1..=33024).map(|end| cache.full_slots_for(end)).collect();
        assert_eq!(distinct.len(), 11, "{distinct:?}");
        let short = Cache::new(&narrow_e2b(), 300, Kind::Float, Kind::Float, &cpu()).unwrap();
        assert_eq!((short.full_slots_for(10), short.full_slots_for(290)), (64, 300));
    }

    #[test]
    fn only_cache_owners_get_a_cache_of_their_kind() {
        let cfg = narrow_e2b();
        let cache = Cache::new(&cfg, 4096, Kind::BFloat16, Kind::BFloat16, &cpu()).unwrap();
        assert_eq!(cache.layers.iter().filter(|c| c.is_some()).count(), 15);
        assert!(cache.layers[15..].iter().all(Option::is_none));
        let size = |i: usize| cache.layers[i].as_ref().unwrap().keys.size();
        assert_eq!((size(0), size(4)), (vec![1, 1024, 2], vec![1, 4096, 2]));
        let kv = cache.layers[0].as_ref().unwrap();
        assert_ne!(kv.keys.data_ptr(), kv.values.data_ptr(), "keys and values must not share storage");
    }

    /// The mask as rows of 0/1 (1 = masked), for comparing with a picture.
    fn rows(masked: &Tensor) -> Vec<Vec<i64>> {
        let (tokens, slots) = masked.size2().unwrap();
        let flat = Vec::<i64>::try_from(masked.to_kind(Kind::Int64).view([-1])).unwrap();
        (0..tokens as usize).map(|t| flat[t * slots as usize..(t + 1) * slots as usize].to_vec()).collect()
    }

    #[test]
    fn the_cache_places_tokens_and_masks_what_each_may_not_see() {
        let mut config = e2b();
        config["text_config"]["head_dim"] = 2.into();
        config["text_config"]["global_head_dim"] = 2.into();
        config["text_config"]["sliding_window"] = 2.into(); // rings of 4 slots, prompt chunks of 2
        let mut cache = Cache::new(&parse(&config).unwrap().text, 8, Kind::Float, Kind::Float, &cpu()).unwrap();
        let pos = |p: &[i64]| Tensor::from_slice(p);

        let slots = cache.place(&pos(&[0, 1]), cache.full_slots_for(2)).unwrap();
        assert_eq!(Vec::<i64>::try_from(&slots.sliding.written).unwrap(), [0, 1]);
        // the first chunk's bucket (2 slots) covers all a ring holds before it wraps: slots 2 and 3 are not scored
        assert_eq!((slots.sliding.seen, slots.full.seen), (2, 2));
        assert_eq!(rows(&slots.sliding.masked), [[0, 1], [0, 0]]); // causal
        assert_eq!(rows(&slots.full.masked), [[0, 1], [0, 0]]);

        for p in 2..5 {
            cache.place(&pos(&[p]), cache.ctx).unwrap();
        }
        // position 5 goes to ring slot 1; the ring holds positions 4, 5, 2, 3; a window of 2 sees 4 and 5
        let slots = cache.place(&pos(&[5]), cache.ctx).unwrap();
        assert_eq!(Vec::<i64>::try_from(&slots.sliding.written).unwrap(), [1]);
        assert_eq!(Vec::<i64>::try_from(&slots.full.written).unwrap(), [5]);
        assert_eq!(rows(&slots.sliding.masked), [[0, 0, 1, 1]]);
        assert_eq!(rows(&slots.full.masked), [[0, 0, 0, 0, 0, 0, 1, 1]]);

        cache.clear().unwrap();
        let slots = cache.place(&pos(&[0]), cache.ctx).unwrap();
        assert_eq!(rows(&slots.sliding.masked), [[0, 1, 1, 1]], "a cleared cache holds nothing");
    }

    #[test]
    fn full_layers_rotate_only_a_quarter_of_their_pairs() {
        let cfg = parse(&e2b()).unwrap().text;
        let nonzero = |kind| {
            let inv_freq = Rotary::new(&cfg, kind, &cpu()).unwrap().inv_freq;
            (inv_freq.size()[0], inv_freq.f_ne(0.0).unwrap().sum(Kind::Int64).int64_value(&[]))
        };
        assert_eq!(nonzero(AttentionKind::Sliding), (128, 128));
        assert_eq!(nonzero(AttentionKind::Full), (256, 64));
    }
}
