"""Run step scripts and record what they printed, for the guide: docs/runs/<device>/<name>.{txt,json}.

Which runs to record is listed in tools/records.txt. Each .txt holds the command and its output under a
line naming the device, versions and date (from the `meta` block the script writes with --json), so every
output block in the guide says where it came from.

usage: python tools/record.py [NAME ...] [--device auto|tpu|cuda|cpu]     (no NAME: every line of records.txt)
"""
import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def manifest() -> dict[str, list[str]]:
    """name -> [step, run.py arguments...] from records.txt."""
    lines = (ROOT / "tools" / "records.txt").read_text().splitlines()
    rows = [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {name: rest for name, *rest in rows}


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


def record(name: str, step: str, args: list[str], device: str, out: Path) -> None:
    partial = out / f".{name}.json.partial"  # renamed into place only when the run succeeds
    own_device = "--device" in args  # e.g. parity, which runs on the CPU wherever it is recorded
    cmd = ["python", f"steps/{step}/run.py", *([] if own_device else ["--device", device]), *args]
    print(f"$ {shlex.join(cmd)}", flush=True)
    proc = subprocess.Popen([sys.executable, *cmd[1:], "--json", str(partial.relative_to(ROOT))], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:  # show it live and keep it
        print(line, end="", flush=True)
        lines.append(line)
    if proc.wait() != 0:
        partial.unlink(missing_ok=True)
        sys.exit(f"{name}: {cmd[1]} failed with exit code {proc.returncode}; nothing recorded for it")
    meta = json.loads(partial.read_text())["meta"]
    partial.replace(out / f"{name}.json")
    (out / f"{name}.txt").write_text(f"{header(meta)}\n$ {shlex.join(cmd)}\n{''.join(lines)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="runs to record (default: all of tools/records.txt)")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    runs = manifest()
    unknown = set(a.names) - set(runs)
    if unknown:
        sys.exit(f"not in tools/records.txt: {', '.join(sorted(unknown))}")
    device = resolve(a.device)
    out = ROOT / "docs" / "runs" / device
    out.mkdir(parents=True, exist_ok=True)
    for name in a.names or runs:
        step, *args = runs[name]
        record(name, step, args, device, out)


if __name__ == "__main__":
    main()
