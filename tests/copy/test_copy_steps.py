"""Each step copied out of the repository — with the steps it depends on, and nothing else — installed from its
own files into a fresh virtualenv, and its tests run there. A step that secretly reads the repository's layout,
imports a sibling by path, or forgets a dependency in its pyproject.toml fails here.

The virtualenv gets only what no pyproject can declare: the build tools used without build isolation (maturin,
setuptools), pytest, and torch (torch-sys needs it while compiling; every step pins it). Everything else comes
from each step's own `dependencies`. uv installs them: it hard-links files from its cache, so a torch install
takes a second and no space where pip takes a minute and 5 GB — seven virtualenvs were a third of this test's
time. Rust builds come from the shared cargo target dir, as in `make`.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
STEPS = sorted(p.parent.name for p in ROOT.glob("steps/*/pyproject.toml"))
# make's setup installs uv into .venv, beside the python running this test
UV = shutil.which("uv", path=os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))


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
    """Each step's wheel, built from the first copy that installs it. A later copy that depends on that step
    installs the wheel (the same files, so the same build) instead of compiling step 03's crate again at a new
    path: cargo keys a crate's build on its path, and that rebuild was most of this test's time."""

    def __init__(self, folder: Path):
        self.folder, self.built = folder, {}  # step -> its wheel

    def install(self, venv: Path, step: str, work: Path) -> None:
        if step not in self.built:
            before = set(self.folder.glob("*.whl"))
            uv("build", "--wheel", "--no-build-isolation", "--python", str(venv / "bin" / "python"),
               "--out-dir", str(self.folder), f"./{step}", cwd=work, env=step_env(venv))
            (self.built[step],) = set(self.folder.glob("*.whl")) - before
        # the wheel's own requirements come from the index (uv's cache); the steps it needs are installed already
        uv("pip", "install", str(self.built[step]), cwd=work, env=step_env(venv))


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Wheels:
    return Wheels(tmp_path_factory.mktemp("wheels"))


@pytest.mark.parametrize("step", STEPS)
def test_a_copied_step_installs_and_passes_its_tests(step, wheels, tmp_path):
    assert UV, "uv is neither beside this python nor on PATH: `make test` installs it into .venv"
    work = tmp_path / "project"
    for s in [*needs(step), step]:
        shutil.copytree(ROOT / "steps" / s, work / s, ignore=shutil.ignore_patterns("__pycache__", "target"))
    venv = tmp_path / "venv"
    pins = {torch_pin(s) for s in STEPS}
    assert len(pins) == 1, f"the steps pin different torch releases: {sorted(pins)}"
    uv("venv", "--python", sys.executable, str(venv), cwd=tmp_path, env=step_env(venv))
    uv("pip", "install", "maturin", "setuptools", "pytest", *pins, cwd=tmp_path, env=step_env(venv))

    for s in [*needs(step), step]:
        wheels.install(venv, s, work)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=work / step, env=step_env(venv), capture_output=True, text=True)
    assert proc.returncode == 0, f"the copied {step}'s tests failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout.splitlines()[-1]
