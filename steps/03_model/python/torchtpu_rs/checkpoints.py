"""Gemma 4 checkpoints made here, in exactly the formats of the real repacks, so every step runs without downloads.

The real weights are `gemma-4-E2B-it-qat-q4_0-w4a16-ct-text` (every linear 4-bit, tables bf16) and its twin
`...-text-emb4` (the embedding tables and an untied head 4-bit too). `make()` writes both twins of a random model,
side by side, as `text/` and `emb4/`:

* `size="tiny"`: a small model with every structural feature of E2B (4:1 sliding/full layers, two head sizes,
  proportional RoPE, KV-shared layers of both types, double-wide MLPs, per-layer embeddings, softcap 30). It is
  built by Transformers and packed by compressed-tensors, the libraries the real files come from; seconds to make.
* `size="e2b"`: the real E2B shapes (6.1 GiB + 2.6 GiB on disk), for benchmarks. No float model is built (it would
  take 8.6 GiB in bf16): `write_random` generates each tensor in row blocks, packs it with `pack_w4` (this project's
  packer, checked bit for bit against compressed-tensors on the tiny model) and streams it into safetensors shards.

Both paths draw every tensor from `random_block`, so the same seed gives the same model either way (a test holds
`write_random` on the tiny config to the Transformers + compressed-tensors files, tensor for tensor).
Each twin also gets a small word-level tokenizer with Gemma's special ids (`write_tokenizer`).
`tiny()` and `e2b()` return cached folders, made on first use. Transformers and compressed-tensors are imported
inside the functions that need them: a cache hit costs no import of either (seconds).
"""
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

# Bump whenever the bytes `make` writes for a given (size, layout, seed) change: it is part of the cache key.
GENERATOR_VERSION = 2

LAYOUTS = ("causal", "multimodal")
GROUP = 32  # int4 group size of the real repacks
ROWS = 4096  # rows per random block: one block of the E2B PLE table is 4096 x 8960 floats (147 MB)
SHARD_BYTES = 2 * 2**30

_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}
_COMMON = dict(
    num_key_value_heads=1, num_global_key_value_heads=None, use_double_wide_mlp=True, attention_k_eq_v=False,
    max_position_embeddings=131072, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2, rope_parameters=_ROPE,
)
# The real gemma-4-E2B text config (notes/gemma4-text.md).
E2B = dict(
    _COMMON, vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size=1536, intermediate_size=6144,
    num_hidden_layers=35, num_attention_heads=8, head_dim=256, global_head_dim=512, hidden_size_per_layer_input=256,
    num_kv_shared_layers=20, sliding_window=512, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
)
# E2B in miniature. Layers 5..9 are KV-shared (sliding ones read layer 3's cache, full ones layer 4's, as E2B's
# 15..34 read 13 and 14) and double-wide; a 16-token window is crossed several times by a 64-token run.
TINY = dict(
    _COMMON, vocab_size=512, vocab_size_per_layer_input=512, hidden_size=128, intermediate_size=256,
    num_hidden_layers=10, num_attention_heads=4, head_dim=32, global_head_dim=64, hidden_size_per_layer_input=32,
    num_kv_shared_layers=5, sliding_window=16, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
)
SPECS = {"tiny": TINY, "e2b": E2B}


def text_config(spec=TINY, tied=True):
    """The Gemma4TextConfig of a spec (TINY, E2B); `tied=False` unties the output head (the emb4 twin)."""
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(**{k: (list(v) if isinstance(v, list) else v) for k, v in spec.items()},
                            tie_word_embeddings=tied)


def _model_config(text, layout):
    """Wrap a text config for a layout: `causal` is Gemma4ForCausalLM (tensors under `model.`), `multimodal` is
    Gemma4ForConditionalGeneration with no vision or audio tower (tensors under `model.language_model.`)."""
    from transformers import Gemma4Config

    if layout == "causal":
        text.architectures = ["Gemma4ForCausalLM"]
        return text
    config = Gemma4Config(text_config=text, vision_config=None, audio_config=None,
                          tie_word_embeddings=text.tie_word_embeddings)
    config.architectures = ["Gemma4ForConditionalGeneration"]
    return config


