"""`make bench`, step 06: the long-prompt experiment at full E2B size on this machine — read and decode speed at
the article's three prompt lengths, the measured bf16 matmul rate and the fraction of it each read reaches, the
measured memory bandwidth and the fraction of it each decode reaches, and the project's targets, met or not.

usage: python bench.py [--size e2b] [--ways ...] [--lengths a,b,c] [--repeats 3,3,1] [--max-new 16]
                       [--json PATH] [--chart PNG]
The checkpoint is the random E2B-shaped one (made once, cached: about 9 GB; `--size tiny` runs the same
benchmark on the tiny one in seconds). Random weights: the answers are noise, the speeds are real. Every run is
a fresh process that reads its prompt in full once (after a cold run over a prefix with the same shapes); at
each length the ways take turns, `--repeats` times, and each figure is the median of a way's runs.
"""
import argparse
import statistics
from pathlib import Path

import torch
from safetensors import safe_open
from torchtpu_longprompt import ARTICLE_FRACTIONS, build_prompt, default_lengths, shortest
from torchtpu_longprompt.measure import DEFAULT_WAYS, WAYS_HELP, measure, verdict
from torchtpu_rs import checkpoints, cli, devices, prompting, records
from torchtpu_rs.bandwidth import best_seconds, memory_bandwidth_gb_s, read_bandwidth_gb_s
from torchtpu_ways.bandwidth import kv_bytes_per_token
from torchtpu_ways.checkpoint import TextConfig
from torchtpu_ways.compiling import chunk_shapes
from torchtpu_ways.report import judge
from torchtpu_ways.ways import NAMES, unknown
from transformers import AutoTokenizer

DTYPE = "bfloat16"  # the matmul rate is measured in bf16, so the reads run in it too


# --8<-- [start:flops]
def matmul_flop_s(m: int, k: int, n: int, tries: int = 20) -> float:
    """The bf16 matrix-multiply rate of a prompt chunk's linear (m rows through an [n, k] weight, stored as the
    checkpoint's linears are: x · Wᵀ), best of `tries`. The layout matters: on this CPU kept to AVX2, the same
    product with the weight stored [k, n] took a path tens of times slower."""
    x, weight = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    return 2 * m * k * n / best_seconds(lambda: torch.nn.functional.linear(x, weight), tries)


def linear_weights(model_dir) -> int:
    """Weights every token multiplies by, in a -text checkpoint: the decoder layers' linears (shapes from the
    checkpoint, so layers that share another's keys and values count no k/v projection) and the per-layer-input
    projection."""
    total = 0
    for shard in sorted(model_dir.glob("*.safetensors")):  # one file or several shards
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                if name.endswith(".weight_shape"):  # a compressed linear's [out, in]
                    out, inp = f.get_tensor(name).tolist()
                elif name.endswith("per_layer_model_projection.weight"):  # a plain bf16 matrix
                    out, inp = f.get_slice(name).get_shape()
                else:
                    continue
                total += out * inp
    return total


def read_gflop_per_token(text: dict, linear: int, n: int, ctx: int) -> tuple[float, float]:
    """GFLOP per prompt token of reading n tokens: (the model's, what the chunked read does). The model's
    attention is causal: position p sees p + 1 keys (at most one window in a sliding layer). The read attends,
    masked, over all 2 · window slots of a sliding ring and over a chunk's bucket of full-cache slots."""
    window, heads = text["sliding_window"], text["num_attention_heads"]
    model = done = 2 * linear * n
    for kind in text["layer_types"][: text["num_hidden_layers"]]:
        dim = text["global_head_dim"] if kind == "full_attention" else text["head_dim"]
        per_key = 4 * heads * dim  # q·k and the weighted sum of v: 2 FLOPs per multiply-add, each
        if kind == "full_attention":
            model += per_key * n * (n + 1) // 2
            done += per_key * sum(tokens * slots for tokens, slots in chunk_shapes(n, window, ctx))
        else:
            model += per_key * sum(min(p + 1, window) for p in range(n))
            done += per_key * n * 2 * window
    head = 2 * text["vocab_size"] * text["hidden_size"]  # logits for the last position only
    return (model + head) / n / 1e9, (done + head) / n / 1e9
# --8<-- [end:flops]


