"""What `attention_dtype` chooses between: one full-attention layer's decode step at E2B's size (8 query heads and
one KV head of 512, over a long cache), in bfloat16 and in float32, on this CPU — and on this CPU limited to AVX2.

usage: python attention.py [--slots 4096,33024] [--repeat 20] [--json PATH]
The AVX2 rows run in a child process with ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and
MKL_ENABLE_INSTRUCTIONS=AVX2, which torch, oneDNN and MKL honour: the same chip without its AVX-512 (and so without
oneDNN's bf16 path), standing in for the
AVX2-only CPUs many readers have. A real AVX2 chip differs in clock and caches; compare rows within one run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torchtpu_rs import cli, records
from torchtpu_ways.baseline import attend, attention_dtype_default

HEADS, HEAD_DIM = 8, 512  # E2B's full-attention layers: 8 query heads over one KV head of 512
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def decode_ms(slots: int, dtype: torch.dtype, repeat: int) -> float:
    """Median milliseconds of one decode step's attention (scores, softmax, probabilities × values)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, HEAD_DIM, generator=gen).to(dtype)
    k, v = (torch.randn(1, slots, HEAD_DIM, generator=gen).to(dtype) for _ in range(2))
    masked = torch.zeros(1, slots, dtype=torch.bool)
    times = []
    for _ in range(repeat + 2):  # two warm-up calls
        start = time.perf_counter()
        attend(q, k, v, masked)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def measure(slot_counts: list[int], repeat: int) -> dict:
    """This process's CPU as torch sees it, and the timings of both dtypes at each cache length."""
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "fast_bf16_matmul": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
            "default": str(attention_dtype_default(torch.bfloat16, "cpu")).removeprefix("torch."),
            "rows": [{"slots": n, "bfloat16_ms": decode_ms(n, torch.bfloat16, repeat),
                      "float32_ms": decode_ms(n, torch.float32, repeat)} for n in slot_counts]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=cli.positive_ints, default="4096,33024",
                    help="cache lengths to attend over, comma-separated")
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per figure (the median is shown)")
    ap.add_argument("--device", default="cpu", choices=["cpu"], help="the CPU: what attention_dtype is about")
    ap.add_argument("--json", metavar="PATH", type=cli.output_path)
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the AVX2 child
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: at least 1 (a median of no calls is none)")
    if args.measure_only:
        print(json.dumps(measure(args.slots, args.repeat)))
        return
    runs = {"this CPU": measure(args.slots, args.repeat)}
    child = subprocess.run([sys.executable, __file__, "--measure-only", "--slots", ",".join(map(str, args.slots)),
                            "--repeat", str(args.repeat)], env={**os.environ, **AVX2}, capture_output=True, text=True,
                           check=True)
    runs["limited to AVX2"] = json.loads(child.stdout.splitlines()[-1])
    print(f"one full layer's decode attention at E2B size ({HEADS} heads × {HEAD_DIM}), median of {args.repeat} calls")
    print(f"{'CPU':<16} {'capability':<11} {'fast bf16':<10} {'slots':>6} {'bf16 ms':>8} {'f32 ms':>7} "
          f"{'bf16/f32':>8}  default")
    for name, run in runs.items():
        for row in run["rows"]:
            print(f"{name:<16} {run['cpu_capability']:<11} {'yes' if run['fast_bf16_matmul'] else 'no':<10} "
                  f"{row['slots']:>6} {row['bfloat16_ms']:>8.2f} {row['float32_ms']:>7.2f} "
                  f"{row['bfloat16_ms'] / row['float32_ms']:>8.2f}  {run['default']}")
    records.write_json(args.json, "cpu", heads=HEADS, head_dim=HEAD_DIM, repeat=args.repeat, runs=runs)


if __name__ == "__main__":
    main()
