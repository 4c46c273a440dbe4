//! This step's own int4 matmuls, on one layout: `torchtpu_dot4_mm` for CPUs with AVX512-BF16 (an Intel Xeon with
//! AMX; an AMD EPYC Zen 4), src/dot4.cpp, whose header draws the layout; and `torchtpu_fma4_mm` for CPUs with AVX2,
//! FMA and F16C (every other x86-64 of the last ten years, and any CPU kept to AVX2), src/fma4.cpp. cpu.rs says which
//! runs here.
//!
//! Why a kernel of our own: ATen's (int4.rs) spends more instructions per weight than memory takes to deliver it
//! — per weight a table lookup, a dequantizing multiply-add and the product's — so on two cores a decode step
//! waits on its arithmetic, not on memory (step 05's bench times one E2B mat-vec through each kernel).
//! Here a shift and one logic instruction turn 8 stored nibbles into 4 bf16 pairs `128 + nibble`, and one
//! `vdpbf16ps` multiplies a pair by the activations' pair and adds both products into float32: the same W4A16
//! arithmetic, exact products, float32 sums, scales applied once per group. It keeps the checkpoint's scales as
//! stored (bf16, or f16 in the emb4 twin's tables: 2 bytes for 32 weights, as llama.cpp's Q4_0) and widens them to
//! float32 in the kernel, exactly, so the twin's f16 scales are kept exactly, where ATen's kernel takes them
//! rounded to bf16.
//!
//! Without AVX512-BF16 there is no bf16 dot product; `torchtpu_fma4_mm` reads the same words with AVX2 instead: a
//! mask leaves one nibble where it lies, `u · 16^p`, an integer the convert instruction makes float32 exactly, and
//! the activation it multiplies was divided by 16^p beforehand — one AND, one convert and one FMA per 8 weights, the
//! same exact products and float32 sums (fma4.cpp's header). On an AMD CPU the masked word is read as a float32
//! subnormal instead, with no convert (`torchtpu_fma4_subnormal_mm`, `cpu::fma4_subnormals`): the same bits. The
//! layout serves both kernels, so one repack serves both.
//!
//! A prompt's rows multiply each weight many times, so there the arithmetic, not memory, sets the pace. Where AMX
//! runs, dot4's products of a few to a hundred-odd rows go by its tiles instead (`torchtpu_amx4_mm`, src/amx4.cpp):
//! the same words made into the tile's operand, 16 × 16 × 32 products an instruction, the same arithmetic. On an
//! Intel CPU without AMX they go by fma4's arithmetic in AVX-512's 16 lanes (`torchtpu_fma16_mm`, src/fma4.cpp):
//! there `vdpbf16ps` issues once every two cycles and a 512-bit FMA twice a cycle; so do fma4's on an Intel CPU with
//! AVX-512 and no AVX512-BF16, twice its lanes (`Prompt`). Chunks of more rows go
//! by panels (`by_panels`): unpacked to weights and multiplied by torch's matmul.
use std::sync::Arc;

use memmap2::MmapMut;
use tch::{Device, Kind, Tensor};

use crate::cpu::{self, Isa};
use crate::error::{invalid, Error, Result};
use crate::packed::{refuses, Packed, REPACK_ROWS};
use crate::pages::Arena;
use crate::tanh;

type Multiply =
    unsafe extern "C" fn(*const u16, *const i32, *const u16, bool, *mut u16, i64, i64, i64, i64, i32, *const u16);

/// Declares the products of this step's kernels, which share one C signature: y [m, n] = x [m, k] · Wᵀ; s the
/// scales, f16 where f16_scales, else bf16; gelu_lanes 0, or 16 / 8: y the gelu of gate's products times up's, or
/// times `up` where given, in ATen's AVX-512 / AVX2 bits (dot4.cpp says it whole).
macro_rules! products {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        extern "C" {
            $($(#[$doc])*
            fn $name(
                x: *const u16,
                w: *const i32,
                s: *const u16,
                f16_scales: bool,
                y: *mut u16,
                m: i64,
                n: i64,
                k: i64,
                group: i64,
                gelu_lanes: i32,
                up: *const u16,
            );)*
        }
    };
}

products! {
    /// dot4.cpp: AVX-512 and AVX512-BF16's `vdpbf16ps`
    torchtpu_dot4_mm;
    /// fma4.cpp: AVX2, FMA and F16C
    torchtpu_fma4_mm;
    /// fma4.cpp: the same product, its nibbles read as float32 subnormals instead of converted (`cpu::fma4_subnormals`)
    torchtpu_fma4_subnormal_mm;
    /// fma4.cpp: fma4's arithmetic in AVX-512's 16 lanes
    torchtpu_fma16_mm;
    /// amx4.cpp: dot4's arithmetic on AMX's tiles
    torchtpu_amx4_mm;
}

extern "C" {
    // panels.cpp: `blocks` blocks of 16 rows back to bf16 weights, into wt [k, 16 · blocks]
    fn torchtpu_unpack_panel(
        w: *const i32,
        s: *const u16,
        f16_scales: bool,
        wt: *mut u16,
        blocks: i64,
        k: i64,
        group: i64,
    );
    // the same into float32 weights (AVX2, FMA and F16C)
    fn torchtpu_unpack_panel_float(
        w: *const i32,
        s: *const u16,
        f16_scales: bool,
        wt: *mut f32,
        blocks: i64,
        k: i64,
        group: i64,
    );
}

