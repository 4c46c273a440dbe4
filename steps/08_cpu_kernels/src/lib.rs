//! `torchtpu_kernels._engine`: step 03's Gemma 4 engine as a Python class, with its linears kept 4-bit for an int4
//! kernel — this step's own on a CPU with AVX512-BF16 (dot4) or with AVX2, FMA and F16C (fma4), else ATen's
//! (`weights="int4"`) — or dequantized at load as in step 03 (`weights="bf16"`).
//!
//! Every failure reaches Python as an exception that names the file, tensor, argument or value — never as a
//! Rust panic (PyO3's `PanicException` is a `BaseException` that `except Exception` does not catch).
mod attend;
mod bridge;
mod budget;
mod config;
mod cpu;
mod dot4;
mod error;
mod gemma;
mod int4;
mod linear;
mod norm;
mod onednn;
mod packed;
mod pages;
mod sampling;
mod tanh;
mod weights;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;

use pyo3::exceptions::{
    PyFileNotFoundError, PyMemoryError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PySet, PyTuple};
use tch::{Kind, Tensor};

use attend::DecodeAttention;
use bridge::{give, take, torch_error};
use config::{Config, TextConfig};
use dot4::Kernel;
use error::Error;
use gemma::{Cache, DecodeSlots, Gemma, Generation, Wanted};
use linear::{Int4Matmul, Weights};
use sampling::{Rng, Sampling};
use weights::Checkpoint;

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::NotFound { .. } => PyFileNotFoundError::new_err(e.to_string()),
            Error::Invalid(msg) => PyValueError::new_err(msg),
            Error::Unsupported(msg) => PyNotImplementedError::new_err(msg),
            Error::OutOfMemory(msg) => PyMemoryError::new_err(msg),
            Error::Torch(t) => torch_error(t),
            Error::Python(e) => e,
        }
    }
}

struct State {
    model: Gemma,
    cache: Cache,
    /// Counts the calls that reuse the cache, so that a token stream knows when another call has taken it.
    epoch: u64,
    /// Where the last `prefill` left the cache, for `tokens` to continue from.
    prefilled: Option<Prefilled>,
    /// Why the linears are held the way they are (what `weights="auto"` found, or what was asked for).
    weights_reason: String,
}

/// A prompt read into the cache by `prefill`, not yet continued.
struct Prefilled {
    logits: Tensor,
    len: i64,
}

/// Ctrl-C between prompt chunks and decode steps: the GIL taken back for a moment, Python's signal handlers
/// run, and a `KeyboardInterrupt` (or whatever a handler raises) ends the call.
fn check_signals() -> error::Result<()> {
    Python::attach(|py| py.check_signals()).map_err(Error::Python)
}

fn decode_slots_arg(decode_slots: Option<&str>, like: &Bound<'_, PyAny>) -> PyResult<DecodeSlots> {
    match decode_slots {
        Some("bucket") => Ok(DecodeSlots::Bucket),
        Some("all") => Ok(DecodeSlots::All),
        Some(other) => Err(PyValueError::new_err(format!("decode_slots={other:?}: use \"bucket\", \"all\" or None"))),
        // the default: one compiled program at every position on a TPU; elsewhere no work on empty slots
        None => {
            let device: String = like.getattr("device")?.getattr("type")?.extract()?;
            Ok(if device == "tpu" { DecodeSlots::All } else { DecodeSlots::Bucket })
        }
    }
}

/// The dtype attention computes in: the argument, or by default the compute dtype — except bfloat16 on a CPU
/// where torch's bf16 matmul has no fast path (`cpu::fast_bf16_matmul`), where float32 attention is several times
/// faster.
fn attention_dtype_arg(arg: Option<&str>, dtype: Kind, like: &Bound<'_, PyAny>) -> PyResult<Kind> {
    match arg {
        Some(name) => compute_dtype(name).map_err(|_| {
            PyValueError::new_err(format!("attention_dtype={name:?}: use \"bfloat16\", \"float32\" or None"))
        }),
        None if dtype == Kind::Float => Ok(Kind::Float),
        None => {
            let device: String = like.getattr("device")?.getattr("type")?.extract()?;
            Ok(if device == "cpu" && !cpu::fast_bf16_matmul(like.py())? { Kind::Float } else { Kind::BFloat16 })
        }
    }
}

/// The dtype the caches hold keys and values in: the argument, or by default bf16 where the model computes in bf16
/// and the own decode attention, which widens a bf16 cache's values as it loads them, runs (its keys and values are
/// bf16 values: held exactly, in half the bytes); else the attention dtype, which ATen's ops take. A float32 model's
/// keys and values are not bf16 values: bf16 caches would round them, so that is refused.
fn kv_dtype_arg(
    arg: Option<&str>,
    dtype: Kind,
    attention_dtype: Kind,
    decode_attention: DecodeAttention,
) -> PyResult<Kind> {
    match arg {
        Some("bfloat16") if dtype == Kind::Float => Err(PyValueError::new_err(
            "kv_dtype=\"bfloat16\" with dtype=\"float32\": bf16 caches would round the float32 keys and values; use \
             \"float32\" or None",
        )),
        Some(name) => compute_dtype(name)
            .map_err(|_| PyValueError::new_err(format!("kv_dtype={name:?}: use \"bfloat16\", \"float32\" or None"))),
        None if dtype == Kind::BFloat16 && decode_attention == DecodeAttention::Own => Ok(Kind::BFloat16),
        None => Ok(attention_dtype),
    }
}

/// How the Python side names a dtype the engine holds: "float32" or "bfloat16".
fn dtype_name(kind: Kind) -> &'static str {
    if kind == Kind::Float {
        "float32"
    } else {
        "bfloat16"
    }
}

/// Whether a decode step's dense one-row linears run on ATen's mat-vec: the argument, or by default oneDNN's where
/// `cpu::onednn_matvec_faster` says (as step 03), ATen's elsewhere.
fn matvec_in_aten_arg(arg: Option<&str>, like: &Bound<'_, PyAny>) -> PyResult<bool> {
    match arg {
        Some("aten") => Ok(true),
        Some("onednn") => Ok(false),
        Some(other) => Err(PyValueError::new_err(format!("matvec={other:?}: use \"aten\", \"onednn\" or None"))),
        None => {
            let device: String = like.getattr("device")?.getattr("type")?.extract()?;
            Ok(!(device == "cpu" && cpu::onednn_matvec_faster(like.py())?))
        }
    }
}

