"""Step 04, a second reference: the Rust engine, Transformers and llama.cpp (`make peer`) on record questions.

usage: python llamacpp.py [--model DIR] [--dtype bfloat16|float32] [--ctx N] [--prompts 24] [--max-new 8]
                          [--json PATH]
Each prompt is a record question for the trained model (3 to 41 records, then "What is the code of record k?
Answer:"), as token ids; every side continues it greedily from those ids (llama.cpp's tokenizer is never used).
llama.cpp reads GGUFs its own converter made from the same -text checkpoint (bf16), and its quantizer (Q8_0,
Q4_0), so the engine here reads that checkpoint alone (the -text-emb4 twin's 4-bit tables would be another model).
Without the peer built, it says so and records nothing else.
"""
import argparse

import numpy as np
import torch  # first: the engine reuses the libtorch it loads
import torchtpu_rs
from torchtpu_parity import against_peer, peer
from torchtpu_parity.compare import greedy
from torchtpu_rs import cli, prompting, records
from torchtpu_rs.reference import transformers_model
from transformers import AutoTokenizer


def sizes(count: int, low: int = 3, high: int = 41) -> list[int]:
    """`count` record counts spread evenly from low to high: prompts from a few dozen ids to a few hundred."""
    return [low + round(i * (high - low) / max(count - 1, 1)) for i in range(count)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_engine_args(ap)
    ap.add_argument("--prompts", type=int, default=24, help="how many record questions")
    ap.add_argument("--max-new", type=int, default=8, help="greedy tokens per prompt (a code, '.', <eos>: 8)")
    args = ap.parse_args()
    if args.emb4:
        ap.error("--emb4: llama.cpp's GGUF is made from the -text checkpoint, so the engine reads that alone")
    if args.device not in ("auto", "cpu"):
        ap.error("this comparison runs on the CPU: use --device cpu")
    if args.prompts < 1 or args.max_new < 1:
        ap.error("--prompts and --max-new must be at least 1")
    args.no_emb4 = True
    args = cli.resolve(args)
    if why := peer.missing("llamacpp-bf16"):
        print(f"llama.cpp is not available here: {why}")
        records.write_json(args.json, "cpu", model=records.name(args.model), available=False, why=why)
        return

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    questions = [(n, *prompting.record_question(tokenizer, n, seed=100 + n)) for n in sizes(args.prompts)]
    prompts = [ids for _, ids, _ in questions]
    print(f"{len(prompts)} record questions ({questions[0][0]} to {questions[-1][0]} records, {len(prompts[0])} to "
          f"{len(prompts[-1])} ids), {args.max_new} greedy tokens each, {args.dtype}, ctx {args.ctx}, on the CPU")

    engine = torchtpu_rs.Engine(args.model, None, torch.zeros(1), args.ctx, args.dtype)
    reference = transformers_model(args.model, args.dtype)
    ours = [engine.generate(ids, args.max_new)[0] for ids in prompts]
    ours_first = np.stack([engine.logits(ids, [len(ids) - 1])[0].numpy() for ids in prompts])
    with torch.no_grad():
        hf = [greedy(reference, ids, args.max_new) for ids in prompts]
        hf_first = np.stack([reference(torch.tensor([ids])).logits[0, -1].float().numpy() for ids in prompts])
    runs = against_peer.llama_runs(args.model, prompts, args.max_new, args.ctx)
    print(f"llama.cpp: llama-cpp-python {peer.VERSION} (native build: {peer.build_info('native')['cmake_args']}), "
          f"weight repacking off, {runs['bf16']['threads']} threads; GGUFs from its converter (bf16) and quantizer: "
          + ", ".join(f"{q} {v['gguf'].stat().st_size / 1e6:.1f} MB" for q, v in runs.items()))
    print(runs["bf16"]["system_info"])
    r = against_peer.agreement(ours, ours_first, runs, hf, hf_first)

    stop = prompting.eos_ids(args.model)

    def right(tokens, code):  # the answer starts with the code's six digits
        return tokenizer.decode(prompting.until_stop(tokens, stop)).replace(" ", "").startswith(code)

    print(f"{'records':>7} {'ids':>4} {'code':>7}  engine answer  {'= HF':>5}" +
          "".join(f" {'= ' + q:>7}" for q in runs))
    for (n, ids, code), mine, theirs, i in zip(questions, ours, hf, range(len(prompts))):
        answer = tokenizer.decode(prompting.until_stop(mine, stop))
        verdict, hf_same = "right" if right(mine, code) else "WRONG", "yes" if mine == theirs else "no"
        print(f"{n:>7} {len(ids):>4} {code:>7}  {answer.strip()[:10]:<10} {verdict:>5} {hf_same:>4}" +
              "".join(f" {'yes' if runs[q]['tokens'][i] == mine else 'no':>7}" for q in runs))
    n = r["prompts"]
    print(f"greedy tokens (all {args.max_new}) equal to the engine's: Transformers {r['hf_same']} of {n}, " +
          ", ".join(f"llama.cpp {q.upper()} {v['same']} of {n}" for q, v in r["llama"].items()))
    print(f"right answers: engine {sum(right(t, c) for t, (_, _, c) in zip(ours, questions))} of {n}, " +
          ", ".join(f"llama.cpp {q.upper()} {sum(right(t, c) for t, (_, _, c) in zip(runs[q]['tokens'], questions))}"
                    f" of {n}" for q in runs))
    print(f"first token, top-1 equal to the engine's: Transformers {r['hf_top1_same']} of {n}, " +
          ", ".join(f"llama.cpp {q.upper()} {v['top1_same']} of {n}" for q, v in r["llama"].items()))
    print(f"first token, max abs logit diff: Transformers - engine {r['hf_max_abs_diff']:.4g}; " +
          "; ".join(f"llama.cpp {q.upper()} - engine {v['max_abs_diff']:.4g}, - Transformers "
                    f"{v['max_abs_diff_hf']:.4g}" for q, v in r["llama"].items()))
    records.write_json(args.json, "cpu", model=records.name(args.model), available=True, dtype=args.dtype,
                       ctx=args.ctx, max_new=args.max_new, prompt_ids=prompts,
                       codes=[c for _, _, c in questions], tokens_rust=ours, tokens_hf=hf,
                       tokens_llama={q: v["tokens"] for q, v in runs.items()},
                       peer={"version": peer.VERSION, "build": "native", "repack": False,
                             "cmake_args": peer.build_info("native")["cmake_args"],
                             "system_info": runs["bf16"]["system_info"],
                             "gguf_bytes": {q: v["gguf"].stat().st_size for q, v in runs.items()}},
                       **r)


if __name__ == "__main__":
    main()
