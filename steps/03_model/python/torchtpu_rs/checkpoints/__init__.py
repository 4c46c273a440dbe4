"""Gemma 4 checkpoints in exactly the formats of the real repacks, so every step runs without downloads.

The real weights are `gemma-4-E2B-it-qat-q4_0-w4a16-ct-text` (every linear 4-bit, tables bf16) and its twin
`...-text-emb4` (the embedding tables and an untied head 4-bit too). Each checkpoint here is a folder holding both
twins as `text/` and `emb4/`, each with the project's small tokenizer:

* `trained()`: the default model of steps 03-06, trained here on the records task (`trained_model.py`).
* `tiny()`: a random model with every structural feature of E2B, built by Transformers and packed by
  compressed-tensors (`with_ct.py`), for the parity battery; seconds to make, then cached (`cache.py`).
* `e2b()`: a random model of the real E2B shapes (about 9 GB), streamed to disk by this project's packer
  (`streamed.py`, `packing.py`), for benchmarks.

One concern a module: `specs` (the shapes), `random_weights`, `packing`, `with_ct`, `streamed`, `tokenizer`,
`cache`, `trained_model`, `variants` (a config with one thing changed, for tests). Transformers and
compressed-tensors are imported inside the functions that need them: a cache hit costs no import of either
(seconds).
"""
from .cache import GENERATOR_VERSION, cache_path, cache_root, cached, e2b, make, tiny
from .packing import GROUP, compress_with_ct, pack_w4, quantization_config
from .random_weights import random_tensor
from .specs import E2B, LAYOUTS, SPECS, TINY, text_config
from .streamed import SHARD_BYTES, write_random
from .tokenizer import write_tokenizer
from .trained_model import export, trained
from .variants import copy_edited, edit_config, variant

__all__ = ["trained", "tiny", "e2b", "make", "cached", "cache_path", "cache_root", "export", "write_random",
           "write_tokenizer", "pack_w4", "compress_with_ct", "quantization_config", "random_tensor", "text_config",
           "variant", "edit_config", "copy_edited", "TINY", "E2B", "SPECS", "LAYOUTS", "GROUP", "SHARD_BYTES",
           "GENERATOR_VERSION"]
