"""Ctrl-C, as a user presses it: a real SIGINT sent to a process busy in a long engine call surfaces as
KeyboardInterrupt within a second — in generate, logits, hidden_states and the token stream — and the engine
then gives the same tokens as a fresh one (the interrupted call left no state behind)."""
import json
import os
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

folder, call = Path(sys.argv[1]), sys.argv[2]
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
print("busy", flush=True)
start = time.perf_counter()
try:
    calls[call]()
    result = {"interrupted": False}
except KeyboardInterrupt:
    result = {"interrupted": True, "caught_at": time.time()}
result["ran_s"] = time.perf_counter() - start
fresh = torchtpu_rs.Engine(folder / "text", folder / "emb4", torch.zeros(1), CTX, "float32")
result["usable"] = engine.generate(short, 16)[0] == fresh.generate(short, 16)[0]
print(json.dumps(result), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is a POSIX signal")
@pytest.mark.parametrize("call", ["generate", "logits", "hidden_states", "stream"])
def test_sigint_interrupts_within_a_second_and_the_engine_stays_usable(tiny, call):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny), call], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "busy"
        time.sleep(1.0)  # well into the call: each of these runs for many seconds uninterrupted
        sent = time.time()
        os.kill(child.pid, signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()  # a call that ignored the signal would run on for minutes
    result = json.loads(out.strip().splitlines()[-1])
    assert result["interrupted"], f"{call} finished ({result['ran_s']:.1f} s) before the signal arrived"
    late = result["caught_at"] - sent
    assert late < 1.0, f"{call}: KeyboardInterrupt {late:.2f} s after SIGINT"
    assert result["usable"], f"after an interrupted {call}, the engine's tokens differ from a fresh engine's"
