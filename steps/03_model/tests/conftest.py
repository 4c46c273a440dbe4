"""Fixtures shared by step 03's tests: the tiny checkpoints, Transformers' reference model, and one isolated
interpreter for a module's crash-prone cases (a case that crashes or lets a panic escape fails alone; the child
stays up for the next case otherwise, so torch imports once per module, not once per case)."""
import json
import os
import selectors
import subprocess
import sys
from pathlib import Path

import pytest
from torchtpu_rs import checkpoints
from torchtpu_rs.reference import transformers_model


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The tiny Gemma 4 checkpoint (causal layout): `text/` and its `emb4/` twin."""
    return checkpoints.tiny("causal")


@pytest.fixture(scope="session")
def tiny_multimodal() -> Path:
    return checkpoints.tiny("multimodal")


@pytest.fixture(scope="session")
def hf_model():
    """A loader for the reference model: `hf_model(folder, dtype=torch.float32)`."""
    return transformers_model


# The child: runs each case's code as `python -c code argv...` would, its stdout and stderr (file descriptors 1
# and 2, so what Rust or C++ prints too) written to the case's own files; the status goes back on a private pipe.
WORKER = r"""
import json, os, sys, traceback
reply = os.fdopen(int(sys.argv[1]), "w")
exec(sys.argv[2])
for request in sys.stdin:
    case = json.loads(request)
    saved = os.dup(1), os.dup(2)
    with open(case["out"], "w") as out, open(case["err"], "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        status = 0
        sys.argv = ["-c", *case["argv"]]
        try:
            exec(compile(case["code"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    for fd in saved:
        os.close(fd)
    reply.write(json.dumps(status) + "\n")
    reply.flush()
"""


class Isolated:
    """`run(code, *argv)` -> a CompletedProcess, as `subprocess.run([python, "-c", code, *argv])` gives, from a
    child that imported `warm` once."""

    def __init__(self, folder, warm: str):
        self.folder, self.warm, self.child, self.cases = folder, warm, None, 0

    def start(self):
        read, write = os.pipe()
        self.log = self.folder / f"worker-{self.cases}.log"
        with open(self.log, "w") as log:
            self.child = subprocess.Popen([sys.executable, "-c", WORKER, str(write), self.warm], stdin=subprocess.PIPE,
                                          stdout=log, stderr=log, text=True, pass_fds=(write,))
        os.close(write)
        self.reply = os.fdopen(read)

    def run(self, code: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        if self.child is None:
            self.start()
        self.cases += 1
        out, err = (self.folder / f"case-{self.cases}.{kind}" for kind in ("out", "err"))
        try:
            self.child.stdin.write(json.dumps({"code": code, "argv": list(argv), "out": str(out),
                                               "err": str(err)}) + "\n")
            self.child.stdin.flush()
        except BrokenPipeError:
            pass  # the child died before it read the case: reported below
        with selectors.DefaultSelector() as wait:
            wait.register(self.reply, selectors.EVENT_READ)
            if not wait.select(timeout):
                self.stop()
                raise subprocess.TimeoutExpired(["-c", code, *argv], timeout)
        line = self.reply.readline()
        if line:
            status = json.loads(line)
        else:  # the case crashed the child: its exit status, as subprocess.run would report it
            status = self.child.wait()
        stdout, stderr = (p.read_text() if p.exists() else "" for p in (out, err))
        if not line:
            stderr += self.log.read_text()
        if status != 0:  # a crash, or an exception nothing caught: the next case starts afresh
            self.stop()
        return subprocess.CompletedProcess(["-c", code, *argv], status, stdout, stderr)

    def stop(self):
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            self.child.stdin.close()
            self.reply.close()
            self.child = None


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    """Runs cases in a child that has imported torch and torchtpu_rs."""
    runner = Isolated(tmp_path_factory.mktemp("isolated"), "import torch, torchtpu_rs")
    yield runner
    runner.stop()


@pytest.fixture
def bare_isolated(tmp_path):
    """The same runner with nothing imported: for the test of the isolation itself."""
    runner = Isolated(tmp_path, "")
    yield runner
    runner.stop()
