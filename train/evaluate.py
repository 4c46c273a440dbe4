"""Measure the trained model: answers on held-out record prompts before and after the 4-bit export, accuracy by
prompt length up to the full 2,048-token context, and the Rust engine beside Transformers on the same prompts.

    python train/evaluate.py --weights .cache/train/run/model.pt --export DIR --json out.json --chart out.png

An answer is right when greedy decoding gives exactly the record's six digits and then <eos>. Greedy decoding
gives a sequence exactly when every token of it is the argmax after the ones before, so one forward pass over
prompt + expected answer tells (teacher forcing): no generation loop is needed to count right answers.
"""
import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402

HELD_OUT = 200  # prompts of 1..48 records, from seeds training never draws
SWEEP = (1, 4, 8, 16, 24, 32, 48, 64, 96, 144)  # records; 144 fill ~2,000 tokens of the 2,048
PER_LENGTH = 20
SEED_BASE = 10**9  # training draws batches from seeds below 10**7


def held_out(enc, count=HELD_OUT, base=SEED_BASE):
    return [data.lookup_example(enc, random.Random(base + i), 1 + i % data.MAX_RECORDS) for i in range(count)]


def at_length(enc, n, count=PER_LENGTH, base=2 * SEED_BASE):
    return [data.lookup_example(enc, random.Random(base + 1000 * n + i), n) for i in range(count)]


def copies(enc, count=HELD_OUT, span=5, base=3 * SEED_BASE):
    """Step 05's long answer: five records repeated (65 tokens and <eos>), from contexts of 5..48 records."""
    return [data.copy_example(enc, random.Random(base + i), 5 + i % (data.MAX_RECORDS - 4), span)
            for i in range(count)]


@torch.no_grad()
def verdicts(logits_fn, examples, batch=16) -> list[str]:
    """How greedy decoding after each prompt compares with its answer (teacher forcing, see the docstring):
    "right", or what its first wrong token does — "stopped early" (an <eos> inside the answer), "ran on" (no
    <eos> where the answer ends; every answer ends with one) or "wrong token"."""
    out = []
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        seqs = [e.prompt + e.answer for e in chunk]
        ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)  # right padding: causal, no mask
        for j, s in enumerate(seqs):
            ids[j, :len(s)] = torch.tensor(s)
        argmax = logits_fn(ids).argmax(-1)
        for j, e in enumerate(chunk):
            start = len(e.prompt) - 1  # the logits at position t predict token t + 1
            got = argmax[j, start:start + len(e.answer)].tolist()
            at = next((k for k, (g, want) in enumerate(zip(got, e.answer)) if g != want), None)
            eos = e.answer[-1]
            out.append("right" if at is None else "stopped early" if got[at] == eos
                       else "ran on" if e.answer[at] == eos else "wrong token")
    return out


def right(logits_fn, examples, batch=16) -> list[bool]:
    """Whether greedy decoding after each prompt gives exactly its answer."""
    return [v == "right" for v in verdicts(logits_fn, examples, batch)]


def hf_logits(model):
    return lambda ids: model(input_ids=ids).logits.float()


def float_model(weights: Path):
    """The trained float32 weights before export (fake quantization off), in Transformers' Gemma4ForCausalLM."""
    from torchtpu_rs.checkpoints import TINY, text_config
    from transformers import Gemma4ForCausalLM

    config = text_config(TINY, tied=True)
    config._attn_implementation = "eager"
    model = Gemma4ForCausalLM(config).float().eval()
    model.load_state_dict(torch.load(weights, weights_only=False)["model"])
    return model


@torch.no_grad()
def hf_greedy(model, prompt, steps):
    """Transformers' greedy tokens (a plain loop, no cache: the model is tiny) and the top-2 logit margin of each."""
    ids, tokens, margins = list(prompt), [], []
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        top = logits.topk(2)
        tokens.append(top.indices[0].item())
        margins.append(round((top.values[0] - top.values[1]).item(), 4))
        ids.append(tokens[-1])
    return tokens, margins


def engine_agreement(folder: Path, emb4: bool, dtype: str, examples, reference) -> dict:
    """The Rust engine's greedy answer beside Transformers' float32 answer (from `reference`) on each prompt."""
    import torchtpu_rs

    engine = torchtpu_rs.Engine(folder / "text", folder / "emb4" if emb4 else None, torch.empty(0), 2048, dtype)
    disagreements = []
    for i, (e, (ref, margins)) in enumerate(zip(examples, reference)):
        tokens, _, _ = engine.generate(e.prompt, len(e.answer))
        if tokens != ref:
            at = next(k for k, (a, b) in enumerate(zip(tokens, ref)) if a != b)
            disagreements.append({"prompt": i, "records": e.records, "transformers": ref, "engine": tokens,
                                  "first_difference": at, "top2_margin": margins[at]})
    return {"agree": len(examples) - len(disagreements), "total": len(examples), "disagreements": disagreements}


