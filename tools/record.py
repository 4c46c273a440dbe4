"""Run one step's script and record what it printed, for the guide: docs/runs/<device>/<step>.{txt,json}.

The .txt is the command and its output under a line naming the device, versions and date (taken from the
`meta` block the script writes with --json), so every output block in the guide says where it came from.

usage: python tools/record.py steps/01_bridge [--device auto|tpu|cuda|cpu] [-- extra run.py arguments]
"""
import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def resolve(device: str) -> str:
    """The device `--device auto` picks (a TPU, else CUDA, else the CPU), so the recording knows its folder."""
    if device != "auto":
        return device
    if hasattr(torch, "tpu") and torch.tpu.device_count() > 0:
        return "tpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def header(meta: dict) -> str:
    versions = " · ".join(f"{k} {meta[k]}" for k in ("python", "torch", "tch", "transformers",
                                                     "compressed_tensors", "rustc") if meta.get(k))
    return (f"# recorded {meta['date'][:10]} on {meta['device']} ({meta['cpu']}, {meta['cores']} cores)\n"
            f"# {versions}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", type=Path)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, help="folder for the records (default docs/runs/<device>)")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="arguments passed on to run.py after --")
    a = ap.parse_args()
    device = resolve(a.device)
    out = (a.out or ROOT / "docs" / "runs" / device).resolve()
    out.mkdir(parents=True, exist_ok=True)
    name = a.step.resolve().name
    json_path = out / f".{name}.json.partial"  # renamed into place only when the run succeeds
    extra = [x for x in a.extra if x != "--"]
    cmd = ["python", f"steps/{name}/run.py", "--device", device, *extra]
    print(f"$ {shlex.join(cmd)}", flush=True)
    proc = subprocess.Popen([sys.executable, *cmd[1:], "--json", str(json_path.relative_to(ROOT))], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # show it live and keep it
        print(line, end="", flush=True)
        lines.append(line)
    if proc.wait() != 0:
        sys.exit(f"{cmd[1]} failed with exit code {proc.returncode}; nothing recorded for it")
    meta = json.loads(json_path.read_text())["meta"]
    json_path.replace(out / f"{name}.json")
    (out / f"{name}.txt").write_text(f"{header(meta)}\n$ {shlex.join(cmd)}\n{''.join(lines)}")


if __name__ == "__main__":
    main()