/// Engine(model_dir, emb4_dir, like, ctx, dtype="bfloat16", progress=None, decode_slots=None, attention_dtype=None,
///        weights="auto", int4_matmul="auto", matvec=None, decode_attention="auto", kv_dtype=None)
///
/// Gemma 4 (E-series) text model in Rust, on the device of `like`, with its 4-bit linears kept 4-bit.
///
/// model_dir: a -text checkpoint folder (config.json + safetensors, one file or sharded).
/// emb4_dir: None, or the -text-emb4 twin: every table it holds packed is taken from it and kept packed.
/// like: any tensor on the target device (tpu, cuda or cpu); only its device matters.
/// ctx: context length, i.e. the length of the full-attention caches.
/// dtype: "bfloat16" or "float32", the precision of the arithmetic.
/// progress: None, or a callable(done, total) called while layers load.
/// decode_slots: what a decode step's full-attention layers attend over: "bucket" (the slots up to its position,
///     rounded up to 64 × 2^k as a prompt chunk's, or chunk × 2^k for a chunk under 64: a few shapes, no work on
///     empty slots), "all" (all ctx slots: one shape, one compiled program at every position), or None: "all" on a
///     TPU, else "bucket".
///     Both give the same tokens and logits, bit for bit (without AVX-512, where MKL's float32 product sums a row of
///     more slots in another order, the logits a float32 rounding apart).
/// attention_dtype: "bfloat16", "float32", or None: the compute dtype, except float32 for bfloat16 on a CPU
///     whose bf16 matmul has no fast path (AVX2-only: `torch.ops.mkldnn._is_mkldnn_bf16_supported()` is False).
///     "bfloat16" keeps Transformers' bf16 bits; "float32" rounds less.
/// weights: "int4" (linears and a packed head kept 4-bit, multiplied by an int4 kernel; NotImplementedError where
///     aten::_weight_int4pack_mm_for_cpu does not run), "bf16" (dequantized at load, as step 03 does), or "auto"
///     (int4 on a device where the kernel runs and dtype="bfloat16", else bf16). `engine.weights` says which was
///     taken and `engine.weights_reason` why.
/// int4_matmul: the int4 kernel: "dot4" (this step's torchtpu_dot4_mm: a CPU with AVX512-BF16), "fma4" (this step's
///     torchtpu_fma4_mm: a CPU with AVX2, FMA and F16C), both bfloat16 activations on the CPU and NotImplementedError
///     elsewhere; "aten" (aten::_weight_int4pack_mm_for_cpu: any CPU), or "auto" (dot4 where it runs, else fma4,
///     else aten; under ATEN_CPU_CAPABILITY=avx2, as on an AVX2-only CPU, fma4). All compute the same W4A16
///     products, their float32 sums in other orders.
/// matvec: the kernel for a decode step's dense linears (one row each) on a CPU: "aten" (ATen's mat-vec, with
///     oneDNN switched off for the call), "onednn" (what Transformers' decode runs: its bits exactly; ATen's differ
///     in an occasional last bf16 bit, its sums being added in another order), or None: "onednn" on an Intel CPU
///     whose bf16 matmul has a fast path, else "aten" (as step 03: the one that streams a matrix faster there). It
///     does not touch the int4 kernels.
/// decode_attention: what runs the attention of a one-token pass (a decode step; a prompt's last chunk of one token)
///     over the cache: "own" (this step's torchtpu_attend_one: one call per layer instead of ATen's seven ops, whose
///     set-up on a CPU costs more than the cache's bytes; a CPU with AVX2 and FMA, bfloat16, NotImplementedError
///     elsewhere), "aten" (ATen's ops, as step 03), or "auto": own where the linears run on dot4 or fma4, else aten.
///     Own computes ATen's roundings, its float32 sums in other orders. Longer prompt chunks run ATen's.
/// kv_dtype: the dtype the caches hold keys and values in: "bfloat16", "float32", or None: bfloat16 where dtype is
///     and decode_attention is own (whose call widens them as it reads them), else the attention dtype. The keys and
///     values of a bfloat16 model are bf16 values, so either holds them exactly and gives the same bits; bfloat16
///     reads half the bytes of float32. With dtype="float32", "bfloat16" is refused: it would round them.
///
/// An Engine belongs to the thread that created it: calls from any other raise RuntimeError.
#[pyclass(module = "torchtpu_kernels")]
struct Engine {
    owner: ThreadId,
    state: Mutex<State>,
}

fn compute_dtype(dtype: &str) -> PyResult<Kind> {
    match dtype {
        "bfloat16" => Ok(Kind::BFloat16),
        "float32" => Ok(Kind::Float),
        _ => Err(PyValueError::new_err(format!("dtype={dtype:?}: use \"bfloat16\" or \"float32\""))),
    }
}

fn check_ctx(ctx: i64, cfg: &TextConfig) -> PyResult<()> {
    let most = cfg.max_position_embeddings;
    if ctx < 1 || ctx > most {
        return Err(PyValueError::new_err(format!("ctx={ctx}: must be between 1 and max_position_embeddings={most}")));
    }
    Ok(())
}

// --8<-- [start:choose]
/// What `int4_matmul=` means on like's device in `dtype`: the kernel for the matrices kept 4-bit. "auto" takes the
/// first of this step's kernels that runs here (dot4, then fma4: cpu.rs decides, honouring the AVX2 limit), else
/// ATen's.
fn choose_matmul(int4_matmul: &str, dtype: Kind, like: &Tensor) -> PyResult<Int4Matmul> {
    let why_not = |kernel: Kernel| {
        if !kernel.runs() {
            Some(format!("needs {}; this process has none", kernel.needs()))
        } else if like.device() != tch::Device::Cpu {
            Some("runs on the CPU only".to_string())
        } else if dtype != Kind::BFloat16 {
            Some("takes bfloat16 activations only".to_string())
        } else {
            None
        }
    };
    let own = |matmul: Int4Matmul, kernel: Kernel| match why_not(kernel) {
        None => Ok(matmul),
        Some(why) => Err(PyNotImplementedError::new_err(format!(
            "int4_matmul=\"{}\": {} {why}; use \"aten\" or \"auto\"",
            matmul.name(),
            kernel.symbol()
        ))),
    };
    match int4_matmul {
        "aten" => Ok(Int4Matmul::Aten),
        "dot4" => own(Int4Matmul::Dot4, Kernel::Dot4),
        "fma4" => own(Int4Matmul::Fma4, Kernel::Fma4),
        "auto" if why_not(Kernel::Dot4).is_none() => Ok(Int4Matmul::Dot4),
        "auto" if why_not(Kernel::Fma4).is_none() => Ok(Int4Matmul::Fma4),
        "auto" => Ok(Int4Matmul::Aten),
        other => {
            Err(PyValueError::new_err(format!("int4_matmul={other:?}: use \"dot4\", \"fma4\", \"aten\" or \"auto\"")))
        }
    }
}

/// What `decode_attention=` means for a model held as `model` is: "auto" takes this step's own kernel where the
/// linears run on one of this step's int4 kernels (so on a CPU with AVX2 and FMA: cpu.rs), else ATen's ops — and so
/// `weights="bf16"` stays step 03's engine, bit for bit.
fn choose_decode_attention(arg: &str, model: &Gemma, like: &Tensor) -> PyResult<DecodeAttention> {
    let own = || DecodeAttention::own(like.device(), model.dtype);
    match arg {
        "aten" => Ok(DecodeAttention::Aten),
        "own" => Ok(own()?),
        "auto" if model.weights == Weights::Int4 && model.matmul.own().is_some() => {
            Ok(own().unwrap_or(DecodeAttention::Aten))
        }
        "auto" => Ok(DecodeAttention::Aten),
        other => Err(PyValueError::new_err(format!("decode_attention={other:?}: use \"own\", \"aten\" or \"auto\""))),
    }
}

/// What `weights=` means on like's device: (how to hold the linears, whether a matrix the kernel refuses may stay
/// dense instead, why). Whether int4 runs at all is ATen's kernel's probe: `matmul` only names the kernel taken.
fn choose_weights(weights: &str, matmul: Int4Matmul, dtype: Kind, like: &Tensor) -> PyResult<(Weights, bool, String)> {
    let (aten, kernel) = (int4::KERNEL, matmul.described());
    match weights {
        "bf16" => Ok((Weights::Bf16, false, "weights=\"bf16\": dequantized at load, as in step 03".into())),
        "int4" => match int4::probe(like) {
            Ok(()) if dtype == Kind::Float => Ok((
                Weights::Int4,
                false,
                format!("weights=\"int4\" with float32 activations: {aten}'s scalar path (slow on x86; exact scales)"),
            )),
            Ok(()) => Ok((Weights::Int4, false, format!("weights=\"int4\": {kernel}"))),
            Err(why) => Err(PyNotImplementedError::new_err(format!(
                "weights=\"int4\": {why}. Only CPU kernels are implemented (CUDA's aten::_weight_int4pack_mm \
                 takes another layout; TorchTPU has no int4 kernel known); use weights=\"bf16\" or \"auto\""
            ))),
        },
        "auto" => Ok(match int4::probe(like) {
            Ok(()) if dtype == Kind::BFloat16 => {
                (Weights::Int4, true, format!("auto: int4 runs on this device, multiplied by {kernel}"))
            }
            Ok(()) => (
                Weights::Bf16,
                false,
                format!(
                    "auto: float32 activations would take {aten}'s scalar path, slower than the dense float32 \
                 product; weights=\"int4\" forces it"
                ),
            ),
            Err(why) => (Weights::Bf16, false, format!("auto: {why}")),
        }),
        _ => Err(PyValueError::new_err(format!("weights={weights:?}: use \"int4\", \"bf16\" or \"auto\""))),
    }
}
// --8<-- [end:choose]

