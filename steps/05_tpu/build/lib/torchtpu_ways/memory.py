"""Peak memory of one way's process, on the device it runs on, in GB (10^9 bytes).

TPU: the libtpu HBM metric, polled (tpu.py). CUDA: the caching allocator's high-water mark (the Rust engine
allocates through the same libtorch, so it counts too). CPU: the process's peak resident set size.
"""
import resource

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
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return peak / 1e9
