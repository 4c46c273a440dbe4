"""The environment of a child process that runs one of this project's packages (`python -m package.module`)."""
import os
from pathlib import Path


def source_first(env: dict, module_file: str) -> dict:
    """`env`, changed in place and returned: when the package of `module_file` runs from its step's folder (a
    pyproject.toml there: not installed), that folder goes first on PYTHONPATH, so the child imports this copy."""
    step = Path(module_file).resolve().parents[1]
    if (step / "pyproject.toml").is_file():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(step), env.get("PYTHONPATH")) if p)
    return env
