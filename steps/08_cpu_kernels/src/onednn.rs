//! Which kernel multiplies a decode step's one-row activations by the weights.
//!
//! On a CPU with AVX-512 or AMX, torch hands bf16 matmuls to oneDNN, which is fast for a prompt chunk's
//! hundreds of rows and slow for the one row of a decode step; ATen's own kernels, with oneDNN switched off, are
//! the other way round (the walkthrough's `make bench` times both, for a mat-vec, a prompt chunk and decode
//! attention: docs/runs/cpu-e2b/05_tpu.txt). Which of the two streams a one-row product faster depends on the CPU
//! (the Engine's `matvec` picks, lib.rs' `matvec_in_aten_arg`): where it is ATen's, a decode step's linears run with
//! oneDNN off for the call, and everything else (attention included) keeps it. Both kernels sum in float32; their sums' order differs, so
//! now and then an output differs in its last bf16 bit (the same record counts them for one mat-vec):
//! `Engine(matvec="onednn")` keeps Transformers' kernel, bit for bit.
use std::cell::Cell;

use tch::Tensor;

use crate::error::Result;

extern "C" {
    fn torchtpu_onednn_enabled() -> bool;
    fn torchtpu_set_onednn_enabled(enabled: bool);
}

thread_local! {
    /// Set for the span of `one_row_in_aten(true, …)`: `linear` then sends one-row activations to ATen.
    static ONE_ROW_IN_ATEN: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with one-row linears on ATen's kernel (`aten`) or on oneDNN's, then restores the previous choice.
pub fn one_row_in_aten<T>(aten: bool, f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ONE_ROW_IN_ATEN.set(self.0);
        }
    }
    let _restore = Restore(ONE_ROW_IN_ATEN.replace(aten));
    f()
}

// --8<-- [start:linear]
/// `x · wᵀ` for activations `x [rows, in]` and a weight `w [out, in]`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.size()[0] == 1 && ONE_ROW_IN_ATEN.get() {
        without_onednn(|| Ok(x.f_linear(w, None::<Tensor>)?))
    } else {
        Ok(x.f_linear(w, None::<Tensor>)?)
    }
}
// --8<-- [end:linear]

/// Runs `f` with torch's oneDNN switch off, then puts it back as it was, also when `f` fails. The switch is
/// the process's: another thread's matmuls in that span run without oneDNN too (the same numbers, at ATen's
/// speed).
fn without_onednn<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: plain calls into libtorch's global context (a bool it reads before each matmul).
            unsafe { torchtpu_set_onednn_enabled(self.0) }
        }
    }
    // SAFETY: as above.
    let _restore = Restore(unsafe { torchtpu_onednn_enabled() });
    unsafe { torchtpu_set_onednn_enabled(false) };
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn one_row_runs_without_onednn_and_the_switch_comes_back() {
        let w = Tensor::randn([256, 128], (Kind::BFloat16, Device::Cpu));
        let x = Tensor::randn([1, 128], (Kind::BFloat16, Device::Cpu));
        let before = unsafe { torchtpu_onednn_enabled() };
        let aten = one_row_in_aten(true, || {
            let inside = without_onednn(|| unsafe { torchtpu_onednn_enabled() });
            assert!(!inside);
            linear(&x, &w).unwrap()
        });
        assert_eq!(unsafe { torchtpu_onednn_enabled() }, before);
        assert!(!ONE_ROW_IN_ATEN.get());
        // the same product, to within the last bit of a bf16
        let reference = x.to_kind(Kind::Float).matmul(&w.to_kind(Kind::Float).tr());
        let error = (aten.to_kind(Kind::Float) - &reference).abs().max().double_value(&[]);
        let bound = reference.abs().max().double_value(&[]) * 2f64.powi(-7);
        assert!(error <= bound, "{error} > {bound}");
    }
}
