"""Run step scripts and record what they printed, for the guide: docs/runs/<device>/<name>.{txt,json}.

Which runs to record is listed in tools/records.txt. Each .txt holds the command and its output under a
line naming the device, versions and date (from the `meta` block the script writes with --json), so every
output block in the guide says where it came from.

After the scripts, the notebook docs/notebooks/walkthrough.ipynb is one more recorded run: executed cell by
cell (nbclient, a fresh kernel started in docs/notebooks/, as Jupyter would), its outputs written into it, and
its first cell replaced by one naming the device, versions and date the same way. The notebook runs on the
device it finds (its scripts' `--device auto`), so it is recorded only when --device is auto or names that one.

usage: python tools/record.py [NAME ...] [--device auto|tpu|cuda|cpu]     (no NAME: every line of records.txt,
                                                                             then the notebook)
       python tools/record.py notebook                                   (the notebook alone)
       python tools/record.py --list tools/bench.txt --folder cpu-e2b     (make bench: the benchmarks)
       python tools/record.py --list tools/bench.txt --folder cpu-e2b-amx 05_tpu   (one of them, kept apart)
A list's arguments may name `{folder}`, the output folder (docs/runs/cpu-e2b), so a chart lands beside its record.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from torchtpu_rs import records
from torchtpu_rs.devices import choose_device

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebooks" / "walkthrough.ipynb"
HEADER_TAG = "recorded-header"  # the notebook's first cell, written by record_notebook(); replaced on every run


def manifest(path: Path) -> dict[str, list[str]]:
    """name -> [script, arguments...] from a list such as records.txt."""
    lines = path.read_text().splitlines()
    rows = [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return {name: rest for name, *rest in rows}


def resolve(device: str) -> str:
    """The device `--device auto` picks (the steps' own rule), so the recording knows its folder."""
    return choose_device(device).type


def record(name: str, script: str, args: list[str], device: str, out: Path) -> None:
    partial = out / f".{name}.json.partial"  # renamed into place only when the run succeeds
    own_device = "--device" in args  # e.g. parity, which runs on the CPU wherever it is recorded
    script = f"steps/{script}" if "/" in script else f"steps/{script}/run.py"  # a step folder means its run.py
    folder = str(out.relative_to(ROOT))  # a list's `{folder}` (say, in `--chart {folder}/05_tpu.png`) is this
    args = [arg.replace("{folder}", folder) for arg in args]
    cmd = ["python", script, *([] if own_device else ["--device", device]), *args]
    command = records.env_prefix(records.cpu_limits()) + shlex.join(cmd)  # as typed, any CPU limits included
    print(f"$ {command}", flush=True)
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
    (out / f"{name}.txt").write_text(f"{records.header(meta)}\n$ {command}\n{''.join(lines)}")


def header_cell_text(meta: dict) -> str:
    """The notebook's first cell: the same header lines as every recorded .txt, as a Markdown code block."""
    return ("**A recorded run.** `make run` (`tools/record.py`) executed this copy of the notebook cell by cell; "
            "every output below is what its cell printed there. Run it yourself and your outputs replace them.\n\n"
            f"```text\n{records.header(meta)}\n$ {meta['command']}\n```")


def github_origin() -> tuple[str, str] | None:
    """(owner/name, branch) of this clone: from GITHUB_REPOSITORY and GITHUB_REF_NAME when set (CI), else from a
    github.com `origin` remote and the checked-out branch; None when neither says."""
    if os.environ.get("GITHUB_REPOSITORY") and os.environ.get("GITHUB_REF_NAME"):
        return os.environ["GITHUB_REPOSITORY"], os.environ["GITHUB_REF_NAME"]
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    remote = git("remote", "get-url", "origin")
    m = re.match(r"(?:https://github\.com/|git@github\.com:)([\w.-]+/[\w.-]+?)(?:\.git)?/?$", remote)
    branch = git("branch", "--show-current")
    return (m[1], branch) if m and branch else None


def name_repository(nb) -> None:
    """Write this clone's GitHub repository and branch into the setup cell's REPOSITORY/BRANCH lines, so a
    fresh Colab runtime clones what the notebook came from; left as they are when this clone cannot say."""
    origin = github_origin()
    if not origin:
        return
    for cell in nb.cells:
        if cell.cell_type == "code" and "REPOSITORY = " in cell.source:
            for var, value in zip(("REPOSITORY", "BRANCH"), origin):
                cell.source = re.sub(rf'^{var} = "[^"]*"', f'{var} = "{value}"', cell.source, count=1, flags=re.M)


def record_notebook(device: str, path: Path = NOTEBOOK) -> None:
    """Execute the notebook with a fresh kernel, write it back with its outputs and a header cell."""
    import nbformat  # the docs extra (mkdocs-jupyter) brings nbformat, nbclient and ipykernel
    from nbclient import NotebookClient

    found = resolve("auto")
    if device != found:
        print(f"notebook: not recorded: it runs on the device it finds ({found}), not on --device {device}")
        return
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if HEADER_TAG not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    name_repository(nb)
    command = f"jupyter: {path.relative_to(ROOT)}, every cell in order (nbclient)"
    print(f"$ {command}", flush=True)
    started = time.monotonic()

    def show(cell, cell_index, **_):  # each cell's output as it finishes, like the scripts' live output
        if cell.cell_type == "code":
            print(f"[{cell_index}] {cell.source.splitlines()[-1] if cell.source else ''}", flush=True)
            for out in cell.outputs:
                print(out.get("text", ""), end="", flush=True)

    client = NotebookClient(nb, kernel_name="python3", timeout=None, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}}, on_cell_executed=show)
    try:
        client.execute()
    except Exception as e:  # a failing cell: nothing is written, like a failing script
        sys.exit(f"notebook: {path.relative_to(ROOT)} failed, nothing recorded for it:\n{e}")
    meta = {**records.meta(device), "command": command}
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(header_cell_text(meta), metadata={"tags": [HEADER_TAG]}))
    nb.metadata.pop("widgets", None)
    partial = path.with_name(f".{path.name}.partial")
    nbformat.write(nb, partial)
    partial.replace(path)
    print(f"notebook: {path.relative_to(ROOT)} recorded in {time.monotonic() - started:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="runs to record (default: all of tools/records.txt)")
    ap.add_argument("--device", default="auto", choices=["auto", "tpu", "cuda", "cpu"])
    ap.add_argument("--list", type=Path, default=ROOT / "tools" / "records.txt",
                    help="which runs (default: %(default)s)")
    ap.add_argument("--folder", help="folder under docs/runs/ (default: the device's name)")
    a = ap.parse_args()
    if not a.list.is_file():
        ap.error(f"--list {a.list}: no such file")
    runs = manifest(a.list)
    default_list = a.list.resolve() == (ROOT / "tools" / "records.txt")
    unknown = set(a.names) - set(runs) - ({"notebook"} if default_list else set())
    if unknown:
        sys.exit(f"not in {a.list}: {', '.join(sorted(unknown))}")
    device = resolve(a.device)
    out = ROOT / "docs" / "runs" / (a.folder or device)
    out.mkdir(parents=True, exist_ok=True)
    for name in [n for n in a.names if n != "notebook"] if a.names else runs:
        script, *args = runs[name]
        record(name, script, args, device, out)
    if default_list and (not a.names or "notebook" in a.names):
        record_notebook(device)  # after the scripts: `make run` runs each thing once


if __name__ == "__main__":
    main()
