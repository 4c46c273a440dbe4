"""Step 06: fill the context with numbered records, ask for one record's code, and measure each way.

usage: python run.py [--model DIR] [--emb4 DIR] [--device auto] [--dtype bfloat16] [--ctx N]
                     [--ways rust-fused,rust-eager,python-compile] [--lengths a,b,c] [--max-new 12] [--json PATH]
Each way runs in a fresh process through step 05's runner. Lengths default to the article's 61, 4,081 and
32,761 tokens of 33,024, as fractions of --ctx.
"""
import argparse

import torch  # noqa: F401  (first: the engine reuses the libtorch it loads)
from transformers import AutoTokenizer

from torchtpu_longprompt import build_prompt, default_lengths, parse_answer, shortest
from torchtpu_rs import cli, devices, records
from torchtpu_ways.ways import WAYS, label, run_way

DEFAULT_WAYS = "rust-fused,rust-eager,python-compile"


def cell(value, spec: str, width: int) -> str:
    return f"{'n/a' if value is None else format(value, spec):>{width}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--ways", default=DEFAULT_WAYS, help=f"comma-separated, from {', '.join(WAYS)}")
    ap.add_argument("--lengths", help="prompt lengths in tokens, comma-separated (default: see above)")
    ap.add_argument("--max-new", type=int, default=12, help="tokens to generate: enough for a six-digit code")
    ap.add_argument("--seed", type=int, default=0, help="seeds the codes and the record asked about")
    args = cli.resolve(ap.parse_args())
    device = devices.choose_device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else default_lengths(args.ctx, shortest(tokenizer, args.seed)))

    print(f"{'way':<26}{'prompt':>7}{'read s':>8}{'read tok/s':>11}{'decode':>8}{'answer':>9}  found")
    rows = []
    for length in lengths:
        # --8<-- [start:measure]
        prompt = build_prompt(tokenizer, min(length, args.ctx - args.max_new), args.seed)
        answers = set()
        for way in args.ways.split(","):
            r = run_way(way, args.model, args.emb4, str(device), args.dtype, args.ctx, prompt.ids, args.max_new,
                        batched=False)
            answer = parse_answer(tokenizer.decode(r["tokens"], skip_special_tokens=True)) if r["available"] else None
            row = {"way": way, "label": label(r), "available": r["available"], "why": r["why"],
                   "torch": r["torch"], "prompt_tokens": len(prompt.ids), "records": prompt.records,
                   "asked": prompt.asked, "read_s": r["read_s"], "read_tok_s": r["read_tok_s"],
                   "decode_tok_s": r["streamed_tok_s"], "answer": answer, "expected": prompt.expected,
                   "found": answer == prompt.expected if r["available"] else None, "tokens": r["tokens"]}
            # --8<-- [end:measure]
            rows.append(row)
            if r["available"]:
                answers.add(answer)
                print(f"{row['label']:<26}{len(prompt.ids):>7}{cell(row['read_s'], '.2f', 8)}"
                      f"{cell(row['read_tok_s'], '.0f', 11)}{cell(row['decode_tok_s'], '.1f', 8)}"
                      f"{str(answer):>9}  {'yes' if row['found'] else 'no'}")
            else:
                print(f"{row['label']:<26}{len(prompt.ids):>7}  n/a: {r['why']}")
        verdict = f"all ways gave {answers.pop()}" if len(answers) == 1 else f"the ways disagree: {sorted(map(str, answers))}"
        print(f"  prompt of {len(prompt.ids)} tokens, record {prompt.asked} of {prompt.records}, "
              f"code {prompt.expected}: {verdict}")
    records.write_json(args.json, device, model=str(args.model), emb4=str(args.emb4) if args.emb4 else None,
                       dtype=args.dtype, ctx=args.ctx, max_new=args.max_new, lengths=lengths, rows=rows)


if __name__ == "__main__":
    main()
