"""Step 08: the engine on this project's own int4 kernels (the one it picks for this CPU), beside the same files
dequantized to bf16 (step 03's way).
usage: python run.py [--model DIR] [--emb4 DIR] [--device auto|tpu|cuda|cpu] [--dtype bfloat16|float32]
                     [--ctx N] [--prompt TEXT] [--max-new 64] [--read-every 1] [--json PATH]
Loads the checkpoint twice, weights="int4" and weights="bf16", and prints the two side by side: the tokens, the
load time (the repack is a cost), decode tok/s and the memory the weights take. Where the int4 kernel does not
run (a TPU, a GPU) the int4 column says why. Without --model it runs the trained model step 03 ships.
"""
import argparse
import gc
import time

import torch  # first: the engine reuses the libtorch it loads
import torchtpu_kernels
from torchtpu_rs import cli, devices, prompting, records
from transformers import AutoTokenizer

# The task the shipped model learned; the right answer is 610395.
PROMPT = ("Record 1: code 482913. Record 2: code 705126. Record 3: code 610395. Record 4: code 238470. "
          "What is the code of record 3? Answer:")


def rss_gb() -> float:
    """This process's resident memory now, GB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9


# --8<-- [start:side]
def one_way(args, device, weights, ids, stop) -> dict:
    """Load with `weights`, generate, time; the memory the engine added to the process."""
    gc.collect()
    before = rss_gb()
    start = time.perf_counter()
    try:
        engine = torchtpu_kernels.Engine(args.model, args.emb4, devices.like(device), args.ctx, args.dtype,
                                      weights=weights)
    except NotImplementedError as e:
        return {"weights": weights, "available": False, "why": str(e)}
    load_s = time.perf_counter() - start
    tokens, read_s, decode_s = engine.generate(ids, args.max_new, args.read_every, stop=stop)
    row = {"weights": weights, "available": True, "held": engine.weights, "why": engine.weights_reason,
           "load_s": load_s, "tokens": tokens, "read_s": read_s, "decode_s": decode_s,
           "read_tok_s": len(ids) / read_s,
           "decode_tok_s": (len(tokens) - 1) / decode_s if decode_s > 0 else float("nan"),
           "weight_bytes_per_token": engine.weight_bytes_per_token(), "engine_gb": rss_gb() - before,
           "next_logits": engine.logits(ids, positions=[len(ids) - 1])[0]}  # float32 [vocab], after the prompt
    del engine
    return row
# --8<-- [end:side]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--read-every", type=int, default=1, help="decode steps between copies of tokens to the host")
    args = cli.resolve(ap.parse_args())
    device = devices.choose_device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ids = prompting.encode(tokenizer, args.prompt)
    stop = prompting.eos_ids(args.model)

    rows = [one_way(args, device, w, ids, stop) for w in ("int4", "bf16")]
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"prompt ({len(ids)} tokens): {args.prompt}")
    print(f"on {device} ({records.cpu_model()}, {cpu}), {args.dtype}, ctx {args.ctx}")
    print(f"{'weights':<8} {'load s':>7} {'read tok/s':>10} {'decode tok/s':>12} {'weights MB/token':>16} "
          f"{'engine GB':>9}  answer")
    for r in rows:
        if not r["available"]:
            print(f"{r['weights']:<8} not available: {r['why']}")
            continue
        text = tokenizer.decode(prompting.until_stop(r["tokens"], stop), skip_special_tokens=True)
        r["text"] = text
        print(f"{r['held']:<8} {r['load_s']:>7.2f} {r['read_tok_s']:>10.0f} {r['decode_tok_s']:>12.1f} "
              f"{r['weight_bytes_per_token'] / 1e6:>16.2f} {r['engine_gb']:>9.2f}  {text!r}")
    both = [r for r in rows if r["available"]]
    print("\n".join(f"{r['held']}: {r['why']}" for r in both))  # which kernel multiplies, and why
    if len(both) == 2:
        same = prompting.same_prefix(both[0]["tokens"], both[1]["tokens"])
        print(f"same tokens: {same} of {max(len(both[0]['tokens']), len(both[1]['tokens']))}")
        int4, bf16 = (r["next_logits"].double().log_softmax(-1) for r in both)
        kl = (bf16.exp() * (bf16 - int4)).sum().item()
        top5 = [r["next_logits"].topk(5).indices.tolist() for r in both]
        print(f"next token after the prompt: KL(bf16 || int4) {kl:.3g}; top-5 int4 {top5[0]}, bf16 {top5[1]}")
        for r, t in zip(both, top5):
            r["top5"] = t
        both[0]["kl_from_bf16"] = kl
    for r in both:
        del r["next_logits"]
    records.write_json(args.json, device, model=records.name(args.model), emb4=records.name(args.emb4),
                       dtype=args.dtype, ctx=args.ctx, cpu_capability=cpu, prompt_ids=ids, stop=stop, rows=rows)


if __name__ == "__main__":
    main()
