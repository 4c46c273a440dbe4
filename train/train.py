"""Train the walkthrough's default model: a small Gemma 4 that answers questions about numbered records.

    python train/train.py                      # about 75 minutes on 2 CPU cores; resumes if interrupted
    python train/train.py --steps 40 --out /tmp/smoke    # a smoke run

Transformers' own Gemma4ForCausalLM (the TINY shape of torchtpu_rs.checkpoints: every structural feature of
E2B), float32 with sdpa attention (bf16 autocast is slow on CPUs without bf16 matmul hardware), AdamW with
warm-up and cosine decay, a curriculum from few records to many (more as soon as the answers are right),
and a last phase that trains through fake 4-bit quantization (train/fakequant.py) so the exported W4A16 model
keeps what it learned. The batches depend
only on (seed, step) and a checkpoint is written every few minutes, so an interrupted run resumes where it
stopped and ends with the same weights. Writes to --out: ckpt.pt (resumable), model.pt (the final float
weights), log.json (one entry per step).
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402
import fakequant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def build_model(seed: int):
    from torchtpu_rs.checkpoints import TINY, text_config
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    config = text_config(TINY, tied=True)
    config._attn_implementation = "sdpa"
    return Gemma4ForCausalLM(config).float()


def tokenizer_for_training():
    """The project's word-level tokenizer (the one every checkpoint ships), written once to a cache folder."""
    from torchtpu_rs.checkpoints import write_tokenizer
    from transformers import AutoTokenizer

    folder = ROOT / ".cache" / "train" / "tokenizer"
    if not (folder / "tokenizer.json").exists():
        write_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def answer_loss(model, ids, labels):
    """Mean cross-entropy over the answer tokens, and the fraction of answers predicted exactly: every token of
    the answer the argmax (what greedy decoding would give, see evaluate.py)."""
    logits = model(input_ids=ids).logits[:, :-1]
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=data.IGNORE)
    mask = target != data.IGNORE
    wrong = ((logits.argmax(-1) != target) & mask).flatten()
    # an answer is a run of targets (a question always separates two): number the runs through the batch
    starts = (mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0))).flatten()
    answer = starts.cumsum(0)
    bad = torch.zeros(int(answer[-1]) + 1, dtype=torch.bool)
    bad[answer[wrong]] = True
    return loss, 1 - bad[1:].float().mean()


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "train" / "run")
    ap.add_argument("--steps", type=int, default=3600)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per batch")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100, help="learning-rate warm-up steps")
    ap.add_argument("--advance", type=float, default=0.9,
                    help="add records to the contexts once this fraction of recent answers is exactly right")
    ap.add_argument("--lookups", type=int, default=data.LOOKUPS, help="lookup questions per training sequence")
    ap.add_argument("--copies", type=int, default=data.COPIES,
                    help="copy questions per training sequence (each ends in one decision: stop after record B)")
    ap.add_argument("--qat", type=float, default=0.8, help="fraction of the run after which weights are 4-bit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-every", type=float, default=180.0, help="seconds between resumable checkpoints")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    a.out.mkdir(parents=True, exist_ok=True)
    enc = data.Encoder(tokenizer_for_training())
    model = build_model(a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    qat_from = int(a.qat * a.steps)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k not in ("out", "save_every")}
    settings["copy_span"] = list(data.COPY_SPAN)  # the data's shape is part of the recipe: a resume checks it too
    start, log, switches, cap, recent = 0, [], [], data.FIRST_CAP, []
    ckpt = a.out / "ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state["settings"] != settings:
            sys.exit(f"{ckpt} was written with other settings {state['settings']}; use another --out")
        start, log, cap, recent = state["step"], state["log"], state["cap"], state["recent"]
        if start >= qat_from:
            switches = fakequant.attach(model)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        print(f"resuming {ckpt} at step {start}", flush=True)
    model.train()
    last_save = time.monotonic()
    bar = tqdm(range(start, a.steps), initial=start, total=a.steps, desc="training", dynamic_ncols=True)
    for step in bar:
        if step == qat_from:
            switches = fakequant.attach(model)
        # the tables are 4-bit only in the emb4 twin: train through both, alternating
        for fq in switches:
            fq.enabled = step % 2 == 1
        ids, labels = data.batch(enc, a.seed, step, cap, a.tokens, a.lookups, a.copies)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.steps, a.lr, a.warmup)
        t0 = time.perf_counter()
        loss, acc = answer_loss(model, ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log.append({"step": step, "loss": round(loss.item(), 5), "answers_right": round(acc.item(), 4), "records": cap,
                    "batch": list(ids.shape), "lr": group["lr"], "qat": step >= qat_from,
                    "seconds": round(time.perf_counter() - t0, 3)})
        bar.set_postfix(loss=f"{loss.item():.3f}", right=f"{acc.item():.2f}", records=cap)
        cap, recent = data.next_cap(cap, recent + [acc.item()], a.advance)
        if time.monotonic() - last_save > a.save_every or step + 1 == a.steps:
            save_atomic({"step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                         "log": log, "settings": settings, "cap": cap, "recent": recent}, ckpt)
            last_save = time.monotonic()
    fakequant.detach(model)
    save_atomic({"model": model.state_dict(), "settings": settings}, a.out / "model.pt")
    from torchtpu_rs.records import meta

    (a.out / "log.json").write_text(json.dumps({"meta": meta("cpu"), "settings": settings,
                                                "seconds": round(sum(e["seconds"] for e in log), 1),
                                                "steps": log}) + "\n")
    print(f"wrote {a.out / 'model.pt'}", flush=True)


if __name__ == "__main__":
    main()
