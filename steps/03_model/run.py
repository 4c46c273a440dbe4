"""Step 03: load Gemma 4 into the Rust engine and generate greedy text.

usage: python run.py [--model DIR] [--emb4 DIR] [--device auto|tpu|cuda|cpu] [--dtype bfloat16|float32]
                     [--ctx N] [--prompt TEXT] [--max-new 64] [--read-every 1] [--json PATH]
Without --model it runs the small model step 03 ships, trained here to answer questions about numbered
records (its tokenizer knows 456 words: other words become <unk>); the same command runs the real -text /
-text-emb4 repacks. Generation stops at the checkpoint's end-of-reply ids, or after --max-new tokens.
"""
import argparse
import time

import torch  # noqa: F401  (first: the engine reuses the libtorch it loads)
import torchtpu_rs
from torchtpu_rs import cli, devices, prompting, records
from tqdm import tqdm
from transformers import AutoTokenizer

# The task the shipped model learned (step 06 asks it at every length); the right answer is 610395.
PROMPT = ("Record 1: code 482913. Record 2: code 705126. Record 3: code 610395. Record 4: code 238470. "
          "What is the code of record 3? Answer:")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--read-every", type=int, default=1, help="decode steps between copies of tokens to the host")
    args = cli.resolve(ap.parse_args())
    device = devices.choose_device(args.device)

    # --8<-- [start:load]
    start = time.perf_counter()
    with tqdm(desc="loading layers", unit="layer", leave=False) as bar:
        def progress(done, total):
            bar.total = total
            bar.update(done - bar.n)

        engine = torchtpu_rs.Engine(args.model, args.emb4, devices.like(device), args.ctx, args.dtype, progress)
    load_s = time.perf_counter() - start
    print(f"load {load_s:.1f} {engine.layout()}")
    # --8<-- [end:load]

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # --8<-- [start:generate]
    ids = prompting.encode(tokenizer, args.prompt)  # <bos> first, the chat template if the tokenizer has one
    stop = prompting.eos_ids(args.model)  # from config.json and generation_config.json
    tokens, read_s, decode_s = engine.generate(ids, args.max_new, args.read_every, stop=stop)
    text = tokenizer.decode(prompting.until_stop(tokens, stop), skip_special_tokens=True)
    # --8<-- [end:generate]
    read_tok_s = len(ids) / read_s
    decode_tok_s = (len(tokens) - 1) / decode_s if decode_s > 0 else float("nan")
    print(f"prompt ({len(ids)} tokens): {args.prompt}")
    print(f"generated ({len(tokens)} tokens): {text}")
    print(f"read {read_s:.3f} s ({read_tok_s:.0f} tok/s) · decode {decode_s:.3f} s ({decode_tok_s:.1f} tok/s) "
          f"on {device}, {args.dtype}")
    records.write_json(args.json, device, model=records.name(args.model), emb4=records.name(args.emb4),
                       dtype=args.dtype, ctx=args.ctx, layout=engine.layout(), load_s=load_s, prompt_ids=ids, stop=stop,
                       tokens=tokens, text=text, read_s=read_s, decode_s=decode_s, read_tok_s=read_tok_s,
                       decode_tok_s=decode_tok_s)


if __name__ == "__main__":
    main()