def _model_class(layout):
    from transformers import Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    return {"causal": Gemma4ForCausalLM, "multimodal": Gemma4ForConditionalGeneration}[layout]


# ---------------------------------------------------------------------------------------------------------------
# Random weights
# ---------------------------------------------------------------------------------------------------------------

def _text_name(name):
    """The layout-free name a tensor is seeded by, so both layouts hold the same model. An untied head starts as a
    copy of the embedding table: the emb4 twin re-packs the -text model's tied head, it is no new model."""
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return "embed_tokens.weight" if name == "lm_head.weight" else name


def random_block(name, shape, seed, block=0):
    """Rows [block*ROWS, (block+1)*ROWS) of the bf16 tensor `name` (a layout-free name, see `_text_name`).

    Each block has its own generator, seeded from (seed, name, block): a tensor is the same whether it is made
    whole (the tiny path) or streamed block by block (the E2B writer), and independent of every other tensor.
    HF's init (std 0.02, unit norms) makes a near-constant model. These values make every path matter and keep
    greedy decoding varied (50 or so distinct tokens in 64 on the tiny model, on every seed tried) and calm."""
    rows = shape[0] if len(shape) == 2 else 1
    shape = (min(ROWS, rows - block * ROWS), *shape[1:]) if len(shape) == 2 else tuple(shape)
    key = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))
    if name.endswith("layer_scalar"):  # scales the whole residual stream each layer: near 1, or it compounds
        return (0.8 + 0.4 * torch.rand(shape, generator=g)).to(torch.bfloat16)
    n = torch.randn(shape, generator=g)
    if name.endswith(("q_norm.weight", "k_norm.weight")):  # attention scaling is 1.0: these set its temperature
        x = 0.5 * (1.0 + 0.1 * n)
    elif name == "embed_tokens.weight":
        # The head is tied, so the current token's own embedding, still in the residual stream, votes for that
        # token: at full size it wins and the model repeats one token forever. A quarter of it leaves the echo
        # below the spread of the logits (layer inputs are normed: this scale reaches only the residual and head).
        x = 0.25 * n / math.sqrt(shape[1])
    elif name == "norm.weight":  # the final norm: logits of std 4, about +-12 at the top, so the softcap bends them
        x = 16.0 * (1.0 + 0.1 * n)
    elif name.endswith("norm.weight"):
        x = 1.0 + 0.2 * n
    else:  # linears and the per-layer table: unit-variance outputs for unit-variance inputs
        x = n / math.sqrt(shape[1])
    return x.to(torch.bfloat16)


def _row_blocks(shape):
    """The row slices of a tensor's random blocks: ROWS rows each, one block for a 1-D tensor."""
    return [slice(None)] if len(shape) == 1 else [slice(r, r + ROWS) for r in range(0, shape[0], ROWS)]


