"""A way's peak memory is its own process's, not the benchmark's that started it."""
import subprocess
import sys

import torch
from torchtpu_ways.memory import cpu_peak_bytes

CHILD = "from torchtpu_ways.memory import cpu_peak_bytes; print(cpu_peak_bytes())"


def test_a_child_s_peak_is_not_its_parent_s():
    # getrusage's ru_maxrss would report the parent's 2 GB in the child (Linux carries it over vfork + exec)
    touched = torch.ones(2 * 10**9 // 4)
    assert cpu_peak_bytes() > 2e9
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    del touched
    assert int(child.stdout) < 1e9
