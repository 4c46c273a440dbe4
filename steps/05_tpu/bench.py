"""`make bench`, step 05: the three ways at full E2B size on this machine, with the figures that make the
numbers comparable across machines — measured memory bandwidth (a copy, and a read-only stream: the read limit),
the bytes each way reads per decode token (weights as held, and the cached keys and values its attention reads),
and the fraction of each limit each way reaches — and the project's targets, met or not. Later ways run only when
`--ways` names them (as tools/bench.txt does): step 08's `rust-int4` and step 07's `rust-int4-aten` (with those
steps installed), rust-int4 again beside Rust eager at a short context (`--short-ctx`); and llama.cpp's
(`llamacpp-q4_0`, `llamacpp-q8_0`, ...; with `make peer` done: step 04's torchtpu_parity.peer, run by
torchtpu_ways.peer_run and peer_worker) on GGUFs made from the same checkpoint, from the same prompt ids, with the
ratios to the best of them printed (no target of theirs: figures as they are).

usage: python bench.py [--repeat 3] [--max-new 64] [--ways ...] [--short-ctx 4096] [--dtype bfloat16]
                       [--json PATH] [--chart PNG]
The checkpoint is the random E2B-shaped one (made once, cached: about 9 GB, minutes). Random weights: the tokens
are noise, the speeds and the memory are real.
"""
import argparse
import contextlib
import importlib.util
import statistics
from pathlib import Path

import torch
from torchtpu_parity import peer
from torchtpu_rs import checkpoints, cli, devices, records
from torchtpu_rs.bandwidth import best_seconds, memory_bandwidth_gb_s, read_bandwidth_gb_s
from torchtpu_ways import prompt
from torchtpu_ways.bandwidth import kv_bytes_per_token
from torchtpu_ways.baseline import linear, one_row_in_aten
from torchtpu_ways.checkpoint import TextConfig
from torchtpu_ways.report import identity_lines, judge, table
from torchtpu_ways.ways import CHOOSE, WAYS, label, median_row, run_way, unknown


