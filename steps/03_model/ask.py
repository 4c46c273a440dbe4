"""Step 03, streaming: a prompt in, the reply printed token by token as the engine makes it.

usage: python ask.py [PROMPT] [--max-new 32] [--temperature T] [--top-k K] [--top-p P] [--seed S]
                     [--model DIR] [--emb4 DIR] [--device auto|tpu|cuda|cpu] [--dtype bfloat16|float32] [--ctx N]
                     [--json PATH]
Greedy unless --temperature, --top-k or --top-p is given; the same --seed gives the same reply. Ctrl-C stops it.
Without --model it asks the small model step 03 ships, which answers questions about numbered records (its
tokenizer knows 456 words: other words become <unk>).
"""
import argparse
import sys
import time

import torch  # noqa: F401  (first: the engine reuses the libtorch it loads)
import torchtpu_rs
from torchtpu_rs import cli, devices, prompting, records
from transformers import AutoTokenizer

PROMPT = ("Record 1: code 482913. Record 2: code 705126. Record 3: code 610395. "
          "What is the code of record 2? Answer:")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("prompt", nargs="?", default=PROMPT)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int)
    args = cli.resolve(ap.parse_args(argv))
    device = devices.choose_device(args.device)
    engine = torchtpu_rs.Engine(args.model, args.emb4, devices.like(device), args.ctx, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    # --8<-- [start:stream]
    ids = prompting.encode(tokenizer, args.prompt)
    stop = prompting.eos_ids(args.model)
    print(args.prompt, end="", flush=True)
    start = time.perf_counter()
    tokens = []
    for token in engine.stream(ids, args.max_new, stop=stop, temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, seed=args.seed):
        if token in stop:
            break
        tokens.append(token)
        # decode the whole reply each time: a word may span tokens, and spacing depends on what came before
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        shown = tokenizer.decode(tokens[:-1], skip_special_tokens=True)
        print(text[len(shown):], end="", flush=True)
    # --8<-- [end:stream]
    seconds = time.perf_counter() - start
    print()
    print(f"[{len(tokens)} tokens in {seconds:.2f} s on {device}, {args.dtype}]", file=sys.stderr)
    records.write_json(args.json, device, model=records.name(args.model), emb4=records.name(args.emb4),
                       dtype=args.dtype, prompt=args.prompt, prompt_ids=ids, tokens=tokens,
                       reply=tokenizer.decode(tokens, skip_special_tokens=True), seconds=seconds,
                       sampling={k: getattr(args, k) for k in ("temperature", "top_k", "top_p", "seed")})


if __name__ == "__main__":
    main()
