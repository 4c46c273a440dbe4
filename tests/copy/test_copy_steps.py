"""Each step copied out of the repository — with the steps it depends on, and nothing else — installed from its
own files into a fresh virtualenv, and its tests run there. A step that secretly reads the repository's layout,
imports a sibling by path, or forgets a dependency in its pyproject.toml fails here.

The virtualenv gets only what no pyproject can declare: the build tools used without build isolation (maturin,
setuptools), pytest, and torch (torch-sys needs it while compiling; every step pins it). Everything else comes
from each step's own `dependencies`. uv installs them: it hard-links files from its cache, so a torch install
takes a second and no space where pip takes a minute and 5 GB — seven virtualenvs were a third of this test's
time. Rust builds come from the shared cargo target dir, as in `make`. Two copies run at a time (COPY_JOBS), each
with its share of the cores; the end of the run lists each copy's wall time.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import tomllib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
STEPS = sorted(p.parent.name for p in ROOT.glob("steps/*/pyproject.toml"))
# make's setup installs uv into .venv, beside the python running this test
UV = shutil.which("uv", path=os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
# Copies run side by side (COPY_JOBS=1: one after another), the cores shared out among them: torch's threads
# (OpenMP's) each wait for the slowest of them, and more threads than cores made a tiny model's tests many times
# slower. A copy's own tests are mostly one Python thread at a time, so two copies at once keep two cores busy.
JOBS_TEXT = os.environ.get("COPY_JOBS", "2")
if not JOBS_TEXT.strip().isdecimal() or int(JOBS_TEXT) < 1:
    raise pytest.UsageError(f"COPY_JOBS={JOBS_TEXT!r}: how many copies run at a time, a whole number of at least 1")
JOBS = int(JOBS_TEXT)
THREADS = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // JOBS))


def project(step: str) -> dict:
    return tomllib.loads((ROOT / "steps" / step / "pyproject.toml").read_text())["project"]


def needs(step: str) -> list[str]:
    """The steps `step` depends on, from its pyproject dependencies (package names), dependencies first."""
    by_package = {project(s)["name"]: s for s in STEPS}
    names = [Requirement(d).name for d in project(step)["dependencies"]]
    direct = [by_package[n] for n in names if n in by_package]
    ordered = []
    for d in direct:
        ordered += [s for s in [*needs(d), d] if s not in ordered]
    return ordered


def torch_pin(step: str) -> str:
    return next(d for d in project(step)["dependencies"] if d.startswith("torch=="))


def uv(*args: str, cwd: Path, env: dict) -> None:
    proc = subprocess.run([UV, *args, "--quiet"], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"uv {' '.join(args)} failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def step_env(venv: Path) -> dict:
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "LIBTORCH_USE_PYTORCH": "1", "PYTHONPATH": ""}
    env.pop("TORCHTPU_RS_CACHE", None)
    return env


class Wheels:
    """Each step's wheel, built once, by the first copy that installs it. A later copy that depends on that step
    installs the wheel (the same files, so the same build) instead of compiling step 03's crate again at a new
    path: cargo keys a crate's build on its path, and that rebuild was most of this test's time. Copies run side
    by side (COPY_JOBS), so a copy that needs a wheel another copy is building waits for it."""

    def __init__(self, folder: Path):
        self.folder, self.built, self.lock = folder, {}, threading.Lock()  # step -> the future of its wheel

    def wheel(self, venv: Path, step: str, work: Path) -> Path:
        with self.lock:
            mine = step not in self.built
            if mine:
                self.built[step] = Future()
        future = self.built[step]
        if mine:
            try:
                out = self.folder / step  # a folder of its own: two builds at once never see each other's wheel
                uv("build", "--wheel", "--no-build-isolation", "--python", str(venv / "bin" / "python"),
                   "--out-dir", str(out), f"./{step}", cwd=work, env=step_env(venv))
                (wheel,) = out.glob("*.whl")
                future.set_result(wheel)
            except BaseException as e:
                future.set_exception(e)
                raise
        return future.result()

    def install(self, venv: Path, step: str, work: Path) -> None:
        # the wheel's own requirements come from the index (uv's cache); the steps it needs are installed already
        uv("pip", "install", str(self.wheel(venv, step, work)), cwd=work, env=step_env(venv))


def copy_and_test(step: str, wheels: Wheels, folder: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`step` and the steps it needs copied into `folder`, installed into a fresh virtualenv there, its tests run;
    and the seconds the copy and install took."""
    start = time.perf_counter()
    work = folder / "project"
    for s in [*needs(step), step]:
        # not what a build here left (cargo's target, setuptools' build/ and egg-info): setuptools would package a
        # stale build/lib copy into the wheel
        shutil.copytree(ROOT / "steps" / s, work / s,
                        ignore=shutil.ignore_patterns("__pycache__", "target", "build", "*.egg-info"))
    venv = folder / "venv"
    pins = {torch_pin(s) for s in STEPS}
    assert len(pins) == 1, f"the steps pin different torch releases: {sorted(pins)}"
    uv("venv", "--python", sys.executable, str(venv), cwd=folder, env=step_env(venv))
    uv("pip", "install", "maturin", "setuptools", "pytest", *pins, cwd=folder, env=step_env(venv))

    for s in [*needs(step), step]:
        wheels.install(venv, s, work)
    installed_s = time.perf_counter() - start
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=work / step, env={**step_env(venv), "OMP_NUM_THREADS": THREADS}, capture_output=True,
                          text=True), installed_s


