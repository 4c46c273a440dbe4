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
    """Point inductor at a cache folder of this process's vector ISA, unless the caller chose a folder of their own
    (`TORCHINDUCTOR_CACHE_DIR` set to anything but inductor's default: theirs to keep apart), and return the folder.
    Call it before the first `torch.compile` of the process; inductor reads the variable whenever it opens its
    cache (importing inductor sets it to the default, so the default is replaced too)."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = default_cache_dir()
    if os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default) == os.path.abspath(default):
        capability = torch.backends.cpu.get_cpu_capability().lower()  # "avx2", "avx512", "default", …
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}-{capability}"
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
