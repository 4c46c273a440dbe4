"""A llama.cpp way's run, from the parent's side: its GGUF (made once), its fresh process, and what the file holds.

    row = peer_run.run("llamacpp-q4_0", model_dir, 2048, ids, 64)   # PeerUnavailable(why) when it cannot run

`ways.run_way` calls this for every `llamacpp-...` way and turns PeerUnavailable into an `unavailable` row. A
crash of the way's process (a signal, a non-zero exit) is such a row too, with the signal and llama.cpp's last
words: llama.cpp's fastest path crashing on some CPU is a finding to record, not a reason to stop the bench.
"""
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from torchtpu_parity import peer, to_gguf
from torchtpu_parity.child_env import source_first
from torchtpu_rs import records


class PeerUnavailable(Exception):
    """The way cannot run here, or its process died: the message says why."""


def stored_bytes(gguf: Path) -> dict[str, int]:
    """{"stored": bytes of all tensors, "per_token": what one decode step reads of them}, counted as the Rust
    engine counts its own (bytes as held): every tensor whole but the two tables, of which a step gathers one row —
    and the token table whole once more when it is also the head (tied, no `output.weight`)."""
    sys.path.insert(0, str(peer.converter() / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    tensors = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    stored = sum(int(t.n_bytes) for t in tensors.values())
    per_token = stored
    for table in ("token_embd.weight", "per_layer_token_embd.weight"):
        if table in tensors:
            t = tensors[table]
            rows = int(t.n_elements) // int(t.shape[0])  # ggml's shape: the row length first
            per_token -= int(t.n_bytes) - int(t.n_bytes) // rows
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        per_token += int(tensors["token_embd.weight"].n_bytes)
    return {"stored": stored, "per_token": per_token}


def crash_why(proc: subprocess.CompletedProcess) -> str:
    """`llama.cpp 0.3.36 crashed: SIGSEGV (signal 11), weights in AMX, CPU_Mapped buffers; its last output: ...`
    for a process that died. The buffers (llama.cpp's own load log) say which repacking, if any, held them."""
    code = proc.returncode
    died = f"crashed: {signal.Signals(-code).name} (signal {-code})" if code < 0 else f"failed (exit code {code})"
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    buffers = [line.split(":", 1)[1].split(" model buffer")[0].strip() for line in lines
               if line.startswith("load_tensors:") and "model buffer size" in line]
    held = f", weights in {', '.join(buffers)} buffers" if buffers else ""
    return f"llama.cpp {peer.VERSION} {died}{held}; its last output: {(lines or ['(nothing)'])[-1][:160]}"


def run(way: str, model, ctx: int, ids: list[int], max_new: int, stop: list[int] | None = None,
        cold: str = "prompt") -> dict:
    """Run one llama.cpp way in a fresh process and return its row (the FIGURES of ways.run_way's rows); `cold` as
    there."""
    build, quant, repack = peer.parse_way(way)
    if why := peer.missing(way):
        raise PeerUnavailable(why)
    gguf = to_gguf.ggufs(model, [quant])[quant]
    with tempfile.TemporaryDirectory(prefix="torchtpu-peer-") as tmp:
        prompt, out = Path(tmp) / "ids.json", Path(tmp) / "row.json"
        prompt.write_text(json.dumps(list(ids)))
        cmd = [sys.executable, "-m", "torchtpu_ways.peer_worker", "--way", way, "--gguf", str(gguf), "--ctx", str(ctx),
               "--ids", str(prompt), "--max-new", str(max_new), "--out", str(out), "--cold", cold,
               *(["--stop", ",".join(map(str, stop))] if stop else [])]
        env = source_first(peer.env(way), __file__)  # this copy of the package, as ways.worker_env does
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise PeerUnavailable(crash_why(proc))
        row = json.loads(out.read_text())
    held = stored_bytes(gguf)
    row.update(bytes_per_token=held["per_token"], memory={"weights as stored": held["stored"]}, mapped=True,
               gguf=records.name(gguf), cmake_args=peer.build_info(build)["cmake_args"], peer_version=peer.VERSION)
    return row
