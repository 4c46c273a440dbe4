//! What this CPU lets the engine run: the one place step 08 decides a default by the CPU.
//!
//! Each answer is the CPU's instruction set as torch itself is allowed to use it: a process started with
//! `ATEN_CPU_CAPABILITY=avx2` (ATen's dispatch) and `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's) runs what an AVX2-only
//! CPU runs — the walkthrough's stand-in for the many CPUs without bf16 matrix hardware (`make bench-avx2`, and
//! `make test`'s AVX2 tier). Likewise `ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` alone keeps oneDNN, and so this step,
//! from AMX: an AMX Xeon runs what an Intel CPU with AVX512-BF16 and no AMX runs (`make bench-avx512`); and
//! `ONEDNN_MAX_CPU_ISA=AVX512_CORE` keeps them from AVX512-BF16 too: what an Intel CPU with AVX-512 and no
//! AVX512-BF16 runs (Skylake to Ice Lake). The CPU's own feature flags come first: no setting adds an instruction.
use std::sync::OnceLock;

use pyo3::prelude::*;

extern "C" {
    fn torchtpu_aten_capability() -> i32;
    // the instructions each kernel file is compiled for, as the CPU's flags report them (dot4.cpp, fma4.cpp)
    fn torchtpu_dot4_supported() -> bool;
    fn torchtpu_fma4_supported() -> bool;
    fn torchtpu_fma16_supported() -> bool;
    fn torchtpu_attend_supported() -> bool; // attend.cpp
    fn torchtpu_tanh_supported() -> bool; // tanh.cpp
    fn torchtpu_panels_supported() -> bool; // panels.cpp
    fn torchtpu_amx4_supported() -> bool; // amx4.cpp, with Linux's leave to use AMX's tiles
    fn torchtpu_intel() -> bool; // cpu.cpp
}

/// ATen's vector ISA in this process, as torch reports it: `DEFAULT < AVX2 < AVX512`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Default,
    Avx2,
    Avx512,
}

/// ATen settles it once per process (it reads `ATEN_CPU_CAPABILITY` at its first dispatch), and so does this: every
/// product asks (the gelu's lanes), and ATen's answer is a string made each time.
pub fn aten_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    // SAFETY: asks ATen a question; no arguments, no state changed.
    *ISA.get_or_init(|| match unsafe { torchtpu_aten_capability() } {
        2 => Isa::Avx512,
        1 => Isa::Avx2,
        _ => Isa::Default,
    })
}

// --8<-- [start:choose]
/// Whether `torchtpu_dot4_mm` runs: AVX-512 F and BW and AVX512-BF16's `vdpbf16ps`, with ATen allowed AVX-512 and
/// oneDNN allowed AVX512-BF16 (the cap that keeps oneDNN from the CPU's bf16 instructions keeps this step's from them).
pub fn dot4_runs() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    let flags = unsafe { torchtpu_dot4_supported() };
    flags && aten_isa() >= Isa::Avx512 && onednn_allows(OnednnIsa::Bf16)
}

/// Whether `torchtpu_fma4_mm` runs: AVX2, FMA and F16C, with ATen allowed AVX2.
pub fn fma4_runs() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    let flags = unsafe { torchtpu_fma4_supported() };
    flags && aten_isa() >= Isa::Avx2
}

/// Whether dot4's prompt chunks go by panels (`torchtpu_unpack_panel`, then torch's bf16 matmul): AMX's bf16 tiles,
/// which oneDNN multiplies on, and the AVX-512 the unpacking uses, with ATen allowed AVX-512 and oneDNN allowed AMX.
pub fn panels_run() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    let flags = unsafe { torchtpu_panels_supported() };
    flags && aten_isa() >= Isa::Avx512 && onednn_allows(OnednnIsa::Amx)
}

/// Whether dot4's products of a short prompt's rows go by AMX's tiles (`torchtpu_amx4_mm`): AMX's bf16 tiles with
/// Linux's leave to use them and dot4's AVX-512, with ATen allowed AVX-512 and oneDNN allowed AMX — the cap that keeps
/// oneDNN from AMX keeps this step's own AMX kernel from it too, so the stand-in runs what a CPU without AMX runs.
pub fn amx4_runs() -> bool {
    // SAFETY: reads the CPU's feature flags and asks Linux once for the tiles' state; nothing else.
    let flags = unsafe { torchtpu_amx4_supported() };
    flags && aten_isa() >= Isa::Avx512 && onednn_allows(OnednnIsa::Amx)
}

