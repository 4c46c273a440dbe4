"""Step 08: where an int4 decode step's time goes — each part of a step timed on its own (Engine.decode_budget),
beside what reading its bytes would take at this machine's read limit (a read-only stream; its copy speed is shown
too), and the parts' sum checked against the same steps untimed. With --read, the same for the prompt read
(Engine.read_budget), whose products wait on arithmetic rather than memory: with fma4, each part beside what its
multiply-adds would take at the CPU's float32 FMA limit (torchtpu_kernels.fma_limit).

usage: python budget.py [--e2b] [--model DIR] [--emb4 DIR] [--weights int4|bf16] [--int4-matmul auto|dot4|fma4|aten]
                        [--decode-attention auto|own|aten] [--steps 16] [--read] [--tokens N] [--repeat 3]
                        [--json PATH] [--chart PNG]
--e2b: the random E2B-shaped checkpoint step 05's bench reads (made once, about 9 GB), the size the budget is
about; without it, the trained model step 03 ships (a toy, whose steps are all small ops). In one process,
`--repeat` rounds of: generate (untimed, the time the parts must add up to), then the budget; the medians of each.
--read: the prompt read's parts instead of a decode step's. Both read step 05's 19-token prompt, or with --tokens N
that prompt's sentence repeated to N tokens: a decode step's budget after a long prompt shows what its cache costs.
"""
import argparse
import statistics
import textwrap

import torch  # noqa: F401  (first: the engine reuses the libtorch it loads)
import torchtpu_kernels
from torchtpu_rs import checkpoints, cli, devices, prompting, records
from torchtpu_rs.bandwidth import memory_bandwidth_gb_s, read_bandwidth_gb_s
from transformers import AutoTokenizer

# The prompt of step 05's bench: a plain sentence, 19 tokens with <bos>, the length of the article's.
PROMPT = "Here is a short story about a man who made his own home by the water ."


def rounds(engine, ids: list[int], steps: int, repeat: int) -> tuple[list[dict], list[float]]:
    """`repeat` budgets of `steps` decode steps, and as many untimed generates of the same steps (seconds a step)."""
    budgets, untimed = [], []
    for _ in range(repeat):
        tokens, _, decode_s = engine.generate(ids, steps + 1)
        untimed.append(decode_s / steps)
        budget = engine.decode_budget(ids, steps)
        if budget["tokens"] != tokens:  # the same steps, so the same tokens: else the budget timed something else
            raise RuntimeError(f"decode_budget made {budget['tokens']}, generate {tokens}")
        budgets.append(budget)
    return budgets, untimed


def read_rounds(engine, ids: list[int], repeat: int) -> tuple[list[dict], list[float]]:
    """`repeat` budgets of the prompt read, and as many untimed reads (generate's read_s, the first token's too)."""
    budgets, untimed = [], []
    for _ in range(repeat):
        tokens, read_s, _ = engine.generate(ids, 1)
        untimed.append(read_s)
        budget = engine.read_budget(ids)
        if budget["token"] != tokens[0]:
            raise RuntimeError(f"read_budget made {budget['token']}, generate {tokens[0]}")
        budgets.append(budget)
    return budgets, untimed


def table(budgets: list[dict], untimed: list[float], gb_s: float, copy_gb_s: float, gflop_s: float | None) -> dict:
    """Median seconds and bytes of each part over the rounds, with each part's time at the read limit `gb_s`, and
    its multiply-adds' time at the FMA limit `gflop_s` where one is given."""
    parts = []
    for i, (name, _, nbytes) in enumerate(budgets[0]["parts"]):
        ms = statistics.median(b["parts"][i][1] for b in budgets) * 1e3
        macs = budgets[0]["multiply_adds"].get(name, 0)
        parts.append({"part": name, "ms": ms, "bytes": nbytes, "limit_ms": nbytes / (gb_s * 1e9) * 1e3,
                      "multiply_adds": macs, "fma_ms": 2 * macs / (gflop_s * 1e9) * 1e3 if gflop_s else None})
    step_ms = sum(p["ms"] for p in parts)
    total_bytes = sum(p["bytes"] for p in parts)
    total_macs = sum(p["multiply_adds"] for p in parts)
    return {"parts": parts, "step_ms": step_ms, "untimed_step_ms": statistics.median(untimed) * 1e3,
            "bytes_per_step": total_bytes, "limit_ms": total_bytes / (gb_s * 1e9) * 1e3, "read_gb_s": gb_s,
            "copy_gb_s": copy_gb_s, "copy_limit_ms": total_bytes / (copy_gb_s * 1e9) * 1e3,
            "multiply_adds": total_macs, "fma_gflop_s": gflop_s,
            "fma_ms": 2 * total_macs / (gflop_s * 1e9) * 1e3 if gflop_s else None}