# --8<-- [start:targets]
def targets(rows: list[dict], lengths: list[int]) -> list[tuple[str, float | None, str, float]]:
    """(target, measured ratio, comparison, bound) — each a ratio of figures from this one run, for the ways it
    was asked to run (one that could not run leaves its targets "not measured")."""
    at = {(r["way"], r["length"]): r for r in rows if r["available"]}
    asked = {r["way"] for r in rows}

    def ratio(a, b, key):
        return a[key] / b[key] if a and b and a.get(key) and b.get(key) else None

    checks = []
    if {"rust-eager", "python-compile"} <= asked:
        for n in lengths:
            rust, compiled = at.get(("rust-eager", n)), at.get(("python-compile", n))
            tokens = (rust or compiled or {}).get("prompt_tokens", n)
            checks.append((f"Rust eager read / Python compile read, {tokens}-token prompt",
                           ratio(rust, compiled, "read_tok_s"), ">=", 0.9))
    for way in [w for w in ("rust-eager", "python-compile", "rust-int4") if w in asked and len(lengths) > 1]:
        longest, shortest_row = at.get((way, lengths[-1])), at.get((way, lengths[0]))
        checks.append((f"{NAMES[way]} decode, longest prompt / shortest",
                       ratio(longest, shortest_row, "decode_tok_s"), ">=", 0.9))
    if "rust-eager" in asked:  # reading what it must at the memory's pace, after a short prompt and a long one
        for n, bound in ((lengths[0], 0.5), (lengths[-1], 0.35)):
            row = at.get(("rust-eager", n))
            tokens = (row or {}).get("prompt_tokens", n)
            checks.append((f"Rust eager decode / bandwidth limit, {tokens}-token prompt",
                           row and row["decode_fraction"], ">=", bound))
    return checks
# --8<-- [end:targets]


def median_of(runs: list[dict]) -> dict:
    """One row from a way's runs at one length: each speed the median of the runs (the first run's answer)."""
    row = dict(runs[0], runs=len(runs))
    if row["available"]:
        for key in ("read_s", "read_tok_s", "decode_tok_s"):
            row[key] = statistics.median(r[key] for r in runs)
        row["read_tok_s_runs"] = [r["read_tok_s"] for r in runs]
        row["decode_tok_s_runs"] = [r["decode_tok_s"] for r in runs]
    return row