/// Whether `torchtpu_fma16_mm`, fma4's arithmetic in AVX-512's 16 lanes, can run here: AVX-512 F and BW, with ATen
/// allowed AVX-512 (the tests run it wherever it can; `fma16_runs` says where the engine takes it).
pub fn fma16_can_run() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    let flags = unsafe { torchtpu_fma16_supported() };
    flags && aten_isa() >= Isa::Avx512
}

/// Whether this step's products of a prompt's rows go by fma16 where AMX's tiles do not take them (`Kernel::prompt`
/// asks for the tiles first): on an Intel CPU with AVX-512 — for dot4, for the reason its longer chunks go by float32
/// panels (below): a 512-bit FMA issues twice a cycle, `vdpbf16ps` once every two; for fma4 (AVX-512 without
/// AVX512-BF16: a Xeon from Skylake to Ice Lake), twice its 8 lanes. An AMD EPYC Zen 4 runs a 512-bit FMA as two
/// 256-bit halves, so dot4 keeps its rows there.
pub fn fma16_runs() -> bool {
    // SAFETY: reads the CPU's vendor, nothing else.
    fma16_can_run() && unsafe { torchtpu_intel() }
}

/// Whether fma4 reads its nibbles as float32 subnormals rather than converting them (`torchtpu_fma4_subnormal_mm`,
/// fma4.cpp): on an AMD CPU, where the convert runs on fewer vector pipes than the AND and the FMA and held a decode
/// step's mat-vec to its arithmetic's pace (step 05's record on an AMD EPYC Zen 3, docs/runs/cpu-e2b-avx2, times the
/// subnormal form). Both forms give the same bits. Intel's cores are left the convert: an FMA of a subnormal input
/// may take a microcode assist on some of them, and none was measured here.
pub fn fma4_subnormals() -> bool {
    // SAFETY: reads the CPU's vendor, nothing else.
    !unsafe { torchtpu_intel() }
}

/// Whether dot4's prompt chunks go by float32 panels where the bf16 ones do not run (`torchtpu_unpack_panel_float`,
/// then torch's float32 matmul, as fma4's): on an Intel CPU, whose two 512-bit FMA units give MKL's float32 product
/// about twice what `vdpbf16ps` gives dot4 and oneDNN (an AMX Xeon kept from AMX, 2026-12-06: E2B's [12288 × 1536] at
/// 512 rows 47 ms in float32, 82 in oneDNN's bf16, about 95 by dot4, which took 11.9 at 63 rows). An AMD EPYC Zen 4
/// runs a 512-bit FMA as two 256-bit halves, so float32 has no such lead there, and dot4 read a 508-token prompt
/// faster than llama.cpp on one (step 08's record): it keeps every chunk there (MKL's float32 not measured on it).
pub fn dot4_float_panels_run() -> bool {
    // SAFETY: reads the CPU's vendor, nothing else.
    dot4_runs() && !panels_run() && unsafe { torchtpu_intel() }
}
// --8<-- [end:choose]

/// The bf16 instructions `ONEDNN_MAX_CPU_ISA` can keep oneDNN, and so this step, from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnednnIsa {
    /// AVX512-BF16's `vdpbf16ps` (oneDNN's `AVX512_CORE_BF16` and every ISA above it)
    Bf16,
    /// AMX's tiles (`AVX512_CORE_AMX`, `AVX10_1_512_AMX`, ...)
    Amx,
}

/// Whether oneDNN may use `isa` in this process by its cap, `ONEDNN_MAX_CPU_ISA` (or its older name
/// `DNNL_MAX_CPU_ISA`), which oneDNN reads once: unset or `ALL` allows both.
fn onednn_allows(isa: OnednnIsa) -> bool {
    let cap = std::env::var("ONEDNN_MAX_CPU_ISA").or_else(|_| std::env::var("DNNL_MAX_CPU_ISA"));
    cap_allows(&cap.unwrap_or_default(), isa)
}

/// Whether a cap (one of oneDNN's ISA names) allows `isa`. oneDNN's names above `AVX512_CORE_BF16` all name what
/// they add to it (`AVX512_CORE_FP16`, `AVX512_CORE_AMX`, `AVX10_1_512`, ...); those below (`AVX512_CORE_VNNI`,
/// `AVX512_CORE`, `AVX2_VNNI_2`, `AVX2`, ...) have no bf16 dot product: oneDNN emulates bf16 there, in float32.
fn cap_allows(cap: &str, isa: OnednnIsa) -> bool {
    let cap = cap.to_ascii_uppercase();
    if cap.is_empty() || cap == "ALL" {
        return true;
    }
    let below_bf16 = ["SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"];
    match isa {
        OnednnIsa::Bf16 => !below_bf16.contains(&cap.as_str()),
        OnednnIsa::Amx => cap.contains("AMX"),
    }
}