def random_tensor(name, shape, seed):
    """The whole bf16 tensor, filled block by block in place (no second copy: the E2B PLE table is 4.4 GiB)."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    for b, rows in enumerate(_row_blocks(shape)):
        out[rows] = random_block(name, shape, seed, b)
    return out


# ---------------------------------------------------------------------------------------------------------------
# W4A16 packing
# ---------------------------------------------------------------------------------------------------------------

def quantization_config(emb4=False):
    """The compressed-tensors config of a twin. -text: every nn.Linear of the text model 4-bit (symmetric int4,
    groups of 32 along the input, scales in the weight's dtype: bf16); the tied head is not stored. -text-emb4: the
    same linears, plus a group for the two embedding tables and the untied head with F16 scales. That group comes
    first: compressed-tensors gives a module the scheme of its most specific target (an exact name beats a regex
    beats a class name) either way, but it warns about a target that an earlier one (`Linear`) already claimed."""
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 QuantizationStatus)

    w4 = dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)
    linears = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**w4))
    if not emb4:
        return QuantizationConfig(config_groups={"group_0": linears}, ignore=["lm_head"], format="pack-quantized",
                                  quantization_status=QuantizationStatus.INITIALIZED)
    tables = QuantizationScheme(targets=["lm_head", "re:.*embed_tokens$", "re:.*embed_tokens_per_layer$"],
                                weights=QuantizationArgs(**w4, scale_dtype=torch.float16))
    return QuantizationConfig(config_groups={"group_0": tables, "group_1": linears}, ignore=[],
                              format="pack-quantized", quantization_status=QuantizationStatus.INITIALIZED)


def pack_w4(weight, group=GROUP, scale_dtype=torch.bfloat16):
    """Pack a 2-D weight [out, in] the way compressed-tensors' minmax + pack-quantized does, bit for bit.

    scale = max|w| / 7.5 per group of `group` columns (calculate_qparams: absmax / ((qmax - qmin) / 2)), computed in
    float32 and rounded once to `scale_dtype` (bf16 division rounds exactly so); an all-zero group gets the dtype's
    eps. q = round(clamp(w / scale, -8, 7)), half to even, with the division in the dtypes' promotion (bf16 / bf16
    rounds to bf16 before the round, as in compressed-tensors). Stored nibble q + 8, element j of a row in int32 word
    j // 8 at bits 4 * (j % 8): low nibble first.
    Returns {"weight_packed": int32 [out, in/8], "weight_scale": [out, in/group], "weight_shape": int64 [2]}."""
    rows, cols = weight.shape
    groups = weight.unflatten(-1, (cols // group, group))
    absmax = groups.abs().amax(-1).float()
    scale = (absmax / 7.5).clamp(max=torch.finfo(scale_dtype).max).to(scale_dtype)
    scale = torch.where(scale == 0, torch.finfo(scale_dtype).eps, scale)
    q = (torch.round(torch.clamp(groups / scale.unsqueeze(-1), -8, 7)) + 8).to(torch.uint8).flatten(-2)
    # two nibbles per byte, even element low; four little-endian bytes make an int32 word
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).view(torch.int32)
    return {"weight_packed": packed, "weight_scale": scale, "weight_shape": torch.tensor([rows, cols])}


@torch.no_grad()
def compress_with_ct(model, qconfig):
    """Quantize and pack `model` in place with compressed-tensors, as llm-compressor would for W4A16: weight-only
    min/max scales (no calibration data needed), then PackedQuantizationCompressor. Returns the ModelCompressor,
    whose `update_config(folder)` writes `quantization_config` into a saved config.json."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    apply_quantization_config(model, qconfig, show_progress=False)
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        args = scheme.weights
        groups = module.weight.unflatten(-1, (-1, args.group_size))
        if args.scale_dtype is not None:
            # compressed-tensors 0.20 creates every scale parameter in the weight's dtype and only rounds the values
            # to `scale_dtype`; for real F16 scales compute them in float32, let calculate_qparams round them to
            # F16, and store that dtype (the compressor packs with the scale it is given, whatever its dtype).
            groups = groups.float()
        scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        module.weight_scale = torch.nn.Parameter(scale.to(args.scale_dtype or module.weight.dtype),
                                                 requires_grad=False)
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor(quantization_config=qconfig, force_compression_format="pack-quantized")
    compressor.compress_model(model)
    return compressor