/// int4_kernel(like) -> (bool, str)
///
/// Whether aten::_weight_int4pack_mm_for_cpu runs on like's device (tried on a small matrix), and why not.
#[pyfunction]
fn int4_kernel(like: &Bound<'_, PyAny>) -> PyResult<(bool, String)> {
    let like = take(like, "int4_kernel(like)")?;
    Ok(match int4::probe(&like) {
        Ok(()) => (true, format!("{} runs on this device", int4::KERNEL)),
        Err(why) => (false, why),
    })
}

/// dot4_runs() -> bool
///
/// Whether torchtpu_dot4_mm, this step's int4 kernel for AVX512-BF16, runs in this process: the CPU has AVX-512 F
/// and BW and AVX512-BF16, ATen may use AVX-512 (not under ATEN_CPU_CAPABILITY=avx2) and oneDNN AVX512-BF16 (not
/// under ONEDNN_MAX_CPU_ISA=AVX512_CORE, which stands in for a CPU with AVX-512 and no AVX512-BF16).
#[pyfunction]
fn dot4_runs() -> bool {
    Kernel::Dot4.runs()
}

/// amx4_runs() -> bool
///
/// Whether dot4's products of 4 to 127 activation rows (a short prompt's, never a decode step's) go by AMX's tiles
/// in this process (torchtpu_amx4_mm: dot4's words made into the tile's operand, dot4's arithmetic). The CPU has AMX
/// and AVX512-BF16, Linux lets the process use AMX's tiles, ATen may use AVX-512 and oneDNN AMX (not under
/// ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16).
#[pyfunction]
fn amx4_runs() -> bool {
    cpu::amx4_runs()
}

/// fma16_runs() -> bool
///
/// Whether this step's products of a short prompt's rows (4 to 127) go by fma4's arithmetic in AVX-512's 16 lanes
/// here (torchtpu_fma16_mm) where AMX's tiles do not take dot4's (amx4_runs() goes first): AVX-512 F and BW, ATen
/// allowed AVX-512, and an Intel CPU — where a 512-bit FMA issues twice a cycle and vdpbf16ps once every two, and
/// where a Xeon without AVX512-BF16 (Skylake to Ice Lake) runs fma4 in 8 lanes.
#[pyfunction]
fn fma16_runs() -> bool {
    cpu::fma16_runs()
}

/// fma_limit(rounds=20_000_000, tries=3) -> float
///
/// The arithmetic limit of a prompt read on fma4's CPUs, in float32 GFLOP/s (two a multiply-add): AVX2's 8-lane
/// FMAs on all of torch's threads at once, `rounds` rounds of 12 independent FMAs on each, best of `tries`. fma4
/// and MKL's AVX2 product do their multiply-adds with this instruction, so no product of theirs goes faster.
/// Raises RuntimeError where fma4 does not run (fma4_runs()), ValueError for rounds or tries below 1.
#[pyfunction]
#[pyo3(signature = (rounds = 20_000_000, tries = 3))]
fn fma_limit(py: Python<'_>, rounds: i64, tries: i32) -> PyResult<f64> {
    if rounds < 1 || tries < 1 {
        return Err(PyValueError::new_err(format!("fma_limit(rounds={rounds}, tries={tries}): need both >= 1")));
    }
    py.detach(|| budget::fma_limit(rounds, tries))
        .ok_or_else(|| PyRuntimeError::new_err(format!("fma_limit: needs {}", Kernel::Fma4.needs())))
}

/// panels_run() -> bool
///
/// Whether dot4's prompt chunks (128 activation rows or more) go by panels in this process: unpacked to bf16 a
/// panel of rows at a time and multiplied by torch's bf16 matmul, which oneDNN runs on AMX. The CPU has AMX and
/// AVX512-BF16, ATen may use AVX-512 and oneDNN AMX (not under ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16). Where they do
/// not run, an Intel CPU's dot4 takes chunks of 128 rows or more by float32 panels (Engine.weights_reason says so).
#[pyfunction]
fn panels_run() -> bool {
    cpu::panels_run()
}

/// dot4_float_panels_run() -> bool
///
/// Whether dot4's prompt chunks (128 activation rows or more) go by float32 panels in this process, as fma4's do:
/// unpacked to exact float32 weights and multiplied by torch's float32 matmul. dot4 runs, its bf16 panels do not
/// (panels_run()), and the CPU is an Intel one, whose two 512-bit FMA units make MKL's float32 product the faster.
#[pyfunction]
fn dot4_float_panels_run() -> bool {
    cpu::dot4_float_panels_run()
}

/// fma4_runs() -> bool
///
/// Whether torchtpu_fma4_mm, this step's int4 kernel for AVX2, runs in this process: the CPU has AVX2, FMA and
/// F16C, and ATen may use AVX2.
#[pyfunction]
fn fma4_runs() -> bool {
    Kernel::Fma4.runs()
}

/// fma4_subnormals() -> bool
///
/// Whether fma4 reads its nibbles as float32 subnormals here (torchtpu_fma4_subnormal_mm) rather than converting
/// them: on an AMD CPU, where the convert instruction set a decode step's pace. Both forms give the same bits.
#[pyfunction]
fn fma4_subnormals() -> bool {
    cpu::fma4_subnormals()
}

/// The packed matrix a Python caller hands over, checked as a checkpoint's would be.
fn packed_from(packed: &Bound<'_, PyAny>, scale: &Bound<'_, PyAny>, cols: i64) -> PyResult<packed::Packed> {
    let (packed, scale) = (take(packed, "weight_packed")?, take(scale, "weight_scale")?);
    if cols < 1 {
        return Err(PyValueError::new_err(format!("cols={cols}: need 1 <= cols")));
    }
    let (rows, words) = (packed.size().first().copied().unwrap_or(0), (cols - 1) / 8 + 1); // ceil(cols / 8)
    if packed.kind() != Kind::Int || packed.size() != [rows, words] {
        return Err(PyValueError::new_err(format!(
            "weight_packed: {:?} {:?}, need int32 [rows, ceil(cols / 8)] = [{rows}, {words}]",
            packed.kind(),
            packed.size(),
        )));
    }
    let groups = scale.size().get(1).copied().unwrap_or(0);
    let ok_kind = matches!(scale.kind(), Kind::BFloat16 | Kind::Half);
    if !ok_kind || scale.dim() != 2 || scale.size()[0] != rows || groups == 0 || cols % groups != 0 {
        return Err(PyValueError::new_err(format!(
            "weight_scale: {:?} {:?}, need bf16 or f16 [{rows}, groups] with groups dividing cols = {cols}",
            scale.kind(),
            scale.size()
        )));
    }
    Ok(packed::Packed::new(packed.to_device(tch::Device::Cpu), scale.to_device(tch::Device::Cpu), cols)?)
}

