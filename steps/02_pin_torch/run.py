"""Step 02: the crate is tied to one torch release; Rust reaches any device by following a tensor there.

usage: python run.py [--device auto|tpu|cuda|cpu] [--json PATH]
"""
import argparse
import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from importlib.metadata import requires

import torch  # first: it loads libtorch and libtorch_python, which the Rust extension reuses


# --8<-- [start:check]
def release(version: str) -> str:
    """`2.13.0+cpu` -> `2.13.0`: local build tags (+cpu, +cu130) do not change the C++ API."""
    return version.split("+")[0]


def check_torch() -> str:
    """Compare the installed torch with the one this crate was built for, before loading the crate:
    a libtorch it was not built against can fail to load, or load and crash later."""
    pin = next(r for r in requires("pin-torch-rs") if r.startswith("torch=="))
    expected, installed = pin.removeprefix("torch=="), release(torch.__version__)
    if installed != expected:
        sys.exit(f"torch {installed} is installed, but pin_torch_rs is built with tch 0.26.0, which is generated "
                 f"for torch {expected} exactly.\nFix: pip install torch=={expected}, then rebuild the crate "
                 f"(pip install --no-build-isolation --force-reinstall ./steps/02_pin_torch).")
    return f"torch {installed} installed, crate built for torch {expected}: confirmed"
# --8<-- [end:check]


def choose_device(name: str) -> torch.device:
    """`auto`: a TPU if torch_tpu finds a chip, else CUDA, else the CPU. An explicit choice must exist."""
    has_tpu = hasattr(torch, "tpu") and torch.tpu.device_count() > 0  # torch_tpu adds torch.tpu on import
    if name == "auto":
        name = "tpu" if has_tpu else "cuda" if torch.cuda.is_available() else "cpu"
    if (name == "tpu" and not has_tpu) or (name == "cuda" and not torch.cuda.is_available()):
        sys.exit(f"--device {name}: no such device here (TPU needs torch_tpu on a TPU VM; CUDA needs a GPU)")
    return torch.device("cpu" if name == "cpu" else f"{name}:0")


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


def meta(device: torch.device, crate) -> dict:
    """What a recorded run ran on: printed beside every number this step reports."""
    return {
        "device": str(device), "cpu": cpu_model(), "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
        "tch": crate.TCH_VERSION, "rustc": crate.RUSTC_VERSION,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "tpu", "cuda", "cpu"])
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    print(check_torch())
    import pin_torch_rs  # only now: the check above has made sure it can load

    device = choose_device(args.device)
    # --8<-- [start:demo]
    like = torch.empty(0, device=device)  # any tensor on the target device: only its device matters
    moved = pin_torch_rs.arange_on(5, like)  # built on the host in Rust, then t.type_as(like.to(t.dtype))
    print(f"built in Rust, moved: {moved.tolist()} on {moved.device}")
    kept = pin_torch_rs.on(torch.ones(3, dtype=torch.bfloat16), like)
    print(f"bf16 kept: {kept.dtype}")
    # --8<-- [end:demo]

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta(device, pin_torch_rs), "built_with_torch": pin_torch_rs.BUILT_WITH_TORCH,
                       "moved": moved.tolist(), "device": str(moved.device), "kept_dtype": str(kept.dtype)},
                      f, indent=2)


if __name__ == "__main__":
    main()
