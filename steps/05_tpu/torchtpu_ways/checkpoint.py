"""Reading a Gemma 4 checkpoint the way the Rust engine does (steps/03_model/src/config.rs and weights.rs):
the text config from `config.json`, tensors from safetensors (one file or a sharded index), and W4A16
"pack-quantized" weights unpacked bit for bit as compressed-tensors does.

Nothing here depends on the Rust engine: the Python ways may run under another interpreter and torch.
"""
import json
from pathlib import Path

import torch
from safetensors import safe_open


class TextConfig:
    """The text model's hyper-parameters. Every number comes from `config.json` (its `text_config` in the
    multimodal layout); nothing about E2B is hard-coded."""

    def __init__(self, text: dict):
        self.hidden_size = text["hidden_size"]
        self.num_hidden_layers = text["num_hidden_layers"]
        self.num_key_value_heads = text["num_key_value_heads"]
        self.head_dim = text["head_dim"]
        # Transformers defaults a missing global_head_dim to 512; so does the Rust engine
        self.global_head_dim = text.get("global_head_dim") or 512
        self.hidden_size_per_layer_input = text["hidden_size_per_layer_input"]
        self.vocab_size = text["vocab_size"]
        self.vocab_size_per_layer_input = text["vocab_size_per_layer_input"]
        self.num_kv_shared_layers = text.get("num_kv_shared_layers", 0)
        self.sliding_window = text["sliding_window"]
        self.max_position_embeddings = text["max_position_embeddings"]
        self.rms_norm_eps = text["rms_norm_eps"]
        self.final_logit_softcapping = text.get("final_logit_softcapping")
        self.layer_types = list(text["layer_types"])
        self.rope_parameters = text["rope_parameters"]
        # as Transformers: tied unless the config says otherwise, and then the head is the table even when a
        # checkpoint also ships an `lm_head`
        self.tie_word_embeddings = text.get("tie_word_embeddings", True)
        if text.get("hidden_activation") != "gelu_pytorch_tanh":
            raise NotImplementedError(f"hidden_activation {text.get('hidden_activation')!r} is not gelu_pytorch_tanh")
        if text.get("attention_k_eq_v"):
            raise NotImplementedError("attention_k_eq_v = true (values shared with keys) is not implemented")

    @classmethod
    def from_file(cls, path: Path) -> "TextConfig":
        config = json.loads(Path(path).read_text())
        return cls(config.get("text_config", config))

    def is_full(self, layer: int) -> bool:
        return self.layer_types[layer] == "full_attention"

    def head_dim_of(self, layer: int) -> int:
        return self.global_head_dim if self.is_full(layer) else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        # `num_global_key_value_heads` counts only with `attention_k_eq_v` (Transformers), refused above
        return self.num_key_value_heads

    @property
    def first_shared(self) -> int:
        """The first layer that reuses another layer's keys and values instead of computing its own."""
        return self.num_hidden_layers - self.num_kv_shared_layers

    def kv_source(self, layer: int) -> int:
        """Whose keys and values `layer` attends over: its own, or (KV-shared layers) those of the last
        non-shared layer of the same attention type."""
        if layer < self.first_shared:
            return layer
        return max(j for j in range(self.first_shared) if self.layer_types[j] == self.layer_types[layer])

    def layout(self) -> tuple[int, int, int, int]:
        """(full-attention rings, sliding rings, KV-shared layers, sliding ring length), as the engine's layout()."""
        owners = self.layer_types[: self.first_shared]
        full = owners.count("full_attention")
        return full, len(owners) - full, self.num_kv_shared_layers, 2 * self.sliding_window


# --8<-- [start:unpack]
def unpack_int4(packed: torch.Tensor, scale: torch.Tensor, cols: int) -> torch.Tensor:
    """W4A16 rows as compressed-tensors decompresses them: 8 values per int32 word, low nibble first, stored as
    `q + 8`; `q.to(scale.dtype) * scale` per group of columns, so each weight is rounded once to the scale dtype."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # the arithmetic shift of a negative word is masked off
    q = nibbles.flatten(-2)[..., :cols] - 8
    groups = scale.shape[-1]
    w = q.to(scale.dtype).unflatten(-1, (groups, cols // groups)) * scale.unsqueeze(-1)
    return w.flatten(-2)


def nbytes(*tensors: torch.Tensor) -> int:
    """Bytes the tensors hold."""
    return sum(t.numel() * t.element_size() for t in tensors)


class DenseTable:
    """An embedding table as stored (bf16): rows are cast to the compute dtype when gathered."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.index_select(0, ids)

    def row_bytes(self) -> int:
        return self.weight.shape[1] * self.weight.element_size()

    def bytes(self) -> int:
        return nbytes(self.weight)

    def dequantize(self) -> torch.Tensor:
        return self.weight