/// repack(weight_packed, weight_scale, cols, dtype="bfloat16") -> (packed, scale_zeros)
///
/// A checkpoint's packed matrix (int32 words of 8 nibbles q + 8, low first; scales [rows, cols / group]) in the
/// int4 kernel's layout, as the Engine makes it: uint8 [rows, cols / 2] and [cols / group, rows, 2] (scale, 0) in
/// `dtype`, the activation dtype. NotImplementedError for a shape or group size the kernel does not take.
#[pyfunction]
#[pyo3(signature = (weight_packed, weight_scale, cols, dtype = "bfloat16"))]
fn repack<'py>(
    py: Python<'py>,
    weight_packed: &Bound<'py, PyAny>,
    weight_scale: &Bound<'py, PyAny>,
    cols: i64,
    dtype: &str,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let w = packed_from(weight_packed, weight_scale, cols)?;
    let cpu = Tensor::f_empty([0], (Kind::Float, tch::Device::Cpu)).map_err(torch_error)?;
    let linear = int4::Int4Linear::new("weight_packed", &w, compute_dtype(dtype)?, &cpu)?;
    let (packed, scale_zeros) = linear.parts();
    Ok((give(py, packed)?, give(py, scale_zeros)?))
}

/// Int4Linear(weight_packed, weight_scale, cols, dtype="bfloat16", matmul="aten")
///
/// A checkpoint's packed matrix (as `repack` takes it) kept 4-bit as the Engine keeps its linears: repacked once
/// for `matmul`'s kernel ("aten", "dot4", "fma4" or "auto", as the Engine's int4_matmul), for activations in `dtype`
/// ("dot4", "fma4": bfloat16 only). Calling it on x [tokens, cols] gives x · Wᵀ in that dtype. `nbytes`: what one product reads.
#[pyclass(name = "Int4Linear", module = "torchtpu_kernels")]
struct PyInt4Linear {
    linear: Mutex<linear::Linear>,
    cols: i64,
    dtype: Kind,
}

#[pymethods]
impl PyInt4Linear {
    #[new]
    #[pyo3(signature = (weight_packed, weight_scale, cols, dtype = "bfloat16", matmul = "aten"))]
    fn new(
        weight_packed: &Bound<'_, PyAny>,
        weight_scale: &Bound<'_, PyAny>,
        cols: i64,
        dtype: &str,
        matmul: &str,
    ) -> PyResult<Self> {
        let w = packed_from(weight_packed, weight_scale, cols)?;
        let dtype = compute_dtype(dtype)?;
        let cpu = Tensor::f_empty([0], (Kind::Float, tch::Device::Cpu)).map_err(torch_error)?;
        let matmul = choose_matmul(matmul, dtype, &cpu)?;
        let linear = linear::Held::new(Weights::Int4, matmul, dtype, false).int4("weight_packed", &w, &cpu)?;
        Ok(PyInt4Linear { linear: Mutex::new(linear), cols, dtype })
    }

    fn __call__<'py>(&self, py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let x = take(x, "x")?;
        if x.kind() != self.dtype {
            return Err(PyTypeError::new_err(format!(
                "x: {:?}, need {:?} (the dtype this matrix was made for)",
                x.kind(),
                self.dtype
            )));
        }
        if x.dim() != 2 || x.size()[1] != self.cols {
            return Err(PyValueError::new_err(format!("x: shape {:?}, need [tokens, {}]", x.size(), self.cols)));
        }
        give(py, &self.held()?.forward(&x)?)
    }

    /// Bytes one product reads: nibbles and scales (and ATen's zero points) as held.
    #[getter]
    fn nbytes(&self) -> PyResult<i64> {
        Ok(self.held()?.bytes())
    }

    /// Which kernel it was made for: "dot4", "fma4" or "aten".
    #[getter]
    fn matmul(&self) -> PyResult<&'static str> {
        Ok(match &*self.held()? {
            linear::Linear::Own(w) if w.kernel() == Kernel::Dot4 => "dot4",
            linear::Linear::Own(_) => "fma4",
            _ => "aten",
        })
    }
}

