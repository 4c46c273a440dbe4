//! Gemma 4 text model (the E-series: E2B, E4B), in the order the guide describes it (docs/steps/03_model.md).
//!
//! One forward pass works on a chunk of consecutive tokens of one sequence. Keys and values go into fixed-size
//! caches — a ring of `window + chunk` slots for each sliding layer, `ctx` slots for each full layer — and
//! every layer attends over its cache, masking the slots it must not see. A decode step attends over all of
//! them: the same program with the same shapes at every depth, what an accelerator that compiles per shape
//! wants. A prompt chunk attends over the part of a full cache that can hold what it sees, rounded up to one
//! of a few bucket sizes: few shapes, and no work on slots that are certainly empty.
use std::path::Path;
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use crate::bridge::on;
use crate::config::{Attention, TextConfig};
use crate::error::{invalid, Result};
use crate::weights::{Checkpoint, Packed};

/// An embedding table: as stored (bf16), or packed int4 (the emb4 twin), gathering and unpacking rows.
enum Table {
    Dense(Tensor),
    Packed(Packed),
}

impl Table {
    fn load(ckpt: &Checkpoint, name: &str, rows: i64, cols: i64, like: &Tensor) -> Result<Table> {
        if ckpt.has(&format!("{name}.weight_packed")) {
            Ok(Table::Packed(ckpt.packed(name, rows, cols, like)?))
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

    fn rows(&self, ids: &Tensor, kind: Kind) -> Result<Tensor> {
        let rows = match self {
            Table::Dense(t) => t.f_index_select(0, ids)?,
            Table::Packed(p) => p.rows(ids)?,
        };
        Ok(rows.f_to_kind(kind)?)
    }

    /// Bytes one gathered row takes as stored.
    fn row_bytes(&self) -> i64 {
        match self {
            Table::Dense(t) => t.size()[1] * t.kind().elt_size_in_bytes() as i64,
            Table::Packed(p) => p.row_bytes(),
        }
    }

    /// The whole table as a `kind` matrix, for an output head tied to the embeddings.
    fn matrix(&self, kind: Kind) -> Result<Tensor> {
        Ok(match self {
            Table::Dense(t) => t.f_to_kind(kind)?, // no copy when the dtypes already agree
            Table::Packed(p) => p.dequantize()?.f_to_kind(kind)?,
        })
    }
}

struct Layer {
    attention: Attention,
    head_dim: i64,
    /// Whose cache this layer attends over: its own, or the one it shares (KV-shared layers).
    kv_source: usize,
    input_norm: Tensor,
    q_proj: Tensor,
    q_norm: Tensor,
    /// k_proj, v_proj and k_norm: only layers that own a cache compute keys and values.
    kv: Option<(Tensor, Tensor, Tensor)>,
    o_proj: Tensor,
    post_attention_norm: Tensor,
    pre_feedforward_norm: Tensor,
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
    post_feedforward_norm: Tensor,
    per_layer_input_gate: Tensor,
    per_layer_projection: Tensor,
    post_per_layer_input_norm: Tensor,
    layer_scalar: Tensor,
}

pub struct Gemma {
    pub cfg: TextConfig,
    /// The compute dtype; weights are what the checkpoint holds, cast to it.
    pub kind: Kind,
    /// A tensor on the target device: new tensors are moved next to it (`tch::Device` cannot name a TPU).
    like: Tensor,
    embed_tokens: Table,
    embed_tokens_per_layer: Table,
    per_layer_model_projection: Tensor,
    per_layer_projection_norm: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    /// RoPE inverse frequencies (float32) for sliding and full layers.
    inv_freq: [Tensor; 2],
}

/// The keys and values of every cache-owning layer, plus which position each slot holds (-1 = empty).
pub struct Cache {
    kv: Vec<Option<(Tensor, Tensor)>>, // per layer: [kv_heads, slots, head_dim]
    slot_pos: [Tensor; 2],             // sliding, full: int64 [slots]
    pub ctx: i64,
}

fn index(kind: Attention) -> usize {
    match kind {
        Attention::Sliding => 0,
        Attention::Full => 1,
    }
}

// --8<-- [start:norm]
/// RMSNorm as Gemma 4 does it: in float32, `x * (mean(x²) + eps)^-0.5 * w` — no `(1 + w)` offset as in
/// Gemma 2 and 3, and `pow(…, -0.5)` rather than `rsqrt`, which rounds differently.
fn rms_norm(x: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
    let xf = x.f_to_kind(Kind::Float)?;
    let mean_square = xf.f_pow_tensor_scalar(2)?.f_mean_dim(-1, true, None::<Kind>)?;
    let mut y = xf.f_mul(&mean_square.f_add_scalar(eps)?.f_pow_tensor_scalar(-0.5)?)?;
    if let Some(w) = weight {
        y = y.f_mul(w)?; // w is kept in float32
    }
    Ok(y.f_to_kind(x.kind())?)
}
// --8<-- [end:norm]

// --8<-- [start:rope]
/// Inverse frequencies. Sliding layers: the usual `θ^(-2i/d)`. Full layers ("proportional", θ = 1e6): only
/// the first `partial_rotary_factor · d/2` pairs rotate, the rest get frequency 0 — so the rotated dims of a
/// 512-wide head are 0–63 and 256–319, since `rotate_half` pairs dim i with i + d/2.
fn inv_freq(cfg: &TextConfig, kind: Attention) -> Result<Tensor> {
    let rope = cfg.rope(kind);
    let d = cfg.head_dim(kind);
    let pairs =
        if rope.rope_type == "proportional" { (rope.partial_rotary_factor * d as f64) as i64 / 2 } else { d / 2 };
    let exponents = Tensor::f_arange_start_step(0, 2 * pairs, 2, (Kind::Int64, Device::Cpu))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(d as f64)?;
    let freq = Tensor::f_pow_scalar(rope.rope_theta, &exponents)?.f_reciprocal()?;
    Ok(Tensor::f_cat(&[freq, Tensor::f_zeros([d / 2 - pairs], (Kind::Float, Device::Cpu))?], 0)?)
}

/// cos and sin `[tokens, 1, d]` for the positions `pos`, computed in float32 and cast to the compute dtype.
fn cos_sin(inv_freq: &Tensor, pos: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
    let freqs = pos.f_to_kind(Kind::Float)?.f_unsqueeze(1)?.f_mul(&inv_freq.f_unsqueeze(0)?)?;
    let angles = Tensor::f_cat(&[&freqs, &freqs], -1)?.f_unsqueeze(1)?;
    Ok((angles.f_cos()?.f_to_kind(kind)?, angles.f_sin()?.f_to_kind(kind)?))
}

/// `x · cos + rotate_half(x) · sin` on `[tokens, heads, d]`, pairing dim i with i + d/2.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.size()[2] / 2;
    let rotated = Tensor::f_cat(&[x.f_narrow(2, half, half)?.f_neg()?, x.f_narrow(2, 0, half)?], -1)?;
    Ok(x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)?)
}
// --8<-- [end:rope]

