"""Step 04: compare the Rust engine with Hugging Face Transformers, figure by figure and layer by layer."""
from .compare import compare, kl_divergence, layer_report, top5

__all__ = ["compare", "kl_divergence", "layer_report", "top5"]