impl PyInt4Linear {
    fn held(&self) -> PyResult<MutexGuard<'_, linear::Linear>> {
        self.linear.lock().map_err(|_| PyRuntimeError::new_err("Int4Linear: an earlier call panicked"))
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (model_dir, emb4_dir, like, ctx, dtype = "bfloat16", progress = None, decode_slots = None,
                        attention_dtype = None, weights = "auto", int4_matmul = "auto", matvec = None,
                        decode_attention = "auto", kv_dtype = None))]
    #[allow(clippy::too_many_arguments)] // the Python signature: keyword arguments with defaults
    fn new(
        model_dir: PathBuf,
        emb4_dir: Option<PathBuf>,
        like: &Bound<'_, PyAny>,
        ctx: i64,
        dtype: &str,
        progress: Option<Bound<'_, PyAny>>,
        decode_slots: Option<&str>,
        attention_dtype: Option<&str>,
        weights: &str,
        int4_matmul: &str,
        matvec: Option<&str>,
        decode_attention: &str,
        kv_dtype: Option<&str>,
    ) -> PyResult<Self> {
        let dtype = compute_dtype(dtype)?;
        let like_tensor = take(like, "Engine(like)")?;
        let decode_slots = decode_slots_arg(decode_slots, like)?;
        let attention_dtype = attention_dtype_arg(attention_dtype, dtype, like)?;
        let matvec_in_aten = matvec_in_aten_arg(matvec, like)?;
        let like = like_tensor;
        let matmul = choose_matmul(int4_matmul, dtype, &like)?;
        let (weights, fallback, weights_reason) = choose_weights(weights, matmul, dtype, &like)?;
        let checkpoint = Checkpoint::open(&model_dir)?;
        check_ctx(ctx, &checkpoint.config.text)?;
        let twin = emb4_dir.as_deref().map(Checkpoint::open).transpose()?;
        let mut report_error = None;
        let mut report = |done: usize, total: usize| {
            if let (Some(callback), None) = (&progress, &report_error) {
                report_error = callback.call1((done, total)).err();
            }
        };
        let held = linear::Held::new(weights, matmul, dtype, fallback);
        let mut model = Gemma::load(&checkpoint, twin.as_ref(), &like, held, &mut report)?;
        model.matvec_in_aten = matvec_in_aten;
        if let Some(e) = report_error {
            return Err(e);
        }
        let weights_reason = match model.kept_dense.len() {
            0 => weights_reason,
            n => format!(
                "{weights_reason}; {n} packed matrices the kernel cannot take held bf16: {:?}",
                model.kept_dense
            ),
        };
        let decode_attention = choose_decode_attention(decode_attention, &model, &like)?;
        let kv_dtype = kv_dtype_arg(kv_dtype, dtype, attention_dtype, decode_attention)?;
        let mut cache = model.new_cache(ctx, kv_dtype, attention_dtype)?;
        cache.decode_slots = decode_slots;
        cache.decode_attention = decode_attention;
        let state = State { model, cache, epoch: 0, prefilled: None, weights_reason };
        Ok(Engine { owner: std::thread::current().id(), state: Mutex::new(state) })
    }

    /// "int4" or "bf16": how this engine holds its linears.
    #[getter]
    fn weights(&self) -> PyResult<&'static str> {
        Ok(self.state()?.model.weights.name())
    }

    /// Why: what weights="auto" found on this device, or what was asked for.
    #[getter]
    fn weights_reason(&self) -> PyResult<String> {
        Ok(self.state()?.weights_reason.clone())
    }

    /// The kernel multiplying the matrices kept 4-bit: "dot4", "fma4" or "aten" (see the class docstring); None with
    /// weights "bf16".
    #[getter]
    fn int4_matmul(&self) -> PyResult<Option<&'static str>> {
        let model = &self.state()?.model;
        Ok((model.weights == Weights::Int4).then(|| model.matmul.name()))
    }

    /// What a decode step's full layers attend over: "bucket" or "all" (see the class docstring).
    #[getter]
    fn decode_slots(&self) -> PyResult<&'static str> {
        Ok(match self.state()?.cache.decode_slots {
            DecodeSlots::Bucket => "bucket",
            DecodeSlots::All => "all",
        })
    }

    /// What a sliding layer attends over: "bucket", as many of its ring's slots as the full caches' rule gives (all a
    /// ring holds until it wraps; then the whole ring) — step 03 attends over the whole ring. Step 05's bench counts
    /// the bytes a decode step reads by it.
    #[getter]
    fn sliding_slots(&self) -> &'static str {
        "bucket"
    }

    /// What runs a decode step's attention over the cache: "own" (torchtpu_attend_one) or "aten" (see the class
    /// docstring).
    #[getter]
    fn decode_attention(&self) -> PyResult<&'static str> {
        Ok(self.state()?.cache.decode_attention.name())
    }

    /// The kernel for a decode step's dense linears: "aten" or "onednn" (see the class docstring).
    #[getter]
    fn matvec(&self) -> PyResult<&'static str> {
        Ok(if self.state()?.model.matvec_in_aten { "aten" } else { "onednn" })
    }

    /// The dtype attention computes in: "bfloat16" or "float32" (see the class docstring).
    #[getter]
    fn attention_dtype(&self) -> PyResult<&'static str> {
        Ok(dtype_name(self.state()?.cache.attention))
    }

    /// The dtype the caches hold keys and values in: "bfloat16" or "float32" (see the class docstring).
    #[getter]
    fn kv_dtype(&self) -> PyResult<&'static str> {
        Ok(dtype_name(self.state()?.cache.dtype))
    }

    /// layout() -> (full_rings, sliding_rings, shared_layers, sliding_ring_len)
    fn layout(&self) -> PyResult<(i64, i64, i64, i64)> {
        Ok(config::layout(&self.state()?.model.cfg).into())
    }

    /// generate(ids, max_new, read_every=1, stop=None) -> (tokens, read_s, decode_s)
    ///
    /// Greedy tokens after the prompt `ids`: exactly `max_new` of them, or with `stop` (a list, tuple or set
    /// of token ids) up to and including the first one in `stop`. read_s: the prompt read, which also yields
    /// the first token; decode_s: the decode steps made after it, so decode tok/s = (len(tokens) - 1) /
    /// decode_s. Tokens reach the host every `read_every` steps, and a stop is seen only then: with
    /// read_every > 1, up to read_every - 1 steps past it are made, dropped, and counted in decode_s.
    #[pyo3(signature = (ids, max_new, read_every = 1, stop = None))]
    fn generate(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        max_new: i64,
        read_every: i64,
        stop: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Vec<i64>, f64, f64)> {
        let ids = token_ids(ids, "generate(ids)")?;
        let mut state = self.state()?;
        let ctx = state.cache.ctx;
        check_ids(&ids, &state.model.cfg, ctx)?;
        let stop = checked_stop(stop, &state.model.cfg)?;
        check_max_new(max_new, ids.len() as i64, ctx)?;
        if read_every < 1 {
            return Err(PyValueError::new_err(format!("read_every={read_every}: must be >= 1")));
        }
        // The GIL is released while the model runs: other Python threads go on (and get a RuntimeError if they
        // touch this engine). `&mut` is Send where `&` would need Sync, which tensors are not.
        let state: &mut State = &mut state;
        state.taken();
        let Generation { tokens, read_s, decode_s } = py.detach(move || {
            state.model.generate(&ids, max_new, read_every, &stop, &mut state.cache, &mut check_signals)
        })?;
        Ok((tokens, read_s, decode_s))
    }

    /// decode_budget(ids, steps) -> dict
    ///
    /// Where a decode step's time goes. Reads the prompt `ids`, then makes `steps` greedy decode steps as
    /// `generate` does, timing each part of them on its own (see the class docstring): returns {"tokens": the
    /// 1 + steps tokens, "parts": [(name, seconds, bytes)] per step on average — bytes read as stored —, "step_s":
    /// their sum, "multiply_adds": {name: the products' multiply-adds per step} for the parts that multiply
    /// matrices}. The parts cover the whole step: work between named parts counts as "the rest (views, the step's
    /// glue)".
    fn decode_budget<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>, steps: i64) -> PyResult<Bound<'py, PyDict>> {
        let ids = token_ids(ids, "decode_budget(ids)")?;
        let mut state = self.state()?;
        let ctx = state.cache.ctx;
        check_ids(&ids, &state.model.cfg, ctx)?;
        if steps < 1 || steps > ctx - ids.len() as i64 {
            return Err(PyValueError::new_err(format!(
                "decode_budget(steps={steps}): need 1 <= steps and len(ids) + steps <= ctx ({} + {steps}, ctx {ctx})",
                ids.len()
            )));
        }
        let state: &mut State = &mut state;
        state.taken();
        let (tokens, budget) =
            py.detach(move || state.model.decode_budget(&ids, steps, &mut state.cache, &mut check_signals))?;
        let per_step = |x: f64| x / steps as f64;
        let parts: Vec<(&str, f64, f64)> = budget::Part::ALL
            .iter()
            .map(|&p| (p.name(), per_step(budget.seconds[p as usize]), per_step(budget.bytes[p as usize] as f64)))
            .collect();
        let out = PyDict::new(py);
        out.set_item("tokens", tokens)?;
        out.set_item("step_s", per_step(budget.seconds.iter().sum()))?;
        out.set_item("parts", parts)?;
        out.set_item("multiply_adds", multiply_adds(&budget, steps))?;
        Ok(out)
    }

    /// read_budget(ids) -> dict
    ///
    /// Where a prompt read's time goes. Reads the prompt `ids` into a fresh cache as `generate` does (its chunks,
    /// the head on the last row, the first greedy token), timing each part on its own: returns {"token": the first
    /// token, "parts": [(name, seconds, bytes)] for the read — bytes read as stored —, "read_s": their sum,
    /// "multiply_adds": {name: the products' multiply-adds} for the parts that multiply matrices}.
    fn read_budget<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let ids = token_ids(ids, "read_budget(ids)")?;
        let mut state = self.state()?;
        check_ids(&ids, &state.model.cfg, state.cache.ctx)?;
        let state: &mut State = &mut state;
        state.taken();
        let (token, budget) = py.detach(move || state.model.read_budget(&ids, &mut state.cache, &mut check_signals))?;
        let parts: Vec<(&str, f64, i64)> = budget::Part::ALL
            .iter()
            .map(|&p| (p.name(), budget.seconds[p as usize], budget.bytes[p as usize]))
            .collect();
        let out = PyDict::new(py);
        out.set_item("token", token)?;
        out.set_item("read_s", budget.seconds.iter().sum::<f64>())?;
        out.set_item("parts", parts)?;
        out.set_item("multiply_adds", multiply_adds(&budget, 1))?;
        Ok(out)
    }

    /// prefill(ids) -> torch.Tensor
    ///
    /// Reads the prompt `ids` into a fresh cache (in chunks, as generate does) and returns the float32 logits
    /// [vocab] after its last token. Continue with `tokens(...)`.
    fn prefill<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let ids = token_ids(ids, "prefill(ids)")?;
        let mut state = self.state()?;
        check_ids(&ids, &state.model.cfg, state.cache.ctx)?;
        let state: &mut State = &mut state;
        state.taken();
        let (reading, prompt): (&mut State, &[i64]) = (&mut *state, &ids);
        let logits = py.detach(move || reading.model.prefill(prompt, &mut reading.cache, &mut check_signals))?;
        let row = logits.f_to_kind(Kind::Float).map_err(torch_error)?.f_reshape([-1]).map_err(torch_error)?;
        state.prefilled = Some(Prefilled { logits, len: ids.len() as i64 });
        give(py, &row)
    }

    /// tokens(max_new, stop=None, temperature=None, top_k=None, top_p=None, seed=None) -> Iterator[int]
    ///
    /// The tokens after the last `prefill`, yielded as they are made: at most `max_new` (len(ids) + max_new <=
    /// ctx), ending after the first one in `stop`. Greedy unless temperature, top_k or top_p is set; then sampled
    /// from the distribution Transformers' temperature, top-k and top-p processors leave (temperature defaults to
    /// 1.0), with a generator seeded by `seed` (an int; None: from the clock): the same seed, the same tokens.
    /// Any other call on the engine ends the stream (its next step raises RuntimeError).
    #[pyo3(signature = (max_new, stop = None, temperature = None, top_k = None, top_p = None, seed = None))]
    fn tokens(
        slf: &Bound<'_, Self>,
        max_new: i64,
        stop: Option<&Bound<'_, PyAny>>,
        temperature: Option<&Bound<'_, PyAny>>,
        top_k: Option<&Bound<'_, PyAny>>,
        top_p: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<TokenStream> {
        let engine = slf.borrow();
        let mut state = engine.state()?;
        let stop = checked_stop(stop, &state.model.cfg)?;
        let sampling = sampling_args(temperature, top_k, top_p)?;
        let seed = seed_arg(seed)?;
        // checked before the prefill is taken, so that a bad max_new leaves it for the next call
        if let Some(prefilled) = &state.prefilled {
            check_max_new(max_new, prefilled.len, state.cache.ctx)?;
        }
        let prefilled = state.prefilled.take().ok_or_else(|| {
            PyRuntimeError::new_err("tokens: no prompt read; call prefill(ids) first (each prefill serves one stream)")
        })?;
        state.epoch += 1;
        let stream = Stream {
            epoch: state.epoch,
            logits: Some(prefilled.logits),
            unfed: None,
            pos: prefilled.len,
            made: 0,
            max_new,
            stop,
            sampler: sampling.map(|s| (s, Rng::new(seed))),
            done: false,
            last_logits: None,
        };
        Ok(TokenStream { engine: slf.clone().unbind(), stream: Mutex::new(stream) })
    }

    /// stream(ids, max_new, stop=None, temperature=None, top_k=None, top_p=None, seed=None) -> Iterator[int]
    ///
    /// prefill(ids), then tokens(max_new, ...): the prompt is read now, the tokens come as you iterate.
    #[pyo3(signature = (ids, max_new, stop = None, temperature = None, top_k = None, top_p = None, seed = None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        max_new: i64,
        stop: Option<&Bound<'_, PyAny>>,
        temperature: Option<&Bound<'_, PyAny>>,
        top_k: Option<&Bound<'_, PyAny>>,
        top_p: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<TokenStream> {
        {
            // check everything before reading the prompt
            let engine = slf.borrow();
            let state = engine.state()?;
            let n = token_ids(ids, "stream(ids)")?.len() as i64;
            checked_stop(stop, &state.model.cfg)?;
            sampling_args(temperature, top_k, top_p)?;
            seed_arg(seed)?;
            check_max_new(max_new, n, state.cache.ctx)?;
        }
        slf.borrow().prefill(py, ids)?;
        Engine::tokens(slf, max_new, stop, temperature, top_k, top_p, seed)
    }

    /// logits(ids, positions=None) -> torch.Tensor
    ///
    /// float32 [n, vocab] logits at `positions` (indices into ids; default all), computed through the same
    /// chunked read and caches as generate, from a fresh cache.
    #[pyo3(signature = (ids, positions = None))]
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        positions: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = token_ids(ids, "logits(ids)")?;
        let positions = positions.map(|p| token_ids(p, "logits(positions)")).transpose()?;
        let mut state = self.state()?;
        check_ids(&ids, &state.model.cfg, state.cache.ctx)?;
        let n = ids.len() as i64;
        let positions = positions.unwrap_or_else(|| (0..n).collect());
        if let Some(p) = positions.iter().find(|&&p| p < 0 || p >= n) {
            return Err(PyValueError::new_err(format!("positions: {p} is not an index into ids (len {n})")));
        }
        state.taken();
        let State { model, cache, .. } = &mut *state;
        let mut rows: Vec<Option<Tensor>> = (0..positions.len()).map(|_| None).collect();
        model.read(&ids, cache, Wanted::EveryRow, &mut check_signals, |start, out, _| {
            for (slot, &p) in rows.iter_mut().zip(&positions) {
                if (start..start + out.size()[0]).contains(&p) {
                    let row = model.head(&out.f_narrow(0, p - start, 1)?)?;
                    *slot = Some(row.f_to_kind(Kind::Float)?);
                }
            }
            Ok(())
        })?;
        let rows: Vec<Tensor> = rows.into_iter().map(|r| r.expect("every position lies in some chunk")).collect();
        let logits = if rows.is_empty() {
            Tensor::f_empty([0, model.cfg.vocab_size], (Kind::Float, tch::Device::Cpu)).map_err(torch_error)?
        } else {
            Tensor::f_cat(&rows, 0).map_err(torch_error)?
        };
        give(py, &logits)
    }

    /// hidden_states(ids) -> list[torch.Tensor]
    ///
    /// L + 1 tensors [len(ids), hidden] in Transformers' convention: the input of each layer, then the
    /// final-norm output.
    fn hidden_states<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let ids = token_ids(ids, "hidden_states(ids)")?;
        let mut state = self.state()?;
        check_ids(&ids, &state.model.cfg, state.cache.ctx)?;
        state.taken();
        let State { model, cache, .. } = &mut *state;
        let mut chunks: Vec<Vec<Tensor>> = Vec::new();
        model.read(&ids, cache, Wanted::EveryLayer, &mut check_signals, |_, _, states| {
            chunks.push(states);
            Ok(())
        })?;
        let layers = chunks.first().map_or(0, |c| c.len());
        let mut out = Vec::new();
        for layer in 0..layers {
            let parts: Vec<&Tensor> = chunks.iter().map(|c| &c[layer]).collect();
            out.push(give(py, &Tensor::f_cat(&parts, 0).map_err(torch_error)?)?);
        }
        PyList::new(py, out)
    }

    /// weight_bytes_per_token() -> int
    ///
    /// Bytes of weights one decode step reads, in the dtypes the engine holds them (not the bytes on disk).
    fn weight_bytes_per_token(&self) -> PyResult<i64> {
        Ok(self.state()?.model.weight_bytes_per_token())
    }

    /// memory() -> dict[str, int]
    ///
    /// Bytes held in memory, by part: the linears (every layer's matrices and the per-layer projection), the
    /// head, each embedding table (0 for one left in the file), the norms and scalars, and the KV caches. The
    /// rest of the process's memory is the runtime (torch, Python) and the allocator's slack.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.state()?;
        let parts = PyDict::new(py); // in the order of the parts
        for (part, bytes) in state.model.held_bytes() {
            parts.set_item(part, bytes)?;
        }
        parts.set_item("kv caches", state.cache.bytes())?;
        Ok(parts)
    }

    fn __repr__(&self) -> PyResult<String> {
        let state = self.state()?;
        let (cfg, ctx) = (&state.model.cfg, state.cache.ctx);
        let layout = config::layout(cfg);
        Ok(format!(
            "Engine(layers={}, weights={}, dtype={:?}, ctx={ctx}, full_rings={}, sliding_rings={}, shared_layers={}, \
             sliding_ring_len={})",
            cfg.num_hidden_layers,
            state.model.weights.name(),
            state.model.dtype,
            layout.full_rings,
            layout.sliding_rings,
            layout.shared_layers,
            layout.sliding_ring_len
        ))
    }
}

