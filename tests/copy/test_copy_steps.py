"""Each step copied out of the repository — with the steps it depends on, and nothing else — installed from its
own files into a fresh virtualenv, and its tests run there. A step that secretly reads the repository's layout,
imports a sibling by path, or forgets a dependency in its pyproject.toml fails here.

The virtualenv gets only what no pyproject can declare: the build tools used without build isolation (maturin,
setuptools), pytest, and torch (torch-sys needs it while compiling). Everything else comes from each step's own
`dependencies`. Downloads come from pip's cache and Rust builds from the shared cargo target dir, as in `make`.
"""
import os
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize("step", STEPS)
def test_a_copied_step_installs_and_passes_its_tests(step, tmp_path):
    work = tmp_path / "project"
    for s in [*needs(step), step]:
        shutil.copytree(ROOT / "steps" / s, work / s, ignore=shutil.ignore_patterns("__pycache__", "target"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "LIBTORCH_USE_PYTORCH": "1", "PYTHONPATH": ""}
    env.pop("TORCHTPU_RS_CACHE", None)

    def run(*cmd, cwd=work):
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    run("python", "-m", "pip", "install", "--quiet", "maturin", "setuptools", "pytest", torch_pin(step))
    for s in [*needs(step), step]:
        run("python", "-m", "pip", "install", "--quiet", "--no-build-isolation", f"./{s}")
    proc = run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=work / step)
    assert " passed" in proc.stdout.splitlines()[-1]