def chart(rows: list[dict], path: str) -> None:
    """Read and decode tok/s against prompt length, a line per way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (read, decode) = plt.subplots(1, 2, figsize=(11, 3.8))
    for way in dict.fromkeys(r["way"] for r in rows if r["available"]):
        mine = [r for r in rows if r["way"] == way and r["available"]]
        x = [r["prompt_tokens"] for r in mine]
        read.plot(x, [r["read_tok_s"] for r in mine], "o-", label=mine[0]["label"])
        decode.plot(x, [r["decode_tok_s"] for r in mine], "o-", label=mine[0]["label"])
    read.set_ylabel("read tok/s")
    decode.set_ylabel("decode tok/s")
    for ax in (read, decode):
        ax.set_xscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("Gemma 4 E2B-shaped, random W4A16 weights, on this CPU: speed against prompt length")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="e2b", choices=["e2b", "tiny"], help="which random checkpoint")
    ap.add_argument("--ways", default=DEFAULT_WAYS, help=WAYS_HELP)
    ap.add_argument("--lengths", type=cli.positive_ints,
                    help="prompt lengths in tokens (default: the article's, as fractions of ctx)")
    ap.add_argument("--device", default="cpu", choices=["cpu"], help="the benchmark is this machine's CPU record")
    ap.add_argument("--repeats", type=cli.positive_ints, default="3,3,1",
                    help="runs per way at each length (one count, or one per length; the 32k read takes minutes)")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", type=cli.output_path)
    ap.add_argument("--chart", metavar="PNG", type=cli.output_path, help="write the plot here (default: beside --json)")
    args = ap.parse_args()
    if bad := unknown(args.ways.split(",")):
        ap.error(f"--ways: unknown {', '.join(bad)}; {WAYS_HELP}")
    n_lengths = len(args.lengths) if args.lengths else len(ARTICLE_FRACTIONS)
    repeats = args.repeats * n_lengths if len(args.repeats) == 1 else args.repeats
    if len(repeats) != n_lengths:
        ap.error(f"--repeats {','.join(map(str, args.repeats))}: one count, or one per length ({n_lengths})")
    if args.max_new < 2:  # the prompt's read yields the first token; decode's speed needs a step after it
        ap.error(f"--max-new {args.max_new}: at least 2 (the first token comes from the prompt's read)")

    folder = checkpoints.cached(args.size)
    model, emb4 = folder / "text", folder / "emb4"
    ctx = cli.default_ctx(model)
    device = devices.choose_device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = prompting.text_config(model)
    one = shortest(tokenizer, args.seed)
    if too_short := [n for n in args.lengths or [] if n < one]:
        ap.error(f"--lengths: {', '.join(map(str, too_short))} below {one}, the smallest prompt (one record and the "
                 "question)")
    lengths = args.lengths or default_lengths(ctx, one)
    linear = linear_weights(model)
    rate = matmul_flop_s(text["sliding_window"], text["hidden_size"], text["intermediate_size"])
    bandwidth = memory_bandwidth_gb_s()
    read_limit, read_kernel = read_bandwidth_gb_s()
    cfg = TextConfig.from_file(model / "config.json")
    name = "E2B-shaped" if args.size == "e2b" else "tiny"
    print(f"{name} checkpoint (random weights), ctx {ctx}, {DTYPE}, on {device}; prompts of {lengths} "
          f"tokens, {args.max_new} greedy tokens; fresh processes, the ways taking turns, medians of {repeats} runs")
    print(f"bf16 matmul rate (a prompt chunk's linear: {text['sliding_window']} rows × [{text['intermediate_size']} × "
          f"{text['hidden_size']}], best of 20): {rate / 1e9:.0f} GFLOP/s; "
          f"{linear / 1e9:.2f} G linear weights per token", flush=True)
    print(f"memory bandwidth (a 2 GiB copy, best of 5): {bandwidth:.1f} GB/s, bytes read plus bytes written; the read "
          f"limit (a 2 GiB read-only stream, best of 5, by {read_kernel}): {read_limit:.1f} GB/s", flush=True)

    print(f"{'way':<26}{'prompt':>7}{'read s':>8}{'read tok/s':>11}{'decode':>8}{'GFLOP/tok':>10}"
          f"{'read_fraction':>14}{'GB/tok':>8}{'decode_fraction':>16}{'of read limit':>14}")
    rows = []
    ways = args.ways.split(",")
    for length, times in zip(lengths, repeats):
        prompt = build_prompt(tokenizer, min(length, ctx - args.max_new), args.seed)
        model_gflop, done_gflop = read_gflop_per_token(text, linear, len(prompt.ids), ctx)
        runs = {way: [] for way in ways}
        for _ in range(times):
            for way in ways:  # taking turns: a slow minute of a shared machine falls on every way alike
                runs[way].append(measure(way, prompt, tokenizer, model, emb4, str(device), DTYPE, ctx, args.max_new))
        these = []
        for way in ways:
            row = median_of(runs[way])
            row.update(length=length, gflop_per_token=model_gflop, done_gflop_per_token=done_gflop)
            if row["available"]:
                # --8<-- [start:fraction]
                row["read_fraction"] = row["read_tok_s"] * model_gflop * 1e9 / rate
                # a decode step reads the weights as held and the cached keys and values it attends over
                row["decode_bytes_per_token"] = row["bytes_per_token"] + kv_bytes_per_token(
                    cfg, ctx, row["prompt_tokens"], len(row["tokens"]) - 1, row["decode_slots"],
                    row["kv_dtype"],
                    row.get("sliding_slots", "ring"), row.get("kv_read", "slots"))
                row["decode_fraction"] = row["decode_tok_s"] * row["decode_bytes_per_token"] / (bandwidth * 1e9)
                row["decode_read_fraction"] = row["decode_tok_s"] * row["decode_bytes_per_token"] / (read_limit * 1e9)
                # --8<-- [end:fraction]
                print(f"{row['label']:<26}{row['prompt_tokens']:>7}{row['read_s']:>8.1f}{row['read_tok_s']:>11.1f}"
                      f"{row['decode_tok_s']:>8.2f}{model_gflop:>10.3g}{row['read_fraction']:>14.3f}"
                      f"{row['decode_bytes_per_token'] / 1e9:>8.2f}{row['decode_fraction']:>16.3f}"
                      f"{row['decode_read_fraction']:>14.3f}", flush=True)
            else:
                print(f"{row['label']:<26}{row['prompt_tokens']:>7}  n/a: {row['why']}", flush=True)
            these.append(row)
        print(f"  prompt of {len(prompt.ids)} tokens: {verdict(these)}; the chunked read does {done_gflop:.2f} "
              f"GFLOP per token ({model_gflop:.2f} of them the model's)", flush=True)
        rows += these

    checks, lines = judge(targets(rows, lengths))
    print("targets (ratios from this run):")
    print("\n".join(lines))

    if args.json:
        records.write_json(args.json, device, model=records.name(model), emb4=records.name(emb4),
                           dtype=DTYPE, ctx=ctx,
                           max_new=args.max_new, lengths=lengths, repeats=repeats, matmul_flop_s=rate,
                           linear_weights=linear, bandwidth_gb_s=bandwidth, read_gb_s=read_limit,
                           read_kernel=read_kernel,
                           rows=rows, targets=checks)
    chart_path = args.chart or (args.json and str(Path(args.json).with_suffix(".png")))
    if chart_path:
        chart(rows, chart_path)


if __name__ == "__main__":
    main()