// --8<-- [start:attend]
/// Attention of `q [tokens, heads, d]` over cache slots `k, v [kv_heads, slots, d]`; `hidden [tokens, slots]`
/// marks the slots a query must not see. The query heads that share a KV head are stacked along the token
/// axis, so grouped-query attention needs no copies of K and V. Gemma 4's scaling is 1.0 (q and k are
/// RMS-normed), and the softmax computes in float32 over scores masked with the dtype's lowest value.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, hidden: &Tensor, kind: Kind) -> Result<Tensor> {
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
    let lowest = if kind == Kind::BFloat16 { -3.3895313892515355e38 } else { f32::MIN as f64 };
    // Transformers takes the softmax in float32 and rounds it to bf16; PyTorch's softmax of a bf16 input does the
    // same inside one kernel (float32 arithmetic, one rounding: the same bits) without two passes to convert.
    let probs = scores.f_masked_fill_(hidden, lowest)?.f_softmax(-1, kind)?;
    let out = probs.f_reshape([kv_heads, group * tokens, -1])?.f_matmul(v)?;
    Ok(out.f_view([heads, tokens, d])?.f_permute([1, 0, 2])?.f_reshape([tokens, heads * d])?)
}
// --8<-- [end:attend]

fn gelu(x: &Tensor) -> Result<Tensor> {
    Ok(x.f_gelu("tanh")?)
}

fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.f_linear(w, None::<Tensor>)?)
}

/// A python-style scalar rounded to the compute dtype first, as Transformers' `tensor(s).to(dtype)` does.
fn scalar_in(value: f64, kind: Kind) -> Result<f64> {
    Ok(Tensor::from(value as f32).f_to_kind(kind)?.f_double_value(&[])?)
}

impl Gemma {
    // --8<-- [start:load]
    /// Loads `model_dir` (a -text checkpoint) onto like's device in `kind`; with `emb4_dir`, every table the
    /// twin holds packed (`embed_tokens_per_layer`, `embed_tokens`, an untied `lm_head`) comes from it and
    /// stays packed.
    pub fn load(
        model_dir: &Path,
        emb4_dir: Option<&Path>,
        like: &Tensor,
        kind: Kind,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Gemma> {
        let cfg = TextConfig::from_file(&model_dir.join("config.json"))?;
        // an empty tensor on the device stands in for the caller's (which may be large) from here on
        let like = &on(&Tensor::f_empty([0], (kind, Device::Cpu))?, like)?;
        let model = Checkpoint::open(model_dir)?;
        let twin = emb4_dir.map(Checkpoint::open).transpose()?;
        let packed_in_twin = |name: &str| twin.as_ref().filter(|t| t.has(&format!("{name}.weight_packed")));
        let table_source = |name: &str| packed_in_twin(name).unwrap_or(&model);
        let (h, l, p) = (cfg.hidden_size, cfg.num_hidden_layers, cfg.hidden_size_per_layer_input);
        let f32_on = |ckpt: &Checkpoint, name: &str, n: i64| ckpt.dense(name, &[n], Kind::Float, like);

        let embed_tokens = Table::load(table_source("embed_tokens"), "embed_tokens", cfg.vocab_size, h, like)?;
        let ple = "embed_tokens_per_layer";
        let embed_tokens_per_layer = Table::load(table_source(ple), ple, cfg.vocab_size_per_layer_input, l * p, like)?;
        // The output head reads every row every token, so it is dequantized once (in the compute dtype)
        // rather than unpacked, 262144 × 1536 values, at every step. Untied only when a checkpoint ships it.
        let has_head = |c: &&Checkpoint| c.has("lm_head.weight_packed") || c.has("lm_head.weight");
        let lm_head = match packed_in_twin("lm_head").or(Some(&model).filter(has_head)) {
            Some(ckpt) => ckpt.linear("lm_head", cfg.vocab_size, h, kind, like)?,
            None => embed_tokens.matrix(kind)?,
        };

        let mut layers = Vec::new();
        for i in 0..l {
            progress(i as usize, l as usize);
            let attention = cfg.attention(i);
            let (d, kv_heads) = (cfg.head_dim(attention), cfg.kv_heads(attention));
            let name = |s: &str| format!("layers.{i}.{s}");
            let lin = |s: &str, out: i64, inp: i64| model.linear(&name(s), out, inp, kind, like);
            let norm = |s: &str, n: i64| f32_on(&model, &name(s), n);
            let kv_source = cfg.kv_source(i);
            let kv = if kv_source == i {
                Some((
                    lin("self_attn.k_proj", kv_heads * d, h)?,
                    lin("self_attn.v_proj", kv_heads * d, h)?,
                    norm("self_attn.k_norm.weight", d)?,
                ))
            } else {
                None // a KV-shared layer has no k/v projections (stray ones in a file are ignored)
            };
            let heads = cfg.num_attention_heads;
            let ff = cfg.intermediate(i);
            layers.push(Layer {
                attention,
                head_dim: d,
                kv_source: kv_source as usize,
                input_norm: norm("input_layernorm.weight", h)?,
                q_proj: lin("self_attn.q_proj", heads * d, h)?,
                q_norm: norm("self_attn.q_norm.weight", d)?,
                kv,
                o_proj: lin("self_attn.o_proj", h, heads * d)?,
                post_attention_norm: norm("post_attention_layernorm.weight", h)?,
                pre_feedforward_norm: norm("pre_feedforward_layernorm.weight", h)?,
                gate_proj: lin("mlp.gate_proj", ff, h)?,
                up_proj: lin("mlp.up_proj", ff, h)?,
                down_proj: lin("mlp.down_proj", h, ff)?,
                post_feedforward_norm: norm("post_feedforward_layernorm.weight", h)?,
                per_layer_input_gate: lin("per_layer_input_gate", p, h)?,
                per_layer_projection: lin("per_layer_projection", h, p)?,
                post_per_layer_input_norm: norm("post_per_layer_input_norm.weight", h)?,
                layer_scalar: model.dense(&name("layer_scalar"), &[1], kind, like)?,
            });
        }
        progress(l as usize, l as usize);
        Ok(Gemma {
            per_layer_model_projection: model.linear("per_layer_model_projection", l * p, h, kind, like)?,
            per_layer_projection_norm: f32_on(&model, "per_layer_projection_norm.weight", p)?,
            norm: f32_on(&model, "norm.weight", h)?,
            inv_freq: [on(&inv_freq(&cfg, Attention::Sliding)?, like)?, on(&inv_freq(&cfg, Attention::Full)?, like)?],
            like: like.shallow_clone(),
            cfg,
            kind,
            embed_tokens,
            embed_tokens_per_layer,
            layers,
            lm_head,
        })
    }
    // --8<-- [end:load]

    /// Empty caches for a context of `ctx` tokens.
    pub fn new_cache(&self, ctx: i64) -> Result<Cache> {
        let ring = 2 * self.cfg.sliding_window; // window + chunk, with chunk = window
        let slots = |a: Attention| if a == Attention::Full { ctx } else { ring };
        let mut kv = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            kv.push(if layer.kv_source == i {
                let shape = [self.cfg.kv_heads(layer.attention), slots(layer.attention), layer.head_dim];
                // zeros, never NaN: masked slots still get multiplied by 0. Two allocations: on the CPU
                // `on` returns its input, and keys and values must not share storage.
                let zeros =
                    || -> Result<Tensor> { Ok(on(&Tensor::f_zeros(shape, (self.kind, Device::Cpu))?, &self.like)?) };
                Some((zeros()?, zeros()?))
            } else {
                None
            });
        }
        let empty =
            |n: i64| -> Result<Tensor> { Ok(on(&Tensor::f_full([n], -1, (Kind::Int64, Device::Cpu))?, &self.like)?) };
        Ok(Cache { kv, slot_pos: [empty(ring)?, empty(ctx)?], ctx })
    }

