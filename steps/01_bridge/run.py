"""Step 01: a tensor made in Python, multiplied in Rust, handed back to Python.

usage: python run.py [--device auto|tpu|cuda|cpu] [--json PATH]
"""
import argparse
import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone

import torch  # first: it loads libtorch and libtorch_python, which the Rust extension reuses

import bridge_rs  # isort: skip  (after torch, on purpose)


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


def meta(device: torch.device) -> dict:
    """What a recorded run ran on: printed beside every number this step reports."""
    return {
        "device": str(device), "cpu": cpu_model(), "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
        "tch": bridge_rs.TCH_VERSION, "rustc": bridge_rs.RUSTC_VERSION,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "tpu", "cuda", "cpu"])
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    device = choose_device(args.device)

    # --8<-- [start:demo]
    x = torch.ones(4, 4, device=device)
    total = bridge_rs.matmul_sum(x)  # computed by tch-rs, on x's device
    print(f"Rust matmul then sum: {total.item()} on {total.device}")

    back = bridge_rs.roundtrip(x)  # into Rust and back: the same memory, not a copy
    print(f"same storage after a round trip through Rust: {back.data_ptr() == x.data_ptr()}")
    # --8<-- [end:demo]

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta(device), "matmul_sum": total.item(), "device": str(total.device),
                       "shared_storage": back.data_ptr() == x.data_ptr()}, f, indent=2)


if __name__ == "__main__":
    main()
