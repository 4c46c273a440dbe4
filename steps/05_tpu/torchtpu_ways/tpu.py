"""Everything TorchTPU-specific in this step, in one place.

NOT RUN HERE: this project's machines have no TPU. The code is written from what is known of torch-tpu 0.2.0
(the walkthrough's notes on TorchTPU): the fused eager mode is an environment variable read when the backend
starts, and 0.2.0 has no `max_memory_allocated`, so peak HBM is polled from libtpu's monitoring SDK. Until
someone records a TPU run, the TPU figures in the guide are the source article's.
"""
import subprocess
import sys
import threading

# TorchTPU's defer-and-fuse eager mode (EagerMode.DEFER_AND_FUSE): read once, when the backend starts, so the
# way that uses it needs a process of its own, started with the variable set.
FUSED_ENV = "TORCH_TPU_DEFER_AND_FUSE"
NO_TPU = f"fused ({FUSED_ENV}=1) is a TorchTPU mode: no TPU here"


def is_tpu(device: str) -> bool:
    return device.split(":")[0] == "tpu"


def choose_device_in_child(name: str) -> str:
    """`torchtpu_rs.devices.choose_device(name)` asked in a short-lived process, its answer as a device name. On a
    TPU VM the process that opens the chip holds it; the ways each need it in their own process, so the parent
    never opens it itself. (Whether importing torch alone opens the chip is not known here; asking for the device
    count may.)"""
    ask = "import sys; from torchtpu_rs import devices; print(devices.choose_device(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", ask, name], capture_output=True, text=True)
    if out.returncode != 0:  # choose_device ends the process with a message when the device is not here
        sys.exit(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"--device {name}: failed")
    return out.stdout.split()[-1]


class HbmPeak:
    """Peak HBM in use on chip 0 while it runs: libtpu's `hbm_capacity_usage` metric (one value per chip, in
    bytes, as strings) is the current value, so a thread polls it every `interval` seconds and keeps the max."""

    def __init__(self, interval: float = 0.05):
        from libtpu.sdk import tpumonitoring  # ships with libtpu, a dependency of torch-tpu

        self.metric = lambda: int(tpumonitoring.get_metric("hbm_capacity_usage").data()[0])
        self.interval, self.peak = interval, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self) -> None:
        while True:
            self.peak = max(self.peak, self.metric())
            if self.done.wait(self.interval):
                return

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> int:
        """Stops polling; the peak in bytes, read once more at the end."""
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.metric())
        return self.peak