def _finish_config(folder, spec, compressor):
    """config.json as the real checkpoints have it: Transformers writes `per_layer_config: {"4": {"head_dim": ...}}`,
    the real files carry `global_head_dim` and `num_global_key_value_heads` (which Gemma4TextConfig turns into
    per_layer_config on load; a config with neither silently means 512). Then the quantization_config."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    tc = config.get("text_config", config)
    tc.pop("per_layer_config")
    tc["global_head_dim"] = spec["global_head_dim"]
    tc["num_global_key_value_heads"] = spec["num_global_key_value_heads"]
    config["dtype"] = tc["dtype"] = "bfloat16"  # of the unpacked tensors (Transformers names the first one's: F16)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    compressor.update_config(str(folder))


# ---------------------------------------------------------------------------------------------------------------
# The tiny path: Transformers builds, compressed-tensors packs
# ---------------------------------------------------------------------------------------------------------------

@torch.no_grad()
def _write_with_ct(folder, spec, layout, seed, emb4):
    model = _model_class(layout)(_model_config(text_config(spec, tied=not emb4), layout)).to(torch.bfloat16)
    for name, t in model.state_dict().items():  # parameters and the persistent layer_scalar buffers
        t.copy_(random_tensor(_text_name(name), t.shape, seed))
    compressor = compress_with_ct(model, quantization_config(emb4))
    model.save_pretrained(folder)
    _finish_config(folder, spec, compressor)


# ---------------------------------------------------------------------------------------------------------------
# The E2B path: this project's packer, streamed into shards
# ---------------------------------------------------------------------------------------------------------------

def _tensor_plan(config, layout, emb4):
    """[(checkpoint name, shape, scale dtype or None for a plain bf16 tensor)] in state-dict order, read off a model
    on the meta device (no memory); which modules are packed, and with which scale dtype, is decided by
    compressed-tensors' own matching of `quantization_config(emb4)`, as on the tiny path."""
    from compressed_tensors.quantization import apply_quantization_config

    with torch.device("meta"):
        model = _model_class(layout)(config)
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
    key = _text_name(name)
    if scale_dtype is None:
        return {name: random_tensor(key, shape, seed)}
    rows, cols = shape
    prefix = name.removesuffix(".weight")
    packed = torch.empty(rows, cols // 8, dtype=torch.int32)
    scale = torch.empty(rows, cols // GROUP, dtype=scale_dtype)
    for b, block in enumerate(_row_blocks(shape)):
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
        config = _model_config(text_config(spec, tied=not emb4), layout)
        jobs.append((Path(out_dir) / twin, config, emb4, _tensor_plan(config, layout, emb4)))
    total = sum(_nbytes(shape, dt) for *_, plan in jobs for _, shape, dt in plan)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"random {layout} checkpoint") as progress:
        for folder, config, emb4, plan in jobs:
            folder.mkdir(parents=True)
            config.save_pretrained(folder)
            GenerationConfig.from_model_config(config).save_pretrained(folder)
            qconfig = quantization_config(emb4)
            qconfig.quantization_status = QuantizationStatus.COMPRESSED
            _finish_config(folder, spec, ModelCompressor(quantization_config=qconfig))
            _write_shards(folder, plan, seed, shard_bytes, progress)


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]  # ids 0..3, as in Gemma
PUNCTUATION = list(".,:;?!'\"()-/%$#&*+=<>[]_@")
# Words that start a line (no space before them) also come without the space mark.
STARTERS = "Record Question Answer What Which Find The Code Number Note Here This It A In".split()
WORDS = """
record records code codes the is what of answer question find number numbers a an and or to in on at for with by
from as it its this that these those which who whom whose when where why how there here be was were are been has
have had do does did not no yes all any each every some many most more less few one two three four five six seven
eight nine ten first second third last next previous value values key keys list table entry entries item items line
lines field name names id ids give tell show return only exactly digit digits text document file page section part
note please read copy write below above after before between among following same different other another word words
long short small large big new old good bad right wrong true false correct incorrect unknown given known search look
match matches found missing contains contain includes include stored store memory context prompt output input data
can could will would should may might must shall if then else than so because but also just very too again still
about into over under up down out off through during without within against across along around near far i you he
she we they me him her us them my your his our their mine yours time day days year years week month hour minute
people person man woman child world life hand place case point group company system program work home water room
mother area money story fact lot study book eye job business issue side kind head house service friend father power
end member law car city community president team idea kid body information back parent face others level office door
health art war history party result change morning reason research girl guy moment air teacher force education make
made get got go went come came take took see saw know knew think thought say said use used want need feel try leave
call keep let begin seem help turn start run move live believe hold bring happen provide sit stand lose pay meet set
learn lead understand watch follow stop create speak allow add spend grow open walk win offer remember love consider
appear buy wait serve die send expect build stay fall cut reach kill remain suggest raise pass sell require report
decide pull check count sum total well way even much great little own high early young important public able free
sure clear full special easy strong certain whole real best better late hard major nothing something everything
anything always never often sometimes usually already soon today
""".split()