    /// Bytes of weights one decode step reads, as held (the benchmark's bandwidth figure): every layer's matrices,
    /// norms and scalar, the per-layer projection, the final norm and head, one row of each embedding table.
    pub fn weight_bytes_per_token(&self) -> i64 {
        let bytes = |t: &Tensor| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64;
        let mut total = [&self.per_layer_model_projection, &self.per_layer_projection_norm, &self.norm, &self.lm_head]
            .into_iter()
            .map(bytes)
            .sum::<i64>();
        for l in &self.layers {
            let own = [&l.input_norm, &l.q_proj, &l.q_norm, &l.o_proj, &l.post_attention_norm, &l.pre_feedforward_norm];
            let rest = [&l.gate_proj, &l.up_proj, &l.down_proj, &l.post_feedforward_norm, &l.per_layer_input_gate];
            let ple = [&l.per_layer_projection, &l.post_per_layer_input_norm, &l.layer_scalar];
            total += own.into_iter().chain(rest).chain(ple).map(bytes).sum::<i64>();
            if let Some((k, v, norm)) = &l.kv {
                total += bytes(k) + bytes(v) + bytes(norm);
            }
        }
        total + self.embed_tokens.row_bytes() + self.embed_tokens_per_layer.row_bytes()
    }

    /// Prompt tokens per forward pass while reading: one sliding window.
    pub fn chunk_len(&self) -> i64 {
        self.cfg.sliding_window
    }