/// From how many activation rows dot4's products go by AMX's tiles (`torchtpu_amx4_mm`, amx4.cpp) where they run: a
/// prompt's, never a decode step's. On an Intel Xeon with AMX, 2 threads, best of 9 (2026-12-06), E2B's [12288 ×
/// 1536] took 0.64 / 0.82-0.86 / 1.10 ms by dot4 at 3 / 4 / 5 rows and 0.60 / 0.60 by the tiles at 4 / 5; [2048 ×
/// 1536] 0.10-0.11 / 0.14 / 0.18 and 0.11 / 0.11; [1536 × 6144] 0.35-0.37 / 0.43-0.46 / 0.56 and 0.39-0.40 / 0.38-0.41
/// (at 1 row 0.29, 0.05 and 0.14 ms either way: dot4's, memory's pace).
pub const AMX4_MIN_ROWS: i64 = 4;
/// From how many activation rows products go by fma4's arithmetic in AVX-512's 16 lanes (`torchtpu_fma16_mm`,
/// fma4.cpp) where it is the way (`cpu::fma16_runs`): a prompt's, never a decode step's. On an Intel Xeon kept from
/// AMX (`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`), 2 threads, best of 7 (2026-12-06), E2B's [12288 × 1536] took 0.27 /
/// 0.64 / 0.84 / 3.30 / 3.60-3.91 / 26.2 ms by dot4 at 1 / 3 / 4 / 16 / 19 / 128 rows and 0.30 / 0.49 / 0.64 / 1.98 /
/// 2.25-2.73 / 16.6-17.7 by fma16; [2048 × 1536] 0.04 / 0.11 / 0.14 / 0.56 and 0.06 / 0.10 / 0.12 / 0.39; [1536 ×
/// 6144] 0.13 / 0.31 / 0.40 / 1.54 and 0.16 / 0.27 / 0.35 / 1.12: a decode step's one row stays dot4's. And against
/// fma4 (8 lanes, what a Xeon with AVX-512 and no AVX512-BF16 ran), in one later run: [12288 × 1536] at 4 / 16 / 19 /
/// 128 rows 0.84 / 3.47 / 4.10 / 29.2 ms by fma4, 0.58 / 1.82 / 2.33 / 15.7 by fma16; [2048 × 1536] at 19 rows 0.74
/// and 0.46; [1536 × 6144] 2.20 and 1.40. (At 1 row fma16 took 0.27 against fma4's 0.36 warm in cache; a decode step
/// streams its weights from memory, and fma4's row stays its own, not measured streamed against fma16.)
pub const FMA16_MIN_ROWS: i64 = 4;
/// From how many activation rows products go by bf16 panels (`Panels::Bf16`, dot4's where AMX runs): a prompt chunk's
/// product, never a decode step's. Below it AMX's tiles take them (`AMX4_MIN_ROWS`), which need no unpacked panel: on
/// an Intel Xeon with AMX, 2 threads, best of 9 (2026-12-06, a busy hour), E2B's [12288 × 1536] took 0.74 / 1.0-1.24 /
/// 1.27 / 4.18 / 5.06-5.56 / 7.0 ms by the tiles at 16 / 19 / 32 / 96 / 128 / 160 rows and 4.15 / 3.96-4.22 / 4.62 /
/// 5.50 / 5.50-5.99 / 7.51 by panels (dot4 4.0 at 19, 26.4 at 128); [2048 × 1536] 0.13 / 0.18-0.23 / 0.20 / 0.67 /
/// 0.86-0.88 / 1.08 and 0.67 / 0.65-0.69 / 0.72 / 0.88 / 0.89-0.91 / 1.04; [1536 × 6144] by the tiles 0.39 / 0.57-0.83
/// / 0.69 / 1.92 / 2.63-5.07 / 3.75, by panels 2.6 to 11 ms in that hour (an hour earlier, with the tiles one group at a
/// time, 1.9 to 3.4 from 16 to 160 rows).
pub const PANEL_MIN_ROWS: i64 = 128;
/// The same for float32 panels (`Panels::Float`): an Intel Xeon with AMX kept to AVX2 (2026-12-06, 2 threads, best
/// of 7), E2B's [12288 × 1536] by fma4 at 64 / 128 / 512 rows 14.8 / 29.0 / 117.9 ms, by panels 19.9 / 28.3 / 97.7;
/// [2048 × 1536] 2.4 / 4.9 / 21.7 and 2.9 / 4.7 / 15.4; [1536 × 6144] 8.2 / 18.0 / 63.8 and 9.2 / 15.3 / 48.5. The
/// same Xeon kept from AMX only (`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`, best of 5): [12288 × 1536] by dot4 at 63 / 96
/// rows 11.9 / 18.3 ms (so about 24 at 128), by its float32 panels at 128 / 512 rows 17.9 / 52.3.
pub const FLOAT_PANEL_MIN_ROWS: i64 = 128;
/// Rows of W unpacked at a time into bf16 panels: 3 MB at E2B's 1,536 columns, written once and read once by the
/// product.
const PANEL_ROWS: i64 = 1024;
/// The same for float32 panels: 1.5 MB at 1,536 columns, 6 MB at the down projection's 6,144. 1,024 rows made the
/// down projection's panels 25 MB, far past the caches: on an AVX2-only AMD EPYC Zen 3 (2026-12-07, `budget.py --e2b
/// --read --tokens 508`, one round each, one after the other) a 508-token read took 15.4 s with 1,024 rows, 13.3 /
/// 13.8 / 13.9 s with 256 / 128 / 512, its down projection 4.32 s against 3.27 / 3.27 / 3.30.
const FLOAT_PANEL_ROWS: i64 = 256;

/// This step's two kernels, which read the same layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `torchtpu_dot4_mm`: AVX-512 and AVX512-BF16's `vdpbf16ps`.
    Dot4,
    /// `torchtpu_fma4_mm`: AVX2, FMA and F16C.
    Fma4,
}

/// What a prompt chunk's product is unpacked to, a panel of rows at a time, and multiplied by (`OwnLinear::by_panels`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panels {
    /// bf16 weights (rounded once: step 03's) and torch's bf16 matmul, which oneDNN runs on AMX.
    Bf16,
    /// float32 weights (exact) and torch's float32 matmul (MKL's), rounded once to bf16.
    Float,
}

impl Panels {
    /// Rows of W unpacked at a time.
    fn rows(self) -> i64 {
        match self {
            Panels::Bf16 => PANEL_ROWS,
            Panels::Float => FLOAT_PANEL_ROWS,
        }
    }

    /// From how many activation rows a product goes by them.
    pub fn min_rows(self) -> i64 {
        match self {
            Panels::Bf16 => PANEL_MIN_ROWS,
            Panels::Float => FLOAT_PANEL_MIN_ROWS,
        }
    }
}

impl Kernel {
    /// The panels its products of many rows go by here (cpu.rs), or None: the kernel at every row count.
    pub fn panels(self) -> Option<Panels> {
        match self {
            Kernel::Dot4 if cpu::panels_run() => Some(Panels::Bf16),
            Kernel::Dot4 if cpu::dot4_float_panels_run() => Some(Panels::Float),
            Kernel::Dot4 => None,
            // its CPUs have what the float32 unpacking needs, and torch's float32 matmul
            Kernel::Fma4 => Some(Panels::Float),
        }
    }

    /// What its products of a prompt's rows go by here (cpu.rs), or None: the kernel itself. dot4's, where AMX runs
    /// (AMX's tiles); either kernel's on an Intel CPU with AVX-512 and no AMX (fma4's arithmetic in 16 lanes).
    pub fn prompt(self) -> Option<Prompt> {
        match self {
            Kernel::Dot4 if cpu::amx4_runs() => Some(Prompt::Amx4),
            _ if cpu::fma16_runs() => Some(Prompt::Fma16),
            _ => None,
        }
    }

    /// The kernel's symbol (named in every error about it).
    pub fn symbol(self) -> &'static str {
        match self {
            Kernel::Dot4 => "torchtpu_dot4_mm",
            Kernel::Fma4 => "torchtpu_fma4_mm",
        }
    }

    /// What it needs of the CPU, for the error that says it is missing.
    pub fn needs(self) -> &'static str {
        match self {
            Kernel::Dot4 => "a CPU with AVX512-BF16 (vdpbf16ps), with ATen allowed AVX-512",
            Kernel::Fma4 => "a CPU with AVX2, FMA and F16C, with ATen allowed AVX2",
        }
    }

    /// Whether it runs in this process (cpu.rs: the CPU's flags and ATen's ISA).
    pub fn runs(self) -> bool {
        match self {
            Kernel::Dot4 => cpu::dot4_runs(),
            Kernel::Fma4 => cpu::fma4_runs(),
        }
    }

    /// Its product here: fma4's reads its nibbles as subnormals where that is the faster form (cpu.rs).
    fn multiply(self) -> Multiply {
        match self {
            Kernel::Dot4 => torchtpu_dot4_mm,
            Kernel::Fma4 if cpu::fma4_subnormals() => torchtpu_fma4_subnormal_mm,
            Kernel::Fma4 => torchtpu_fma4_mm,
        }
    }
}

/// What a kernel's products of a prompt's rows go by, where not the kernel itself: from `min_rows` rows up to the
/// panels'. Both compute the W4A16 arithmetic the kernels do, exactly (the same products, float32 sums per group); a
/// prompt's rows share each weight they unpack, so there the pace is set by the multiply-adds an instruction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// AMX's tiles (`torchtpu_amx4_mm`, amx4.cpp): dot4's words made into the tile's operand, 16 × 16 × 32 products
    /// an instruction.
    Amx4,
    /// fma4's arithmetic in AVX-512's 16 lanes (`torchtpu_fma16_mm`, fma4.cpp): float32 FMAs, where an Intel core
    /// issues two a cycle and one `vdpbf16ps` every two, in twice fma4's lanes.
    Fma16,
}

impl Prompt {
    pub fn symbol(self) -> &'static str {
        match self {
            Prompt::Amx4 => "torchtpu_amx4_mm",
            Prompt::Fma16 => "torchtpu_fma16_mm",
        }
    }

    /// From how many activation rows a product goes by it.
    pub fn min_rows(self) -> i64 {
        match self {
            Prompt::Amx4 => AMX4_MIN_ROWS,
            Prompt::Fma16 => FMA16_MIN_ROWS,
        }
    }

    /// How `weights_reason` says it.
    pub fn described(self) -> &'static str {
        match self {
            Prompt::Amx4 => "AMX's tiles",
            Prompt::Fma16 => "fma4's arithmetic in AVX-512's 16 lanes",
        }
    }

    fn multiply(self) -> Multiply {
        match self {
            Prompt::Amx4 => torchtpu_amx4_mm,
            Prompt::Fma16 => torchtpu_fma16_mm,
        }
    }
}