class PackedTable:
    """An int4 table kept packed on the device; an embedding lookup unpacks only the rows it gathers."""

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, cols: int):
        self.packed, self.scale, self.cols = packed, scale, cols

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return unpack_int4(self.packed.index_select(0, ids), self.scale.index_select(0, ids), self.cols)

    def row_bytes(self) -> int:
        return self.packed.shape[1] * self.packed.element_size() + self.scale.shape[1] * self.scale.element_size()

    def bytes(self) -> int:
        return nbytes(self.packed, self.scale)

    def dequantize(self) -> torch.Tensor:
        return unpack_int4(self.packed, self.scale, self.cols)
# --8<-- [end:unpack]


class Checkpoint:
    """A checkpoint folder: `config.json` plus `model.safetensors` or `model.safetensors.index.json` + shards.
    Files are opened with safetensors' `safe_open` (memory-mapped); each tensor is read when asked for."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"{self.folder}: no such checkpoint folder")
        quantization = json.loads((self.folder / "config.json").read_text()).get("quantization_config")
        if quantization and quantization.get("format") != "pack-quantized":
            raise NotImplementedError(f"{self.folder}: quantization format {quantization.get('format')!r}: "
                                      "only compressed-tensors pack-quantized (W4A16) is implemented")
        index = self.folder / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
            else ["model.safetensors"]
        self.files = {}  # tensor name -> the open file that holds it
        for name in files:
            if not (self.folder / name).is_file():
                raise FileNotFoundError(f"{self.folder / name}: missing safetensors file")
            handle = safe_open(self.folder / name, framework="pt")
            self.files.update({key: handle for key in handle.keys()})
        # Gemma4ForCausalLM keeps the text model under `model.`, Gemma4ForConditionalGeneration under
        # `model.language_model.`; an untied `lm_head.*` sits at the top in both
        multimodal = any(key.startswith("model.language_model.") for key in self.files)
        self.prefix = "model.language_model." if multimodal else "model."

    def full_name(self, name: str) -> str:
        return name if name.startswith("lm_head.") else self.prefix + name

    def has(self, name: str) -> bool:
        return self.full_name(name) in self.files

    def read(self, name: str) -> torch.Tensor:
        """The tensor `name` (without the model prefix) on the host, in its stored dtype."""
        full = self.full_name(name)
        if full not in self.files:
            raise ValueError(f"missing tensor {full} in {self.folder}")
        return self.files[full].get_tensor(full)

    def dense(self, name: str, dtype: torch.dtype, device) -> torch.Tensor:
        return self.read(name).to(dtype).to(device)

    def packed(self, module: str, device) -> PackedTable:
        """An int4 matrix as stored: `weight_packed`, `weight_scale` (bf16 or f16) and `weight_shape`."""
        rows, cols = self.read(f"{module}.weight_shape").tolist()
        packed, scale = self.read(f"{module}.weight_packed"), self.read(f"{module}.weight_scale")
        if packed.shape[0] != rows or cols % scale.shape[1] != 0:
            raise ValueError(f"{self.full_name(module)} in {self.folder}: packed {list(packed.shape)} and "
                             f"scale {list(scale.shape)} do not fit weight_shape [{rows}, {cols}]")
        return PackedTable(packed.to(device), scale.to(device), cols)

    def table(self, name: str, device) -> DenseTable | PackedTable:
        """An embedding table (`embed_tokens`, `embed_tokens_per_layer`) as stored: dense, or packed int4."""
        if self.has(f"{name}.weight_packed"):
            return self.packed(name, device)
        return DenseTable(self.read(f"{name}.weight").to(device))

    def linear(self, module: str, dtype: torch.dtype, device) -> torch.Tensor:
        """A linear layer's weight [out, in] in the compute dtype: unpacked once (on the host) if stored packed."""
        if self.has(f"{module}.weight_packed"):
            return self.packed(module, "cpu").dequantize().to(dtype).to(device)
        return self.dense(f"{module}.weight", dtype, device)
