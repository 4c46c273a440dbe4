"""What a recorded run ran on: the `meta` block beside every number a script reports (`--json`)."""
import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from . import _engine


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _cpuinfo(field: str) -> str:
    """The first `field` line of /proc/cpuinfo ("model name", "flags"), or "" where there is none."""
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), "")


def cpu_model() -> str:
    return _cpuinfo("model name") or "unknown"


def bf16_matmul_hardware() -> str | None:
    """The CPU's bf16 matrix hardware, which torch's capability does not name (an AMX Xeon reports AVX512, as an
    AMD EPYC does): "AMX", "AVX512-BF16", or None (AVX2-only CPUs: no bf16 matmul hardware at all)."""
    flags = _cpuinfo("flags").split()
    return "AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None


def name(path) -> str | None:
    """How a record names a checkpoint folder: by what it is (`trained-model/causal/text`, a cached random
    `tiny-causal-seed0-…/text`), or relative to the working directory; never one machine's absolute folders."""
    from .checkpoints import cache_root
    from .checkpoints.trained_model import SHIPPED

    if path is None:
        return None
    resolved = Path(path).resolve()
    for base, prefix in ((SHIPPED, "trained-model"), (cache_root().resolve(), "checkpoints")):
        if resolved.is_relative_to(base):
            return f"{prefix}/{resolved.relative_to(base)}"
    return str(resolved.relative_to(Path.cwd())) if resolved.is_relative_to(Path.cwd()) else str(path)


# Variables with which torch and oneDNN use less of the CPU than it has: a stand-in for an older CPU (step 05's
# attention probe sets them for its AVX2 rows). A record made under them says so in its header and command.
CPU_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_limits() -> dict[str, str]:
    """The CPU_LIMITS set in this process's environment, by name."""
    return {key: os.environ[key] for key in CPU_LIMITS if os.environ.get(key)}


def meta(device: torch.device | str) -> dict:
    limits = cpu_limits()
    return {
        "device": str(device), "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_matmul_hardware": bf16_matmul_hardware(), "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
        "tch": _engine.TCH_VERSION, "rustc": _engine.RUSTC_VERSION,
        "transformers": _version("transformers"), "compressed_tensors": _version("compressed-tensors"),
        "torch_tpu": _version("torch-tpu"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
        **({"cpu_limits": limits} if limits else {}),
    }


def header(meta: dict) -> str:
    """The two lines above every recorded output: where and when it ran, and on which versions."""
    versions = " · ".join(f"{k} {meta[k]}" for k in ("python", "torch", "tch", "transformers",
                                                     "compressed_tensors", "rustc") if meta.get(k))
    # e.g. "Intel Xeon …, AVX512, AMX" or "AMD EPYC …, AVX2"
    cpu = ", ".join(str(meta[k]) for k in ("cpu", "cpu_capability", "bf16_matmul_hardware") if meta.get(k))
    if meta.get("cpu_limits"):  # e.g. "AMD EPYC, AVX2 (limited: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)"
        cpu += f" (limited: {env_prefix(meta['cpu_limits']).strip()})"
    return (f"# recorded {meta['date'][:10]} on {meta['device']} ({cpu}, {meta['cores']} cores)\n"
            f"# {versions}")


def env_prefix(variables: dict[str, str]) -> str:
    """Variables as a shell command's prefix: `A=1 B=2 ` (empty for none)."""
    return "".join(f"{key}={shlex.quote(value)} " for key, value in variables.items())


def write_json(path: str | None, device, **results) -> None:
    """Write `results` plus the meta block to `path` (nothing when path is None): whole or not at all — written
    beside it first, then renamed over it, so a run stopped (or a value JSON cannot hold) midway leaves the file
    that was there."""
    if path:
        partial = Path(f"{path}.partial")
        try:
            partial.write_text(json.dumps({"meta": meta(device), **results}, indent=2))
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
