//! Picking the next token from a row of logits: greedy (argmax, on the device), or sampled from the distribution
//! that temperature, top-k and top-p leave — filtered with the same tensor operations, in the same order, as
//! Transformers' logits processors (`TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`), then
//! drawn on the host with a seeded generator of our own, so that the same seed gives the same tokens whatever
//! else uses torch's global random state.
use tch::{Device, Kind, Tensor};

use crate::error::{invalid, Result};

extern "C" {
    fn torchtpu_argmax(row: *const std::ffi::c_void, n: i64, bf16: bool) -> i64;
}

/// The greedy tokens, int64 `[rows]`: `logits.argmax(-1)`. One row on the CPU (a decode step's) is scanned by
/// src/argmax.cpp, which picks what torch's argmax picks (the first largest; the first NaN): the budget
/// (docs/steps/08_cpu_kernels/budget.md) put a step's sampling at 0.3 ms with it, 1.0 ms with ATen's on an AMD EPYC.
pub fn greedy(logits: &Tensor) -> Result<Tensor> {
    let one_row = logits.dim() == 2 && logits.size()[0] == 1 && logits.size()[1] > 0;
    if !(one_row && logits.device() == Device::Cpu && matches!(logits.kind(), Kind::BFloat16 | Kind::Float)) {
        return Ok(logits.f_argmax(-1, false)?);
    }
    let row = logits.f_contiguous()?;
    // SAFETY: a contiguous bf16 or float32 row of size()[1] > 0 values on the host: checked above.
    let index = unsafe { torchtpu_argmax(row.data_ptr(), row.size()[1], row.kind() == Kind::BFloat16) };
    Ok(Tensor::f_from_slice(&[index])?)
}

/// How to sample tokens (greedy decoding has no `Sampling`: `None` where one would be).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f64,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
}

impl Sampling {
    /// Checks the arguments; the messages name them as Python does.
    pub fn new(temperature: f64, top_k: Option<i64>, top_p: Option<f64>) -> Result<Sampling> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(invalid!(
                "temperature={temperature}: must be > 0 when sampling (leave temperature, top_k \
                                 and top_p unset for greedy decoding)"
            ));
        }
        if let Some(k) = top_k.filter(|&k| k < 1) {
            return Err(invalid!("top_k={k}: must be >= 1"));
        }
        if let Some(p) = top_p.filter(|&p| !(p > 0.0 && p <= 1.0)) {
            return Err(invalid!("top_p={p}: must be in (0, 1]"));
        }
        Ok(Sampling { temperature, top_k, top_p })
    }

    // --8<-- [start:filter]
    /// The filtered distribution: float32 probabilities `[rows, vocab]` (0 where a token is filtered out).
    pub fn probabilities(&self, logits: &Tensor) -> Result<Tensor> {
        let mut scores = logits.f_to_kind(Kind::Float)?.f_div_scalar(self.temperature)?;
        let vocab = scores.size()[scores.dim() - 1];
        if let Some(k) = self.top_k.map(|k| k.min(vocab)) {
            // Transformers: remove every score below the k-th largest (ties with it stay)
            let kth = scores.f_topk(k, -1, true, true)?.0.f_narrow(-1, k - 1, 1)?;
            scores = scores.f_masked_fill(&scores.f_lt_tensor(&kth)?, f64::NEG_INFINITY)?;
        }
        if let Some(p) = self.top_p.filter(|&p| p < 1.0) {
            // Transformers: sort ascending, remove the tokens whose cumulative probability is <= 1 - top_p,
            // always keeping the most likely one
            let (sorted, order) = scores.f_sort(-1, false)?;
            let cumulative = sorted.f_softmax(-1, Kind::Float)?.f_cumsum(-1, Kind::Float)?;
            let remove = cumulative.f_le(1.0 - p)?;
            let last = remove.size()[remove.dim() - 1] - 1;
            let _ = remove.f_narrow(-1, last, 1)?.f_fill_(0)?;
            let remove = remove.f_scatter(-1, &order, &remove)?;
            scores = scores.f_masked_fill(&remove, f64::NEG_INFINITY)?;
        }
        Ok(scores.f_softmax(-1, Kind::Float)?)
    }
    // --8<-- [end:filter]
}