# What a table sets each part against: a decode step's bytes at the read limit, or, with `arithmetic`, a prompt read's
# multiply-adds at the FMA limit — (column, a part's amount in it, its time at the limit, that column's name).
BY_BYTES = ("MB read", lambda p: p["bytes"] / 1e6, "limit_ms", "ms at read limit")
BY_MULTIPLY_ADDS = ("GFLOP", lambda p: 2 * p["multiply_adds"] / 1e9, "fma_ms", "ms at FMA limit")


def show(result: dict, read: bool, arithmetic: bool) -> None:
    """The table, its sum against the same work untimed, and that against its limit: the read limit (and the copy's),
    or with `arithmetic` the FMA limit."""
    unit, what, one = ("a prompt read", "read", "read") if read else ("a decode step", "steps", "step")
    step, untimed = result["step_ms"], result["untimed_step_ms"]
    column, amount, limit, limit_name = BY_MULTIPLY_ADDS if arithmetic else BY_BYTES
    print(f"{'part':<38}{'ms':>8}{'share':>8}{column:>10}{limit_name:>18}{'of its limit':>14}")
    for p in result["parts"]:
        of_limit = f"{p[limit] / p['ms']:.2f}" if amount(p) and p["ms"] > 0 else "-"
        print(f"{p['part']:<38}{p['ms']:>8.2f}{p['ms'] / step:>8.1%}{amount(p):>10.2f}{p[limit]:>18.2f}{of_limit:>14}")
    total = {"bytes": result["bytes_per_step"], "multiply_adds": result["multiply_adds"]}
    print(f"{unit + ', the parts summed':<38}{step:>8.2f}{1:>8.0%}{amount(total):>10.1f}"
          f"{result[limit]:>18.2f}{result[limit] / step:>14.2f}")
    print(f"the same {what} untimed (generate): {untimed:.2f} ms a {one}; the parts add up to it within "
          f"{abs(step - untimed) / untimed:.1%}")
    if read:
        every_row, products = (2 * result[n] / 1e9 for n in ("every_row_multiply_adds", "multiply_adds"))
        print(f"every row through every layer would multiply {every_row:.0f} GFLOP; the KV-shared layers take only the "
              f"last row, so the read's products are {products:.0f} GFLOP, {products / every_row:.2f} of that")
    if arithmetic:
        print(f"at the FMA limit's {result['fma_gflop_s']:.0f} GFLOP/s (float32, 8 lanes, all threads) the "
              f"{amount(total):.0f} GFLOP of a read's products take {result['fma_ms']:.0f} ms: the untimed read runs "
              f"at {result['fma_ms'] / untimed:.2f} of its arithmetic limit; its {result['bytes_per_step'] / 1e9:.3f} "
              f"GB at the read limit's {result['read_gb_s']:.1f} GB/s take {result['limit_ms']:.0f} ms")
        return
    print(f"at the read limit's {result['read_gb_s']:.1f} GB/s (a read-only stream, by {result['read_kernel']}) the "
          f"{result['bytes_per_step'] / 1e9:.3f} GB a {one} reads take {result['limit_ms']:.2f} ms: the untimed {one} "
          f"runs at {result['limit_ms'] / untimed:.2f} of its read limit; at the copy's {result['copy_gb_s']:.1f} GB/s "
          f"(read plus write), {result['copy_limit_ms'] / untimed:.2f}")


