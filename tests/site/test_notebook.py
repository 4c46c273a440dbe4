"""The "Run it all" notebook, docs/notebooks/walkthrough.ipynb: what it runs, what its recorded copy shows, and
its setup cell in the three places it is meant for.

- its cells: each step folder with a run.py has one cell running that script, in order, with `.venv/bin/python`;
  no cell imports torch into the notebook's own kernel;
- the committed, executed copy (written by `tools/record.py`) against the recorded runs under docs/runs/ of the
  same commands, as they are at test time: the same lines, the same text and the same numbers, except a recorded
  number that is the rounding of a measured figure in that run's JSON (a key ending in `_s` or `_gb`: times,
  speeds, memory), which may differ;
- a quick variant executed here with a fresh kernel (nbclient): the setup cell, steps 01–04, and step 05 with one
  way (`--ways rust-eager`), on the steps' default model — about a minute on 2 cores; it fails if a cell errors;
- the setup cell run by a plain Python with fake commands on PATH (git, curl, sh, make, rustc, pip: each logs
  its arguments and does nothing), so it runs no network and installs nothing: a fresh Colab runtime with and
  without a TPU, another Linux machine, this repository's own .venv, and a Python 3.10 that must stop at once;
- the "Open in Colab" link, from a build with fake GITHUB_REPOSITORY and GITHUB_REF_NAME: the exact href.
"""
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "docs" / "notebooks" / "walkthrough.ipynb"
STEP_CELL = re.compile(r"^!\.venv/bin/python (steps/(\w+)/run\.py)((?: \S+)*)\s*$")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
MEASURED_KEY = re.compile(r"(_s|_gb)$")
QUICK_STEPS = ("01_bridge", "02_pin_torch", "03_model", "04_parity", "05_tpu")
QUICK_EXTRA = {"05_tpu": " --ways rust-eager"}  # one way of step 05: no compile, no second process per way


def load(path: Path = NOTEBOOK) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def step_cells(nb: dict) -> list[tuple[int, str, str, list[str]]]:
    """(cell index, step folder, script, arguments) of each cell that runs a step's script."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        m = STEP_CELL.match(source(cell).strip()) if cell["cell_type"] == "code" else None
        if m:
            found.append((i, m[2], m[1], shlex.split(m[3])))
    return found


def setup_source(nb: dict) -> str:
    return next(source(c) for c in nb["cells"] if c["cell_type"] == "code" and "REPOSITORY = " in source(c))


def output_text(cell: dict) -> str:
    """What a cell printed to stdout, as a terminal would show it: \\r\\n as \\n, a line redrawn after \\r as its last
    draw."""
    # a stream's text is a string, or a list of lines as the .ipynb file stores it
    texts = [o.get("text", "") for o in cell.get("outputs", []) if o["output_type"] == "stream"]
    text = "".join(t if isinstance(t, str) else "".join(t) for t in texts)
    lines = [line.split("\r")[-1] for line in text.replace("\r\n", "\n").split("\n")]
    return "\n".join(line for line in lines if not stderr_warning(line))


# `!cmd` merges a script's stderr into its output; tools/record.py records stdout only. Library warnings are the
# stderr lines a run prints: Python's (`file.py:N: SomeWarning: …` and the source line under it) and
# Transformers' logger (`[transformers] …`).
WARNING = re.compile(r"^(\S+\.py:\d+: \w*Warning: |\[transformers\] |  \S.*= func\(self, \*args, \*\*kwargs\)$)")


def stderr_warning(line: str) -> bool:
    return bool(WARNING.match(line))


def recorded_device(nb: dict) -> str | None:
    first = source(nb["cells"][0]) if nb["cells"] else ""
    m = re.search(r"^# recorded \S+ on (\S+) ", first, re.M)
    return m[1] if m else None


def records() -> dict[str, list[str]]:
    """tools/records.txt: name -> [step folder or script, arguments...]."""
    rows = [shlex.split(line) for line in (REPO / "tools" / "records.txt").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    return {name: rest for name, *rest in rows}


def record_for(script: str, args: list[str]) -> str | None:
    """The records.txt name whose run is this command (record.py adds --device to a line that has none)."""
    for name, (target, *rec_args) in records().items():
        rec_script = f"steps/{target}" if "/" in target else f"steps/{target}/run.py"
        if rec_script == script and rec_args == args:
            return name
    return None


def measured(results, key: str = "") -> list[float]:
    """Every measured figure of a run's JSON (keys ending in _s or _gb), the meta block left out."""
    if isinstance(results, dict):
        return [v for k, x in results.items() if k != "meta" for v in measured(x, k)]
    if isinstance(results, list):
        return [v for x in results for v in measured(x, key)]
    return [float(results)] if MEASURED_KEY.search(key) and isinstance(results, (int, float)) else []


