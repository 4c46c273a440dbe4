"""Step 03: load Gemma 4 into the Rust engine and generate greedy text.

usage: python run.py [--model DIR] [--emb4 DIR] [--device auto|tpu|cuda|cpu] [--dtype bfloat16|float32]
                     [--ctx N] [--prompt TEXT] [--max-new 64] [--read-every 1] [--json PATH]
Without --model it uses the tiny checkpoint in the real formats (made on first use, in seconds); the same
command runs the real -text / -text-emb4 repacks.
"""
import argparse
import time

import torch  # first: the engine reuses the libtorch it loads
from tqdm import tqdm
from transformers import AutoTokenizer

import torchtpu_rs
from torchtpu_rs import cli, devices, records

PROMPT = "What is the code of record 17 ?"


# --8<-- [start:encode]
def encode(tokenizer, prompt: str) -> list[int]:
    """Prompt ids as the model expects them: the chat template when the tokenizer has one (the -it model was
    trained on it), and <bos> first — Gemma's tokenizer does not add it, and without it the model echoes."""
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_dict=False)  # transformers 5 returns a BatchEncoding by default
    else:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
    return ids if ids[:1] == [tokenizer.bos_token_id] else [tokenizer.bos_token_id, *ids]
# --8<-- [end:encode]


def until_end(tokenizer, tokens: list[int]) -> list[int]:
    """The generated tokens up to the first end of turn or end of text."""
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")} - {None, tokenizer.unk_token_id}
    return next((tokens[:i] for i, t in enumerate(tokens) if t in stops), tokens)


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
    ids = encode(tokenizer, args.prompt)
    # --8<-- [start:generate]
    tokens, read_s, decode_s = engine.generate(ids, args.max_new, args.read_every)
    # --8<-- [end:generate]
    text = tokenizer.decode(until_end(tokenizer, tokens), skip_special_tokens=True)
    read_tok_s = len(ids) / read_s
    decode_tok_s = (len(tokens) - 1) / decode_s if decode_s > 0 else float("nan")
    print(f"prompt ({len(ids)} tokens): {args.prompt}")
    print(f"generated ({len(tokens)} tokens): {text}")
    print(f"read {read_s:.3f} s ({read_tok_s:.0f} tok/s) · decode {decode_s:.3f} s ({decode_tok_s:.1f} tok/s) "
          f"on {device}, {args.dtype}")
    records.write_json(args.json, device, model=str(args.model), emb4=str(args.emb4) if args.emb4 else None,
                       dtype=args.dtype, ctx=args.ctx, layout=engine.layout(), load_s=load_s, prompt_ids=ids,
                       tokens=tokens, text=text, read_s=read_s, decode_s=decode_s, read_tok_s=read_tok_s,
                       decode_tok_s=decode_tok_s)


if __name__ == "__main__":
    main()