def write_tokenizer(folder):
    """A small real tokenizer that AutoTokenizer loads: word-level, one entry per id of the tiny vocabulary (512),
    with Gemma's special ids (<pad>=0, <eos>=1, <bos>=2) and, like Gemma's, no <bos> added: callers prepend 2.
    Spaces become "▁" marks as in sentencepiece, so text decodes back to itself; numbers split into single digits,
    so the codes of a record-retrieval prompt ("Record 17: code 610395.") are digit tokens; unknown words are <unk>.
    The E2B checkpoint gets the same one: its ids from 512 up decode to nothing."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIAL + [str(d) for d in range(10)] + PUNCTUATION + ["▁", "\n"]
    tokens += [t for w in STARTERS for t in (w, "▁" + w)] + ["▁" + w for w in WORDS]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens) == TINY["vocab_size"], "one token per id, no repeats"
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", "isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation("isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                            unk_token="<unk>").save_pretrained(str(folder))


# ---------------------------------------------------------------------------------------------------------------
# Making and caching
# ---------------------------------------------------------------------------------------------------------------

def make(out_dir, size="tiny", layout="causal", seed=0):
    """Write `out_dir/text/` (the -text format) and `out_dir/emb4/` (the -text-emb4 twin) of a random Gemma 4 of
    `size` ("tiny" or "e2b") and `layout` ("causal" or "multimodal"), each with a tokenizer. Same arguments, same
    bytes. Refuses to write into an existing non-empty folder (FileExistsError): it never overwrites anything."""
    if size not in SPECS or layout not in LAYOUTS:
        raise ValueError(f"size must be one of {tuple(SPECS)} and layout one of {LAYOUTS}, got {size!r}, {layout!r}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; make() writes only into a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    if size == "tiny":
        for twin, emb4 in (("text", False), ("emb4", True)):
            _write_with_ct(out / twin, TINY, layout, seed, emb4)
    else:
        write_random(out, E2B, seed, layout)
    for twin in ("text", "emb4"):
        write_tokenizer(out / twin)
    return out


def cache_root():
    """$TORCHTPU_RS_CACHE if set; else `.cache/checkpoints` at the top of the git checkout holding the working
    directory; else ~/.cache/torchtpu_rs/checkpoints."""
    if "TORCHTPU_RS_CACHE" in os.environ:
        return Path(os.environ["TORCHTPU_RS_CACHE"])
    cwd = Path.cwd().resolve()
    top = next((d for d in (cwd, *cwd.parents) if (d / ".git").exists()), None)
    return top / ".cache" / "checkpoints" if top else Path.home() / ".cache" / "torchtpu_rs" / "checkpoints"


def cache_path(size="tiny", layout="causal", seed=0):
    """Where `cached(size, layout, seed)` keeps its checkpoint: `<cache_root>/<size>-<layout>-seed<seed>-<key>`,
    the key a hash of the arguments and GENERATOR_VERSION."""
    key = hashlib.sha256(json.dumps([size, layout, seed, GENERATOR_VERSION]).encode()).hexdigest()[:12]
    return cache_root() / f"{size}-{layout}-seed{seed}-{key}"


def cached(size="tiny", layout="causal", seed=0):
    """The cached `make(size, layout, seed)` folder, made on first use. It is made in a temporary sibling and renamed
    into place, so a reader never sees half a checkpoint; if another process renamed its copy first, that one wins."""
    final = cache_path(size, layout, seed)
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        make(tmp, size, layout, seed)
        try:
            tmp.rename(final)
        except OSError:  # another process renamed its copy first: use the winner's
            if not final.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def tiny(layout="causal", seed=0):
    """The cached tiny checkpoint folder (holding `text/` and `emb4/`)."""
    return cached("tiny", layout, seed)


def e2b(seed=0):
    """The cached full-size random E2B checkpoint folder (about 9 GB; minutes to make once)."""
    return cached("e2b", "causal", seed)
