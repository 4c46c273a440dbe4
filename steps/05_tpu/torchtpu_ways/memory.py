"""Peak memory of one way's process, on the device it runs on, in GB (10^9 bytes).

TPU: the libtpu HBM metric, polled (tpu.py). CUDA: the caching allocator's high-water mark (the Rust engine
allocates through the same libtorch, so it counts too). CPU: the process's peak resident set size — read from
`VmHWM` in /proc/self/status, the high-water mark of this process's own memory. Not `getrusage`'s `ru_maxrss`:
Linux carries the parent's high-water mark into a child that subprocess starts (vfork, then exec), so every way
would read at least the benchmark's own peak (its 4 GiB bandwidth buffers).
"""
import resource
from pathlib import Path

import torch

from . import tpu


class PeakMemory:
    """`start()` before loading, `gb()` at the end."""

    def __init__(self, device: torch.device):
        self.device = device
        self.hbm = tpu.HbmPeak() if device.type == "tpu" else None

    def start(self) -> None:
        if self.hbm:
            self.hbm.start()
        elif self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def gb(self) -> float:
        if self.hbm:
            peak = self.hbm.stop()
        elif self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = cpu_peak_bytes()
        return peak / 1e9


def cpu_peak_bytes() -> int:
    """This process's peak resident set size: VmHWM on Linux; elsewhere getrusage's maximum (macOS: in bytes)."""
    status = Path("/proc/self/status")
    if status.exists():
        line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