impl State {
    /// A call is about to reuse the cache: a stream or prefill in progress ends.
    fn taken(&mut self) {
        self.epoch += 1;
        self.prefilled = None;
    }
}

/// The iterator `Engine.tokens` and `Engine.stream` return: one decode step per `next`, made when asked.
#[pyclass(module = "torchtpu_kernels")]
struct TokenStream {
    engine: Py<Engine>,
    stream: Mutex<Stream>,
}

/// A token stream's progress.
struct Stream {
    epoch: u64,
    /// Logits to pick the next token from (after the prefill, or after the last step).
    logits: Option<Tensor>,
    /// The last token yielded, not yet fed back (the step is made at the next `next`, not ahead of it).
    unfed: Option<Tensor>,
    /// The position the unfed token goes to.
    pos: i64,
    made: i64,
    max_new: i64,
    stop: Vec<i64>,
    sampler: Option<(Sampling, Rng)>,
    done: bool,
    /// The logits the last token was picked from.
    last_logits: Option<Tensor>,
}

#[pymethods]
impl TokenStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// last_logits() -> torch.Tensor | None
    ///
    /// The float32 logits [vocab] the last yielded token was picked from (before any sampling filter).
    fn last_logits<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let stream = self.stream.lock().map_err(|_| PyRuntimeError::new_err("TokenStream: broken"))?;
        match &stream.last_logits {
            None => Ok(None),
            Some(l) => {
                Ok(Some(give(py, &l.f_to_kind(Kind::Float).and_then(|l| l.f_reshape([-1])).map_err(torch_error)?)?))
            }
        }
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        // A C loop over the stream (`list(stream)`) never returns to Python's eval loop, where Ctrl-C is noticed
        py.check_signals()?;
        let engine = self.engine.bind(py).borrow();
        let mut state = engine.state()?;
        let mut stream = self.stream.lock().map_err(|_| PyRuntimeError::new_err("TokenStream: broken"))?;
        let s: &mut Stream = &mut stream;
        if s.done || s.made >= s.max_new {
            s.done = true;
            return Ok(None);
        }
        if state.epoch != s.epoch {
            s.done = true;
            return Err(PyRuntimeError::new_err(
                "TokenStream: another call on the engine has reused its cache since this stream began",
            ));
        }
        let st: &mut State = &mut state;
        let result = py.detach(move || -> error::Result<(Tensor, i64)> {
            if let Some(token) = s.unfed.take() {
                s.logits = Some(st.model.step(&token, s.pos, &mut st.cache)?);
                s.pos += 1;
            }
            let logits = s.logits.take().expect("logits after the prefill or a step");
            let token = sampling::pick(&logits, s.sampler.as_mut().map(|(sampling, rng)| (&*sampling, rng)))?;
            s.last_logits = Some(logits);
            let id = token.f_int64_value(&[0])?;
            s.made += 1;
            if s.stop.contains(&id) {
                s.done = true;
            } else {
                s.unfed = Some(token.f_reshape([1])?);
            }
            Ok((token, id))
        });
        match result {
            Ok((_, id)) => Ok(Some(id)),
            Err(e) => {
                stream.done = true;
                Err(e.into())
            }
        }
    }
}