/// Where the kernel wants nibble `j` of a checkpoint word (which holds it at bit `4j`): the nibbles of columns
/// `k + 2i` and `k + 2i + 1` at bits `4i` and `16 + 4i`, so one shift brings both to the bottom of a bf16 half.
fn bit(j: i64) -> i64 {
    4 * (j / 2) + 16 * (j % 2)
}

// --8<-- [start:dot4]
/// A linear layer kept 4-bit for one of this step's kernels: `y = x · Wᵀ`, `W[n, k] = (nibble - 8) · scale[n, k /
/// group]`. It takes the shapes ATen's kernel takes (`packed::refuses`), so every kernel loads the same checkpoints.
pub struct OwnLinear {
    /// int32 `[out / 16, in / 8, 16]`: for each block of 16 output rows, the rows' words side by side, column
    /// octet after octet, so a block's weights are one stream.
    words: Tensor,
    /// bf16 or f16 `[out / 16, in / group, 16]`, as the checkpoint stores them: the 16 rows' scales of each group,
    /// side by side (the kernel widens them to float32, exactly).
    scales: Tensor,
    group: i64,
    kernel: Kernel,
    /// The kernel's panels in this process (`Kernel::panels`), decided once here: a decode step's mat-vecs never ask.
    panels: Option<Panels>,
    /// What its products of a prompt's rows go by (`Kernel::prompt`), decided here too.
    prompt: Option<Prompt>,
    /// The kernel's product in this process (`Kernel::multiply`), decided here too.
    multiply: Multiply,
    stacking: Stacking,
    bytes: i64,
    /// The memory `words` and `scales` are views of, kept as long as they are.
    _pages: Arc<MmapMut>,
}

/// How `OwnLinear::new` lays several matrices of one input in one linear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacking {
    /// Row after row: `forward` gives each matrix's outputs where its rows are (q, k and v; one matrix alone).
    Rows,
    /// Two matrices of one height, `[gate; up]`, a 16-row block of gate's then the same block of up's: read together
    /// by `gelu_of_halves`, which gives `gelu_tanh(gate) · up` and nothing else.
    Pairs,
}

/// What a kernel call writes.
enum Out<'a> {
    /// `x · Wᵀ`.
    Products,
    /// `gelu_tanh(gate) · up` of `[gate; up]` held in pairs.
    GeluOfPairs,
    /// `gelu_tanh(x · Wᵀ) · up`, up given.
    GeluTimes(&'a Tensor),
}

impl OwnLinear {
    /// Re-lays the checkpoint's matrices `parts` (one, or several stacked as `stacking` says: one product of one
    /// input instead of several) for the kernel, in memory taken from `arena`, `REPACK_ROWS` rows at a time (a whole
    /// head's int32 nibbles would be 1.6 GB): the same nibbles, moved within each word and gathered into blocks of
    /// 16 rows. The kernels multiply each block alone, so a stacked part's outputs have the bits they have apart.
    pub fn new(
        name: &str,
        parts: &[&Packed],
        stacking: Stacking,
        kernel: Kernel,
        arena: &mut Arena,
    ) -> Result<OwnLinear> {
        let first = parts.first().ok_or_else(|| invalid!("{name}: no matrix to hold"))?;
        if stacking == Stacking::Pairs && (parts.len() != 2 || parts[1].out_rows() != first.out_rows()) {
            let heights = parts.iter().map(|w| w.out_rows()).collect::<Vec<_>>();
            return Err(invalid!("{name}: paired blocks need two matrices of one height, got heights {heights:?}"));
        }
        let (cols, groups, kind) = (first.cols(), first.groups(), first.scale().kind());
        let group = cols / groups;
        for w in parts {
            if (w.cols(), w.groups(), w.scale().kind()) != (cols, groups, kind) {
                return Err(invalid!(
                    "{name}: stacked matrices differ in (columns, groups, scales): {:?} and {:?}",
                    (cols, groups, kind),
                    (w.cols(), w.groups(), w.scale().kind())
                ));
            }
            if let Some(why) = refuses(w.out_rows(), cols, group) {
                return Err(Error::Unsupported(format!("{name}: {why}; load it with weights=\"bf16\"")));
            }
        }
        if !kernel.runs() {
            return Err(Error::Unsupported(format!("{name}: {} needs {}", kernel.symbol(), kernel.needs())));
        }
        if !matches!(kind, Kind::BFloat16 | Kind::Half) {
            return Err(Error::Unsupported(format!("{name}: scales in {kind:?}, need bf16 or f16")));
        }
        let blocks = parts.iter().map(|w| w.out_rows() / 16).sum::<i64>();
        let (pages, words, scales) = held_in(arena, blocks, cols / 8, groups, kind)?;
        // a paired part's blocks: every other block, from block p
        let every_other =
            |t: &Tensor, p: usize| -> Result<Tensor> { Ok(t.f_unflatten(0, [blocks / 2, 2])?.f_select(1, p as i64)?) };
        let mut at = 0; // the part's first block, where stacked by rows
        for (p, w) in parts.iter().enumerate() {
            let rows = w.out_rows();
            let (words_to, scales_to, first) = match stacking {
                Stacking::Rows => (words.shallow_clone(), scales.shallow_clone(), at),
                Stacking::Pairs => (every_other(&words, p)?, every_other(&scales, p)?, 0),
            };
            let mut start = 0;
            while start < rows {
                let n = REPACK_ROWS.min(rows - start);
                let nibbles = w.nibbles(start, n)?.f_view([n, cols / 8, 8])?; // the stored q + 8, 0..15
                let mut moved = nibbles.f_select(2, 0)?; // nibble 0 stays at bit 0
                for j in 1..8 {
                    moved = moved
                        .f_bitwise_or_tensor(&nibbles.f_select(2, j)?.f_bitwise_left_shift_tensor_scalar(bit(j))?)?;
                }
                let moved = moved.f_view([n / 16, 16, cols / 8])?.f_transpose(1, 2)?;
                words_to.f_narrow(0, first + start / 16, n / 16)?.f_copy_(&moved)?;
                start += n;
            }
            let by_block = w.scale().f_view([rows / 16, 16, groups])?.f_transpose(1, 2)?;
            scales_to.f_narrow(0, first, rows / 16)?.f_copy_(&by_block)?;
            at += rows / 16;
        }
        let bytes = [&words, &scales].iter().map(|t| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64).sum();
        let (panels, prompt, multiply) = (kernel.panels(), kernel.prompt(), kernel.multiply());
        Ok(OwnLinear { words, scales, group, kernel, panels, prompt, multiply, stacking, bytes, _pages: pages })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.stacking == Stacking::Pairs {
            return Err(invalid!(
                "{}: a paired [gate; up] gives gelu_of_halves, not its products",
                self.kernel.symbol()
            ));
        }
        let x = self.checked(x)?;
        match self.panels_for(&x) {
            Some(panels) => self.by_panels(&x, panels),
            None => self.by_kernel(&x, Out::Products),
        }
    }

    // --8<-- [start:gelu_of_halves]
    /// `gelu_tanh(gate) · up` `[tokens, rows / 2]` for `[gate; up]` held in pairs (`Stacking::Pairs`): the bits of
    /// their products and tanh.rs' `gelu_times` on them, in one call — the kernel computes a gate block and its up
    /// block one after the other and the gelu on their way out, so a decode step neither writes the 2 × 12,288
    /// products nor reads them back, and the gelu is shared between the threads with the blocks.
    pub fn gelu_of_halves(&self, x: &Tensor) -> Result<Tensor> {
        if self.stacking != Stacking::Pairs {
            return Err(invalid!("{}: gelu_of_halves needs [gate; up] held in pairs", self.kernel.symbol()));
        }
        let x = self.checked(x)?;
        if let Some(panels) = self.panels_for(&x) {
            // a prompt chunk's product by panels (its columns a block of gate's, a block of up's, ...), then the gelu
            let both = self.by_panels(&x, panels)?.f_unflatten(1, [-1, 2, 16])?;
            let half = |p: i64| both.f_select(2, p)?.f_flatten(1, 2);
            return tanh::gelu_times(&half(0)?, &half(1)?);
        }
        self.by_kernel(&x, Out::GeluOfPairs)
    }
    // --8<-- [end:gelu_of_halves]

