"""Step 07's kernel figures at E2B's shapes, small enough for any CPU (seconds, no 9 GB checkpoint):

usage: python measure.py [--repeat 50] [--json PATH]
- each E2B linear shape and the head [262144 x 1536], one token: int4 kernel vs the dense bf16 product (ms), and
  the bytes each reads;
- the repack's cost per shape (ms), in 1,024-row blocks;
- the emb4 twin's F16 scales rounded to bf16 (the kernel reads scales in the activation dtype): how many change, by
  how much, and what that does to a head's output distribution.
Random weights in the real format (the project's compressed-tensors-equal packer).
"""
import argparse
import time

import torch
import torchtpu_int4
from torchtpu_rs import checkpoints, records

# (name, rows, cols): E2B's matrices (layers 15-34 have the double-wide MLP)
SHAPES = [("q_proj", 2048, 1536), ("k_proj / v_proj", 256, 1536), ("o_proj", 1536, 2048),
          ("gate / up (layers 0-14)", 6144, 1536), ("down (layers 0-14)", 1536, 6144),
          ("gate / up (layers 15-34)", 12288, 1536), ("down (layers 15-34)", 1536, 12288),
          ("per_layer_input_gate", 256, 1536), ("per_layer_projection", 1536, 256),
          ("per_layer_model_projection", 8960, 1536), ("lm_head", 262144, 1536)]


def ms(fn, repeat):
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    print(f"{records.cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print(f"{'matrix':<28} {'shape':>14} {'repack ms':>9} {'int4 ms':>8} {'bf16 ms':>8} {'x':>5} {'int4 MB':>8} "
          f"{'bf16 MB':>8}")
    for name, n, k in SHAPES:
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        p = checkpoints.pack_w4(w)
        start = time.perf_counter()
        packed, sz = torchtpu_int4.repack(p["weight_packed"], p["weight_scale"], k)
        repack_ms = (time.perf_counter() - start) * 1e3
        dense = ((((p["weight_packed"].unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF)
                  .flatten(-2) - 8).to(torch.bfloat16).unflatten(-1, (-1, 32)) * p["weight_scale"].unsqueeze(-1)
                 ).flatten(-2)
        del w
        x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
        repeat = max(3, args.repeat if n < 100000 else args.repeat // 10)
        t4 = ms(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz), repeat)
        tb = ms(lambda: torch.nn.functional.linear(x, dense), repeat)
        row = {"matrix": name, "rows": n, "cols": k, "repack_ms": repack_ms, "int4_ms": t4, "bf16_ms": tb,
               "int4_bytes": packed.numel() + sz.numel() * 2, "bf16_bytes": dense.numel() * 2}
        rows_out.append(row)
        print(f"{name:<28} {f'{n}x{k}':>14} {repack_ms:>9.1f} {t4:>8.3f} {tb:>8.3f} {tb / t4:>5.2f} "
              f"{row['int4_bytes'] / 1e6:>8.1f} {row['bf16_bytes'] / 1e6:>8.1f}")

    # --8<-- [start:f16]
    # The emb4 twin's head: F16 scales; in bfloat16 mode the kernel reads them as bf16.
    n, k = 262144, 1536
    w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    p = checkpoints.pack_w4(w, scale_dtype=torch.float16)
    del w
    s16 = p["weight_scale"]
    changed = (s16.to(torch.bfloat16).to(torch.float16) != s16).float().mean().item()
    rel = ((s16.to(torch.bfloat16).float() - s16.float()).abs() / s16.float()).max().item()
    h = torch.randn(4, k, generator=gen)
    h = (h / h.norm(dim=-1, keepdim=True) * 40).to(torch.bfloat16)  # final-norm-sized hidden states
    exact = torchtpu_int4.int4_linear(h.float(), p["weight_packed"], s16, k)  # float32: F16 scales exact
    # float32 again, the scales rounded to bf16 first: the rounding's effect alone
    rounded = torchtpu_int4.int4_linear(h.float(), p["weight_packed"], s16.to(torch.bfloat16), k)
    in_bf16 = torchtpu_int4.int4_linear(h, p["weight_packed"], s16, k).float()  # what bfloat16 mode computes

    def kl(a, b):
        log_p, log_q = a.double().log_softmax(-1), b.double().log_softmax(-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).max().item()

    print(f"emb4 head F16 scales -> bf16: {changed:.1%} change, by at most {rel:.2e} relative; head logits "
          f"max |diff| {(exact - rounded).abs().max():.4f}, KL {kl(exact, rounded):.2e} (the rounding alone); "
          f"bfloat16 mode in all: max |diff| {(exact - in_bf16).abs().max():.4f}, KL {kl(exact, in_bf16):.2e}")
    # --8<-- [end:f16]
    records.write_json(args.json, "cpu", cpu_capability=torch.backends.cpu.get_cpu_capability(),
                       threads=torch.get_num_threads(), rows=rows_out, f16_scales_changed=changed,
                       f16_scale_max_rel_change=rel, head_kl_scales=kl(exact, rounded), head_kl_bf16=kl(exact, in_bf16))


if __name__ == "__main__":
    main()