impl Engine {
    /// The engine's state, for the thread that created it only: libtorch (and a TPU's runtime) state belongs to
    /// that thread. PyO3's `unsendable` would panic instead of raising, so the check is ours.
    fn state(&self) -> PyResult<MutexGuard<'_, State>> {
        if std::thread::current().id() != self.owner {
            return Err(PyRuntimeError::new_err(
                "Engine: called from a thread other than the one that created it; \
                 create the Engine in the thread that uses it",
            ));
        }
        self.state
            .lock()
            .map_err(|_| PyRuntimeError::new_err("Engine: an earlier call failed midway; create a new Engine"))
    }
}

/// A list of ints from Python; anything else is a TypeError that names the argument.
fn token_ids(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<i64>> {
    let wrong = |why: String| PyTypeError::new_err(format!("{arg}: expected a list of ints, {why}"));
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(wrong("got str".into()));
    }
    obj.extract::<Vec<i64>>()
        .map_err(|e| wrong(format!("got {}: {e}", obj.get_type().name().map_or("?".into(), |n| n.to_string()))))
}

/// Stop ids from Python: a list, tuple or set of ints; anything else is a TypeError that names `stop`.
fn stop_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let type_name = |o: &Bound<'_, PyAny>| o.get_type().name().map_or("?".into(), |n| n.to_string());
    let collection = obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>();
    if !collection {
        let got = format!("{} {}", type_name(obj), obj.repr().map_or("?".into(), |r| r.to_string()));
        return Err(PyTypeError::new_err(format!("stop: expected a list, tuple or set of ints, got {got}")));
    }
    obj.try_iter()?
        .map(|item| {
            let item = item?;
            item.extract::<i64>().map_err(|_| {
                let got = format!("{} {}", type_name(&item), item.repr().map_or("?".into(), |r| r.to_string()));
                PyTypeError::new_err(format!("stop: expected ints, got {got}"))
            })
        })
        .collect()
}

/// Stop ids checked against the vocabulary (None: no stop).
fn checked_stop(stop: Option<&Bound<'_, PyAny>>, cfg: &TextConfig) -> PyResult<Vec<i64>> {
    let stop = stop.map(stop_ids).transpose()?.unwrap_or_default();
    let vocab = vocabulary(cfg);
    if let Some(id) = stop.iter().find(|&&id| id < 0 || id >= vocab) {
        return Err(PyValueError::new_err(format!("stop: {id} is outside the vocabulary [0, {vocab})")));
    }
    Ok(stop)
}

fn check_max_new(max_new: i64, n: i64, ctx: i64) -> PyResult<()> {
    if max_new < 0 {
        return Err(PyValueError::new_err(format!("max_new={max_new}: need 0 <= max_new")));
    }
    // `max_new > ctx - n`, not `n + max_new > ctx`: a max_new near 2^63 would wrap the sum past the check
    if max_new > ctx - n {
        return Err(PyValueError::new_err(format!(
            "max_new={max_new}: need len(ids) + max_new <= ctx ({n} + {max_new} > {ctx})"
        )));
    }
    Ok(())
}

/// A number argument: an int or float (not a bool), else a TypeError naming it; one out of `T`'s range (Python's
/// OverflowError) a ValueError.
fn number<T>(obj: Option<&Bound<'_, PyAny>>, arg: &str, what: &str) -> PyResult<Option<T>>
where
    T: for<'a, 'py> FromPyObject<'a, 'py>,
    for<'a, 'py> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    let got = || {
        format!(
            "{} {}",
            obj.get_type().name().map_or("?".into(), |n| n.to_string()),
            obj.repr().map_or("?".into(), |r| r.to_string())
        )
    };
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("{arg}: expected {what}, got {}", got())));
    }
    obj.extract::<T>().map(Some).map_err(|e| {
        if e.into().is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) {
            PyValueError::new_err(format!(
                "{arg}={}: out of range for {what}",
                obj.repr().map_or("?".into(), |r| r.to_string())
            ))
        } else {
            PyTypeError::new_err(format!("{arg}: expected {what}, got {}", got()))
        }
    })
}

