"""Each step copied out of the repository — with the steps it depends on, and nothing else — installed from its
own files into a fresh virtualenv, and its tests run there. A step that secretly reads the repository's layout,
imports a sibling by path, or forgets a dependency in its pyproject.toml fails here.

The virtualenv gets only what no pyproject can declare: the build tools used without build isolation (maturin,
setuptools), pytest, and torch (torch-sys needs it while compiling; every step pins it). Those are installed once,
into a base virtualenv, and each step's virtualenv gets hard links to their files: a torch install takes a minute
and 5 GB, a link takes a second and no space. Everything else comes from each step's own `dependencies`.
Downloads come from pip's cache and Rust builds from the shared cargo target dir, as in `make`.
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


def site_packages(venv: Path) -> Path:
    return venv / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link every file under src into dst, leaving what dst already has (its python, its activate script)."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir() and not path.is_symlink():
            target.mkdir(exist_ok=True)
        elif not target.exists() and not target.is_symlink():
            os.link(path, target, follow_symlinks=False)


def pip(venv: Path, *args: str, cwd: Path) -> None:
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *args], cwd=cwd,
                          env=step_env(venv), capture_output=True, text=True)
    assert proc.returncode == 0, (f"pip install {' '.join(args)} failed in {cwd}:\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def step_env(venv: Path) -> dict:
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "LIBTORCH_USE_PYTORCH": "1", "PYTHONPATH": ""}
    env.pop("TORCHTPU_RS_CACHE", None)
    return env


@pytest.fixture(scope="session")
def base(tmp_path_factory) -> Path:
    """A virtualenv with the build tools, pytest and the steps' torch pin, installed once for every copy."""
    pins = {torch_pin(s) for s in STEPS}
    assert len(pins) == 1, f"the steps pin different torch releases: {sorted(pins)}"
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip(venv, "maturin", "setuptools", "pytest", *pins, cwd=venv)
    return venv


class Wheels:
    """Each step's wheel, built from the first copy that installs it. A later copy that depends on that step
    installs the wheel (the same files, so the same build) instead of compiling step 03's crate again at a new
    path: cargo keys a crate's build on its path, and that rebuild was most of this test's time."""

    def __init__(self, folder: Path):
        self.folder, self.built = folder, {}  # step -> its wheel

    def install(self, venv: Path, step: str, work: Path) -> None:
        if step not in self.built:
            before = set(self.folder.glob("*.whl"))
            proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "wheel", "--quiet", "--no-deps",
                                   "--no-build-isolation", "-w", str(self.folder), f"./{step}"],
                                  cwd=work, env=step_env(venv), capture_output=True, text=True)
            assert proc.returncode == 0, (f"building {step}'s wheel failed:\n{proc.stdout[-3000:]}\n"
                                          f"{proc.stderr[-3000:]}")
            (self.built[step],) = set(self.folder.glob("*.whl")) - before
        # the wheel's own requirements come from the index (pip's cache); the steps it needs are installed already
        pip(venv, str(self.built[step]), cwd=work)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Wheels:
    return Wheels(tmp_path_factory.mktemp("wheels"))


@pytest.mark.parametrize("step", STEPS)
def test_a_copied_step_installs_and_passes_its_tests(step, base, wheels, tmp_path):
    work = tmp_path / "project"
    for s in [*needs(step), step]:
        shutil.copytree(ROOT / "steps" / s, work / s, ignore=shutil.ignore_patterns("__pycache__", "target"))
    venv = tmp_path / "venv"  # empty: even pip comes from the base, so no package is there twice
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    link_tree(site_packages(base), site_packages(venv))
    link_tree(base / "bin", venv / "bin")  # the maturin binary the build backend runs

    for s in [*needs(step), step]:
        wheels.install(venv, s, work)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=work / step, env=step_env(venv), capture_output=True, text=True)
    assert proc.returncode == 0, f"the copied {step}'s tests failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout.splitlines()[-1]