/// splitmix64: small, fast, and the same stream on every machine for a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One index drawn from `probs` (one row, on any device), by the inverse of its cumulative sum.
    pub fn draw(&mut self, probs: &Tensor) -> Result<i64> {
        let host = Vec::<f32>::try_from(probs.f_to_device(Device::Cpu)?.f_reshape([-1])?)?;
        let total: f64 = host.iter().map(|&p| p as f64).sum();
        if total.is_nan() || total <= 0.0 {
            return Err(invalid!("sampling: the filtered distribution is empty (logits all -inf or NaN)"));
        }
        let target = self.uniform() * total;
        let mut cumulative = 0.0;
        let mut last = 0;
        for (i, &p) in host.iter().enumerate() {
            if p > 0.0 {
                cumulative += p as f64;
                last = i;
                if cumulative > target {
                    return Ok(i as i64);
                }
            }
        }
        Ok(last as i64) // rounding left the target past the end: the last token with any probability
    }
}

/// Picks the next token `[1]` (int64, on the logits' device) from `logits [1, vocab]`.
pub fn pick(logits: &Tensor, how: Option<(&Sampling, &mut Rng)>) -> Result<Tensor> {
    match how {
        None => greedy(logits),
        Some((sampling, rng)) => {
            let token = rng.draw(&sampling.probabilities(logits)?)?;
            Ok(Tensor::f_from_slice(&[token])?.f_to_device(logits.device())?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_what_torch_argmax_picks() {
        tch::manual_seed(0);
        let random = Tensor::randn([1, 262144], (Kind::Float, Device::Cpu));
        let row = |values: &[f32]| Tensor::from_slice(values).view([1, -1]);
        // ties (the first wins), -0 beside 0, NaN (the first NaN wins), a single value, and bf16's coarse ties
        let cases = [
            random.shallow_clone(),
            random.to_kind(Kind::BFloat16),
            (&random * 0.01).to_kind(Kind::BFloat16),
            row(&[1.0, 3.0, 3.0, 2.0]),
            row(&[-0.0, 0.0, -1.0]),
            row(&[1.0, f32::NAN, 5.0, f32::NAN]),
            row(&[f32::NAN, 1.0]),
            row(&[-f32::INFINITY, -f32::INFINITY]),
            row(&[7.0]),
        ];
        for logits in cases {
            let ours = greedy(&logits).unwrap();
            assert!(
                ours.equal(&logits.argmax(-1, false)),
                "{:?}: {ours:?}",
                logits.narrow(1, 0, 4.min(logits.size()[1]))
            );
        }
    }

    #[test]
    fn bad_arguments_name_themselves() {
        let msg = |r: Result<Sampling>| r.unwrap_err().to_string();
        assert!(msg(Sampling::new(0.0, None, None)).starts_with("temperature=0"));
        assert!(msg(Sampling::new(1.0, Some(0), None)).starts_with("top_k=0"));
        assert!(msg(Sampling::new(1.0, None, Some(1.5))).starts_with("top_p=1.5"));
        assert!(msg(Sampling::new(1.0, None, Some(0.0))).starts_with("top_p=0"));
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens_and_only_kept_ones() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0, -1.0, 0.5]).view([1, 5]);
        let sampling = Sampling::new(1.0, Some(3), None).unwrap();
        let draws = |seed| {
            let mut rng = Rng::new(seed);
            (0..200).map(|_| pick(&logits, Some((&sampling, &mut rng))).unwrap().int64_value(&[0])).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        assert!(draws(7).iter().all(|t| [0, 1, 2].contains(t)), "top_k=3 keeps tokens 1, 2, 0");
    }
}
