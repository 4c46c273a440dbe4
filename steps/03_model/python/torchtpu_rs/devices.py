"""Which device a script runs on. `auto`: a TPU if torch_tpu finds a chip, else CUDA, else the CPU."""
import sys

import torch


def has_tpu() -> bool:
    # torch_tpu registers itself as a torch backend: `import torch` loads it and adds `torch.tpu`. Without a
    # chip the import still succeeds, with a device count of 0 (and no CPU fallback: we must choose).
    return hasattr(torch, "tpu") and torch.tpu.device_count() > 0


def choose_device(name: str = "auto") -> torch.device:
    """The device for `--device NAME`; an explicit choice that does not exist here ends the script, saying so."""
    if name == "auto":
        name = "tpu" if has_tpu() else "cuda" if torch.cuda.is_available() else "cpu"
    if (name == "tpu" and not has_tpu()) or (name == "cuda" and not torch.cuda.is_available()):
        sys.exit(f"--device {name}: no such device here (TPU needs torch_tpu on a TPU VM; CUDA needs a GPU)")
    return torch.device("cpu" if name == "cpu" else f"{name}:0")


def like(device: torch.device) -> torch.Tensor:
    """An empty tensor on `device`: all the engine needs to know where to put its weights."""
    return torch.empty(0, device=device)
