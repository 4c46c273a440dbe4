"""Step 01 checks: the Rust result equals torch's, storage is shared, bad input is a Python exception."""
import signal
import subprocess
import sys
from pathlib import Path

import bridge_rs
import pytest
import torch

RUN = Path(__file__).resolve().parents[1] / "run.py"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 3, 16])
def test_matmul_sum_equals_torch(dtype, n):
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(n)).to(dtype)
    got = bridge_rs.matmul_sum(x)
    want = (x @ x).sum(dtype=torch.float32)  # the same libtorch ops: the same bits
    assert got.dtype == torch.float32 and got.shape == () and got.device == x.device
    assert torch.equal(got, want)


def test_ones_give_64():
    assert bridge_rs.matmul_sum(torch.ones(4, 4)).item() == 64.0


def test_roundtrip_shares_storage_both_ways():
    x = torch.zeros(3, 5)
    y = bridge_rs.roundtrip(x)
    assert y.data_ptr() == x.data_ptr()
    y[1, 2] = 7.0
    assert x[1, 2].item() == 7.0  # a write through Rust's tensor is seen by Python's
    assert bridge_rs.roundtrip(x[1]).data_ptr() == x[1].data_ptr()  # views keep their offset


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_result_stays_on_cuda():
    assert bridge_rs.matmul_sum(torch.ones(4, 4, device="cuda")).device.type == "cuda"


@pytest.mark.parametrize("arg, kind, words", [
    ("[[1.0, 2.0], [3.0, 4.0]]", "TypeError", "matmul_sum(x): expected a torch.Tensor, got list"),
    ("'abc'", "TypeError", "got str"),
    ("torch.ones(2, 3)", "RuntimeError", "cannot be multiplied (2x3 and 2x3)"),
    ("torch.ones(2, 2, dtype=torch.bool)", "RuntimeError", "not implemented for 'Bool'"),
])
def test_bad_input_raises_a_python_exception(isolated, arg, kind, words):
    # in a child process (conftest's `isolated`): an abort or a segfault fails this case, not the session
    code = f"""
import torch, bridge_rs
try:
    bridge_rs.matmul_sum({arg})
except {kind} as e:
    print("raised:", e)
"""
    p = isolated.run(code)
    assert p.returncode == 0, p.stderr  # no abort, no segfault, no PanicException (a BaseException)
    assert "raised:" in p.stdout and words in p.stdout, p.stdout
    assert "Exception raised from" not in p.stdout  # torch's message, without the C++ stack



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

def test_run_py_prints_the_article_line():
    out = subprocess.run([sys.executable, str(RUN), "--device", "cpu"], capture_output=True, text=True,
                         check=True).stdout
    assert "Rust matmul then sum: 64.0 on cpu" in out
    assert "same storage after a round trip through Rust: True" in out
