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
import torch
from torchtpu_ways import prompt
from torchtpu_ways.baseline import Baseline
tiny, ctx, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ids = prompt.encode(f"{tiny}/text", text)
eager = Baseline(f"{tiny}/text", f"{tiny}/emb4", "cpu", ctx, "float32").generate(ids, 3)[0]
compiled = Baseline(f"{tiny}/text", f"{tiny}/emb4", "cpu", ctx, "float32", compile=True)
print(json.dumps({"eager": eager, "compiled": compiled.generate(ids, 3)[0],
                  "cache": os.environ["TORCHINDUCTOR_CACHE_DIR"], "isa": torch.backends.cpu.get_cpu_capability()}))
"""


def test_limited_and_plain_runs_keep_their_compiled_graphs_apart(tiny, ctx, short_prompt):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # inductor's default cache, which every run on this machine shares: test_compile compiled these graphs (the same
    # checkpoint, dtype, ctx and prompt) into the plain folder earlier in the session, so the limited child compiles
    # after a plain compile, and the plain child reads its graphs after the limited child compiled its own — both
    # orders, in two children. Shared folders fail either way round.
    base = {k: v for k, v in os.environ.items() if k not in (*CPU_LIMITS, "TORCHINDUCTOR_CACHE_DIR")}
    runs = []
    for limits in (AVX2, {}):  # limited after plain (test_compile's), then plain after limited
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tiny), str(ctx), short_prompt],
                              env={**base, **limits}, capture_output=True, text=True)
        assert proc.returncode == 0, f"limits {limits}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["compiled"] == out["eager"], f"limits {limits}: compiled {out['compiled']} != {out['eager']}"
        runs.append(out)
    # each in the folder of its own vector ISA: on an AVX-512 CPU two folders, on an AVX2-only one the same
    assert runs[0]["isa"] == "AVX2"
    assert all(r["cache"] == f"{default_cache_dir()}-{r['isa'].lower()}" for r in runs), runs


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
