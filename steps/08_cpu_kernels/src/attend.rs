//! A decode step's attention (any one-token pass's) in one call of this step's own (src/attend.cpp), or in ATen's ops
//! as step 03 runs it (gemma.rs' `attend`): the choice the engine's `decode_attention` names.
//!
//! Why: on a CPU, ATen's attention of one query token costs what its ops cost to set up, not what the cache's bytes
//! cost to read — two bf16 matmuls of one row take 30–50 µs each on an AMD EPYC however few slots they score — so
//! 35 layers took a sixth of an E2B int4 decode step (docs/steps/08_cpu_kernels/budget.md). The kernel computes the
//! same thing (the scores' and probabilities' roundings to bf16 with a bf16 cache, float32 sums in other orders, as the
//! int4 kernels),
//! each key and value read once for the query heads that share it. It is the default where this step's own int4
//! kernel runs: `weights="bf16"` stays step 03's engine, bit for bit.
use tch::{Device, Kind, Tensor};

use crate::cpu;
use crate::error::{invalid, Error, Result};

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn torchtpu_attend_one(
        q: *const u16,
        k: *const std::ffi::c_void,
        v: *const std::ffi::c_void,
        kv_bf16: bool,
        round_bf16: bool,
        kv_head_stride: i64,
        slot_stride: i64,
        masked: *const bool,
        out: *mut u16,
        heads: i64,
        kv_heads: i64,
        slots: i64,
        d: i64,
    );
}

/// What runs a decode step's attention over the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeAttention {
    /// ATen's ops (gemma.rs' `attend`), as step 03 and every prompt chunk.
    Aten,
    /// `torchtpu_attend_one`: a CPU with AVX2 and FMA, bf16 queries.
    Own,
}

pub const KERNEL: &str = "torchtpu_attend_one";

impl DecodeAttention {
    pub fn name(self) -> &'static str {
        match self {
            DecodeAttention::Aten => "aten",
            DecodeAttention::Own => "own",
        }
    }

    /// `Own` where it can run: on the CPU (AVX2 and FMA, ATen allowed AVX2) in bfloat16; else why not.
    pub fn own(device: Device, dtype: Kind) -> Result<DecodeAttention> {
        if device != Device::Cpu || !cpu::attend_runs() {
            return Err(Error::Unsupported(format!(
                "decode_attention=\"own\": {KERNEL} needs a CPU with AVX2 and FMA, with ATen allowed AVX2"
            )));
        }
        if dtype != Kind::BFloat16 {
            return Err(Error::Unsupported(format!("decode_attention=\"own\": {KERNEL} takes bfloat16 queries only")));
        }
        Ok(DecodeAttention::Own)
    }
}