def fraction(flags):
    return round(sum(flags) / len(flags), 4)


def main(argv=None) -> None:
    from torchtpu_rs import records
    from torchtpu_rs.reference import transformers_model
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, help="the float weights before export (train.py's model.pt)")
    ap.add_argument("--export", type=Path, required=True, help="the exported folder (<layout>/text, <layout>/emb4)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--chart", type=Path)
    ap.add_argument("--against", type=Path, help="an earlier evaluate.json (the shipped model's) to compare with")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    start = time.perf_counter()

    enc = data.Encoder(AutoTokenizer.from_pretrained(a.export / "causal" / "text"))
    tests = held_out(enc)
    sweep = {n: at_length(enc, n) for n in SWEEP}
    long_answers = copies(enc)
    models = {} if a.weights is None else {"float (before export)": float_model(a.weights)}
    for layout in ("causal", "multimodal"):
        for twin in ("text", "emb4"):
            models[f"W4A16 {layout} {twin}"] = transformers_model(a.export / layout / twin)

    result = {"held_out": {}, "copy": {}, "copy_misses": {}, "by_length": {}}
    for name, model in tqdm(models.items(), desc="Transformers", unit="model"):
        result["held_out"][name] = fraction(right(hf_logits(model), tests))
        copied = verdicts(hf_logits(model), long_answers)
        result["copy"][name] = fraction([v == "right" for v in copied])
        result["copy_misses"][name] = {kind: copied.count(kind) for kind in ("stopped early", "ran on", "wrong token")}
        if "multimodal" not in name:  # the same weights as causal (tested): the sweep once per twin
            result["by_length"][name] = [
                {"records": n, "prompt_tokens": round(sum(len(e.prompt) for e in ex) / len(ex)),
                 "accuracy": fraction(right(hf_logits(model), ex, batch=8))} for n, ex in sweep.items()]

    result["engine"] = {}
    for twin in ("text", "emb4"):
        ref_model = models[f"W4A16 causal {twin}"]
        reference = [hf_greedy(ref_model, e.prompt, len(e.answer)) for e in tqdm(tests, desc=f"greedy {twin}")]
        for dtype in ("bfloat16", "float32"):
            result["engine"][f"{twin} {dtype}"] = engine_agreement(a.export / "causal", twin == "emb4", dtype,
                                                                  tests, reference)
    result["seconds"] = round(time.perf_counter() - start, 1)

    print(records.header(records.meta("cpu")))
    print(f"$ {records.meta('cpu')['command']}")
    print(f"held-out record prompts ({HELD_OUT}, 1-{data.MAX_RECORDS} records): right answers")
    for name in models:
        misses = ", ".join(f"{n} {kind}" for kind, n in result["copy_misses"][name].items())
        print(f"  {name:<24} lookup {result['held_out'][name]:7.1%}   copy 5 records {result['copy'][name]:7.1%}"
              f"  (misses: {misses})")
    print("by length (records: accuracy)")
    for name, rows in result["by_length"].items():
        print(f"  {name:<24} " + " ".join(f"{r['records']}:{r['accuracy']:.2f}" for r in rows))
    print("Rust engine vs Transformers float32, greedy answers on the held-out prompts")
    for key, r in result["engine"].items():
        worst = "; ".join(f"prompt {d['prompt']} margin {d['top2_margin']}" for d in r["disagreements"])
        print(f"  {key:<16} same {r['agree']}/{r['total']}" + (f"  (differ: {worst})" if worst else ""))
    if a.against and a.against.exists():
        before = json.loads(a.against.read_text())
        print(f"beside {a.against} (recorded {before['meta']['date'][:10]} on {before['meta']['cpu']}):")
        for name, value in result["held_out"].items():
            old = before["held_out"].get(name)
            print(f"  {name:<24} lookup {value:7.1%} here, {'n/a' if old is None else format(old, '7.1%')} there")
    records.write_json(a.json, "cpu", **result)
    if a.chart:
        chart(result, a.chart)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for name, rows in result["by_length"].items():
        ax.plot([r["prompt_tokens"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=name)
    edge = next(r["prompt_tokens"] for r in next(iter(result["by_length"].values())) if r["records"] == 48)
    ax.axvline(edge, color="gray", linestyle="--", linewidth=1)
    ax.text(edge, 0.05, " trained up to 48 records", color="gray")
    ax.set_xlabel("prompt tokens (context 2,048)")
    ax.set_ylabel("right answers")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
