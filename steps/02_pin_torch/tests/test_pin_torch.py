"""Step 02 checks: the torch pin is verified, and `on` moves tensors by device while keeping their dtype."""
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

import pin_torch_rs
import pytest
import torch

RUN = Path(__file__).resolve().parents[1] / "run.py"
ENGINE_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool]


def load_run_py():
    spec = importlib.util.spec_from_file_location("pin_torch_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crate_was_built_against_the_installed_torch():
    run = load_run_py()
    assert run.release(pin_torch_rs.BUILT_WITH_TORCH) == run.release(torch.__version__) == "2.13.0"
    assert pin_torch_rs.TCH_VERSION == "0.26.0"


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.0+cu130"])
def test_check_accepts_the_pinned_release_with_any_build_tag(monkeypatch, version):
    run = load_run_py()
    monkeypatch.setattr(run.torch, "__version__", version)
    assert run.check_torch().endswith("confirmed")


@pytest.mark.parametrize("version", ["2.14.1", "2.12.0+cpu", "2.13.1"])
def test_check_refuses_another_release_and_says_what_to_install(monkeypatch, version):
    run = load_run_py()
    monkeypatch.setattr(run.torch, "__version__", version)
    with pytest.raises(SystemExit) as e:
        run.check_torch()
    assert f"torch {version.split('+')[0]} is installed" in str(e.value)
    assert "pip install torch==2.13.0" in str(e.value)


HAS_TPU = hasattr(torch, "tpu") and torch.tpu.device_count() > 0
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
    pytest.param("tpu", marks=pytest.mark.skipif(not HAS_TPU, reason="no TPU (torch_tpu on a TPU VM)")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ENGINE_DTYPES)
def test_on_moves_to_like_device_and_keeps_dtype(device, dtype):
    t = (torch.arange(12) % 3).reshape(3, 4).to(dtype)
    like = torch.zeros(2, dtype=torch.float32 if dtype != torch.float32 else torch.int64, device=device)
    moved = pin_torch_rs.on(t, like)
    assert moved.dtype == dtype and moved.device.type == device
    assert torch.equal(moved.cpu(), t)
    if device == "cpu":
        assert moved.data_ptr() == t.data_ptr()  # already there: no copy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_arange_built_in_rust_lands_on_like_device(device, dtype):
    got = pin_torch_rs.arange_on(5, torch.empty(0, device=device), dtype)
    assert got.device.type == device and str(got.dtype) == f"torch.{dtype}"
    assert got.cpu().tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("call, kind, words", [
    ("pin_torch_rs.on([1, 2], torch.zeros(1))", "TypeError", "on(t): expected a torch.Tensor, got list"),
    ("pin_torch_rs.on(torch.zeros(1), 'cpu')", "TypeError", "on(like): expected a torch.Tensor, got str"),
    ("pin_torch_rs.arange_on(-1, torch.zeros(1))", "ValueError", "n must be >= 0, got -1"),
    ("pin_torch_rs.arange_on(3, torch.zeros(1), 'float8')", "ValueError", 'dtype="float8" is not supported'),
])
def test_bad_input_raises_a_python_exception(isolated, call, kind, words):
    # in a child process (conftest's `isolated`): an abort or a segfault fails this case, not the session
    code = f"import torch, pin_torch_rs\ntry:\n    {call}\nexcept {kind} as e:\n    print('raised:', e)\n"
    p = isolated.run(code)
    assert p.returncode == 0, p.stderr  # a crash or a PanicException fails here
    assert "raised:" in p.stdout and words in p.stdout, p.stdout



def test_a_crash_or_an_escaped_exception_fails_only_its_own_case(bare_isolated):
    """The isolation the bad-input cases rely on: cases share one child until one crashes (a segfault) or lets an
    exception escape (as a Rust panic's PanicException would); that case fails, and the next runs in a new child."""
    first = bare_isolated.run("import os; print(os.getpid())")
    assert bare_isolated.run("import os; print(os.getpid())").stdout == first.stdout  # one interpreter
    crash = bare_isolated.run("import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    assert (crash.returncode, crash.stdout) == (-signal.SIGSEGV, "before\n")
    escaped = bare_isolated.run("raise BaseException('a panic')")
    assert escaped.returncode == 1 and "BaseException: a panic" in escaped.stderr
    after = bare_isolated.run("import os, sys; print(os.getpid(), *sys.argv[1:])", "an argument")
    assert after.returncode == 0 and after.stdout.split()[1:] == ["an", "argument"]
    assert after.stdout.split()[0] != first.stdout.strip()

def test_run_py_prints_the_check_and_the_moved_tensor():
    out = subprocess.run([sys.executable, str(RUN), "--device", "cpu"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["torch 2.13.0 installed, crate built for torch 2.13.0: confirmed",
                   "built in Rust, moved: [0.0, 1.0, 2.0, 3.0, 4.0] on cpu",
                   "bf16 kept: torch.bfloat16"]