    /// `gelu_tanh(x · Wᵀ) · up` for W one matrix (or stacked by rows) and up bf16 `[tokens, rows]` (the per-layer
    /// input's gate and input): the bits of `forward` and then tanh.rs' `gelu_times`, in one call, as
    /// `gelu_of_halves`. Its callers ask for it where the rows come in ATen's whole vector steps (`tanh::whole_steps`).
    pub fn gelu_times(&self, x: &Tensor, up: &Tensor) -> Result<Tensor> {
        let x = self.checked(x)?;
        let shape = [x.size()[0], self.out_rows()];
        if self.stacking != Stacking::Rows
            || up.kind() != Kind::BFloat16
            || up.size() != shape
            || up.device() != Device::Cpu
        {
            return Err(invalid!(
                "{}: gelu_times of {:?} by up {:?} {:?} on {:?}: need one matrix's products and up bf16 {shape:?} on the CPU",
                self.kernel.symbol(),
                self.stacking,
                up.kind(),
                up.size(),
                up.device()
            ));
        }
        let up = up.f_contiguous()?;
        if let Some(panels) = self.panels_for(&x) {
            return tanh::gelu_times(&self.by_panels(&x, panels)?, &up);
        }
        self.by_kernel(&x, Out::GeluTimes(&up))
    }

    /// Rows of W: the products' count.
    pub fn out_rows(&self) -> i64 {
        self.words.size()[0] * 16
    }

    /// x as the kernels take it: contiguous 2-D bf16 `[tokens, cols]` on the CPU, or an error naming what it is.
    fn checked(&self, x: &Tensor) -> Result<Tensor> {
        let cols = self.words.size()[1] * 8;
        if x.kind() != Kind::BFloat16 || x.dim() != 2 || x.size()[1] != cols || x.device() != Device::Cpu {
            return Err(invalid!(
                "{}: activations {:?} of shape {:?} on {:?}, need 2-D bfloat16 [tokens, {cols}] on the CPU",
                self.kernel.symbol(),
                x.kind(),
                x.size(),
                x.device()
            ));
        }
        Ok(x.f_contiguous()?)
    }

    /// The panels x's product goes by, if its rows are enough for the kernel's panels here.
    fn panels_for(&self, x: &Tensor) -> Option<Panels> {
        self.panels.filter(|panels| x.size()[0] >= panels.min_rows())
    }

