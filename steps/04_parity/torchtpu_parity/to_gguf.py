"""The project's checkpoints as GGUF files for llama.cpp: bf16 by llama.cpp's own converter, Q8_0 and Q4_0 by its
own quantizer, cached beside the checkpoints.

    files = to_gguf.ggufs(model_dir, ["q4_0", "q8_0"])   # {"q4_0": Path, "q8_0": Path}, made once, then cached

The converter (`convert_hf_to_gguf.py` from the sdist `make peer` built) reads a compressed-tensors W4A16
checkpoint itself: it dequantizes q × scale and writes bf16, the weights the engine computes with. Its one
obstacle is the tokenizer: Gemma 4's converter expects Gemma's BPE `tokenizer.json`, and this project's is
word-level. So the converter gets a stand-in vocabulary (`stand_in_vocab`): the same strings under the same ids,
sentencepiece-style with zero scores, ids 0-3 control tokens, bos/eos/pad/unk from the config. The bench never
uses llama.cpp's tokenizer (it reads token ids), so the vocabulary only has to load: every id must be named,
because Gemma 3's converter rule cuts the embedding table to the tokenizer's entry count, and at E2B size this
project's tokenizer names 512 of 262,144 ids. The stand-in names the rest `<unusedN>` and keeps the whole table.

The conversion and the quantizing each run in a fresh process (`python -m torchtpu_parity.to_gguf ...`): the
converter registers its model classes globally, and the calling process (a comparison, a bench) stays free of
llama_cpp.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from . import peer
from .child_env import source_first

CONTROL, NORMAL, UNUSED = 3, 1, 5  # gguf.TokenType, as sentencepiece numbers them
# llama.cpp's file types (enum llama_ftype): the quantizer's targets
FTYPES = {"q4_0": 2, "q8_0": 7}


# --8<-- [start:stand_in]
def stand_in_vocab(model_dir) -> dict:
    """The stand-in vocabulary of a checkpoint: {"tokens", "types", "bos", "eos", "pad", "unk"}, one token per id
    of the config's vocab_size. ValueError when the tokenizer names an id twice or past the vocabulary."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    size = config["vocab_size"]
    vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    named = {i: t for t, i in vocab.items()}
    if len(named) != len(vocab) or max(named) >= size:
        raise ValueError(f"{model_dir / 'tokenizer.json'}: its ids must be distinct and below vocab_size {size}")
    tokens = [named.get(i, f"<unused{i}>") for i in range(size)]
    if len(set(tokens)) != size:
        raise ValueError(f"{model_dir / 'tokenizer.json'}: a token is spelled like a stand-in name <unusedN>")
    types = [CONTROL if i < 4 else NORMAL if i in named else UNUSED for i in range(size)]
    eos = config.get("eos_token_id", 1)
    return {"tokens": tokens, "types": types, "bos": config.get("bos_token_id", 2),
            "eos": eos[0] if isinstance(eos, list) else eos, "pad": config.get("pad_token_id", 0),
            "unk": vocab.get("<unk>", 3)}
# --8<-- [end:stand_in]


def folder_for(model_dir) -> Path:
    """Where a checkpoint's GGUFs live: beside the cached checkpoints, keyed on its config and its files' names
    and sizes (cheap: no 9 GB hash) and the peer's version."""
    from torchtpu_rs import checkpoints

    model_dir = Path(model_dir).resolve()
    key = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")) + [model_dir / "tokenizer.json"]:
        key.update(f"{f.name} {f.stat().st_size}\n".encode())
    key.update(peer.VERSION.encode())
    parent = model_dir.parent  # the trained model's is its layout: name the folder above it too
    label = f"{parent.parent.name}-{parent.name}" if parent.name in checkpoints.LAYOUTS else parent.name
    return checkpoints.cache_root() / f"gguf-{label}-{model_dir.name}-{key.hexdigest()[:12]}"


