"""The E2B path: this project's packer, streamed into safetensors shards without a float model in memory."""
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from .packing import GROUP, finish_config, pack_w4, quantization_config
from .random_weights import random_block, random_tensor, row_blocks, text_name
from .specs import model_class, model_config, text_config

SHARD_BYTES = 2 * 2**30


def _tensor_plan(config, layout, emb4):
    """[(checkpoint name, shape, scale dtype or None for a plain bf16 tensor)] in state-dict order, read off a model
    on the meta device (no memory); which modules are packed, and with which scale dtype, is decided by
    compressed-tensors' own matching of `quantization_config(emb4)`, as on the tiny path."""
    from compressed_tensors.quantization import apply_quantization_config

    with torch.device("meta"):
        model = model_class(layout)(config)
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    names = [(n, tuple(t.shape)) for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")]
    apply_quantization_config(model, quantization_config(emb4), show_progress=False)
    modules = dict(model.named_modules())
    plan = []
    for name, shape in names:
        scheme = getattr(modules.get(name.removesuffix(".weight")), "quantization_scheme", None)
        plan.append((name, shape, None if scheme is None else scheme.weights.scale_dtype or torch.bfloat16))
    return plan


def _nbytes(shape, scale_dtype):
    if scale_dtype is None:
        return 2 * math.prod(shape)
    rows, cols = shape
    return 4 * rows * cols // 8 + 2 * rows * cols // GROUP + 16


def _make_tensors(name, shape, scale_dtype, seed):
    """The tensors one plan entry becomes, generated (and packed) block by block into preallocated outputs."""
    key = text_name(name)
    if scale_dtype is None:
        return {name: random_tensor(key, shape, seed)}
    rows, cols = shape
    prefix = name.removesuffix(".weight")
    packed = torch.empty(rows, cols // 8, dtype=torch.int32)
    scale = torch.empty(rows, cols // GROUP, dtype=scale_dtype)
    for b, block in enumerate(row_blocks(shape)):
        p = pack_w4(random_block(key, shape, seed, b), GROUP, scale_dtype)
        packed[block], scale[block] = p["weight_packed"], p["weight_scale"]
    return {f"{prefix}.weight_packed": packed, f"{prefix}.weight_scale": scale,
            f"{prefix}.weight_shape": torch.tensor([rows, cols])}


def _write_shards(folder, plan, seed, shard_bytes, progress):
    """Greedy shards of at most `shard_bytes` (a bigger tensor gets a shard of its own), each written with
    safetensors' `save_file` as soon as it is complete: peak memory is about one shard. Several shards get
    Transformers' names and a `model.safetensors.index.json`; one is `model.safetensors`."""
    shards = [[]]
    size = 0
    for entry in plan:
        n = _nbytes(entry[1], entry[2])
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += n
    weight_map = {}
    for i, shard in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape, scale_dtype in shard:
            tensors.update(_make_tensors(name, shape, scale_dtype, seed))
            progress.update(_nbytes(shape, scale_dtype))
        save_file(tensors, str(Path(folder) / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    if len(shards) > 1:
        total = sum(_nbytes(shape, dt) for _, shape, dt in plan)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (Path(folder) / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_random(out_dir, spec, seed=0, layout="causal", shard_bytes=SHARD_BYTES):
    """Write both twins (`text/`, `emb4/`) of a random model of text config `spec` (a dict like TINY or E2B) straight
    to disk with `pack_w4`, without a float model in memory. `make(size="e2b")` runs this on the E2B config;
    on the tiny config it reproduces what compressed-tensors writes, tensor for tensor."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationStatus
    from transformers import GenerationConfig

    jobs = []
    for twin, emb4 in (("text", False), ("emb4", True)):
        config = model_config(text_config(spec, tied=not emb4), layout)
        jobs.append((Path(out_dir) / twin, config, emb4, _tensor_plan(config, layout, emb4)))
    total = sum(_nbytes(shape, dt) for *_, plan in jobs for _, shape, dt in plan)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"random {layout} checkpoint") as progress:
        for folder, config, emb4, plan in jobs:
            folder.mkdir(parents=True)
            config.save_pretrained(folder)
            GenerationConfig.from_model_config(config).save_pretrained(folder)
            qconfig = quantization_config(emb4)
            qconfig.quantization_status = QuantizationStatus.COMPRESSED
            finish_config(folder, spec, ModelCompressor(quantization_config=qconfig))
            _write_shards(folder, plan, seed, shard_bytes, progress)
