"""Ctrl-C, as a user presses it: a real SIGINT sent to a process busy in a long engine call surfaces as
KeyboardInterrupt within a second — in generate, logits, hidden_states and the token stream — and the engine
then gives the same tokens as a fresh one (the interrupted call left no state behind).

One child process takes the four calls in turn, on one engine (loading it is most of a case's time): each case
checks the engine after its own interruption, so a call that left state behind fails its own case. A child that
dies or misbehaves fails that case only; the next case starts a new child."""
import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

CHILD = r"""
import json, signal, sys, time
import torch, torchtpu_rs
from pathlib import Path

# Python's own Ctrl-C handler, as an interactive session has it: a process started in the background by a
# non-interactive shell (CI, `make test &`) inherits SIGINT ignored, and Python then installs no handler
signal.signal(signal.SIGINT, signal.default_int_handler)

folder = Path(sys.argv[1])
CTX = 32768
engine = torchtpu_rs.Engine(folder / "text", folder / "emb4", torch.zeros(1), CTX, "float32")
short = [2] + [(7 * i + 3) % 500 + 3 for i in range(40)]
long = [2] + [(7 * i + 3) % 500 + 3 for i in range(CTX - 2)]
calls = {
    "generate": lambda: engine.generate(short, CTX - len(short)),
    "logits": lambda: engine.logits(long),
    "hidden_states": lambda: engine.hidden_states(long),
    "stream": lambda: list(engine.stream(short, CTX - len(short))),
}
fresh = engine.generate(short, 16)[0]  # what a fresh engine gives: nothing has been interrupted yet
print("ready", flush=True)
for call in sys.stdin:
    print("busy", flush=True)
    start = time.perf_counter()
    try:
        calls[call.strip()]()
        result = {"interrupted": False}
    except KeyboardInterrupt:
        result = {"interrupted": True, "caught_at": time.time()}
    result["ran_s"] = time.perf_counter() - start
    result["usable"] = engine.generate(short, 16)[0] == fresh
    print(json.dumps(result), flush=True)
"""


class Child:
    """The child above, started on first use and again after a case that failed."""

    def __init__(self, tiny):
        self.tiny, self.proc = tiny, None

    def line(self, timeout: float) -> str:
        while b"\n" not in self.buffer:
            with selectors.DefaultSelector() as wait:
                wait.register(self.proc.stdout, selectors.EVENT_READ)
                assert wait.select(timeout), f"no answer from the child within {timeout} s"
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            assert chunk, f"the child died (exit status {self.proc.wait()})"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def ready(self):
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(self.tiny)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, bufsize=0)
            self.buffer = b""
            assert self.line(timeout=300) == "ready"
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.kill()  # a call that ignored the signal would run on for minutes
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.proc = None


@pytest.fixture(scope="module")
def child(tiny):
    child = Child(tiny)
    yield child
    child.stop()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is a POSIX signal")
@pytest.mark.parametrize("call", ["generate", "logits", "hidden_states", "stream"])
def test_sigint_interrupts_within_a_second_and_the_engine_stays_usable(child, call):
    try:
        child.ready().proc.stdin.write(f"{call}\n".encode())
        assert child.line(timeout=60) == "busy"
        time.sleep(0.5)  # well into the call: each of these runs for many seconds uninterrupted
        sent = time.time()
        os.kill(child.proc.pid, signal.SIGINT)
        result = json.loads(child.line(timeout=60))
        assert result["interrupted"], f"{call} finished ({result['ran_s']:.1f} s) before the signal arrived"
        late = result["caught_at"] - sent
        assert late < 1.0, f"{call}: KeyboardInterrupt {late:.2f} s after SIGINT"
        assert result["usable"], f"after an interrupted {call}, the engine's tokens differ from a fresh engine's"
    except BaseException:
        child.stop()  # whatever state it is in, the next case gets a new child
        raise