/// Whether `torchtpu_attend_one` runs: AVX2 and FMA, with ATen allowed AVX2 (as fma4).
pub fn attend_runs() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    let flags = unsafe { torchtpu_attend_supported() };
    flags && aten_isa() >= Isa::Avx2
}

/// Whether tanh.cpp's gelu and softcap run: AVX2 and FMA, with ATen allowed AVX2 (the Sleef tanh of ATen's AVX2 or
/// AVX-512 loop, whichever ATen dispatches to).
pub fn tanh_runs() -> bool {
    // SAFETY: reads the CPU's feature flags, nothing else.
    let flags = unsafe { torchtpu_tanh_supported() };
    flags && aten_isa() >= Isa::Avx2
}

/// Whether torch's bf16 matmul has a fast path here: oneDNN finds AVX-512 or AMX (its effective ISA, which
/// `ONEDNN_MAX_CPU_ISA` caps): `torch.ops.mkldnn._is_mkldnn_bf16_supported()`. Where it has none (AVX2 only),
/// float32 attention is several times faster than bf16.
pub fn fast_bf16_matmul(py: Python<'_>) -> PyResult<bool> {
    let mkldnn = py.import("torch")?.getattr("ops")?.getattr("mkldnn")?;
    mkldnn.getattr("_is_mkldnn_bf16_supported")?.call0()?.extract()
}

/// Whether a decode step's dense one-row linears go faster on oneDNN's mat-vec than on ATen's: on an Intel CPU where
/// torch's bf16 matmul has oneDNN's fast path (streamed from memory, oneDNN's at 1.1-1.8 times ATen's on the Intel
/// Xeons measured; ATen's twice oneDNN's on an AMD EPYC, and without the fast path oneDNN takes no bf16 product).
pub fn onednn_matvec_faster(py: Python<'_>) -> PyResult<bool> {
    // SAFETY: reads the CPU's vendor, nothing else.
    Ok(unsafe { torchtpu_intel() } && fast_bf16_matmul(py)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run of these tests expects of the CPU, where its caller says (tools/emulated-avx2.sh, on QEMU's
    /// AVX2-only CPUs: `TORCHTPU_EXPECT_ISA=avx2`): so an emulated run that skipped fma4's tests cannot pass.
    #[test]
    fn the_cpu_is_what_the_caller_expects() {
        match std::env::var("TORCHTPU_EXPECT_ISA").as_deref() {
            Ok("avx2") => {
                assert_eq!(aten_isa(), Isa::Avx2);
                assert!(fma4_runs() && attend_runs(), "fma4 and attend must run on an AVX2 CPU with FMA and F16C");
                assert!(
                    !dot4_runs() && !panels_run() && !amx4_runs() && !fma16_can_run(),
                    "no AVX-512 kernel may run here"
                );
                // SAFETY: reads the CPU's feature flags, nothing else.
                assert!(!unsafe { torchtpu_dot4_supported() }, "the CPU reports AVX512-BF16: not an AVX2-only CPU");
            }
            Ok(other) => panic!("TORCHTPU_EXPECT_ISA={other:?}: only \"avx2\" is known"),
            Err(_) => eprintln!("no expectation set (TORCHTPU_EXPECT_ISA)"),
        }
    }

    #[test]
    fn onednns_cap_names_what_it_keeps_from_this_step() {
        for cap in ["", "all", "ALL", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16"] {
            assert!(cap_allows(cap, OnednnIsa::Bf16) && cap_allows(cap, OnednnIsa::Amx), "{cap}");
        }
        for cap in ["AVX512_CORE_BF16", "avx512_core_bf16", "AVX512_CORE_FP16", "AVX10_1_512"] {
            assert!(cap_allows(cap, OnednnIsa::Bf16) && !cap_allows(cap, OnednnIsa::Amx), "{cap}");
        }
        for cap in ["AVX512_CORE", "AVX512_CORE_VNNI", "AVX2_VNNI_2", "AVX2", "SSE41"] {
            assert!(!cap_allows(cap, OnednnIsa::Bf16) && !cap_allows(cap, OnednnIsa::Amx), "{cap}");
        }
    }
}
