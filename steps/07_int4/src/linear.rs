//! A linear layer as the engine holds it, and the choice that makes it: dense as in step 03, or kept 4-bit for
//! ATen's int4 kernel (int4.rs).
use std::cell::RefCell;

use tch::{Kind, Tensor};

use crate::error::Result;
use crate::int4::{refuses, Int4Linear};
use crate::weights::Packed;

/// How the engine holds its linears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// 4-bit, in the kernel's layout, multiplied by the int4 kernel.
    Int4,
    /// Dequantized once at load, as compressed-tensors does (step 03): bf16 values, held in the compute dtype.
    Bf16,
}

impl Weights {
    pub fn name(self) -> &'static str {
        match self {
            Weights::Int4 => "int4",
            Weights::Bf16 => "bf16",
        }
    }
}

// --8<-- [start:linear]
/// A linear layer as the engine holds it.
pub enum Linear {
    /// `[out, in]` in the compute dtype (step 03's).
    Dense(Tensor),
    /// Kept 4-bit, multiplied by ATen's int4 kernel.
    Int4(Int4Linear),
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => crate::onednn::linear(x, w),
            Linear::Int4(w) => w.forward(x),
        }
    }

    /// Bytes one product reads.
    pub fn bytes(&self) -> i64 {
        match self {
            Linear::Dense(t) => t.numel() as i64 * t.kind().elt_size_in_bytes() as i64,
            Linear::Int4(w) => w.bytes(),
        }
    }
}
// --8<-- [end:linear]

/// How `Gemma::load` makes its linears: what to hold them as, and, when the choice was `"auto"`, which ones the
/// kernel refused and were kept dense instead.
pub struct Held {
    pub weights: Weights,
    pub dtype: Kind,
    /// `weights="auto"`: a matrix the kernel cannot take stays dense (and is listed) instead of failing the load.
    pub fallback: bool,
    pub kept_dense: RefCell<Vec<String>>,
}

impl Held {
    pub fn new(weights: Weights, dtype: Kind, fallback: bool) -> Held {
        Held { weights, dtype, fallback, kept_dense: RefCell::new(Vec::new()) }
    }

    /// Whether the packed matrix `name`, `[rows, cols]` in groups of `group`, falls back to dense: with
    /// `weights="auto"`, where the kernel cannot take its shape (its name then kept in `kept_dense`). Otherwise it
    /// is kept 4-bit, and a shape the kernel refuses fails the load, naming it.
    pub fn falls_back(&self, name: &str, rows: i64, cols: i64, group: i64) -> bool {
        let falls = self.fallback && refuses(rows, cols, group).is_some();
        if falls {
            self.kept_dense.borrow_mut().push(name.to_string());
        }
        falls
    }

    /// The packed matrix `name` kept 4-bit for the kernel, on like's device.
    pub fn int4(&self, name: &str, w: &Packed, like: &Tensor) -> Result<Linear> {
        Ok(Linear::Int4(Int4Linear::new(name, w, self.dtype, like)?))
    }
}