@contextlib.contextmanager
def onednn_on(enabled: bool):
    """oneDNN on or off for a block (torch.backends.mkldnn.flags() would also set TF32, with a warning)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


# --8<-- [start:kernels]
def matvec_gb_s(n: int = 6144, k: int = 1536, group: int = 32, tries: int = 7, calls: int = 200,
                streamed_gb: float = 0.0) -> dict:
    """One E2B MLP mat-vec ([6144 × 1536], one bf16 activation row) called again and again, best of `tries`: the
    bytes each kernel reads (bf16 weights; or nibbles + bf16 scales and zeros for ATen's int4 kernel; or, with step
    08 installed, nibbles + bf16 scales for each of its own that runs here: torchtpu_dot4_mm with AVX512-BF16,
    torchtpu_fma4_mm with AVX2, FMA and F16C) over its time. bf16 twice: through oneDNN, as torch picks by default (and
    Transformers decodes), and through ATen's own mat-vec, as the ways' decode steps run it (`matvec="aten"`). The
    weights stay warm in the CPU's caches, so this is the kernel's best case: a way whose weights come from memory
    reads them no faster than this, however fast the memory is. With `streamed_gb`, each call takes the next of
    distinct copies of the weights, about that many GB of them per kernel, so the weights come from memory, as a
    decode step's do."""
    torch.manual_seed(0)
    x = torch.randn(1, k, dtype=torch.bfloat16)

    def bf16():
        return torch.randn(n, k, dtype=torch.bfloat16)

    def int4():
        nibbles = torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
        return nibbles, torch.stack([torch.rand(k // group, n), torch.zeros(k // group, n)], -1).to(torch.bfloat16)

    def aten(weight):
        with one_row_in_aten(True):
            return linear(x, weight)

    kernels = {
        "bf16 oneDNN": (bf16, lambda weight: torch.nn.functional.linear(x, weight)),
        "bf16 ATen": (bf16, aten),
        "int4 ATen": (int4, lambda w: torch._weight_int4pack_mm_for_cpu(x, w[0], group, w[1])),
    }
    if importlib.util.find_spec("torchtpu_kernels"):  # step 08's kernels; steps 04-06 never need step 08
        import torchtpu_kernels

        def own(kernel):  # step 08's kernels share one layout: nibbles and bf16 scales
            def make():
                words = torch.randint(-2**31, 2**31, (n, k // 8), dtype=torch.int32)
                scale = torch.rand(n, k // group).to(torch.bfloat16)
                return torchtpu_kernels.Int4Linear(words, scale, k, matmul=kernel)
            return make

        for kernel, runs in (("dot4", torchtpu_kernels.dot4_runs()), ("fma4", torchtpu_kernels.fma4_runs())):
            if runs:
                kernels[f"int4 {kernel} (step 08)"] = (own(kernel), lambda w: w(x))

    def gb_s(make, call) -> float:  # the weights' copies are freed when it returns, before the next kernel's
        first = make()
        nbytes = sum(t.nbytes for t in first) if isinstance(first, tuple) else first.nbytes  # Int4Linear too
        weights = [first] + [make() for _ in range(round(streamed_gb * 1e9 / nbytes) - 1)]
        each = max(calls, len(weights))
        return nbytes * each / best_seconds(lambda: [call(weights[i % len(weights)]) for i in range(each)],
                                            tries) / 1e9

    return {name: gb_s(make, call) for name, (make, call) in kernels.items()}


def onednn_against_aten_ms(tries: int = 3) -> dict[str, dict[str, float]]:
    """What the ways leave on oneDNN, timed through it and through ATen's own bf16 kernels (oneDNN switched off),
    best of `tries` (ms): one prompt chunk's product (512 rows × [6144 × 1536]) and one full-attention layer's
    decode attention over 32,768 slots (E2B: 8 query heads on one KV head of 512; the scores k · qᵀ and the
    weighted sum p · v, as the ways compute them)."""
    torch.manual_seed(0)
    chunk, weight = torch.randn(512, 1536, dtype=torch.bfloat16), torch.randn(6144, 1536, dtype=torch.bfloat16)
    keys, values = (torch.randn(1, 32768, 512, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(1, 8, 512, dtype=torch.bfloat16)
    probs = torch.softmax(torch.randn(1, 8, 32768), -1).to(torch.bfloat16)
    products = {"prompt chunk": lambda: torch.nn.functional.linear(chunk, weight),
                "decode attention": lambda: (keys.matmul(q.transpose(1, 2)), probs.matmul(values))}
    times = {}
    for name, call in products.items():
        for kernel, onednn in (("oneDNN", True), ("ATen", False)):
            with onednn_on(onednn):
                times.setdefault(name, {})[kernel] = best_seconds(call, tries) * 1e3
    return times


def matvec_bits_apart(rows: int = 64) -> int:
    """How many outputs of `rows` E2B mat-vecs (each a bf16 row × [6144 × 1536]) oneDNN and ATen's mat-vec round
    to different bf16 values: why the ways' decode steps are not bit for bit what Transformers' are."""
    torch.manual_seed(0)
    x, weight = torch.randn(rows, 1536, dtype=torch.bfloat16), torch.randn(6144, 1536, dtype=torch.bfloat16)
    out = {}
    for kernel, onednn in (("oneDNN", True), ("ATen", False)):
        with onednn_on(onednn):
            out[kernel] = torch.cat([torch.nn.functional.linear(row, weight) for row in x.split(1)])
    return int((out["oneDNN"] != out["ATen"]).sum())
# --8<-- [end:kernels]


def memory_line(row: dict) -> str:
    """`<way> holds: linears 1.17 GB, …; the runtime and the allocator's slack: the rest of its peak`. llama.cpp maps
    its file instead (`mapped`): its peak counts the pages it touched, so part of a table read a row at a time (the
    per-layer one) may never count, and the file can be larger than the peak."""
    if row.get("mapped"):
        stored = sum(row["memory"].values()) / 1e9
        return (f"{label(row)} maps its {stored:.2f} GB file and reads a page where it needs one: its "
                f"{row['peak_gb']:.2f} GB peak is the pages it touched, its copies of them and the runtime")
    held = ", ".join(f"{part} {n / 1e9:.2f}" for part, n in row["memory"].items())
    rest = row["peak_gb"] - sum(row["memory"].values()) / 1e9
    return f"{label(row)} holds (GB): {held}; the rest of its {row['peak_gb']:.2f} GB peak ({rest:.2f}) is the runtime"


# --8<-- [start:targets]
def targets(rows: dict, short: dict) -> list[tuple[str, float | None, str, float]]:
    """(target, measured value, comparison, bound) — each a ratio of medians from this one run, but for int4's
    peak memory, a median in GB. `short`: the rows at the short context."""
    rust, eager, compiled = rows.get("rust-eager"), rows.get("python-eager"), rows.get("python-compile")

    def ratio(a, b, key):
        return a[key] / b[key] if a and b and a.get(key) and b.get(key) else None

    return [
        ("Rust eager decode / Python eager decode", ratio(rust, eager, "streamed_tok_s"), ">=", 0.95),
        ("Rust eager decode / Python compile decode", ratio(rust, compiled, "streamed_tok_s"), ">=", 0.9),
        ("Rust eager decode / bandwidth limit", rust and rust.get("bandwidth_fraction"), ">=", 0.6),
        ("Rust peak memory / Python eager peak", ratio(rust, eager, "peak_gb"), "<=", 1.05),
        ("Rust peak memory / Python compile peak", ratio(rust, compiled, "peak_gb"), "<=", 1.05),
    ] + ([] if not rows.get("rust-int4", {}).get("available") else [  # step 08's way, when it ran
        ("Rust int4 decode / Rust eager decode", ratio(rows["rust-int4"], rust, "streamed_tok_s"), ">=", 2.0),
        ("  the same at the short context", ratio(short.get("rust-int4"), short.get("rust-eager"), "streamed_tok_s"),
         ">=", 2.5),
        ("Rust int4 decode / its bandwidth limit", rows["rust-int4"].get("bandwidth_fraction"), ">=", 0.5),
        ("Rust int4 decode / the read limit", rows["rust-int4"].get("read_fraction"), ">=", 0.8),
        ("Rust int4 peak memory, GB", rows["rust-int4"].get("peak_gb"), "<=", 4.0),
    ]) + ([] if not rows.get("rust-int4-aten", {}).get("available") else [  # step 08 against step 07
        ("Rust int4 decode / Rust int4 ATen decode (step 07)",
         ratio(rows.get("rust-int4"), rows["rust-int4-aten"], "streamed_tok_s"), ">=", 1.0),
    ])
# --8<-- [end:targets]


# --8<-- [start:peer_ratios]
def peer_ratios(rows: dict) -> list[tuple[str, float | None, None, None]]:
    """Rust int4 / llama.cpp Q4_0 and Rust eager / llama.cpp Q8_0 and bf16, decode tok/s, each against the fastest
    llama.cpp row of that format that ran (build × repacking: its best is found, not assumed), named in the line.
    No target: (name, value, None, None) for `judge`."""
    out = []
    for ours, quant in (("rust-int4", "q4_0"), ("rust-eager", "q8_0"), ("rust-eager", "bf16")):
        theirs = [r for way, r in rows.items() if peer.is_peer(way) and peer.parse_way(way)[1] == quant]
        if not theirs or ours not in rows:
            continue
        best = max(theirs, key=lambda r: r["streamed_tok_s"])
        out.append((f"{label(rows[ours])} decode / {label(best)} decode",
                    rows[ours]["streamed_tok_s"] / best["streamed_tok_s"], None, None))
    return out
# --8<-- [end:peer_ratios]


def peer_lines(rows: list[dict]) -> list[str]:
    """Which llama.cpp each llama.cpp row ran: version, build flags, what its CPU backend reported."""
    seen = {}
    for row in rows:
        if peer.is_peer(row["way"]) and row["available"]:
            seen.setdefault(row["build"], f"llama.cpp {row['build']} build: llama-cpp-python {row['peer_version']} "
                            f"from its sdist, cmake {row['cmake_args']}, {row['threads']} threads; "
                            f"{row['system_info']}")
    return list(seen.values())


def chart(rows: list[dict], path: str) -> None:
    """Decode tok/s (streamed, in batches) and peak memory per way, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r["available"]]
    names = [label(r).replace(" (", "\n(") for r in ran]  # llama.cpp's: its build and setting on a second line
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11 + 0.6 * max(0, len(ran) - 5), 4.2))
    x = range(len(ran))
    nan = float("nan")  # llama.cpp's rows have no "in batches" figure: every token reaches the host as made
    speed.bar([i - 0.2 for i in x], [r["streamed_tok_s"] for r in ran], 0.4, label="streamed")
    speed.bar([i + 0.2 for i in x], [r["batched_tok_s"] or nan for r in ran], 0.4, label="in batches (every 8)")
    speed.set_ylabel("decode tok/s")
    speed.legend()
    memory.bar(list(x), [r["peak_gb"] for r in ran], 0.5, color="tab:gray")
    memory.set_ylabel("peak memory, GB")
    for ax in (speed, memory):
        ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    fig.suptitle("Gemma 4 E2B-shaped, random W4A16 weights, on this CPU (higher is better / lower is better)"
                 + ("; llama.cpp on GGUFs of the same checkpoint" if any(peer.is_peer(r["way"]) for r in ran) else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def read_fraction(rates: list[float], limits: list[float], nbytes: float) -> float:
    """A way's fraction of the read limit: the median over the turns of its decode rate (tok/s) times the bytes a
    token reads, against the read limit (GB/s) measured just before that turn."""
    return statistics.median(rate * nbytes / (limit * 1e9) for rate, limit in zip(rates, limits, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ways", default=",".join(WAYS),
                    help=f"comma-separated; {CHOOSE} (steps 07 and 08's when installed, llama.cpp's after make peer)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cpu", choices=["cpu"], help="the benchmark is this machine's CPU record")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--short-ctx", type=int, default=4096,
                    help="with step 08's way: Rust int4 and Rust eager again at this context (0: skip)")
    ap.add_argument("--json", metavar="PATH", type=cli.output_path)
    ap.add_argument("--chart", metavar="PNG", type=cli.output_path,
                    help="write the bar chart here (default: beside --json)")
    args = ap.parse_args()
    ways = args.ways.split(",")
    if bad := unknown(ways):
        ap.error(f"--ways: unknown {', '.join(bad)}; {CHOOSE}")
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: at least 1")
    if args.max_new < 2:  # the prompt's read yields the first token; decode's speed needs a step after it
        ap.error(f"--max-new {args.max_new}: at least 2 (the first token comes from the prompt's read)")
    if args.short_ctx < 0:
        ap.error(f"--short-ctx {args.short_ctx}: a context length, or 0 to skip")

    folder = checkpoints.e2b()
    model, emb4 = folder / "text", folder / "emb4"
    ctx = cli.default_ctx(model)
    device = devices.choose_device(args.device)
    ids = prompt.encode(model, prompt.BENCH_PROMPT)
    bandwidth = memory_bandwidth_gb_s()
    read_limit, read_kernel = read_bandwidth_gb_s()
    print(f"E2B-shaped checkpoint (random weights), {len(ids)}-token prompt, {args.max_new} greedy tokens, "
          f"{args.dtype}, ctx {ctx}, on {device}; median of {args.repeat} fresh processes per way, taking turns")
    print(f"memory bandwidth (a 2 GiB copy, best of 5): {bandwidth:.1f} GB/s, bytes read plus bytes written; the read "
          f"limit (a 2 GiB read-only stream, best of 5, by {read_kernel}): {read_limit:.1f} GB/s", flush=True)
    kernels, streamed = matvec_gb_s(), matvec_gb_s(streamed_gb=0.4)
    for weights, rates in (("warm in cache (best of 7 × 200 calls)", kernels),
                           ("streamed from memory (0.4 GB of distinct copies, best of 7 × 200 calls)", streamed)):
        each = [f"{name} {rate:.1f} GB/s ({rate / bandwidth:.2f} of the copy, {rate / read_limit:.2f} of the read "
                f"limit)" for name, rate in rates.items()]
        print(f"one [6144 × 1536] mat-vec, {weights}: " + ", ".join(each), flush=True)
    kept, apart = onednn_against_aten_ms(), matvec_bits_apart()
    print("left on oneDNN (best of 3): " + ", ".join(
        f"{name} {t['oneDNN']:.1f} ms (ATen {t['ATen']:.1f} ms, {t['ATen'] / t['oneDNN']:.0f}x slower)"
        for name, t in kept.items())
        + f"; 64 mat-vecs through each round {apart} of {64 * 6144} outputs apart", flush=True)

    cfg = TextConfig.from_file(model / "config.json")
    # llama.cpp's GGUFs of this checkpoint, made once before any way is timed (minutes at E2B size), then cached
    quants = sorted({peer.parse_way(w)[1] for w in ways if peer.is_peer(w) and not peer.missing(w)})
    if quants:
        from torchtpu_parity import to_gguf

        files = to_gguf.ggufs(model, quants)
        sizes = ", ".join(f"{q} {f.stat().st_size / 1e9:.2f} GB" for q, f in files.items())
        print(f"llama.cpp's GGUFs of this checkpoint (its converter, bf16; its quantizer): {sizes}, "
              f"in {records.name(files[quants[0]].parent)}", flush=True)

    def measure(ways: list[str], at: int) -> tuple[list[dict], list[float]]:
        """A row per way: the medians of its `--repeat` fresh processes, the ways taking turns, so that a slow
        minute of this shared machine falls on every way alike; and the read limit measured before each turn."""
        runs, limits = {way: [] for way in ways}, []
        for turn in range(args.repeat):
            # this shared machine's memory runs faster some minutes than others: the read limit again just before
            # each turn, so that a way's rate is set against the memory of its own minutes
            limits.append(read_bandwidth_gb_s(tries=3)[0])
            for way in ways:
                runs[way].append(run_way(way, model, emb4, str(device), args.dtype, at, ids, args.max_new))
            print(f"  ctx {at}: turn {turn + 1} of {args.repeat} done", flush=True)
        rows = [median_row(runs[way]) for way in ways]
        for way, row in zip(ways, rows):
            if row["available"]:
                row["kv_bytes_per_token"] = kv_bytes_per_token(cfg, at, row["prompt_len"], len(row["tokens"]) - 1,
                                                               row["decode_slots"],
                                                               row["kv_dtype"],
                                                               row.get("sliding_slots", "ring"),
                                                               row.get("kv_read", "slots"))
                read = row["bytes_per_token"] + row["kv_bytes_per_token"]
                row["bandwidth_fraction"] = row["streamed_tok_s"] * read / (bandwidth * 1e9)
                row["read_fraction"] = read_fraction([run["streamed_tok_s"] for run in runs[way]], limits, read)
        return rows, limits

    rows, turn_limits = measure(ways, ctx)
    by_way = {r["way"]: r for r in rows if r["available"]}
    # step 08's target at a short context: the ratio to Rust eager, measured side by side there too
    short_ways = ["rust-eager", "rust-int4"] if args.short_ctx and {"rust-eager", "rust-int4"} <= set(by_way) else []
    short = {row["way"]: row for row in measure(short_ways, args.short_ctx)[0]} if short_ways else {}
    print(table(rows))
    print("\n".join(identity_lines(rows)))
    wide = max([len(label(row)) + 2 for row in rows if row["available"]] + [28])
    print("the read limit again just before each turn (the same stream, best of 3): "
          + ", ".join(f"{limit:.1f}" for limit in turn_limits) + " GB/s; a way's read fraction is the median over the "
          "turns of its rate against that turn's limit")
    print(f"{'way':<{wide}}{'weights GB / token':>19}{'KV GB / token':>15}{'bandwidth fraction':>20}"
          f"{'read fraction':>15}")
    for row in rows:
        if row["available"]:
            print(f"{label(row):<{wide}}{row['bytes_per_token'] / 1e9:>19.2f}{row['kv_bytes_per_token'] / 1e9:>15.4f}"
                  f"{row['bandwidth_fraction']:>20.2f}{row['read_fraction']:>15.2f}")
    # the ways share attention's default dtype (float32 where this CPU's bf16 matmul is slow) and hold their caches
    # in it, but for a way whose attention widens bf16 caches as it reads them (step 08's own call)
    attention = next((r["attention_dtype"] for r in rows if r["available"]), args.dtype)
    apart = [f"{label(r)} in {r['kv_dtype']}" for r in rows
             if r["available"] and r["kv_dtype"] not in (attention, "float16")]
    print(f"what each way holds, by part (its memory()); attention computes in {attention} on this CPU, the caches "
          f"held in it{' (but ' + ', '.join(apart) + ')' if apart else ''}:")
    print("\n".join(memory_line(row) for row in rows if row["available"]))
    print("\n".join(f"{label(row)}: {row['weights_reason']}" for row in rows if row.get("weights_reason")))
    matvec_names = {"aten": "ATen's mat-vec", "onednn": "oneDNN's mat-vec"}
    dense = [f"{label(row)} on {matvec_names[row['matvec']]}" for row in rows
             if row.get("matvec") and not row.get("weights_reason")]
    if dense:
        print(f"a decode step's one-row linears: {'; '.join(dense)}")
    for row in short.values():
        print(f"at ctx {args.short_ctx}: {label(row)} decodes {row['streamed_tok_s']:.1f} tok/s streamed, "
              f"peak {row['peak_gb']:.2f} GB")

    print("\n".join(peer_lines(rows)))
    checks, lines = judge(targets(by_way, short) + peer_ratios(by_way))
    print("targets (ratios of medians from this run):")
    print("\n".join(lines))

    if args.json:
        records.write_json(args.json, device, model=records.name(model), emb4=records.name(emb4),
                           dtype=args.dtype, ctx=ctx,
                           max_new=args.max_new, repeat=args.repeat, prompt_ids=ids, bandwidth_gb_s=bandwidth,
                           read_gb_s=read_limit, read_kernel=read_kernel, turn_read_gb_s=turn_limits,
                           matvec_gb_s=kernels, matvec_streamed_gb_s=streamed, onednn_against_aten_ms=kept,
                           matvec_bits_apart=apart, rows=rows, short_ctx=args.short_ctx,
                           short_rows=list(short.values()), targets=checks)
    chart_path = args.chart or (args.json and str(Path(args.json).with_suffix(".png")))
    if chart_path:
        chart(rows, chart_path)


if __name__ == "__main__":
    main()
