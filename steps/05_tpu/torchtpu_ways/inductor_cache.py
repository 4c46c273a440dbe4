"""Inductor's on-disk cache, one per vector ISA: a compiled graph is only reused by a process that would have
compiled the same code.

Inductor generates C++ for the vector ISA that ATen dispatches to (`torch.backends.cpu.get_cpu_capability()`:
AVX2 under `ATEN_CPU_CAPABILITY=avx2`, AVX512 without it on an AVX-512 CPU), but the key of its cache does not
include that choice. So on one machine, a run kept to AVX2 (`make bench-avx2`, `make test`'s AVX2 tier) and a
plain run would share graphs compiled for the other: found on an AMD EPYC with AVX512-BF16 (torch 2.13),
the limited run generated `[0, 0, 0, …]` from a cache the plain run had filled, and the plain run after a
limited one died inside the cached graph (SIGSEGV). Keying the folder on the capability keeps them apart."""
import os


def key_on_this_cpu() -> str:
    """Point inductor at a cache folder of this process's vector ISA, unless the caller chose one
    (`TORCHINDUCTOR_CACHE_DIR` already set: theirs to keep apart), and return the folder. Call it before the first
    compile; inductor reads the variable whenever it opens its cache."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        capability = torch.backends.cpu.get_cpu_capability().lower()  # "avx2", "avx512", "default", …
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}-{capability}"
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
