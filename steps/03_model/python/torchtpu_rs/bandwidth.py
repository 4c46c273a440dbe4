"""How fast this machine reads memory: the limit every benchmark (steps 05, 06 and 08) measures a decode step
against, since a decode step reads every weight once.

    gb_s = memory_bandwidth_gb_s()          # a 2 GiB copy, best of 5: bytes read plus bytes written
    gb_s, kernel = read_bandwidth_gb_s()    # a 2 GiB read-only stream, the fastest of a few reductions
    seconds = best_seconds(call, tries=7)   # any call, the fastest of 7 after one untimed
"""
import time
from collections.abc import Callable

import torch


def best_seconds(call: Callable[[], object], tries: int) -> float:
    """The fastest of `tries` timed calls (after one untimed call that sets the kernel up): the least a shared
    machine's other work got in the way."""
    call()
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


# --8<-- [start:bandwidth]
def memory_bandwidth_gb_s(gib: int = 2, tries: int = 5) -> float:
    """A large copy, best of `tries`: every byte is read once and written once."""
    src = torch.ones(gib * 2**30, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / best_seconds(lambda: dst.copy_(src), tries) / 1e9
# --8<-- [end:bandwidth]


# --8<-- [start:read]
def read_bandwidth_gb_s(gib: float = 2, tries: int = 5) -> tuple[float, str]:
    """The read limit: a read-only stream over a buffer far larger than the caches, on all of torch's threads, as a
    decode step reads its weights. Each kernel tried reads every byte once and writes one number; the fastest of
    them, best of `tries` each, and its name. A copy also writes what it reads, so it is another kind of stream."""
    src = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    kernels = {"float32 sum": src.sum, "float32 max": src.amax, "int32 max": src.view(torch.int32).amax}
    rates = {name: src.nbytes / best_seconds(call, tries) / 1e9 for name, call in kernels.items()}
    fastest = max(rates, key=rates.get)
    return rates[fastest], fastest
# --8<-- [end:read]