def differences(recorded: str, figures: list[float], shown: str) -> list[str]:
    """Where `shown` (the notebook's output) is not the recorded output up to measured figures."""
    def is_measured(token: str) -> bool:
        decimals = len(token.split(".")[1]) if "." in token and "e" not in token else 0
        return any(f"{v:.{decimals}f}" == token for v in figures)

    rec, got = recorded.strip("\n").split("\n"), shown.strip("\n").split("\n")
    if len(rec) != len(got):
        return [f"{len(got)} lines, the recorded run has {len(rec)}:\n  recorded: {rec}\n  notebook: {got}"]
    found = []
    for n, (a, b) in enumerate(zip(rec, got), 1):
        def skeleton(s):
            return " ".join(NUMBER.sub("#", s).split())
        if skeleton(a) != skeleton(b):
            found.append(f"line {n} differs:\n  recorded: {a}\n  notebook: {b}")
            continue
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
            if x != y and not is_measured(x):
                found.append(f"line {n}: {x} recorded, {y} in the notebook (not a measured figure):\n  {a}\n  {b}")
                break
    return found


# ------------------------------------------------------------------------------------------------ the cells

def test_every_step_has_one_cell_in_order():
    steps = sorted(p.parent.name for p in (REPO / "steps").glob("*/run.py"))
    cells = [folder for _, folder, _, _ in step_cells(load())]
    assert cells == steps, (f"the notebook runs {cells}; the steps with a run.py are {steps}: add a markdown cell "
                            "(what the step adds, a link to its page) and a cell `!.venv/bin/python "
                            "steps/NN_name/run.py` for each, in order")


def test_the_kernel_never_imports_torch_and_every_link_names_a_page():
    nb = load()
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] == "code":
            python = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("!"))
            assert not re.search(r"^\s*(import|from)\s+(torch|torchtpu_\w+|transformers)\b", python, re.M), text
        for link in re.findall(r"\]\(([^)#]+\.md)\)", text):
            assert (NOTEBOOK.parent / link).resolve().is_file(), f"a link to {link}, which is not under docs/"


def test_the_optional_real_model_cell_uses_the_articles_repacks():
    text = "\n".join(source(c) for c in load()["cells"])
    assert "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text" in text
    assert "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text-emb4" in text
    assert re.search(r"^REAL_MODEL = False", text, re.M), "the download stays off unless the reader turns it on"


# ------------------------------------------------------------------------------ the committed, executed copy

def test_committed_notebook_shows_what_the_recorded_runs_printed():
    nb = load()
    device = recorded_device(nb)
    if device is None:
        pytest.fail("the committed notebook has no recorded-run header cell: run `python tools/record.py notebook`")
    runs = REPO / "docs" / "runs" / device
    if not runs.is_dir():
        pytest.skip(f"no recorded runs for {device} (docs/runs/{device}/) to compare the notebook with")
    problems = []
    for i, folder, script, args in step_cells(nb):
        cell = nb["cells"][i]
        errors = [o for o in cell.get("outputs", []) if o["output_type"] == "error"]
        if errors or not cell.get("outputs"):
            problems.append(f"cell {i} ({folder}): {'an error output' if errors else 'no output'}")
            continue
        name = record_for(script, args)
        if name is None or not (runs / f"{name}.txt").is_file():
            problems.append(f"cell {i}: no recorded run of `{shlex.join(['python', script, *args])}` in {runs}")
            continue
        body = (runs / f"{name}.txt").read_text(encoding="utf-8").split("\n", 3)[3]  # after the 3 header lines
        figures = measured(json.loads((runs / f"{name}.json").read_text()))
        problems += [f"cell {i} vs docs/runs/{device}/{name}.txt: {d}"
                     for d in differences(body, figures, output_text(cell))]
    assert not problems, ("the executed notebook does not show what the recorded runs printed (re-run `make run`):\n"
                          + "\n".join(problems))


