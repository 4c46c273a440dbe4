"""Step 05: three ways on one chip — Rust fused, Rust eager, Python compile (and Python eager) — side by side.

usage: python run.py [--model DIR] [--emb4 DIR] [--device auto|tpu|cuda|cpu] [--dtype bfloat16|float32] [--ctx N]
                     [--ways rust-fused,rust-eager,python-compile,python-eager] [--max-new 64] [--repeat 1]
                     [--compile-python PATH] [--prompt TEXT] [--json PATH]
Each way runs in a fresh process; a way this device does not have (fused, off a TPU) is reported n/a, with why.
"""
import argparse
import shutil
import sys

from torchtpu_rs import cli, prompting, records
from torchtpu_ways import prompt, tpu
from torchtpu_ways.report import identity_lines, table
from torchtpu_ways.ways import WAYS, label, median_row, run_way


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated, from: " + ", ".join(WAYS))
    ap.add_argument("--max-new", type=int, default=64, help="greedy tokens per run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per way (fresh processes); each figure the median")
    ap.add_argument("--compile-python", metavar="PATH", default=sys.executable,
                    help="the interpreter for the Python ways (another torch, e.g. 2.14.1; needs this package)")
    ap.add_argument("--prompt", default=prompt.PROMPT)
    args = ap.parse_args()
    ways = args.ways.split(",")
    if bad := [w for w in ways if w not in WAYS]:
        ap.error(f"--ways: unknown {', '.join(bad)}; choose from {', '.join(WAYS)}")
    if args.max_new < 1 or args.repeat < 1:
        ap.error("--max-new and --repeat must be at least 1")
    if not shutil.which(args.compile_python):
        ap.error(f"--compile-python {args.compile_python}: not an executable (a Python with torch and this package)")
    args = cli.resolve(args)
    device = tpu.choose_device_in_child(args.device)
    ids = prompt.encode(args.model, args.prompt)
    answer = prompt.expected(args.model, args.prompt)  # None for a prompt of your own
    print(f"{len(ids)}-token prompt, {args.max_new} greedy tokens, {args.dtype}, ctx {args.ctx}, on {device}; "
          f"each way in a fresh process{f', median of {args.repeat} runs' if args.repeat > 1 else ''}", flush=True)

    rows = []
    for way in ways:
        python = args.compile_python if way.startswith("python") else sys.executable
        runs = [run_way(way, args.model, args.emb4, device, args.dtype, args.ctx, ids, args.max_new, python)
                for _ in range(args.repeat)]
        row = median_row(runs)
        # how many tokens, from the first, are the right answer (the identity lines below compare ways)
        row["tokens_correct"] = None if answer is None or not row["available"] else \
            prompting.same_prefix(row["tokens"], answer)
        rows.append(row)
    print(table(rows))
    identical = identity_lines(rows)
    print("\n".join(identical))
    if answer is not None:
        print("\n".join(f"{label(r)}: first {r['tokens_correct']} of {args.max_new} tokens are the right answer"
                        for r in rows if r["available"]))
    records.write_json(args.json, device, model=records.name(args.model), emb4=records.name(args.emb4),
                       dtype=args.dtype, ctx=args.ctx, max_new=args.max_new, repeat=args.repeat, prompt=args.prompt,
                       prompt_ids=ids, expected=answer, rows=rows, identical=identical)


if __name__ == "__main__":
    main()