def chart(result: dict, unit: str, title: str, path: str, arithmetic: bool) -> None:
    """Each part's measured time beside its time at the read limit (or the FMA limit), largest first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = sorted(result["parts"], key=lambda p: p["ms"])
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(parts) + 1.4))
    y = range(len(parts))
    ax.barh([i + 0.2 for i in y], [p["ms"] for p in parts], 0.4, label="measured")
    limit, label = (("fma_ms", f"its multiply-adds at the FMA limit's {result['fma_gflop_s']:.0f} GFLOP/s")
                    if arithmetic else ("limit_ms", f"its bytes at the read limit's {result['read_gb_s']:.0f} GB/s"))
    ax.barh([i - 0.2 for i in y], [p[limit] for p in parts], 0.4, color="tab:gray", label=label)
    ax.set_yticks(list(y), [p["part"] for p in parts], fontsize=8)
    ax.set_xlabel(f"ms per {unit}")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(textwrap.fill(title, 95), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--e2b", action="store_true", help="the random E2B-shaped checkpoint (made once, about 9 GB)")
    ap.add_argument("--weights", default="int4", choices=["int4", "bf16"])
    ap.add_argument("--int4-matmul", default="auto", choices=["auto", "dot4", "fma4", "aten"])
    ap.add_argument("--decode-attention", default="auto", choices=["auto", "own", "aten"])
    ap.add_argument("--steps", type=int, default=16, help="decode steps per round")
    ap.add_argument("--read", action="store_true", help="the prompt read's budget instead of a decode step's")
    ap.add_argument("--tokens", type=int, help="the prompt's sentence repeated to this many tokens")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the medians are shown")
    ap.add_argument("--chart", metavar="PNG")
    args = ap.parse_args()
    if args.e2b:
        folder = checkpoints.e2b()
        args.model, args.emb4 = folder / "text", args.emb4 or folder / "emb4"
    args = cli.resolve(args)
    device = devices.choose_device(args.device)
    ids = prompting.encode(AutoTokenizer.from_pretrained(args.model), PROMPT)
    if args.tokens is not None:
        if not 1 <= args.tokens <= args.ctx - (0 if args.read else args.steps + 1):
            ap.error(f"--tokens {args.tokens}: 1 <= N <= ctx ({args.ctx}), less the decode steps without --read")
        ids = ids[:1] + (ids[1:] * (args.tokens // max(len(ids) - 1, 1) + 1))[:args.tokens - 1]
    copy_gb_s = memory_bandwidth_gb_s()
    read_gb_s, read_kernel = read_bandwidth_gb_s()
    engine = torchtpu_kernels.Engine(args.model, args.emb4, devices.like(device), args.ctx, args.dtype,
                                  weights=args.weights, int4_matmul=args.int4_matmul,
                                  decode_attention=args.decode_attention)
    kernel = engine.int4_matmul or "none: bf16 weights"
    what = (f"{records.name(args.model)}, weights {engine.weights} (int4 kernel {kernel}), attention in "
            f"{engine.attention_dtype} ({engine.decode_attention}'s), {len(ids)}-token prompt, ctx {args.ctx}, "
            f"on {device}")
    if args.read:
        unit = "prompt read"
        print(f"{what}; per prompt read, median of {args.repeat} rounds", flush=True)
        budgets, untimed = read_rounds(engine, ids, args.repeat)
    else:
        unit = "decode step"
        print(f"{what}; per decode step, median of {args.repeat} rounds of {args.steps} steps", flush=True)
        budgets, untimed = rounds(engine, ids, args.steps, args.repeat)
    # a prompt read's products wait on arithmetic: with fma4's float32 FMAs, its limit is theirs
    arithmetic = args.read and engine.int4_matmul == "fma4"
    gflop_s = torchtpu_kernels.fma_limit() if arithmetic else None
    result = {**table(budgets, untimed, read_gb_s, copy_gb_s, gflop_s), "read_kernel": read_kernel}
    if args.read:
        # a decode step's products are one row's, after any prompt: a read that took every row through every layer
        # would multiply each weight by every row, the head's by the last
        row = engine.decode_budget(ids[:1], 1)["multiply_adds"]
        result["every_row_multiply_adds"] = sum(c if n == "output head" else len(ids) * c for n, c in row.items())
    show(result, args.read, arithmetic)
    if args.chart:
        chart(result, unit, f"A {unit}'s time by part: {what}", args.chart, arithmetic)
    seconds = "read_s" if args.read else "step_s"
    records.write_json(args.json, device, model=records.name(args.model), weights=engine.weights,
                       int4_matmul=engine.int4_matmul, attention_dtype=engine.attention_dtype,
                       decode_attention=engine.decode_attention,
                       prompt_ids=ids, budget="read" if args.read else "decode",
                       steps=None if args.read else args.steps,
                       repeat=args.repeat, tokens=[budgets[0]["token"]] if args.read else budgets[0]["tokens"],
                       rounds=[{"parts": b["parts"], seconds: b[seconds]} for b in budgets],
                       untimed_step_s=untimed, **result)


if __name__ == "__main__":
    main()