def test_the_comparison_allows_measured_figures_only():
    recorded = "load 0.0 (1, 4, 5, 32)\nread 0.043 s (278 tok/s)\nanswer 610395 found yes\n"
    figures = [0.041, 0.0431, 278.25]
    assert not differences(recorded, figures,
                           "load 0.7 (1, 4, 5, 32)\nread 0.741 s (16 tok/s)\nanswer 610395 found yes")
    assert differences(recorded, figures, "load 0.7 (1, 4, 5, 32)\nread 0.741 s (16 tok/s)\nanswer 610396 found yes")
    assert differences(recorded, figures, "load 0.7 (1, 4, 5, 33)\nread 0.741 s (16 tok/s)\nanswer 610395 found yes")
    assert differences(recorded, figures, "load 0.7 (1, 4, 5, 32)\nread 0.741 s (16 tok/s)\nanswer 610395 found no")
    assert differences(recorded, figures, "load 0.7 (1, 4, 5, 32)\nanswer 610395 found yes")
    assert measured({"meta": {"x_s": 1}, "rows": [{"read_s": 0.5, "tokens": [1, 2], "peak_gb": 0.6}]}) == [0.5, 0.6]


# ------------------------------------------------------------------------------------- the quick variant

def quick_variant(nb: dict) -> dict:
    """The setup cell, then steps 01–04 and one way of step 05, each as the notebook runs it."""
    keep = [c for c in nb["cells"] if c["cell_type"] == "code" and "REPOSITORY = " in source(c)]
    for i, folder, _, _ in step_cells(nb):
        if folder in QUICK_STEPS:
            cell = json.loads(json.dumps(nb["cells"][i]))
            cell["source"] = source(cell).rstrip() + QUICK_EXTRA.get(folder, "")
            keep.append(cell)
    return {**nb, "cells": keep}


