"""Step 06: fill the context with numbered records, ask for one record's code, and measure each way.

usage: python run.py [--model DIR] [--emb4 DIR] [--device auto] [--dtype bfloat16] [--ctx N]
                     [--ways rust-fused,rust-eager,python-compile] [--lengths a,b,c] [--max-new 12] [--json PATH]
Each way runs in a fresh process through step 05's runner. Lengths default to the article's 61, 4,081 and
32,761 tokens of 33,024, as fractions of --ctx.
"""
import argparse

import torch  # noqa: F401  (first: the engine reuses the libtorch it loads)
from torchtpu_longprompt import build_prompt, default_lengths, shortest
from torchtpu_longprompt.measure import DEFAULT_WAYS, HEADER, WAYS_HELP, line, measure, verdict
from torchtpu_rs import cli, prompting, records
from torchtpu_ways import tpu
from torchtpu_ways.ways import unknown
from transformers import AutoTokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--ways", default=DEFAULT_WAYS, help=WAYS_HELP)
    ap.add_argument("--lengths", type=cli.positive_ints,
                    help="prompt lengths in tokens, comma-separated (default: see above)")
    ap.add_argument("--max-new", type=int, default=12, help="tokens to generate: enough for a six-digit code")
    ap.add_argument("--seed", type=int, default=0, help="seeds the codes and the record asked about")
    args = ap.parse_args()
    if bad := unknown(args.ways.split(",")):
        ap.error(f"--ways: unknown {', '.join(bad)}; {WAYS_HELP}")
    if args.max_new < 1:
        ap.error(f"--max-new {args.max_new}: at least 1")
    args = cli.resolve(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    one = shortest(tokenizer, args.seed)
    if too_short := [n for n in args.lengths or [] if n < one]:
        ap.error(f"--lengths: {', '.join(map(str, too_short))} below {one}, the smallest prompt (one record and the "
                 "question)")
    lengths = args.lengths or default_lengths(args.ctx, one)
    device = tpu.choose_device_in_child(args.device)  # the parent never opens the chip: the ways each need it

    stop = prompting.eos_ids(args.model)  # the answer ends where the model ends it
    print(HEADER)
    rows = []
    for length in lengths:
        prompt = build_prompt(tokenizer, min(length, args.ctx - args.max_new), args.seed)
        these = []
        for way in args.ways.split(","):
            these.append(measure(way, prompt, tokenizer, args.model, args.emb4, str(device), args.dtype, args.ctx,
                                 args.max_new, stop))
            print(line(these[-1]), flush=True)
        print(f"  prompt of {len(prompt.ids)} tokens, record {prompt.asked} of {prompt.records}, "
              f"code {prompt.expected}: {verdict(these)}")
        rows += these
    records.write_json(args.json, device, model=records.name(args.model), emb4=records.name(args.emb4),
                       dtype=args.dtype, ctx=args.ctx, max_new=args.max_new, lengths=lengths, stop=stop, rows=rows)


if __name__ == "__main__":
    main()