/// Greedy (None) unless temperature, top_k or top_p is given.
fn sampling_args(
    temperature: Option<&Bound<'_, PyAny>>,
    top_k: Option<&Bound<'_, PyAny>>,
    top_p: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Sampling>> {
    let temperature = number::<f64>(temperature, "temperature", "a float")?;
    let top_k = if top_k.is_some_and(|k| k.is_instance_of::<pyo3::types::PyFloat>()) {
        return Err(PyTypeError::new_err(format!("top_k: expected an int, got float {}", top_k.unwrap())));
    } else {
        number::<i64>(top_k, "top_k", "an int")?
    };
    let top_p = number::<f64>(top_p, "top_p", "a float")?;
    if temperature.is_none() && top_k.is_none() && top_p.is_none() {
        return Ok(None);
    }
    Ok(Some(Sampling::new(temperature.unwrap_or(1.0), top_k, top_p)?))
}

/// The seed: an int (any size: taken modulo 2^64), or None for one from the clock.
fn seed_arg(seed: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let Some(seed) = seed.filter(|s| !s.is_none()) else {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return Ok(now.as_nanos() as u64);
    };
    let is_int = seed.is_instance_of::<pyo3::types::PyInt>() && !seed.is_instance_of::<pyo3::types::PyBool>();
    if !is_int {
        let name = seed.get_type().name().map_or("?".into(), |n| n.to_string());
        return Err(PyTypeError::new_err(format!("seed: expected an int, got {name} {}", seed.repr()?)));
    }
    let masked = seed.call_method1("__and__", (u64::MAX,))?;
    masked.extract::<u64>()
}

/// The ids both embedding tables hold: what a prompt may contain.
fn vocabulary(cfg: &TextConfig) -> i64 {
    cfg.vocab_size.min(cfg.vocab_size_per_layer_input)
}

/// A budget's multiply-adds by part name, per step over `steps`: the parts that multiply matrices (attention's scores
/// and sums are not counted).
fn multiply_adds(budget: &budget::Budget, steps: i64) -> std::collections::BTreeMap<&'static str, i64> {
    budget::Part::ALL
        .iter()
        .filter(|&&p| budget.multiply_adds[p as usize] > 0)
        .map(|&p| (p.name(), budget.multiply_adds[p as usize] / steps))
        .collect()
}

/// Prompt ids must be in the vocabulary and fit the context.
fn check_ids(ids: &[i64], cfg: &TextConfig, ctx: i64) -> PyResult<()> {
    if ids.is_empty() {
        return Err(PyValueError::new_err("ids: the prompt is empty; it needs at least one token (e.g. <bos> = 2)"));
    }
    if ids.len() as i64 > ctx {
        return Err(PyValueError::new_err(format!("ids: {} tokens do not fit ctx={ctx}", ids.len())));
    }
    let vocab = vocabulary(cfg);
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id < 0 || id >= vocab) {
        return Err(PyValueError::new_err(format!("ids[{i}] = {id} is outside the vocabulary [0, {vocab})")));
    }
    Ok(())
}

/// layout_for(config_json, ctx) -> (full_rings, sliding_rings, shared_layers, sliding_ring_len)
///
/// The cache layout an Engine would have, from a config.json alone (no weights needed). `ctx` is checked as the
/// Engine checks it (1 to max_position_embeddings); the layout itself does not depend on it.
#[pyfunction]
fn layout_for(config_json: PathBuf, ctx: i64) -> PyResult<(i64, i64, i64, i64)> {
    let cfg = Config::from_file(&config_json)?.text;
    check_ctx(ctx, &cfg)?;
    Ok(config::layout(&cfg).into())
}

/// sample(logits, n, seed, temperature=None, top_k=None, top_p=None) -> list[int]
///
/// `n` draws from one row of logits, filtered and drawn exactly as `Engine.tokens` samples (for tests and for
/// seeing what the arguments do).
#[pyfunction]
#[pyo3(signature = (logits, n, seed, temperature = None, top_k = None, top_p = None))]
fn sample(
    logits: &Bound<'_, PyAny>,
    n: i64,
    seed: &Bound<'_, PyAny>,
    temperature: Option<&Bound<'_, PyAny>>,
    top_k: Option<&Bound<'_, PyAny>>,
    top_p: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<i64>> {
    let logits = logits_arg(logits, "sample(logits)")?.f_reshape([1, -1]).map_err(torch_error)?;
    if n < 0 {
        return Err(PyValueError::new_err(format!("n={n}: need 0 <= n")));
    }
    let sampling = sampling_args(temperature, top_k, top_p)?.map_or_else(|| Sampling::new(1.0, None, None), Ok)?;
    let mut rng = Rng::new(seed_arg(Some(seed))?);
    let probs = sampling.probabilities(&logits)?;
    let py = seed.py();
    (0..n)
        .map(|i| {
            if i % 4096 == 4095 {
                py.check_signals()?; // Ctrl-C, in a long run of draws
            }
            Ok(rng.draw(&probs)?)
        })
        .collect()
}

/// logits as `sample` and `filtered_probs` take them: a tensor with a last axis of at least one token.
fn logits_arg(logits: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    let logits = take(logits, what)?;
    if logits.dim() == 0 || logits.size().last() == Some(&0) {
        return Err(PyValueError::new_err(format!(
            "{what}: shape {:?}, need [..., vocab] with vocab >= 1",
            logits.size()
        )));
    }
    Ok(logits)
}

/// filtered_probs(logits, temperature=None, top_k=None, top_p=None) -> torch.Tensor
///
/// The float32 distribution `tokens` samples from: temperature (1.0 when unset), top-k, top-p as Transformers'
/// processors.
#[pyfunction]
#[pyo3(signature = (logits, temperature = None, top_k = None, top_p = None))]
fn filtered_probs<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    temperature: Option<&Bound<'py, PyAny>>,
    top_k: Option<&Bound<'py, PyAny>>,
    top_p: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let logits = logits_arg(logits, "filtered_probs(logits)")?;
    let sampling = sampling_args(temperature, top_k, top_p)?.map_or_else(|| Sampling::new(1.0, None, None), Ok)?;
    give(py, &sampling.probabilities(&logits)?)
}

/// The Rust half of torchtpu_kernels: `Engine` (and its `TokenStream`), `sample`, `filtered_probs`, `layout_for`,
/// `int4_kernel`, which of this step's kernels run and how (`dot4_runs`, `fma4_runs`, `fma4_subnormals`, `amx4_runs`,
/// `fma16_runs`, `panels_run`, `dot4_float_panels_run`), `fma_limit`, `repack`, `Int4Linear`, and the versions it was
/// built with.
#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // torch must be loaded first: it owns libtorch_python, which `give` uses to build Python tensors.
    m.py().import("torch")?;
    m.add_class::<Engine>()?;
    m.add_class::<TokenStream>()?;
    m.add_function(wrap_pyfunction!(sample, m)?)?;
    m.add_function(wrap_pyfunction!(filtered_probs, m)?)?;
    m.add_function(wrap_pyfunction!(layout_for, m)?)?;
    m.add_function(wrap_pyfunction!(int4_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(repack, m)?)?;
    m.add_class::<PyInt4Linear>()?;
    m.add_function(wrap_pyfunction!(dot4_runs, m)?)?;
    m.add_function(wrap_pyfunction!(fma4_runs, m)?)?;
    m.add_function(wrap_pyfunction!(fma4_subnormals, m)?)?;
    m.add_function(wrap_pyfunction!(amx4_runs, m)?)?;
    m.add_function(wrap_pyfunction!(fma16_runs, m)?)?;
    m.add_function(wrap_pyfunction!(panels_run, m)?)?;
    m.add_function(wrap_pyfunction!(dot4_float_panels_run, m)?)?;
    m.add_function(wrap_pyfunction!(fma_limit, m)?)?;
    m.add("TCH_VERSION", env!("TCH_VERSION"))?;
    m.add("RUSTC_VERSION", env!("RUSTC_VERSION"))?;
    m.add("BUILT_WITH_TORCH", env!("BUILT_WITH_TORCH"))?;
    Ok(())
}