def test_quick_variant_runs_without_an_error(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    if not (REPO / ".venv" / ".steps").is_file():
        pytest.skip("the steps are not built into .venv (make setup)")
    nb = nbformat.reads(json.dumps(quick_variant(load())), as_version=4)  # sources joined, as nbclient wants
    for cell in nb.cells:
        cell.outputs, cell.execution_count = [], None
    assert [f for _, f, _, _ in step_cells(nb)] == list(QUICK_STEPS)
    NotebookClient(nb, kernel_name="python3", timeout=600, allow_errors=False,
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()  # raises on an error cell
    nbformat.write(nb, tmp_path / "quick.ipynb")
    printed = [output_text(c) for c in nb.cells]
    assert "in this repository's own .venv" in printed[0] and "nothing to install" in printed[0], printed[0]
    assert all(text.strip() for text in printed), "a cell printed nothing"


def test_a_failing_step_fails_its_cell():
    """The setup cell makes a `!` command that exits non-zero raise, so a failing script stops "Run all"."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    if not (REPO / ".venv" / ".steps").is_file():
        pytest.skip("the steps are not built into .venv (make setup)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup_source(load())),
                                         nbformat.v4.new_code_cell("!.venv/bin/python -c 'raise SystemExit(3)'")])
    with pytest.raises(CellExecutionError, match="failed with exit code 3"):
        NotebookClient(nb, kernel_name="python3", timeout=120,
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()


# ------------------------------------------------------------------------------------- the setup cell

FAKES = {
    # each logs "name args" (and the variables that matter) to $FAKE_LOG and does the least the cell relies on
    "git": 'echo "git $*" >> "$FAKE_LOG"; if [ "$1" = clone ]; then d="${@: -1}"; mkdir -p "$d/steps" "$d/tools";'
           ' touch "$d/Makefile" "$d/tools/record.py"; fi',
    "curl": 'echo "curl $*" >> "$FAKE_LOG"; while [ $# -gt 1 ]; do [ "$1" = -o ] && : > "$2"; shift; done',
    "sh": 'echo "sh $* CARGO_HOME=$CARGO_HOME RUSTUP_HOME=$RUSTUP_HOME" >> "$FAKE_LOG"; mkdir -p "$CARGO_HOME/bin";'
          ' printf \'#!/bin/bash\\necho "rustc 1.95.0 (fake)"\\n\' > "$CARGO_HOME/bin/rustc"; chmod +x "$CARGO_HOME/bin/rustc"',  # noqa: E501
    "make": 'echo "make $* (in $PWD)" >> "$FAKE_LOG"; mkdir -p .venv/bin; printf \'#!/bin/bash\\n'
            'echo "pip $* (in $PWD)" >> "$FAKE_LOG"\\n\' > .venv/bin/pip; chmod +x .venv/bin/pip; touch .venv/.steps',
    "rustc": 'echo "rustc ${FAKE_RUSTC:-1.75.0} (fake)"',
}


def run_setup_cell(tmp_path: Path, env: dict, cwd: Path | None = None, python: list[str] | None = None,
                   rustc: bool = True) -> tuple[subprocess.CompletedProcess, list[str]]:
    fakes = tmp_path / "fakebin"
    fakes.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        if name == "rustc" and not rustc:
            continue
        (fakes / name).write_text(f"#!/bin/bash\n{body}\n")
        (fakes / name).chmod(0o755)
    cell = tmp_path / "setup_cell.py"
    cell.write_text(setup_source(load()))
    log = tmp_path / "commands.log"
    log.touch()
    work = cwd or tmp_path / "content"
    work.mkdir(exist_ok=True)
    base = {"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_LOG": str(log), "LANG": "C.UTF-8"}
    proc = subprocess.run([*(python or [sys.executable]), str(cell)], cwd=work, env={**base, **env},
                          capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines()


COLAB = {"COLAB_RELEASE_TAG": "fake-release", "WALKTHROUGH_REPOSITORY": "fake-owner/fake-walkthrough",
         "WALKTHROUGH_BRANCH": "fake-branch"}


@pytest.mark.parametrize("tpu", [False, True], ids=["cpu-runtime", "tpu-runtime"])
def test_setup_cell_on_a_fresh_colab_runtime(tmp_path, tpu):
    env = {**COLAB, **({"TPU_ACCELERATOR_TYPE": "v5litepod-1"} if tpu else {})}
    proc, log = run_setup_cell(tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = tmp_path / "content" / "fake-walkthrough"
    expected = [
        f"git clone --depth 1 --branch fake-branch https://github.com/fake-owner/fake-walkthrough.git {root}",
        f"curl --proto =https --tlsv1.2 -sSf https://sh.rustup.rs -o {root}/.venv/rustup-init.sh",
        f"sh {root}/.venv/rustup-init.sh -y --no-modify-path --profile minimal "
        f"CARGO_HOME={root}/.venv/cargo RUSTUP_HOME={root}/.venv/rustup",
        f"make setup PYTHON={sys.executable} (in {root})",
        *([f"pip install .[tpu] (in {root})"] if tpu else []),
    ]
    assert log == expected, "\n".join(log)
    out = proc.stdout
    assert "setup: in a fresh Colab runtime" in out and ("a TPU is here" if tpu else "no TPU here") in out, out
    assert "rustc 1.75: the steps need 1.85 or newer" in out, out
    for part in ("clone", "download rustup", "install Rust", "make setup", *(["TorchTPU into .venv"] if tpu else [])):
        assert re.search(rf"^== {re.escape(part)}: \d+\.\d s$", out, re.M), f"no time printed for {part}:\n{out}"
    assert "rustc 1.95.0 (fake)" in out.splitlines()[-1], "the cell ends on the Rust it installed into .venv"


def test_setup_cell_on_another_linux_machine(tmp_path):
    """Not Colab, Rust new enough: clone and `make setup`, nothing else."""
    env = {"WALKTHROUGH_REPOSITORY": "fake-owner/fake-walkthrough", "FAKE_RUSTC": "1.90.0"}
    proc, log = run_setup_cell(tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = tmp_path / "content" / "fake-walkthrough"
    assert [line.split()[0] for line in log] == ["git", "make"], log
    assert "setup: in a Linux machine without the walkthrough's .venv" in proc.stdout, proc.stdout
    assert f"ready: {root}" in proc.stdout


def test_setup_cell_stops_when_it_does_not_know_what_to_clone(tmp_path):
    proc, log = run_setup_cell(tmp_path, {"COLAB_RELEASE_TAG": "fake-release"})
    assert proc.returncode != 0 and "REPOSITORY is empty" in proc.stderr, proc.stderr
    assert log == []


def test_setup_cell_in_this_repositorys_own_venv(tmp_path):
    if not (REPO / ".venv" / ".steps").is_file():
        pytest.skip("the steps are not built into .venv (make setup)")
    proc, log = run_setup_cell(tmp_path, {"COLAB_RELEASE_TAG": "fake-release"}, cwd=NOTEBOOK.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log == [], "the repository's own .venv needs nothing installed"
    assert "setup: in this repository's own .venv" in proc.stdout and "nothing to install" in proc.stdout


def python_310() -> list[list[str]]:
    """A real Python 3.10 when one is on PATH; always also this Python told it is 3.10 (sys.version_info)."""
    fake = [sys.executable, "-c", "import sys; sys.version_info = (3, 10, 14, 'final', 0); "
            "sys.version = '3.10.14 (stand-in)'; p = sys.argv[1]; sys.argv = sys.argv[1:]; "
            "exec(compile(open(p).read(), p, 'exec'))"]
    candidates = [shutil.which("python3.10"), *sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3.10"))]
    for found in filter(None, candidates):  # a pyenv shim may name no interpreter: ask each for its own path
        real = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True,
                              text=True).stdout.strip()
        if real:
            return [fake, [real]]
    return [fake]


@pytest.mark.parametrize("python", python_310(), ids=lambda p: "python3.10" if len(p) == 1 else "stand-in-3.10")
def test_setup_cell_stops_at_once_on_python_310(tmp_path, python):
    proc, log = run_setup_cell(tmp_path, COLAB, python=python)
    assert proc.returncode != 0
    assert "Python 3.10" in proc.stderr and "needs Python 3.11 or newer" in proc.stderr, proc.stderr
    assert log == [] and not proc.stdout, "nothing runs before the version check"
    assert not (tmp_path / "content" / "fake-walkthrough").exists()


# ----------------------------------------------------------------------------------------- the Colab link

def hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "tools" / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_build_without_repository_and_branch_leaves_the_link_out():
    block = hooks().colab_block({})
    assert "colab.research.google.com" not in block
    assert 'No "Open in Colab" link in this build' in block and "GITHUB_REPOSITORY" in block


def test_the_colab_link_names_the_repository_and_branch_built(tmp_path):
    if not shutil.which("mkdocs"):
        pytest.skip("mkdocs is not installed (the docs extra)")
    env = {**os.environ, "GITHUB_REPOSITORY": "fake-owner/fake-fork", "GITHUB_REF_NAME": "fake-branch",
           "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(["mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
                   check=True, timeout=300)
    href = ("https://colab.research.google.com/github/fake-owner/fake-fork/blob/fake-branch/"
            "docs/notebooks/walkthrough.ipynb")
    for page in ("notebooks/walkthrough/index.html", "tpu/index.html"):
        html = (tmp_path / "site" / page).read_text(encoding="utf-8")
        links = re.findall(r'<a [^>]*id="open-in-colab"[^>]*>', html)
        assert len(links) == 1, f"{page}: {links}"
        assert f'href="{href}"' in links[0], f"{page}: {links[0]}"