    // --8<-- [start:full_slots]
    /// How many slots of a full cache a prompt chunk ending at position `end` (exclusive) attends over. A prompt
    /// fills a full cache from slot 0 and never wraps it (it is at most `ctx` long), so all the chunk can see lies
    /// in slots `0..end`. That is rounded up to the chunk length times a power of two, capped at `ctx`: a handful
    /// of shapes to compile (eight for E2B's 512-token chunks in a 33,024-token context), and a chunk near the
    /// start of a long context does not score thousands of empty slots. The rounding adds only masked slots,
    /// whose probabilities are exactly 0, so the result does not change.
    pub fn full_slots_for(&self, end: i64, ctx: i64) -> i64 {
        let mut slots = self.chunk_len();
        while slots < end {
            slots *= 2;
        }
        slots.min(ctx)
    }
    // --8<-- [end:full_slots]

    /// Ids as a device tensor.
    pub fn to_device(&self, values: &[i64]) -> Result<Tensor> {
        Ok(on(&Tensor::f_from_slice(values)?, &self.like)?)
    }

    // --8<-- [start:forward]
    /// One forward pass over `ids` at positions `pos` (int64 device tensors `[tokens]`), writing their keys
    /// and values into `cache`; full layers attend over the cache's first `full_slots` slots (a bucket for a
    /// prompt chunk, all `cache.ctx` for a decode step). Returns the final-norm hidden states `[tokens, hidden]`;
    /// with `hidden`, also collects each layer's input (Transformers' `output_hidden_states` convention).
    pub fn forward(
        &self,
        ids: &Tensor,
        pos: &Tensor,
        full_slots: i64,
        cache: &mut Cache,
        mut hidden: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (kind, eps) = (self.kind, cfg.rms_norm_eps);
        let (h_size, l, p) = (cfg.hidden_size, cfg.num_hidden_layers, cfg.hidden_size_per_layer_input);
        let tokens = ids.size()[0];

        // Embeddings, scaled by sqrt(hidden) rounded to the compute dtype (39.19 -> 39.25 in bf16).
        let mut h = self.embed_tokens.rows(ids, kind)?.f_mul_scalar(scalar_in((h_size as f64).sqrt(), kind)?)?;

        // Per-layer inputs: a token-identity part (a second, huge embedding table) and a context part
        // (a projection of the embeddings), mixed once here and handed to every layer.
        let identity =
            self.embed_tokens_per_layer.rows(ids, kind)?.f_mul_scalar(scalar_in((p as f64).sqrt(), kind)?)?;
        let context = linear(&h, &self.per_layer_model_projection)?.f_mul_scalar((h_size as f64).powf(-0.5))?;
        let context = rms_norm(&context.f_view([tokens, l, p])?, Some(&self.per_layer_projection_norm), eps)?;
        let per_layer_input = context.f_add(&identity.f_view([tokens, l, p])?)?.f_mul_scalar(2f64.powf(-0.5))?;

        // Where the new tokens go in each cache, and which slots each query may see.
        let mut masks = Vec::new();
        let mut rope = Vec::new();
        for a in [Attention::Sliding, Attention::Full] {
            let slot_pos = &mut cache.slot_pos[index(a)];
            let slots = pos.f_remainder(slot_pos.size()[0])?;
            let _ = slot_pos.f_index_copy_(0, &slots, pos)?;
            let query = pos.f_unsqueeze(1)?;
            let slot_pos =
                if a == Attention::Full { slot_pos.f_narrow(0, 0, full_slots)? } else { slot_pos.shallow_clone() };
            let mut visible =
                slot_pos.f_ge(0)?.f_unsqueeze(0)?.f_logical_and(&slot_pos.f_unsqueeze(0)?.f_le_tensor(&query)?)?;
            if a == Attention::Sliding {
                // key k is visible to query q iff q - window < k <= q
                visible = visible
                    .f_logical_and(&slot_pos.f_unsqueeze(0)?.f_gt_tensor(&query.f_sub_scalar(cfg.sliding_window)?)?)?;
            }
            masks.push((slots, visible.f_logical_not()?));
            rope.push(cos_sin(&self.inv_freq[index(a)], pos, kind)?);
        }

        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(states) = hidden.as_deref_mut() {
                states.push(h.shallow_clone());
            }
            let a = index(layer.attention);
            let ((slots, masked), (cos, sin)) = (&masks[a], &rope[a]);
            let d = layer.head_dim;

            // Attention: q/k/v projections, q/k RMS-normed (v without a weight), RoPE after the norms.
            let x = rms_norm(&h, Some(&layer.input_norm), eps)?;
            let q = rms_norm(&linear(&x, &layer.q_proj)?.f_view([tokens, -1, d])?, Some(&layer.q_norm), eps)?;
            let q = rotate(&q, cos, sin)?;
            if let Some((k_proj, v_proj, k_norm)) = &layer.kv {
                let k = rms_norm(&linear(&x, k_proj)?.f_view([tokens, -1, d])?, Some(k_norm), eps)?;
                let k = rotate(&k, cos, sin)?;
                let v = rms_norm(&linear(&x, v_proj)?.f_view([tokens, -1, d])?, None, eps)?;
                let (k_cache, v_cache) = cache.kv[i].as_mut().expect("a cache-owning layer has a cache");
                let _ = k_cache.f_index_copy_(1, slots, &k.f_transpose(0, 1)?)?;
                let _ = v_cache.f_index_copy_(1, slots, &v.f_transpose(0, 1)?)?;
            }
            // KV-shared layers read the cache their source layer (earlier in this same pass) just wrote.
            let (k_cache, v_cache) = cache.kv[layer.kv_source].as_ref().expect("a KV source owns a cache");
            let seen = if layer.attention == Attention::Full { full_slots } else { k_cache.size()[1] };
            let (k_seen, v_seen) = (k_cache.f_narrow(1, 0, seen)?, v_cache.f_narrow(1, 0, seen)?);
            let attn = linear(&attend(&q, &k_seen, &v_seen, masked, kind)?, &layer.o_proj)?;
            h = h.f_add(&rms_norm(&attn, Some(&layer.post_attention_norm), eps)?)?;

            // Feed-forward: down(gelu_tanh(gate(x)) * up(x)); double-wide on KV-shared layers.
            let x = rms_norm(&h, Some(&layer.pre_feedforward_norm), eps)?;
            let ff =
                linear(&gelu(&linear(&x, &layer.gate_proj)?)?.f_mul(&linear(&x, &layer.up_proj)?)?, &layer.down_proj)?;
            h = h.f_add(&rms_norm(&ff, Some(&layer.post_feedforward_norm), eps)?)?;

            // Per-layer input: gate the residual stream, mix in this layer's slice, project back.
            let gated =
                gelu(&linear(&h, &layer.per_layer_input_gate)?)?.f_mul(&per_layer_input.f_select(1, i as i64)?)?;
            let x =
                rms_norm(&linear(&gated, &layer.per_layer_projection)?, Some(&layer.post_per_layer_input_norm), eps)?;
            h = h.f_add(&x)?.f_mul(&layer.layer_scalar)?; // the scalar scales the whole residual stream
        }
        let out = rms_norm(&h, Some(&self.norm), eps)?;
        if let Some(states) = hidden {
            states.push(out.shallow_clone());
        }
        Ok(out)
    }
    // --8<-- [end:forward]

    /// Logits `[tokens, vocab]` from final hidden states: the output head, then `tanh(x / cap) * cap`.
    pub fn head(&self, h: &Tensor) -> Result<Tensor> {
        let logits = linear(h, &self.lm_head)?;
        Ok(match self.cfg.final_logit_softcapping {
            Some(cap) => logits.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?,
            None => logits,
        })
    }

    // --8<-- [start:read]
    /// Reads a prompt into a fresh cache in chunks of `window` tokens (so a sliding ring of `2 · window` slots
    /// always still holds the window before a chunk), calling `each(start, out, states)` after each chunk with
    /// the final hidden states and, when `collect`, every layer's input (else an empty list).
    pub fn read(
        &self,
        ids: &[i64],
        cache: &mut Cache,
        collect: bool,
        mut each: impl FnMut(i64, Tensor, Vec<Tensor>) -> Result<()>,
    ) -> Result<()> {
        for slot_pos in cache.slot_pos.iter_mut() {
            let _ = slot_pos.f_fill_(-1)?; // a fresh cache: every slot empty (the stale keys are masked)
        }
        for (n, chunk) in ids.chunks(self.chunk_len() as usize).enumerate() {
            let start = n as i64 * self.chunk_len();
            let end = start + chunk.len() as i64;
            let pos = self.to_device(&(start..end).collect::<Vec<_>>())?;
            let full_slots = self.full_slots_for(end, cache.ctx);
            let mut states = Vec::new();
            let h = self.forward(&self.to_device(chunk)?, &pos, full_slots, cache, collect.then_some(&mut states))?;
            each(start, h, states)?;
        }
        Ok(())
    }
    // --8<-- [end:read]

    // --8<-- [start:generate]
    /// Greedy decoding: read `ids`, then produce exactly `max_new` tokens. The next token is picked on the
    /// device (argmax) and fed straight back; tokens are copied to the host every `read_every` steps.
    /// Returns the tokens, the seconds for the prompt read (which yields the first token) and for the rest.
    pub fn generate(
        &self,
        ids: &[i64],
        max_new: i64,
        read_every: i64,
        cache: &mut Cache,
    ) -> Result<(Vec<i64>, f64, f64)> {
        let start = Instant::now();
        let mut last = None;
        self.read(ids, cache, false, |_, h, _| {
            last = Some(h.f_select(0, h.size()[0] - 1)?.f_unsqueeze(0)?);
            Ok(())
        })?;
        let mut tokens = Vec::new();
        if max_new == 0 {
            return Ok((tokens, start.elapsed().as_secs_f64(), 0.0));
        }
        let last = last.ok_or_else(|| invalid!("generate: the prompt is empty"))?;
        let mut token = self.head(&last)?.f_argmax(-1, false)?;
        tokens.push(token.f_int64_value(&[0])?);
        let read_s = start.elapsed().as_secs_f64();

        let start = Instant::now();
        let mut pos = self.to_device(&[ids.len() as i64])?;
        let mut pending = Vec::new();
        for step in 1..max_new {
            let h = self.forward(&token, &pos, cache.ctx, cache, None)?;
            token = self.head(&h)?.f_argmax(-1, false)?;
            pos = pos.f_add_scalar(1)?;
            pending.push(token.shallow_clone());
            if pending.len() as i64 == read_every || step == max_new - 1 {
                tokens.extend(Vec::<i64>::try_from(Tensor::f_cat(&pending, 0)?)?);
                pending.clear();
            }
        }
        Ok((tokens, read_s, start.elapsed().as_secs_f64()))
    }
    // --8<-- [end:generate]
}