def run_child(*args: str, lib: str | None = None) -> None:
    """`python -m torchtpu_parity.to_gguf ARGS` in a fresh process (this package importable there too)."""
    env = source_first(dict(os.environ), __file__)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    proc = subprocess.run([sys.executable, "-m", "torchtpu_parity.to_gguf", *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"to_gguf {' '.join(args)} failed (exit code {proc.returncode}):\n{proc.stdout[-3000:]}")


def ggufs(model_dir, quants) -> dict[str, Path]:
    """{quant: GGUF path} for each of `quants` (q4_0, q8_0, bf16), made where missing: bf16 by the converter, the
    others by llama.cpp's quantizer from the bf16 file. Each is written under a temporary name and renamed."""
    if bad := [q for q in quants if q not in peer.QUANTS]:
        raise ValueError(f"quants {bad}: choose from {', '.join(peer.QUANTS)}")
    if not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (a -text checkpoint folder is expected)")
    folder = folder_for(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    out = {q: folder / f"{q}.gguf" for q in quants}
    bf16 = folder / "bf16.gguf"
    if not bf16.is_file() and any(not path.is_file() for path in out.values()):
        tmp = folder / f"bf16.gguf.{os.getpid()}.tmp"
        run_child("convert", str(model_dir), str(tmp))
        tmp.rename(bf16)
    for quant, path in out.items():
        if not path.is_file():
            tmp = folder / f"{quant}.gguf.{os.getpid()}.tmp"
            run_child("quantize", str(bf16), str(tmp), quant, lib=peer.any_build()["lib"])
            tmp.rename(path)
    return out


# --- in the child process -------------------------------------------------------------------------------------

def convert(model_dir: str, out: str) -> None:
    """llama.cpp's converter on `model_dir`, bf16, with the stand-in vocabulary (see the module docstring)."""
    folder = peer.converter()
    sys.path[:0] = [str(folder), str(folder / "gguf-py")]
    import convert_hf_to_gguf  # noqa: F401  (sets up the converter's registry of model classes)
    from conversion import ModelBase
    from conversion.base import TextModel
    from conversion.gemma import Gemma4Model

    vocab = stand_in_vocab(model_dir)

    class StandInVocab(Gemma4Model):
        model_arch = Gemma4Model.model_arch  # the converter asks each class for its own

        def set_vocab(self):
            w = self.gguf_writer
            w.add_tokenizer_model("llama")  # sentencepiece-style: a token list with scores, no merges
            w.add_token_list(vocab["tokens"])
            w.add_token_scores([0.0] * len(vocab["tokens"]))
            w.add_token_types(vocab["types"])
            w.add_bos_token_id(vocab["bos"])
            w.add_eos_token_id(vocab["eos"])
            w.add_pad_token_id(vocab["pad"])
            w.add_unk_token_id(vocab["unk"])
            w.add_add_bos_token(False)  # the ids the bench passes already start with <bos>
            w.add_add_space_prefix(False)

        def modify_tensors(self, data_torch, name, bid):
            if "embed_tokens.weight" in name:  # skip Gemma 3's cut of the table to tokenizer.json's entries
                yield from TextModel.modify_tensors(self, data_torch, name, bid)  # (Gemma 4 shifts no norm)
                return
            yield from super().modify_tensors(data_torch, name, bid)

    for arch in ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"):
        ModelBase.register(arch)(StandInVocab)
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", "bf16", "--outfile", out]
    convert_hf_to_gguf.main()


def quantize(src: str, dst: str, quant: str) -> None:
    """llama.cpp's quantizer (llama_model_quantize, as its llama-quantize tool calls it), with its defaults: for
    Q4_0 that keeps the token table, which is also the tied head, at Q6_K."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} ({quant}) failed")


def main() -> None:
    ap = argparse.ArgumentParser(description="one step of making a checkpoint's GGUFs (ggufs() runs these)")
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("convert")
    c.add_argument("model")
    c.add_argument("out")
    q = sub.add_parser("quantize")
    q.add_argument("src")
    q.add_argument("dst")
    q.add_argument("quant", choices=sorted(FTYPES))
    args = ap.parse_args()
    if args.what == "convert":
        convert(args.model, args.out)
    else:
        quantize(args.src, args.dst, args.quant)


if __name__ == "__main__":
    main()
