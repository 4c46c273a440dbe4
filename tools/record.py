"""Run step scripts and record what they printed, for the guide: docs/runs/<device>/<name>.{txt,json}.

Which runs to record is listed in tools/records.txt. Each .txt holds the command and its output under a
line naming the device, versions and date (from the `meta` block the script writes with --json), so every
output block in the guide says where it came from.

usage: python tools/record.py [NAME ...] [--device auto|tpu|cuda|cpu]     (no NAME: every line of records.txt)
       python tools/record.py --list tools/bench.txt --folder cpu-e2b     (make bench: the benchmarks)
"""
import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from torchtpu_rs.devices import choose_device

ROOT = Path(__file__).resolve().parents[1]


def manifest(path: Path) -> dict[str, list[str]]:
    """name -> [script, arguments...] from a list such as records.txt."""
    lines = path.read_text().splitlines()
    rows = [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {name: rest for name, *rest in rows}


def resolve(device: str) -> str:
    """The device `--device auto` picks (the steps' own rule), so the recording knows its folder."""
    return choose_device(device).type


def header(meta: dict) -> str:
    versions = " · ".join(f"{k} {meta[k]}" for k in ("python", "torch", "tch", "transformers",
                                                     "compressed_tensors", "rustc") if meta.get(k))
    return (f"# recorded {meta['date'][:10]} on {meta['device']} ({meta['cpu']}, {meta['cores']} cores)\n"
            f"# {versions}")


def record(name: str, script: str, args: list[str], device: str, out: Path) -> None:
    partial = out / f".{name}.json.partial"  # renamed into place only when the run succeeds
    own_device = "--device" in args  # e.g. parity, which runs on the CPU wherever it is recorded
    script = f"steps/{script}" if "/" in script else f"steps/{script}/run.py"  # a step folder means its run.py
    cmd = ["python", script, *([] if own_device else ["--device", device]), *args]
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
    ap.add_argument("--list", type=Path, default=ROOT / "tools" / "records.txt", help="which runs (default: %(default)s)")
    ap.add_argument("--folder", help="folder under docs/runs/ (default: the device's name)")
    a = ap.parse_args()
    runs = manifest(a.list)
    unknown = set(a.names) - set(runs)
    if unknown:
        sys.exit(f"not in {a.list}: {', '.join(sorted(unknown))}")
    device = resolve(a.device)
    out = ROOT / "docs" / "runs" / (a.folder or device)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.names or runs:
        script, *args = runs[name]
        record(name, script, args, device, out)


if __name__ == "__main__":
    main()