    /// `x · Wᵀ` by the kernel itself, or the gelu of products times others (`out`). x is contiguous bf16 [m, cols]
    /// (`checked`).
    fn by_kernel(&self, x: &Tensor, out: Out) -> Result<Tensor> {
        let [blocks, octets, _] = self.words.size()[..] else { unreachable!("words are 3-D") };
        let (rows, cols, m) = (blocks * 16, octets * 8, x.size()[0]);
        let outputs = if matches!(out, Out::GeluOfPairs) { rows / 2 } else { rows };
        // the lanes ATen's gelu computes in
        let lanes = if cpu::aten_isa() == Isa::Avx512 { 16 } else { 8 };
        let (gelu_lanes, up) = match out {
            Out::Products => (0, std::ptr::null()),
            Out::GeluOfPairs => (lanes, std::ptr::null()),
            Out::GeluTimes(up) => (lanes, up.data_ptr() as *const u16),
        };
        let multiply = match self.prompt {
            Some(prompt) if m >= prompt.min_rows() => prompt.multiply(),
            _ => self.multiply,
        };
        let y = Tensor::f_empty([m, outputs], (Kind::BFloat16, Device::Cpu))?;
        if m > 0 {
            // SAFETY: x is contiguous bf16 [m, cols], y bf16 [m, outputs], up null or contiguous bf16 [m, rows]
            // (`gelu_times`), words and scales contiguous in the layout above (made in `new`: in pairs for
            // `Out::GeluOfPairs`, `gelu_of_halves` checked), all on the host; shapes checked here and in `new` (rows %
            // 16, cols % group, group one of 32, 64, 128, 256), which is all the kernels assume; `new` checked that
            // this one runs here, and with it the AVX2 or AVX-512 the gelu's lanes need, and what a prompt's rows go by.
            unsafe {
                multiply(
                    x.data_ptr() as *const u16,
                    self.words.data_ptr() as *const i32,
                    self.scales.data_ptr() as *const u16,
                    self.scales.kind() == Kind::Half,
                    y.data_ptr() as *mut u16,
                    m,
                    rows,
                    cols,
                    self.group,
                    gelu_lanes,
                    up,
                );
            }
        }
        Ok(y)
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    // --8<-- [start:panels]
    /// `x · Wᵀ` a panel of rows at a time (`Panels::rows`): the panel unpacked to weights (panels.cpp: `(q - 8) ·
    /// scale`), then torch's matmul — bf16 weights (rounded once: step 03's) and bf16's product, which oneDNN runs on
    /// AMX; or float32 weights (exact) and float32's product, rounded once to bf16 as it is copied into y. x is
    /// contiguous bf16 [m, cols] (checked by `forward`); the panels run here (`Kernel::panels`, or the tests').
    fn by_panels(&self, x: &Tensor, panels: Panels) -> Result<Tensor> {
        let [blocks, octets, _] = self.words.size()[..] else { unreachable!("words are 3-D") };
        let (rows, cols, groups) = (blocks * 16, octets * 8, self.scales.size()[1]);
        let y = Tensor::f_empty([x.size()[0], rows], (Kind::BFloat16, Device::Cpu))?;
        let (kind, x) = match panels {
            Panels::Bf16 => (Kind::BFloat16, x.shallow_clone()),
            Panels::Float => (Kind::Float, x.f_to_kind(Kind::Float)?), // exact
        };
        let mut start = 0;
        while start < rows {
            let n = panels.rows().min(rows - start);
            let wt = Tensor::f_empty([cols, n], (kind, Device::Cpu))?;
            // SAFETY: words and scales are contiguous in dot4's layout (made in `new`), block start / 16 onwards
            // holds n / 16 blocks (start and n are multiples of 16, start + n <= rows); wt is a fresh contiguous
            // [cols, n] of the kind each writes; the caller checked that these panels run here.
            unsafe {
                let w = (self.words.data_ptr() as *const i32).add((start / 16 * octets * 16) as usize);
                let s = (self.scales.data_ptr() as *const u16).add((start / 16 * groups * 16) as usize);
                let (f16, blocks, group) = (self.scales.kind() == Kind::Half, n / 16, self.group);
                match panels {
                    Panels::Bf16 => torchtpu_unpack_panel(w, s, f16, wt.data_ptr() as *mut u16, blocks, cols, group),
                    Panels::Float => {
                        torchtpu_unpack_panel_float(w, s, f16, wt.data_ptr() as *mut f32, blocks, cols, group)
                    }
                }
            }
            y.f_narrow(1, start, n)?.f_copy_(&x.f_mm(&wt)?)?;
            start += n;
        }
        Ok(y)
    }
    // --8<-- [end:panels]

    /// Bytes one product reads: the words and the scales (counted once, in `new`: a decode step asks 212 times).
    pub fn bytes(&self) -> i64 {
        self.bytes
    }

    /// Rows × columns: eight nibbles a word.
    pub fn weights(&self) -> i64 {
        self.words.numel() as i64 * 8
    }
}
// --8<-- [end:dot4]

/// Words int32 `[blocks, octets, 16]` and then scales (`kind`) `[blocks, groups, 16]`, zeros, in one piece of the
/// arena (pages.rs says why): a product reads them as one stretch of memory; and the map they are views of.
fn held_in(
    arena: &mut Arena,
    blocks: i64,
    octets: i64,
    groups: i64,
    kind: Kind,
) -> Result<(Arc<MmapMut>, Tensor, Tensor)> {
    let (words_bytes, scales_bytes) = (blocks * octets * 16 * 4, blocks * groups * 16 * 2);
    let (pages, piece) = arena.take(words_bytes + scales_bytes)?;
    let words = piece.f_narrow(0, 0, words_bytes)?.f_view_dtype(Kind::Int)?.f_view([blocks, octets, 16])?;
    let scales = piece.f_narrow(0, words_bytes, scales_bytes)?.f_view_dtype(kind)?.f_view([blocks, groups, 16])?;
    Ok((pages, words, scales))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::tests::{random_matrix, random_matrix_scaled_in};

    /// A kernel, its product (fma4's in either form), and what its products of a prompt's rows go by (None: the
    /// kernel itself at every row count).
    #[derive(Clone, Copy, Debug)]
    struct Way {
        kernel: Kernel,
        multiply: Multiply,
        prompt: Option<Prompt>,
    }

    /// A kernel the way the engine holds it here.
    impl From<Kernel> for Way {
        fn from(kernel: Kernel) -> Way {
            Way { kernel, multiply: kernel.multiply(), prompt: kernel.prompt() }
        }
    }

    /// Matrices held for `way`, as `OwnLinear::new` holds them for its kernel, with `way`'s prompt products.
    fn held(
        name: &str,
        parts: &[&Packed],
        stacking: Stacking,
        way: impl Into<Way>,
        arena: &mut Arena,
    ) -> Result<OwnLinear> {
        let way = way.into();
        let mut linear = OwnLinear::new(name, parts, stacking, way.kernel, arena)?;
        (linear.multiply, linear.prompt) = (way.multiply, way.prompt);
        Ok(linear)
    }

    /// One matrix held for `way`, in an arena of its own.
    fn alone(name: &str, w: &Packed, way: impl Into<Way>) -> Result<OwnLinear> {
        held(name, &[w], Stacking::Rows, way, &mut Arena::new())
    }

    /// Each way of this step's kernels that can run here, whether or not the engine takes it here: each kernel by
    /// itself at every row count (fma4 in both its forms), fma4's arithmetic in 16 lanes wherever AVX-512 runs (the
    /// engine takes it on an Intel CPU without AMX), and dot4 by AMX's tiles where AMX runs.
    fn ways_here() -> Vec<Way> {
        let kernels = kernels_here();
        let mut here: Vec<Way> = kernels.iter().map(|&kernel| Way { prompt: None, ..Way::from(kernel) }).collect();
        if Kernel::Fma4.runs() {
            // the form the engine does not take here
            let other: Multiply = if cpu::fma4_subnormals() { torchtpu_fma4_mm } else { torchtpu_fma4_subnormal_mm };
            here.push(Way { kernel: Kernel::Fma4, multiply: other, prompt: None });
        }
        if let (Some(&kernel), true) = (kernels.first(), cpu::fma16_can_run()) {
            here.push(Way { prompt: Some(Prompt::Fma16), ..Way::from(kernel) });
        }
        if Kernel::Dot4.runs() && cpu::amx4_runs() {
            here.push(Way { prompt: Some(Prompt::Amx4), ..Way::from(Kernel::Dot4) });
        }
        here
    }

    /// This step's kernels that run here (under the AVX2 limit: fma4 alone; on an AVX2-only CPU: fma4).
    fn kernels_here() -> Vec<Kernel> {
        let here: Vec<Kernel> = [Kernel::Dot4, Kernel::Fma4].into_iter().filter(|k| k.runs()).collect();
        if here.is_empty() {
            eprintln!("skipped: neither kernel runs on this CPU (no AVX2, FMA and F16C)");
        }
        here
    }

    /// A chunk's rows that go by the kernel's panels where they run here (by the kernel itself where none do).
    fn chunk(kernel: Kernel) -> i64 {
        kernel.panels().map_or(PANEL_MIN_ROWS, Panels::min_rows)
    }

    /// Whether every output of `a`, a product of `x` by the matrices `w` summed in another order than `b`, is `b`'s or
    /// a bf16 step from it (a step is at most 2^-7 of the value), give or take what the order itself may move a
    /// float32 sum: of k products, at most k·2^-23 times the sum of their sizes. Where products cancel, that is more
    /// than a step of the output (MKL's float32 matmul under QEMU's Haswell summed in an order that showed it).
    fn within_a_step(a: &Tensor, b: &Tensor, x: &Tensor, w: &[&Packed]) -> bool {
        let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
        let w = Tensor::cat(&w.iter().map(|w| w.dequantize().unwrap()).collect::<Vec<_>>(), 0).to_kind(Kind::Float);
        let sizes = x.to_kind(Kind::Float).abs().mm(&w.abs().tr());
        let order = sizes * (x.size()[1] as f64 * 2f64.powi(-23));
        (&a - &b).abs().le_tensor(&(b.abs() / 128.0 + order + 1e-30)).all().int64_value(&[]) == 1
    }

    /// The row counts the tests multiply by: a decode step's; a few (dot4's own below `AMX4_MIN_ROWS`, AMX's tiles
    /// from it where they run); a short prompt's, in one tile of 32 rows and in two and a remainder; and a chunk that
    /// goes by panels where they run.
    fn row_counts(kernel: Kernel) -> [i64; 5] {
        [1, 5, 19, 37, chunk(kernel)]
    }

    /// Each kernel here with each kind of panels that can run with it here, whether or not its products go by them:
    /// bf16 ones where AMX runs, float32 ones wherever AVX2, FMA and F16C do (fma4's needs).
    fn panels_here() -> Vec<(Kernel, Panels)> {
        let mut here = vec![];
        for kernel in kernels_here() {
            if kernel == Kernel::Dot4 && cpu::panels_run() {
                here.push((kernel, Panels::Bf16));
            }
            if Kernel::Fma4.runs() {
                here.push((kernel, Panels::Float));
            }
        }
        here
    }

    /// The checkpoint's packed matrix with these nibbles (int32 [rows, cols], 0..15) and scales [rows, groups].
    fn packed_of(nibbles: &Tensor, scale: Tensor) -> Packed {
        let (rows, cols) = (nibbles.size()[0], nibbles.size()[1]);
        let nibbles = nibbles.view([rows, cols / 8, 8]);
        let mut words = Tensor::zeros([rows, cols / 8], (Kind::Int, Device::Cpu));
        for i in 0..8 {
            words = words.bitwise_or_tensor(&nibbles.select(2, i).bitwise_left_shift_tensor_scalar(4 * i));
        }
        Packed::new(words, scale, cols).unwrap()
    }

    #[test]
    fn each_nibble_lands_where_the_kernel_reads_it() {
        // columns k + 2i and k + 2i + 1 at bits 4i and 16 + 4i
        assert_eq!((0..8).map(bit).collect::<Vec<_>>(), [0, 16, 4, 20, 8, 24, 12, 28]);
    }

    /// y's difference from the exact product `x · Wᵀ` (W unrounded, in float64), in bf16 steps of the exact value
    /// (0.5 or less: exactly rounded), and whether every output is within what the kernels' float32 sums can miss
    /// by. dot4's group sums run over `128 + nibble`, about 136 · Σ|x| in size, before 136 · Σx is taken off (fma4's
    /// over the nibble itself, at most 15 · Σ|x|, less 8 · Σx): a handful of float32 roundings of that size per
    /// group (2^-19 of 136 · Σ|x| allows 32), then the output's rounding to bf16. Where an output's terms nearly
    /// cancel, that is many steps of the small exact value.
    fn steps_off(y: &Tensor, x: &Tensor, w: &Packed) -> (Tensor, bool) {
        // (q - 8) · scale unrounded, as the int4 kernels take it (the bf16 path rounds it to bf16 first)
        let q = w.nibbles(0, w.out_rows()).unwrap().to_kind(Kind::Double) - 8.0;
        let scale = w.scale().to_kind(Kind::Double).repeat_interleave_self_int(w.cols() / w.groups(), 1, None);
        let x = x.to_kind(Kind::Double);
        let exact = x.matmul(&(q * &scale).tr());
        let step = exact.abs().clamp_min(1e-300).log2().floor().exp2() / 128.0; // a bf16 step at |exact|
        let err = (y.to_kind(Kind::Double) - &exact).abs();
        let x_per_group = x.abs().view([x.size()[0], w.groups(), -1]).sum_dim_intlist(-1, false, Kind::Double);
        let sums = x_per_group.matmul(&w.scale().to_kind(Kind::Double).tr()) * 136.0;
        let within = err.le_tensor(&(sums / 524288.0 + &step)).all().int64_value(&[]) == 1;
        (err / step, within)
    }

    /// `linear`'s product of x against the float64 reference: shape, and every output within reach.
    fn check_within(linear: &OwnLinear, w: &Packed, x: &Tensor, what: &str) -> Tensor {
        let y = linear.forward(x).unwrap();
        assert_eq!(y.size(), [x.size()[0], w.out_rows()], "{what}");
        let (off, within) = steps_off(&y, x, w);
        assert!(within, "{:?} {what}: {} steps off", linear.kernel(), off.max().double_value(&[]));
        off
    }

    /// The same, and 99% of the outputs exactly rounded: for products with thousands of outputs, where a few
    /// near-cancelling ones (a float32 rounding of dot4's large group sums) cannot tip the share.
    fn check(linear: &OwnLinear, w: &Packed, x: &Tensor, what: &str) {
        let off = check_within(linear, w, x, what);
        let missed = off.gt(0.5 + 1e-6).sum(Kind::Int64).int64_value(&[]);
        assert!(
            missed * 100 <= off.numel() as i64,
            "{:?} {what}: {missed} of {} not exactly rounded",
            linear.kernel(),
            off.numel()
        );
    }

    #[test]
    fn the_product_is_the_exact_one_rounded_once() {
        // 1,072 rows: a block of REPACK_ROWS and a remainder of 48, with 1 to 5 rows of x (every tile size of the
        // vector kernels, and two tiles) and 16 and 37 (where AMX's tiles run: x in one tile, and in two tiles of 32
        // rows and a remainder); E2B's q_proj [2048 × 1536] with a decode step's row, a few and a short prompt's (19:
        // both halves of a tile); f16 scales, as the emb4 twin's tables have them (exact in float32: nothing is
        // rounded to bf16 first)
        let cases = [
            (REPACK_ROWS + 48, 192, Kind::BFloat16, vec![1, 2, 3, 4, 5, 16, 37]),
            (2048, 1536, Kind::BFloat16, vec![1, 4, 19]),
            (256, 1536, Kind::Half, vec![1, 2, 19]),
        ];
        for way in ways_here() {
            for (rows, cols, scale_kind, ms) in cases.clone() {
                let w = random_matrix_scaled_in(rows, cols, 2, scale_kind);
                let linear = alone("w", &w, way).unwrap();
                assert_eq!(linear.bytes(), rows * cols / 2 + rows * (cols / 32) * 2);
                for m in ms {
                    let x = Tensor::randn([m, cols], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                    check(&linear, &w, &x, &format!("[{rows} × {cols}], m={m}"));
                }
            }
            // identity activations: one product each, (q - 8) · scale rounded once to bf16, the dequantized weight
            let w = random_matrix(REPACK_ROWS + 48, 192, 3);
            let linear = alone("w", &w, way).unwrap();
            let y = linear.forward(&Tensor::eye(192, (Kind::BFloat16, Device::Cpu))).unwrap();
            assert!(y.tr().equal(&w.dequantize().unwrap()), "{way:?}");
            // and no rows at all
            let none = linear.forward(&Tensor::zeros([0, 192], (Kind::BFloat16, Device::Cpu))).unwrap();
            assert_eq!(none.size(), [0, REPACK_ROWS + 48]);
        }
    }

    #[test]
    fn a_rows_products_have_the_same_bits_in_a_pass_of_any_rows() {
        // the kernels take a prompt's rows 4, 8 or 32 at a time (the last pass fewer): each row's sums are the same
        // whichever rows share its pass — so a token's products do not depend on where a chunk cuts the prompt
        // (fma4 alone keeps more sums in flight in a pass of 1 or 2 rows, a decode step's: other bits; none here)
        tch::manual_seed(12);
        let w = random_matrix(2048, 1536, 12);
        // activations of many sizes, so that outputs cancel and a float32 sum's order shows in their bf16 bits
        let sizes = (Tensor::randn([19, 1536], (Kind::Float, Device::Cpu)) * 3.0).exp();
        let x = (Tensor::randn([19, 1536], (Kind::Float, Device::Cpu)) * sizes).to_kind(Kind::BFloat16);
        for way in ways_here() {
            let linear = alone("w", &w, way).unwrap();
            let all = linear.forward(&x).unwrap();
            for (start, rows) in [(0, 4), (3, 8), (5, 7), (11, 8), (1, 11)] {
                let some = linear.forward(&x.narrow(0, start, rows)).unwrap();
                assert!(some.equal(&all.narrow(0, start, rows)), "{way:?}: rows {start}..{}", start + rows);
            }
        }
    }

    #[test]
    fn edge_inputs_give_the_exact_product_too() {
        tch::manual_seed(7);
        for way in ways_here() {
            // every nibble 0 (q = -8) and every nibble 15 (q = 7), one block of 16 rows and an odd count of blocks
            for (value, rows) in [(0, 16), (15, 48)] {
                let nibbles = Tensor::full([rows, 96], value, (Kind::Int, Device::Cpu));
                let scale = (Tensor::rand([rows, 3], (Kind::Float, Device::Cpu)) * 0.01 + 1e-3).to_kind(Kind::BFloat16);
                let w = packed_of(&nibbles, scale);
                let linear = alone("w", &w, way).unwrap();
                for m in [1, 3, 9, 19] {
                    let x = Tensor::randn([m, 96], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                    let _ = check_within(&linear, &w, &x, &format!("nibbles all {value}, [{rows} × 96], m={m}"));
                }
            }
            // scales at f16's extremes (largest, smallest normal, a subnormal), and every group size the kernels
            // take: one group of 256, two of 128, and K = 96 (three groups of 32: no multiple of 64)
            for (cols, group) in [(96, 32), (256, 64), (256, 128), (256, 256)] {
                let nibbles = Tensor::randint(16, [32, cols], (Kind::Int, Device::Cpu));
                let extremes = Tensor::from_slice(&[65504f32, 6.103515625e-5, 5.9604645e-8, 1.0]);
                let picks = Tensor::randint(4, [32 * (cols / group)], (Kind::Int64, Device::Cpu));
                let scale = extremes.index_select(0, &picks).view([32, cols / group]).to_kind(Kind::Half);
                let w = packed_of(&nibbles, scale);
                let linear = alone("w", &w, way).unwrap();
                for m in [2, 20] {
                    let x = Tensor::randn([m, cols], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                    let what = format!("f16 scales at the extremes, [32 × {cols}], group {group}, m={m}");
                    let _ = check_within(&linear, &w, &x, &what);
                }
            }
            // activations far apart in one row (a tiny one beside large ones: fma4 divides it by up to 2^24), a row
            // of zeros, and a row of one large value; every output within reach (these have too few outputs for a
            // share of exactly rounded ones to mean anything: the random products above check that)
            let w = random_matrix(32, 64, 5);
            let linear = alone("w", &w, way).unwrap();
            let x = Tensor::randn([3, 64], (Kind::Float, Device::Cpu)) * 1e4;
            let _ = x.get(0).get(7).fill_(1e-30);
            let _ = x.get(1).fill_(0.0);
            let _ = x.get(2).fill_(0.0).get(63).fill_(1e30);
            // those 3 rows, and 7 times over (21 rows: AMX's tiles, where they run)
            for x in [x.to_kind(Kind::BFloat16), x.repeat([7, 1]).to_kind(Kind::BFloat16)] {
                let _ = check_within(&linear, &w, &x, "activations far apart, zeros, one large value");
                assert!(linear.forward(&x).unwrap().get(1).eq(0.0).all().int64_value(&[]) == 1, "{way:?}: zeros");
            }
        }
    }

    #[test]
    fn stacked_rows_give_the_bits_they_give_apart() {
        for way in ways_here() {
            // gate and up (two alike), or q, k and v (one taller than the other two)
            let (a, b, c) = (random_matrix(96, 192, 1), random_matrix(48, 192, 2), random_matrix(48, 192, 5));
            let mut arena = Arena::new();
            let matrices = [&a, &b, &c];
            let all = held("a, b and c", &matrices, Stacking::Rows, way, &mut arena).unwrap();
            let [a, b, c] = [("a", &a), ("b", &b), ("c", &c)].map(|(name, w)| alone(name, w, way).unwrap());
            assert_eq!(all.bytes(), a.bytes() + b.bytes() + c.bytes());
            for m in row_counts(way.kernel) {
                let x = Tensor::randn([m, 192], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                let apart = Tensor::cat(&[a.forward(&x).unwrap(), b.forward(&x).unwrap(), c.forward(&x).unwrap()], 1);
                let together = all.forward(&x).unwrap();
                if all.panels_for(&x).is_some() {
                    // torch's matmul of a wider panel may sum in another order (MKL's float32 one did, now and then)
                    assert!(within_a_step(&together, &apart, &x, &matrices), "{way:?}, m={m}, by panels");
                } else {
                    assert!(together.equal(&apart), "{way:?}, m={m}");
                }
            }
            // matrices that cannot be one are named: other widths, or none at all
            let narrow = random_matrix(16, 64, 3);
            let Err(Error::Invalid(msg)) =
                held("a and c", &[&random_matrix(16, 192, 4), &narrow], Stacking::Rows, way, &mut arena)
            else {
                panic!("{way:?}: 192 and 64 columns must be refused");
            };
            assert!(msg.starts_with("a and c: stacked matrices differ"), "{msg}");
            assert!(held("nothing", &[], Stacking::Rows, way, &mut arena).is_err());
        }
    }

    #[test]
    fn the_gelu_on_the_way_out_gives_the_bits_of_the_products_then_the_gelu() {
        for way in ways_here() {
            // rows in 64s, where ATen's gelu has no scalar tail (tanh.rs' `whole_steps`)
            for (rows, cols, scale_kind) in
                [(64, 192, Kind::BFloat16), (64, 64, Kind::Half), (128, 256, Kind::BFloat16)]
            {
                let gate = random_matrix_scaled_in(rows, cols, 6, scale_kind);
                let up = random_matrix_scaled_in(rows, cols, 7, scale_kind);
                let mut arena = Arena::new();
                let matrices = [&gate, &up];
                let paired = held("gate and up", &matrices, Stacking::Pairs, way, &mut arena).unwrap();
                let [gate, up] = [("gate", &gate), ("up", &up)].map(|(name, w)| alone(name, w, way).unwrap());
                assert_eq!(paired.bytes(), gate.bytes() + up.bytes());
                // activations large enough that the gelu's tanh saturates on some outputs
                for m in row_counts(way.kernel) {
                    for scale in [1.0, 40.0] {
                        let x = (Tensor::randn([m, cols], (Kind::Float, Device::Cpu)) * scale).to_kind(Kind::BFloat16);
                        let (mut g, mut u) = (gate.forward(&x).unwrap(), up.forward(&x).unwrap());
                        if let Some(panels) = paired.panels_for(&x) {
                            // by panels the pair is one matmul, which may sum in another order than each matrix's
                            // alone (MKL's float32 one did, now and then): its own products, each within a bf16 step
                            let both = paired.by_panels(&x, panels).unwrap().unflatten(1, [-1, 2, 16]);
                            let (pg, pu) = (both.select(2, 0).flatten(1, 2), both.select(2, 1).flatten(1, 2));
                            let [gate_w, up_w] = matrices.map(|w| [w]);
                            assert!(
                                within_a_step(&pg, &g, &x, &gate_w) && within_a_step(&pu, &u, &x, &up_w),
                                "{way:?}, m={m}"
                            );
                            (g, u) = (pg, pu);
                        }
                        let apart = g.gelu("tanh") * u; // ATen's ops
                        let together = paired.gelu_of_halves(&x).unwrap();
                        assert_eq!(together.size(), [m, rows]);
                        let bits = |t: &Tensor| t.view_dtype(Kind::Int16);
                        assert!(bits(&together).equal(&bits(&apart)), "{way:?}, [{rows} x {cols}], m={m}, x{scale}");
                    }
                }
                // a pair gives the gelu's product only; one of another height, or a lone matrix, is no pair
                let Err(Error::Invalid(msg)) = paired.forward(&Tensor::zeros([1, cols], (Kind::BFloat16, Device::Cpu)))
                else {
                    panic!("{way:?}: the products of a pair must be refused");
                };
                assert!(msg.contains("gelu_of_halves"), "{msg}");
                let short = random_matrix(rows + 16, cols, 8);
                let taller =
                    held("gate and taller", &[&random_matrix(rows, cols, 9), &short], Stacking::Pairs, way, &mut arena);
                assert!(matches!(taller, Err(Error::Invalid(msg)) if msg.contains("two matrices of one height")));
                assert!(gate.gelu_of_halves(&Tensor::zeros([1, cols], (Kind::BFloat16, Device::Cpu))).is_err());
                // one matrix's products times a given `up` (the per-layer input's), the same bits; a pair, or an up of
                // another shape, refused by name
                for m in row_counts(way.kernel) {
                    let x = (Tensor::randn([m, cols], (Kind::Float, Device::Cpu)) * 8.0).to_kind(Kind::BFloat16);
                    let other = Tensor::randn([m, rows], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                    let apart = gate.forward(&x).unwrap().gelu("tanh") * &other;
                    let bits = |t: &Tensor| t.view_dtype(Kind::Int16);
                    assert!(bits(&gate.gelu_times(&x, &other).unwrap()).equal(&bits(&apart)), "{way:?}, m={m}");
                }
                let x = Tensor::zeros([2, cols], (Kind::BFloat16, Device::Cpu));
                let Err(Error::Invalid(msg)) =
                    gate.gelu_times(&x, &Tensor::zeros([2, rows + 1], (Kind::BFloat16, Device::Cpu)))
                else {
                    panic!("{way:?}: an up of the wrong shape must be refused");
                };
                assert!(msg.contains("gelu_times") && msg.contains(&format!("[2, {rows}]")), "{msg}");
                assert!(paired.gelu_times(&x, &Tensor::zeros([2, rows], (Kind::BFloat16, Device::Cpu))).is_err());
            }
        }
    }

    #[test]
    fn panels_give_the_product_of_their_weights() {
        for (kernel, panels) in panels_here() {
            // a panel and a remainder of 48 rows (3 blocks: an odd count, the last unpacked alone); E2B's
            // down_proj's 6,144 columns (3 blocks of its rows; all 1,536 would be minutes under make test's emulated
            // CPUs) with a chunk a little over the fewest rows that go by panels; f16 scales (the emb4 twin's)
            let cases = [
                (panels.rows() + 48, 192, Kind::BFloat16, panels.min_rows()),
                (48, 6144, Kind::BFloat16, panels.min_rows() + 36),
                (256, 1536, Kind::Half, panels.min_rows() + 3),
            ];
            for (rows, cols, scale_kind, m) in cases {
                let w = random_matrix_scaled_in(rows, cols, 4, scale_kind);
                let linear = alone("w", &w, kernel).unwrap();
                // the weights as the panels hold them: (q - 8) · scale, exact in float64; bf16 panels' rounded once
                // to bf16 — with bf16 scales, step 03's (`dequantize`) — float32 panels' exact
                let q = w.nibbles(0, rows).unwrap().to_kind(Kind::Double) - 8.0;
                let scale = w.scale().to_kind(Kind::Double).repeat_interleave_self_int(cols / w.groups(), 1, None);
                let exact_weights = q * scale;
                let rounded = exact_weights.to_kind(Kind::BFloat16);
                if scale_kind == Kind::BFloat16 {
                    assert!(rounded.equal(&w.dequantize().unwrap()), "[{rows} × {cols}]");
                }
                let what = format!("{kernel:?} by {panels:?} panels, [{rows} × {cols}], {scale_kind:?} scales, m={m}");
                // identity activations give each weight rounded once to bf16, bit for bit: of a few columns every
                // column's, of more every 23rd (each nibble position and group reached: a product of a few hundred
                // MFLOP, where all would be seconds here and minutes under make test's emulated CPUs)
                let step = if cols > 192 { 23 } else { 1 };
                let picked = Tensor::arange_start_step(0, cols, step, (Kind::Int64, Device::Cpu));
                let eye = Tensor::eye(cols, (Kind::BFloat16, Device::Cpu)).index_select(0, &picked);
                let weights = linear.by_panels(&eye, panels).unwrap();
                assert!(weights.tr().equal(&rounded.index_select(1, &picked)), "{what}: the weights");
                // and a product is the exact one of those weights, rounded once, give or take float32's sums
                let weights = match panels {
                    Panels::Bf16 => rounded.to_kind(Kind::Double),
                    Panels::Float => exact_weights,
                };
                let x = Tensor::randn([m, cols], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
                let y = linear.by_panels(&x, panels).unwrap();
                if linear.panels == Some(panels) {
                    assert!(linear.forward(&x).unwrap().equal(&y), "{what}: forward takes them");
                }
                let (y, x) = (y.to_kind(Kind::Double), x.to_kind(Kind::Double));
                let exact = x.matmul(&weights.tr());
                let step = exact.abs().clamp_min(1e-300).log2().floor().exp2() / 128.0;
                let reach = x.abs().matmul(&weights.abs().tr()) / 262144.0 + &step; // 2^-18 of Σ|x · w|
                let err = (&y - &exact).abs();
                assert!(err.le_tensor(&reach).all().int64_value(&[]) == 1, "{what}: an output out of reach");
                let missed = err.gt_tensor(&(step * (0.5 + 1e-6))).sum(Kind::Int64).int64_value(&[]);
                assert!(missed * 100 <= err.numel() as i64, "{what}: {missed} of {} not exactly rounded", err.numel());
            }
        }
    }

    #[test]
    fn the_two_kernels_agree() {
        if !(Kernel::Dot4.runs() && Kernel::Fma4.runs()) {
            eprintln!("skipped: dot4 does not run here");
            return;
        }
        // both round their float32 sums once; their sums are added in other orders, so now and then an output is
        // a bf16 step apart, never more than the exactness bound allows either of them; at 19 rows dot4's go by AMX's
        // tiles where they run, in the tile's order
        let w = random_matrix(2048, 1536, 11);
        for m in [3, 19] {
            let x = Tensor::randn([m, 1536], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
            let dot4 = alone("w", &w, Kernel::Dot4).unwrap().forward(&x).unwrap();
            let fma4 = alone("w", &w, Kernel::Fma4).unwrap().forward(&x).unwrap();
            let same = dot4.eq_tensor(&fma4).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
            assert!(same > 0.95, "m={m}: only {same} of the outputs are the same bits");
        }
    }

    /// fma4 held in each form: converted, and read as subnormals.
    fn fma4_forms(w: &Packed) -> [OwnLinear; 2] {
        [torchtpu_fma4_mm as Multiply, torchtpu_fma4_subnormal_mm]
            .map(|multiply| alone("w", w, Way { kernel: Kernel::Fma4, multiply, prompt: None }).unwrap())
    }

    #[test]
    fn fma4s_two_forms_give_the_same_bits() {
        if !Kernel::Fma4.runs() {
            eprintln!("skipped: fma4 does not run here");
            return;
        }
        // the same products scaled by another power of two, so the same sums: every row count of a pass, a short
        // prompt's, activations of many sizes (a float32 sum's order shows in bf16 bits where outputs cancel), bf16
        // and f16 scales, and the gelu of a pair on the way out
        tch::manual_seed(13);
        for scale_kind in [Kind::BFloat16, Kind::Half] {
            let w = random_matrix_scaled_in(2048, 1536, 13, scale_kind);
            let [converted, subnormal] = fma4_forms(&w);
            for m in [1, 2, 3, 4, 5, 19] {
                let sizes = (Tensor::randn([m, 1536], (Kind::Float, Device::Cpu)) * 3.0).exp();
                let x = (Tensor::randn([m, 1536], (Kind::Float, Device::Cpu)) * sizes).to_kind(Kind::BFloat16);
                let (a, b) = (converted.forward(&x).unwrap(), subnormal.forward(&x).unwrap());
                assert!(a.view_dtype(Kind::Int16).equal(&b.view_dtype(Kind::Int16)), "{scale_kind:?}, m={m}");
            }
        }
        let (gate, up) = (random_matrix(64, 192, 6), random_matrix(64, 192, 7));
        let [converted, subnormal] = [torchtpu_fma4_mm as Multiply, torchtpu_fma4_subnormal_mm].map(|multiply| {
            let way = Way { kernel: Kernel::Fma4, multiply, prompt: None };
            held("gate and up", &[&gate, &up], Stacking::Pairs, way, &mut Arena::new()).unwrap()
        });
        let x = (Tensor::randn([3, 192], (Kind::Float, Device::Cpu)) * 8.0).to_kind(Kind::BFloat16);
        let bits = |t: Tensor| t.view_dtype(Kind::Int16);
        assert!(bits(converted.gelu_of_halves(&x).unwrap()).equal(&bits(subnormal.gelu_of_halves(&x).unwrap())));
    }

    #[test]
    #[allow(deprecated)] // _mm_getcsr and _mm_setcsr: the flags themselves are what this test sets
    fn fma4s_subnormal_form_reads_its_nibbles_with_denormals_are_zero_set() {
        use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
        if !Kernel::Fma4.runs() {
            eprintln!("skipped: fma4 does not run here");
            return;
        }
        // what torch.set_flush_denormal(True) sets on the thread that calls it (MXCSR's denormals-are-zero and
        // flush-to-zero): this thread computes the first blocks of the product, which would read every nibble as 0
        let w = random_matrix(64, 192, 8);
        let [converted, subnormal] = fma4_forms(&w);
        let x = Tensor::randn([1, 192], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
        let want = converted.forward(&x).unwrap();
        // SAFETY: sets this thread's floating-point flags, and restores them below
        let saved = unsafe { _mm_getcsr() };
        unsafe { _mm_setcsr(saved | 1 << 6 | 1 << 15) };
        let got = subnormal.forward(&x);
        let after = unsafe { _mm_getcsr() };
        unsafe { _mm_setcsr(saved) };
        assert_eq!(after, saved | 1 << 6 | 1 << 15, "the kernel restores the thread's flags");
        assert!(got.unwrap().equal(&want));
    }

    #[test]
    fn what_the_kernel_cannot_take_is_named() {
        for kernel in [Kernel::Dot4, Kernel::Fma4] {
            let error = alone("model.layers.0.mlp.up_proj", &random_matrix(40, 64, 0), kernel);
            let Err(Error::Unsupported(msg)) = error else { panic!("a 40-row matrix must be refused") };
            assert!(msg.starts_with("model.layers.0.mlp.up_proj: 40 rows"), "{msg}");
            if !kernel.runs() {
                let Err(Error::Unsupported(msg)) = alone("w", &random_matrix(32, 64, 0), kernel) else {
                    panic!("{kernel:?} must refuse a CPU it does not run on");
                };
                assert!(msg.contains(kernel.needs()), "{msg}");
                continue;
            }
            let linear = alone("w", &random_matrix(32, 64, 0), kernel).unwrap();
            for x in [
                Tensor::ones([1, 64], (Kind::Float, Device::Cpu)),
                Tensor::ones([1, 1, 64], (Kind::BFloat16, Device::Cpu)),
                Tensor::ones([1, 32], (Kind::BFloat16, Device::Cpu)),
            ] {
                let Err(Error::Invalid(msg)) = linear.forward(&x) else { panic!("{:?} must be refused", x.size()) };
                assert!(msg.starts_with(&format!("{}: activations", kernel.symbol())), "{msg}");
            }
        }
    }
}