# Each copy's wall time in the last run on this machine, beside the other caches that outlive a clone.
CACHE = Path(os.environ.get("GEMMA4_CACHE") or Path.home() / ".cache" / "gemma4-walkthrough")
TIMES = CACHE / "copy-seconds.json"
# Where each copy and its virtualenv live while it runs: the same folder every run, emptied first. Inductor keys
# the C++ it compiles on the compiler's command line, which names the virtualenv's torch headers; in a new
# temporary folder each run, step 05's copy compiled every graph again (209 s of a 276 s copy test, 2026-12-05;
# 192 new files in inductor's cache each run). One make test at a time per machine: two would share the folders.
COPIES = CACHE / "copies"


def last_times() -> dict:
    try:
        return json.loads(TIMES.read_text())
    except (OSError, ValueError):
        return {}


def first(step: str, seconds: dict) -> tuple:
    """The order copies start in: the longest first, by its last run here (step 05's copy took as long as the others
    together, and started third it ended the test alone), so that the two slots end together; without a last run,
    the steps others need first (their wheels), then the longer chains. A copy that needs a wheel another is
    building waits for it, whatever the order."""
    return -seconds.get(step, 0), -sum(step in needs(s) for s in STEPS), -len(needs(step)), step


@pytest.fixture(scope="session")
def copies(request, tmp_path_factory, copy_seconds, install_seconds) -> dict:
    """step -> the future of its copy's test run, for the steps this session selected, COPY_JOBS at a time."""
    selected = sorted({item.callspec.params["step"] for item in request.session.items
                       if item.originalname == "test_a_copied_step_installs_and_passes_its_tests"},
                      key=lambda step: first(step, last_times()))
    wheels = Wheels(tmp_path_factory.mktemp("wheels"))

    def job(step):
        start = time.perf_counter()
        folder = COPIES / step
        shutil.rmtree(folder, ignore_errors=True)  # fresh every run: last run's copy and virtualenv go first
        folder.mkdir(parents=True)
        proc, installed_s = copy_and_test(step, wheels, folder)
        copy_seconds[step] = time.perf_counter() - start
        install_seconds[step] = installed_s
        if proc.returncode == 0:
            shutil.rmtree(folder, ignore_errors=True)  # a virtualenv per copy: keep only a failed one's
        return proc

    with ThreadPoolExecutor(JOBS) as pool:
        yield {step: pool.submit(job, step) for step in selected}
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps({**last_times(), **copy_seconds}, indent=1))


@pytest.mark.parametrize("step", STEPS)
def test_a_copied_step_installs_and_passes_its_tests(step, copies):
    assert UV, "uv is neither beside this python nor on PATH: `make test` installs it into .venv"
    proc = copies[step].result()
    assert proc.returncode == 0, f"the copied {step}'s tests failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout.splitlines()[-1]
