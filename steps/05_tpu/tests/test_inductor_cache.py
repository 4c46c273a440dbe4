"""A compiled run kept to AVX2 and a plain one on the same machine each get the eager tokens, in either order:
each vector ISA compiles into a cache folder of its own (torchtpu_ways.inductor_cache)."""
import json
import os
import subprocess
import sys

from torchtpu_rs.records import CPU_LIMITS

AVX2 = dict(zip(CPU_LIMITS, ("avx2", "AVX2")))
CHILD = """
import json, os, sys
from torchtpu_ways import prompt
from torchtpu_ways.baseline import Baseline
tiny, ctx, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ids = prompt.encode(f"{tiny}/text", text)
eager = Baseline(f"{tiny}/text", f"{tiny}/emb4", "cpu", ctx, "float32").generate(ids, 3)[0]
compiled = Baseline(f"{tiny}/text", f"{tiny}/emb4", "cpu", ctx, "float32", compile=True)
print(json.dumps({"eager": eager, "compiled": compiled.generate(ids, 3)[0],
                  "cache": os.environ["TORCHINDUCTOR_CACHE_DIR"]}))
"""


def test_limited_and_plain_runs_keep_their_compiled_graphs_apart(tiny, ctx, short_prompt, tmp_path):
    # a fresh temporary folder: inductor's default cache lives under it, shared by every child as on one machine
    base = {k: v for k, v in os.environ.items() if k not in (*CPU_LIMITS, "TORCHINDUCTOR_CACHE_DIR")}
    base["TMPDIR"] = str(tmp_path)
    caches = []
    for limits in (AVX2, {}, AVX2):  # plain after limited, then limited after plain
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tiny), str(ctx), short_prompt],
                              env={**base, **limits}, capture_output=True, text=True)
        assert proc.returncode == 0, f"limits {limits}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["compiled"] == out["eager"], f"limits {limits}: compiled {out['compiled']} != {out['eager']}"
        caches.append(out["cache"])
    assert caches[0] == caches[2] != caches[1]
    assert all(c.startswith(str(tmp_path)) for c in caches)


def test_the_default_folder_is_keyed_and_a_chosen_one_kept(monkeypatch, tmp_path):
    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    from torchtpu_ways.inductor_cache import key_on_this_cpu

    isa = torch.backends.cpu.get_cpu_capability().lower()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # as importing inductor leaves it
    assert key_on_this_cpu() == f"{default_cache_dir()}-{isa}"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert key_on_this_cpu() == f"{default_cache_dir()}-{isa}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the caller's own: left alone
    assert key_on_this_cpu() == str(tmp_path / "mine")
