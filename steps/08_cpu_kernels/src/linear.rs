//! A linear layer as the engine holds it, and the choice that makes it: dense, or kept 4-bit for one of the int4
//! kernels (ATen's in int4.rs, this step's two in dot4.rs). The top of step 08's int4 modules: it picks a kernel;
//! the kernels repack a `packed::Packed`; nothing below imports this.
use std::cell::RefCell;

use tch::{Kind, Tensor};

use crate::cpu;
use crate::dot4::{Kernel, OwnLinear, Panels, Stacking};
use crate::error::{invalid, Result};
use crate::int4::{self, Int4Linear};
use crate::packed::{refuses, Packed};
use crate::pages::Arena;

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

/// Which kernel multiplies the matrices kept 4-bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Matmul {
    /// ATen's, `aten::_weight_int4pack_mm_for_cpu`: any x86 CPU.
    Aten,
    /// This step's, `torchtpu_dot4_mm` (dot4.rs): CPUs with AVX512-BF16, bfloat16 activations.
    Dot4,
    /// This step's, `torchtpu_fma4_mm` (dot4.rs, the same layout): CPUs with AVX2, FMA and F16C, bfloat16 activations.
    Fma4,
}

impl Int4Matmul {
    pub fn name(self) -> &'static str {
        match self {
            Int4Matmul::Aten => "aten",
            Int4Matmul::Dot4 => "dot4",
            Int4Matmul::Fma4 => "fma4",
        }
    }

    /// The op, as errors and `weights_reason` name it.
    pub fn symbol(self) -> &'static str {
        match self {
            Int4Matmul::Aten => int4::KERNEL,
            Int4Matmul::Dot4 => Kernel::Dot4.symbol(),
            Int4Matmul::Fma4 => Kernel::Fma4.symbol(),
        }
    }

    /// The kernel as `weights_reason` names it: its op and, where they go otherwise, how a prompt's products go.
    pub fn described(self) -> String {
        let mut described = self.symbol().to_string();
        let Some(kernel) = self.own() else { return described };
        if kernel == Kernel::Fma4 && cpu::fma4_subnormals() {
            described += ", its nibbles read as float32 subnormals (torchtpu_fma4_subnormal_mm)";
        }
        if let Some(prompt) = kernel.prompt() {
            let (rows, by, symbol) = (prompt.min_rows(), prompt.described(), prompt.symbol());
            described += &format!("; products of {rows} rows or more by {by} ({symbol})");
        }
        if let Some(panels) = kernel.panels() {
            let by = match panels {
                Panels::Bf16 => "panels (torchtpu_unpack_panel, then torch's bf16 matmul on AMX)",
                Panels::Float => "float32 panels (torchtpu_unpack_panel_float, then torch's float32 matmul)",
            };
            described += &format!("; prompt chunks of {} rows or more by {by}", panels.min_rows());
        }
        described
    }

    /// This step's own kernel it names, if it names one.
    pub fn own(self) -> Option<Kernel> {
        match self {
            Int4Matmul::Aten => None,
            Int4Matmul::Dot4 => Some(Kernel::Dot4),
            Int4Matmul::Fma4 => Some(Kernel::Fma4),
        }
    }
}

/// A linear layer as the engine holds it.
pub enum Linear {
    /// `[out, in]` in the compute dtype (step 03's).
    Dense(Tensor),
    /// Multiplied by ATen's int4 kernel.
    Int4(Int4Linear),
    /// Multiplied by one of this step's own kernels (dot4 or fma4), on their layout.
    Own(OwnLinear),
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => crate::onednn::linear(x, w),
            Linear::Int4(w) => w.forward(x),
            Linear::Own(w) => w.forward(x),
        }
    }

    /// `gelu_tanh(gate) · up` of a `[gate; up]` held in pairs, in one call (dot4.rs); only this step's kernels
    /// hold them so (`Held::own`).
    pub fn gelu_of_halves(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Own(w) => w.gelu_of_halves(x),
            _ => Err(invalid!("gelu_of_halves: a stacked gate/up is held on this step's kernels only")),
        }
    }

    /// Its weights, rows × columns: the multiply-adds a product does per row of x.
    pub fn weights(&self) -> i64 {
        match self {
            Linear::Dense(t) => t.numel() as i64,
            Linear::Int4(w) => w.weights(),
            Linear::Own(w) => w.weights(),
        }
    }

    pub fn bytes(&self) -> i64 {
        match self {
            Linear::Dense(t) => t.numel() as i64 * t.kind().elt_size_in_bytes() as i64,
            Linear::Int4(w) => w.bytes(),
            Linear::Own(w) => w.bytes(),
        }
    }
}

/// How `Gemma::load` makes its linears: what to hold them as, and, when the choice was `"auto"`, which ones the
/// kernel refused and were kept dense instead.
pub struct Held {
    pub weights: Weights,
    /// The kernel for the matrices kept 4-bit.
    pub matmul: Int4Matmul,
    pub dtype: Kind,
    /// `weights="auto"`: a matrix the kernel cannot take stays dense (and is listed) instead of failing the load.
    pub fallback: bool,
    pub kept_dense: RefCell<Vec<String>>,
    /// Where this step's kernels' matrices go, one after another in load order (pages.rs).
    arena: RefCell<Arena>,
}

impl Held {
    pub fn new(weights: Weights, matmul: Int4Matmul, dtype: Kind, fallback: bool) -> Held {
        Held {
            weights,
            matmul,
            dtype,
            fallback,
            kept_dense: RefCell::new(Vec::new()),
            arena: RefCell::new(Arena::new()),
        }
    }

    /// Whether the packed matrix `name`, `[rows, cols]` in groups of `group`, falls back to dense: with
    /// `weights="auto"`, where the kernels cannot take its shape (its name then kept in `kept_dense`). Otherwise it
    /// is kept 4-bit, and a shape the kernels refuse fails the load, naming it.
    pub fn falls_back(&self, name: &str, rows: i64, cols: i64, group: i64) -> bool {
        let falls = self.fallback && refuses(rows, cols, group).is_some();
        if falls {
            self.kept_dense.borrow_mut().push(name.to_string());
        }
        falls
    }

    /// The packed matrix `name` kept 4-bit for the chosen kernel, on like's device.
    pub fn int4(&self, name: &str, w: &Packed, like: &Tensor) -> Result<Linear> {
        Ok(match self.matmul.own() {
            None => Linear::Int4(Int4Linear::new(name, w, self.dtype, like)?),
            Some(kernel) => self.own(name, &[w], Stacking::Rows, kernel)?,
        })
    }

    /// This step's kernel, where the matrices are kept 4-bit on one: then several products of one input can be one
    /// call on them stacked (`own`), every output the bits it has apart (dot4.rs). None otherwise: a dense
    /// product, or ATen's int4 kernel, of stacked rows may sum in another order, and `weights="bf16"` stays step
    /// 03's engine bit for bit.
    pub fn stacking_kernel(&self) -> Option<Kernel> {
        self.matmul.own().filter(|_| self.weights == Weights::Int4)
    }

    /// The packed matrices `parts`, stacked as `stacking` says, as one linear on `kernel`, in this model's arena.
    pub fn own(&self, name: &str, parts: &[&Packed], stacking: Stacking, kernel: Kernel) -> Result<Linear> {
        Ok(Linear::Own(OwnLinear::new(name, parts, stacking, kernel, &mut self.arena.borrow_mut())?))
    }
}
