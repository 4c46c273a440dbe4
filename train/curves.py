"""Plot a training log (train.py's log.json): answer loss, exact answers and the curriculum's records, by step;
and print what the run cost and when the curriculum moved.

    python train/curves.py .cache/train/run/log.json docs/runs/train/loss.png
"""
import json
import sys
from pathlib import Path


def smooth(values, k=25):
    return [sum(values[max(0, i - k):i + 1]) / len(values[max(0, i - k):i + 1]) for i in range(len(values))]


def plot(log: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = log["steps"]
    x = [e["step"] for e in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    top.plot(x, [e["loss"] for e in steps], color="#bbb", linewidth=0.6, label="answer loss (each step)")
    top.plot(x, smooth([e["loss"] for e in steps]), color="C0", label="answer loss (mean of 25)")
    top.set_yscale("log")
    top.set_ylabel("cross-entropy, answer tokens")
    top.legend(loc="upper right")
    bottom.plot(x, smooth([e["answers_right"] for e in steps]), color="C2", label="answers exactly right (mean of 25)")
    bottom.set_ylabel("fraction right")
    bottom.set_ylim(0, 1.02)
    records = bottom.twinx()
    records.plot(x, [e["records"] for e in steps], color="C1", linestyle="--", label="most records per context")
    records.set_ylabel("records")
    qat = next((e["step"] for e in steps if e["qat"]), None)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if qat is not None:
            ax.axvline(qat, color="gray", linewidth=1)
    if qat is not None:
        top.text(qat, top.get_ylim()[1], " 4-bit (QAT) from here", color="gray", va="top")
    bottom.set_xlabel("step")
    handles = bottom.get_legend_handles_labels()[0] + records.get_legend_handles_labels()[0]
    bottom.legend(handles, [h.get_label() for h in handles], loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summary(log: dict) -> str:
    steps, meta, settings = log["steps"], log["meta"], log["settings"]
    reached = {}
    for e in steps:
        reached.setdefault(e["records"], e["step"])
    qat = next(e["step"] for e in steps if e["qat"])
    tail = steps[-100:]
    from torchtpu_rs.records import header

    seconds = sorted(e["seconds"] for e in steps)
    lines = [
        header(meta),
        f"$ {meta['command']}",
        f"{len(steps)} steps on {settings['threads']} threads, {settings['tokens']} tokens a batch, "
        f"lr {settings['lr']}",
        f"time in training steps: {log['seconds'] / 60:.1f} minutes (median step {seconds[len(seconds) // 2]:.2f} s)",
        "most records per context, from step: " + ", ".join(f"{n} at {s}" for n, s in reached.items()),
        f"4-bit weights (quantization-aware) from step {qat}",
        f"last 100 steps: answer loss {sum(e['loss'] for e in tail) / len(tail):.4f}, "
        f"answers exactly right {sum(e['answers_right'] for e in tail) / len(tail):.3f}",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    log = json.loads(Path(sys.argv[1]).read_text())
    plot(log, Path(sys.argv[2]))
    print(summary(log), end="")
