"""Step 04: compare the Rust engine with Hugging Face Transformers, figure by figure and layer by layer — and with
llama.cpp, the peer (`peer`, `to_gguf`, `llama`), a second implementation of the same model.

The comparison's names are imported when first used: llama.cpp's own processes (`python -m torchtpu_parity.llama`,
step 05's llama.cpp ways) import this package without torch, so their memory is llama.cpp's.
"""
import importlib

_WHERE = {"compare": "compare", "kl_divergence": "compare", "layer_report": "compare", "top5": "compare"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'torchtpu_parity' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # kept, and over the submodule the import just bound to the same name (`compare`)
    return value