/// `[1, heads · d]` bf16: the attention of one token's queries `q [1, heads, d]` (bf16) over the slots of
/// `k, v [kv_heads, slots, d]` (the cache's dtype, float32 or bf16; views of the cache, strided as it is),
/// `masked [1, slots]` true where the query must not see a slot, computed in `arithmetic` (bf16's roundings of the
/// scores and probabilities, or float32 throughout), whatever the cache's dtype.
pub fn attend_one(q: &Tensor, k: &Tensor, v: &Tensor, masked: &Tensor, arithmetic: Kind) -> Result<Tensor> {
    let (tokens, heads, d) = q.size3()?;
    let (kv_heads, slots, kd) = k.size3()?;
    let fits = tokens == 1
        && q.kind() == Kind::BFloat16
        && matches!(k.kind(), Kind::Float | Kind::BFloat16)
        && v.kind() == k.kind()
        && v.size() == k.size()
        && v.stride() == k.stride()
        && k.stride()[2] == 1
        && kd == d
        && d % 8 == 0
        && kv_heads > 0
        && heads % kv_heads == 0
        && masked.kind() == Kind::Bool
        && masked.size() == [1, slots]
        && matches!(arithmetic, Kind::Float | Kind::BFloat16)
        && [q, k, v, masked].iter().all(|t| t.device() == Device::Cpu);
    if !fits {
        return Err(invalid!(
            "{KERNEL}: q {:?} {:?}, k {:?} {:?} strides {:?}, v {:?} {:?}, masked {:?} {:?}, in {:?}: need one bf16 \
             token [1, heads, d] with d % 8 == 0, float32 or bf16 caches [kv_heads, slots, d] alike, bool [1, slots], \
             on the CPU, in float32 or bf16",
            q.kind(),
            q.size(),
            k.kind(),
            k.size(),
            k.stride(),
            v.kind(),
            v.size(),
            masked.kind(),
            masked.size(),
            arithmetic
        ));
    }
    let (q, masked) = (q.f_contiguous()?, masked.f_contiguous()?);
    let out = Tensor::f_empty([1, heads * d], (Kind::BFloat16, Device::Cpu))?;
    // SAFETY: q and masked contiguous, k and v strided as passed (d contiguous elements at each slot), out [heads · d]
    // bf16, all on the host, shapes checked above; the query sees its own slot, so some slot is not masked.
    unsafe {
        torchtpu_attend_one(
            q.data_ptr() as *const u16,
            k.data_ptr(),
            v.data_ptr(),
            k.kind() == Kind::BFloat16,
            arithmetic == Kind::BFloat16,
            k.stride()[0],
            k.stride()[1],
            masked.data_ptr() as *const bool,
            out.data_ptr() as *mut u16,
            heads,
            kv_heads,
            slots,
            d,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arithmetic the kernel names, in float64: scores (rounded to bf16 in bf16 attention), a softmax over the
    /// slots not masked (its probabilities rounded to bf16 alike), their weighted sum of the values.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, masked: &Tensor, arithmetic: Kind) -> Tensor {
        let (_, heads, d) = q.size3().unwrap();
        let kv_heads = k.size()[0];
        let bf16 = arithmetic == Kind::BFloat16;
        let round = |t: Tensor| if bf16 { t.to_kind(Kind::BFloat16).to_kind(Kind::Double) } else { t };
        let q = q.to_kind(Kind::Double).view([kv_heads, heads / kv_heads, d]);
        let (k, v) = (k.to_kind(Kind::Double), v.to_kind(Kind::Double));
        let scores = round(q.matmul(&k.transpose(1, 2))).masked_fill(masked, f64::NEG_INFINITY);
        round(scores.softmax(-1, Kind::Double)).matmul(&v).view([1, heads * d])
    }

    /// Random bf16 values of about `scale`.
    fn random(shape: &[i64], scale: f64, seed: i64) -> Tensor {
        tch::manual_seed(seed);
        (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * scale).to_kind(Kind::BFloat16)
    }

    /// The case: one token's q over `slots` of a cache `room` slots long (a narrowed view, as the engine passes).
    fn case(heads: i64, kv_heads: i64, d: i64, slots: i64, room: i64, kind: Kind, seed: i64) -> [Tensor; 4] {
        let q = random(&[1, heads, d], 0.3, seed);
        let cache = |s| random(&[kv_heads, room, d], 0.3, s).to_kind(kind).narrow(1, 0, slots);
        // every third slot hidden, and the last one seen, as a query always sees its own slot
        let masked = Tensor::arange(slots, (Kind::Int64, Device::Cpu)).remainder(3).eq(1).unsqueeze(0);
        let _ = masked.narrow(1, slots - 1, 1).fill_(0);
        [q, cache(seed + 1), cache(seed + 2), masked]
    }

    #[test]
    fn it_computes_the_arithmetic_it_names_for_every_shape_and_cache_dtype() {
        // bf16 attention over a bf16 cache and float32 attention over float32 and bf16 caches: the engine's three
        for (kind, arithmetic) in
            [(Kind::BFloat16, Kind::BFloat16), (Kind::Float, Kind::Float), (Kind::BFloat16, Kind::Float)]
        {
            // E2B's sliding and full heads, a head group wider than the kernel's 8, two KV heads, one slot, and
            // enough slots that the work is split between threads
            for (heads, kv_heads, d, slots) in
                [(8, 1, 256, 37), (8, 1, 512, 300), (12, 1, 64, 5), (4, 2, 32, 1), (8, 2, 32, 1100)]
            {
                let [q, k, v, masked] = case(heads, kv_heads, d, slots, slots + 7, kind, slots);
                // and with the first two thirds hidden too, as a sliding layer's oldest slots are: the slots seen
                // start past the cache's first
                let late = masked.logical_or(&Tensor::arange(slots, (Kind::Int64, Device::Cpu)).lt(slots * 2 / 3));
                let _ = late.narrow(1, slots - 1, 1).fill_(0);
                for masked in [masked, late] {
                    let ours = attend_one(&q, &k, &v, &masked, arithmetic).unwrap().to_kind(Kind::Double);
                    let exact = reference(&q, &k, &v, &masked, arithmetic);
                    let apart = (&ours - &exact).abs().max().double_value(&[]);
                    let size = exact.abs().max().double_value(&[]);
                    // bf16 output: half an ulp of the largest; the scores' and probabilities' own roundings can land
                    // the other way after float32 sums in another order: a few more
                    assert!(
                        apart <= size / 128.0,
                        "{kind:?} cache, {arithmetic:?}, {heads}/{kv_heads} heads, d {d}, {slots} slots: {apart}/{size}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_bf16_cache_in_float32_attention_gives_a_float32_caches_bits() {
        // the engine's keys and values are bf16 values, so a float32 cache holds them exactly: the same values
        // widened as they are loaded, the same sums
        for (heads, kv_heads, d, slots) in [(8, 1, 512, 2000), (8, 1, 256, 37), (4, 2, 32, 1100)] {
            let [q, k, v, masked] = case(heads, kv_heads, d, slots, slots, Kind::BFloat16, 11);
            let half = attend_one(&q, &k, &v, &masked, Kind::Float).unwrap();
            let (kf, vf) = (k.to_kind(Kind::Float), v.to_kind(Kind::Float));
            let full = attend_one(&q, &kf, &vf, &masked, Kind::Float).unwrap();
            assert!(half.equal(&full), "{heads}/{kv_heads} heads, d {d}, {slots} slots");
        }
    }

    #[test]
    fn masked_slots_are_not_seen_whatever_they_hold() {
        let [q, k, v, masked] = case(8, 1, 256, 40, 40, Kind::BFloat16, 3);
        let before = attend_one(&q, &k, &v, &masked, Kind::BFloat16).unwrap();
        let hidden = masked.squeeze_dim(0).nonzero().squeeze_dim(1);
        let (mut k2, mut v2) = (k.copy(), v.copy());
        let _ = k2.index_fill_(1, &hidden, 1e4);
        let _ = v2.index_fill_(1, &hidden, -1e4);
        assert!(before.equal(&attend_one(&q, &k2, &v2, &masked, Kind::BFloat16).unwrap()));
    }

    #[test]
    fn one_thread_and_two_give_the_same_bits() {
        let threads = tch::get_num_threads();
        for kind in [Kind::Float, Kind::BFloat16] {
            let [q, k, v, masked] = case(8, 1, 512, 2000, 2048, kind, 5);
            tch::set_num_threads(1);
            let one = attend_one(&q, &k, &v, &masked, kind).unwrap();
            tch::set_num_threads(2);
            let two = attend_one(&q, &k, &v, &masked, kind).unwrap();
            assert!(one.equal(&two), "{kind:?}");
        }
        tch::set_num_threads(threads);
    }

    #[test]
    fn shapes_it_does_not_take_are_named() {
        let [q, k, v, masked] = case(8, 1, 32, 4, 4, Kind::BFloat16, 1);
        let two_tokens = Tensor::cat(&[&q, &q], 0);
        let err = attend_one(&two_tokens, &k, &v, &masked, Kind::BFloat16).unwrap_err().to_string();
        assert!(err.contains(KERNEL) && err.contains("[2, 8, 32]"), "{err}");
        assert!(attend_one(&q, &k, &v.to_kind(Kind::Float), &masked, Kind::BFloat16).is_err());
        assert!(attend_one(&q, &k, &v, &masked.narrow(1, 0, 3), Kind::BFloat16).is_err());
        let err = attend_one(&q, &k, &v, &masked, Kind::Half).unwrap_err().to_string();
        assert!(err.contains("in Half"), "{err}");
    }
}
