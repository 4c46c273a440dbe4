//! Gemma 4's two uses of tanh on the CPU, each in one call (src/tanh.cpp), bit for bit what ATen's ops give (step
//! 03's): `gelu_tanh(gate) · up` (gemma.rs' `gelu_times`) — a decode step runs 35 feed-forward blocks and 35
//! per-layer inputs at E2B, and ATen's two ops on a row of 6,144 spend most of their ~20 µs dispatching — and the
//! logits' softcap `tanh(x / cap) · cap` (`Gemma::head`), three passes over 262,144 logits in one. Its tanh
//! is the Sleef function ATen's vector loops call, in the build (AVX-512 or AVX2) ATen dispatches to in this
//! process, so `weights="bf16"` stays step 03's engine bit for bit.
use tch::{Device, Kind, Tensor};

use crate::cpu::{aten_isa, tanh_runs, Isa};
use crate::error::Result;

extern "C" {
    fn torchtpu_gelu_times(gate: *const u16, up: *const u16, y: *mut u16, n: i64, avx512: bool);
    fn torchtpu_softcap(x: *const u16, y: *mut u16, cap: f32, n: i64, avx512: bool);
}

/// Whether ATen's vector loop covers `n` values whole: a multiple of 64 (two AVX-512 vectors of bf16 a step), so
/// its bits are the vector code's, with no scalar tail (whose tanh rounds otherwise). Also where dot4.rs' kernels
/// may take the feed-forward block's gelu on their way out (gemma.rs' `Mlp::load`).
pub fn whole_steps(n: i64) -> bool {
    n % 64 == 0
}

/// Whether the kernels take `x`: bf16 on the CPU, with ATen's vector loop for it (AVX2 or AVX-512) and a count it
/// covers whole (`whole_steps`).
fn takes(x: &Tensor) -> bool {
    tanh_runs() && x.device() == Device::Cpu && x.kind() == Kind::BFloat16 && whole_steps(x.numel() as i64)
}

/// Whether `gelu_times` takes `gate` and `up`: both as `takes` says, of one shape.
pub fn gelu_takes(gate: &Tensor, up: &Tensor) -> bool {
    takes(gate) && takes(up) && gate.size() == up.size()
}

/// Whether `softcap` takes `logits`.
pub fn softcap_takes(logits: &Tensor) -> bool {
    takes(logits)
}

/// `gelu_tanh(gate) · up`, each rounded to bf16 as ATen's ops round: ATen's bits. `gelu_takes` must hold.
pub fn gelu_times(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let (gate, up) = (gate.f_contiguous()?, up.f_contiguous()?);
    let y = gate.f_empty_like()?;
    // SAFETY: gate, up and y contiguous bf16 of one shape, numel a multiple of 64, on the host (`gelu_takes`).
    unsafe {
        torchtpu_gelu_times(
            gate.data_ptr() as *const u16,
            up.data_ptr() as *const u16,
            y.data_ptr() as *mut u16,
            gate.numel() as i64,
            aten_isa() == Isa::Avx512,
        );
    }
    Ok(y)
}

/// `tanh(logits / cap) · cap`, each op rounded to bf16 as ATen's round: ATen's bits. `softcap_takes` must hold.
/// In place: it takes the logits (the head's fresh output) and returns them capped, without a second 512 KB tensor
/// a step (each lane is read before it is written).
pub fn softcap(logits: Tensor, cap: f64) -> Result<Tensor> {
    let x = logits.f_contiguous()?;
    // SAFETY: x contiguous bf16, numel a multiple of 64, on the host (`softcap_takes`); read and written in place.
    unsafe {
        torchtpu_softcap(
            x.data_ptr() as *const u16,
            x.data_ptr() as *mut u16,
            cap as f32, // ATen's op math for a bf16 tensor and a Python number: float32
            x.numel() as i64,
            aten_isa() == Isa::Avx512,
        );
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_times_gives_atens_bits() {
        if !takes(&Tensor::zeros([64], (Kind::BFloat16, Device::Cpu))) {
            eprintln!("skipped: ATen has no vector loop here (no AVX2 and FMA)");
            return;
        }
        // E2B's feed-forward rows (6,144; 12,288 on its KV-shared layers) and per-layer inputs (256), a prompt
        // chunk's rows (split between threads), the tiny model's; values from tiny to where tanh saturates
        for shape in [[1, 6144], [1, 12288], [1, 256], [19, 12288], [3, 64]] {
            for (seed, scale) in [(0, 1.0), (1, 4.0), (2, 1e-3), (3, 30.0)] {
                tch::manual_seed(seed);
                let gate = (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * scale).to_kind(Kind::BFloat16);
                let up = Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                let theirs = gate.gelu("tanh") * &up;
                let ours = gelu_times(&gate, &up).unwrap();
                assert!(ours.view_dtype(Kind::Int16).equal(&theirs.view_dtype(Kind::Int16)), "{shape:?} x{scale}");
            }
        }
        // every bf16 there is as a gate (NaNs, infinities, subnormals, ±0 included), each against 1, -3 and a NaN
        let every = Tensor::arange(65536, (Kind::Int, Device::Cpu)).to_kind(Kind::Int16).view_dtype(Kind::BFloat16);
        for factor in [1.0, -3.0, f64::NAN] {
            let up = every.full_like(factor);
            let theirs = every.gelu("tanh") * &up;
            let ours = gelu_times(&every, &up).unwrap();
            assert!(ours.view_dtype(Kind::Int16).equal(&theirs.view_dtype(Kind::Int16)), "every bf16 times {factor}");
        }
    }

    #[test]
    fn softcap_gives_atens_bits() {
        if !takes(&Tensor::zeros([64], (Kind::BFloat16, Device::Cpu))) {
            eprintln!("skipped: ATen has no vector loop here (no AVX2 and FMA)");
            return;
        }
        // every bf16 there is, and an E2B head's logits for two tokens; Gemma 4's cap and another
        let every = Tensor::arange(65536, (Kind::Int, Device::Cpu)).to_kind(Kind::Int16).view_dtype(Kind::BFloat16);
        let logits = (Tensor::randn([2, 262144], (Kind::Float, Device::Cpu)) * 20.0).to_kind(Kind::BFloat16);
        for x in [every, logits] {
            for cap in [30.0, 7.5] {
                let theirs = x.f_div_scalar(cap).unwrap().tanh().f_mul_scalar(cap).unwrap();
                let ours = softcap(x.copy(), cap).unwrap();
                assert!(
                    ours.view_dtype(Kind::Int16).equal(&theirs.view_dtype(Kind::Int16)),
                    "{:?}, cap {cap}",
                    x.size()
                );
            }
        }
    }

    #[test]
    fn they_take_only_what_they_compute_whole() {
        let bf16 = |n: i64| Tensor::zeros([1, n], (Kind::BFloat16, Device::Cpu));
        assert!(!gelu_takes(&bf16(32), &bf16(32)), "no multiple of 64: ATen's tail is a scalar loop");
        assert!(!gelu_takes(&bf16(64), &bf16(128)), "shapes differ");
        assert!(!softcap_takes(&bf16(64).to_kind(Kind::Float)), "float32");
    }
}
