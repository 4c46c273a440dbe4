"""Step 04: the Rust engine beside Hugging Face Transformers on the CPU — same checkpoint, same prompt.

usage: python run.py [--model DIR] [--emb4 DIR] [--reference-model DIR] [--dtype bfloat16|float32]
                     [--attention-dtype bfloat16|float32] [--matvec aten|onednn] [--prompt-len N] [--max-new 64]
                     [--layers] [--plant-fault LAYER] [--json PATH]
The reference defaults to the folder the engine's tables come from: the emb4 twin when given, else --model.
"""
import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch  # first: the engine reuses the libtorch it loads
import torchtpu_rs
from safetensors.torch import load_file, save_file
from torchtpu_parity import compare
from torchtpu_rs import cli, prompting, records
from torchtpu_rs.reference import transformers_model
from transformers import AutoTokenizer

# The task the default model learned; its right answer is 220431.
PROMPT = ("Record 1: code 482913. Record 2: code 705126. Record 3: code 610395. Record 4: code 238470. "
          "Record 5: code 220431. Record 6: code 957302. What is the code of record 5? Answer:")


def prompt_ids(tokenizer, length: int | None) -> list[int]:
    """<bos> and the prompt's tokens; with a length, the prompt repeated and cut to exactly that many ids."""
    ids = prompting.encode(tokenizer, PROMPT)
    if length is None:
        return ids
    return [ids[0], *(ids[1:] * (length // len(ids) + 1))][:length]


def plant_fault(model: Path, layer: int, into: Path) -> Path:
    """A copy of `model` with one layer's query projection negated (its scales times -1): the layer attends to
    the wrong tokens, a bug the layer comparison must find. (Scaling a projection up would hide: the norm after
    each block undoes it.)"""
    faulty = into / model.name
    shutil.copytree(model, faulty)
    tensors = load_file(faulty / "model.safetensors")
    name = next(k for k in tensors if k.endswith(f"layers.{layer}.self_attn.q_proj.weight_scale"))
    tensors[name] = -tensors[name]
    save_file(tensors, faulty / "model.safetensors", metadata={"format": "pt"})
    return faulty


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--reference-model", type=Path, help="the folder Transformers reads (default: see above)")
    ap.add_argument("--attention-dtype", choices=["bfloat16", "float32"],
                    help="what the engine's attention computes in (default: the engine's choice for this CPU)")
    ap.add_argument("--matvec", choices=["aten", "onednn"],
                    help="the kernel for the engine's decode-step linears (onednn: Transformers' own; default: the "
                         "engine's choice for this CPU)")
    ap.add_argument("--prompt-len", type=int, help="prompt length in tokens (default: the built-in prompt)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--layers", action="store_true", help="also compare every hidden state, naming the first off")
    ap.add_argument("--plant-fault", type=int, metavar="LAYER",
                    help="demo: the engine gets a copy whose LAYER has its queries negated (the reference: clean)")
    args = ap.parse_args()
    if args.device not in ("auto", "cpu"):
        ap.error("parity runs on the CPU, where Transformers is the reference: use --device cpu")
    if args.prompt_len is not None and args.prompt_len < 1:
        ap.error(f"--prompt-len {args.prompt_len}: at least 1 (the <bos> token)")
    if args.max_new < 1:
        ap.error(f"--max-new {args.max_new}: at least 1")
    args = cli.resolve(args)
    reference_dir = args.reference_model or args.emb4 or args.model
    clean = args.model  # what the record names: a planted fault is recorded as planted_fault, not its temp folder
    if args.plant_fault is not None:
        layers = prompting.text_config(args.model)["num_hidden_layers"]
        if not 0 <= args.plant_fault < layers:
            ap.error(f"--plant-fault {args.plant_fault}: {args.model} has layers 0 to {layers - 1}")
        # removed when this object is collected, at the latest when the interpreter exits: no copy is left behind
        scratch = tempfile.TemporaryDirectory(prefix="faulty-")
        args.model = plant_fault(args.model, args.plant_fault, Path(scratch.name))
        print(f"planted a fault in layer {args.plant_fault} of the engine's copy; Transformers reads the clean one")

    start = time.perf_counter()
    engine = torchtpu_rs.Engine(args.model, args.emb4, torch.zeros(1), args.ctx, args.dtype,
                                attention_dtype=args.attention_dtype, matvec=args.matvec)
    load_s = time.perf_counter() - start
    print(f"load {load_s:.1f} {engine.layout()}, attention in {engine.attention_dtype}, "
          f"decode's linears on {engine.matvec}")
    reference = transformers_model(reference_dir, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ids = prompt_ids(tokenizer, args.prompt_len)

    r = compare(engine, reference, ids, args.max_new, args.dtype, layers=args.layers)
    print(f"top5 rust {r['top5_rust']['ids']} {r['top5_rust']['logits']}")
    print(f"top5 hf   {r['top5_hf']['ids']} {r['top5_hf']['logits']}")
    print(f"max abs diff {r['max_abs_diff']:.4g} KL(hf||rs) {r['kl_hf_rs']:.3g}")
    print(f"same {r['same']} of {r['of']}")
    print(f"first diff {r['first_diff']}")
    stop = prompting.eos_ids(args.model)
    answers = {who: tokenizer.decode(prompting.until_stop(r[f"tokens_{who}"], stop), skip_special_tokens=True)
               for who in ("rust", "hf")}
    print(f"answer rust {answers['rust']!r}")
    print(f"answer hf   {answers['hf']!r}")
    if args.layers:
        for row in r["layers"]:
            print(f"  hidden {row['index']:>2} {row['name']:<16} max abs diff {row['max_abs_diff']:.3g}"
                  f"{'' if row['ok'] else '   <-- past tolerance ' + format(row['tolerance'], '.3g')}")
        first_off = next((row for row in r["layers"] if not row["ok"]), None)
        print(f"first layer past tolerance: {first_off['name'] if first_off else 'none'}")
    records.write_json(args.json, "cpu", model=records.name(clean),
                       planted_fault=args.plant_fault, emb4=records.name(args.emb4),
                       reference_model=records.name(reference_dir), dtype=args.dtype,
                       attention_dtype=engine.attention_dtype, matvec=engine.matvec, load_s=load_s, prompt_ids=ids,
                       answers=answers, **r)


if __name__ == "__main__":
    main()
