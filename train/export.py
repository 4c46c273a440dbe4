"""Export the trained weights in both real formats and say how far they are from the files the package ships.

    python train/export.py                       # .cache/train/run/model.pt -> .cache/train/export, compared
    python train/export.py --ship                # ... and then replace the shipped files with the new ones

The export is `torchtpu_rs.checkpoints.export` (Transformers builds the model, compressed-tensors packs it, as
the real repacks were made): <layout>/text and <layout>/emb4 for both layouts. Without --ship nothing the package
holds is touched; with it, the old files are replaced only after the new ones are complete.
"""
import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
# The package data in this repository (what `pip install steps/03_model` ships), not an installed copy of it.
SHIPPED = ROOT / "steps" / "03_model" / "python" / "torchtpu_rs" / "checkpoints" / "trained-model"


def compare(new: Path, old: Path) -> list[str]:
    """Lines saying how the tensors of two exports differ: equal, or the largest difference per tensor kind."""
    if not old.exists():
        return [f"{old}: nothing shipped yet"]
    lines = []
    for a in sorted(new.rglob("model.safetensors")):
        rel = a.relative_to(new)
        b = old / rel
        if not b.exists():
            lines.append(f"{rel}: not in the shipped files")
            continue
        x, y = load_file(a), load_file(b)
        changed = [k for k in x if k not in y or not torch.equal(x[k], y[k])]
        if not changed:
            lines.append(f"{rel.parent}: every tensor identical ({len(x)})")
            continue
        packed = [k for k in changed if k.endswith("weight_packed")]
        nibbles = sum(int(((x[k].unsqueeze(-1) >> torch.arange(0, 32, 4)) & 15).ne(
            (y[k].unsqueeze(-1) >> torch.arange(0, 32, 4)) & 15).sum()) for k in packed if x[k].shape == y[k].shape)
        total = sum(x[k].numel() * 8 for k in x if k.endswith("weight_packed"))
        dense = [k for k in changed if x[k].is_floating_point() and k in y and x[k].shape == y[k].shape]
        worst = max(((x[k].float() - y[k].float()).abs().max().item(), k) for k in dense) if dense else (0, "-")
        lines.append(f"{rel.parent}: {len(changed)} of {len(x)} tensors differ; {nibbles:,} of {total:,} 4-bit "
                     f"values; largest difference elsewhere {worst[0]:.3g} ({worst[1]})")
    return lines


def main(argv=None) -> None:
    from torchtpu_rs.checkpoints import export

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, default=ROOT / ".cache" / "train" / "run" / "model.pt")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "train" / "export")
    ap.add_argument("--ship", action="store_true", help=f"replace the shipped files ({SHIPPED}) with this export")
    a = ap.parse_args(argv)
    if not a.weights.exists():
        sys.exit(f"{a.weights}: no trained weights; run train/train.py first")
    state = torch.load(a.weights, weights_only=False)["model"]
    tmp = Path(tempfile.mkdtemp(prefix=".export.", dir=a.out.parent))
    try:
        export(state, tmp / "new")
        if a.out.exists():
            shutil.rmtree(a.out)  # our own output folder from an earlier export, never the shipped files
        (tmp / "new").rename(a.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"exported {a.weights} -> {a.out}")
    print("\n".join(compare(a.out, SHIPPED)))
    if a.ship:
        staged = SHIPPED.with_name(".shipped.new")
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(a.out, staged)
        shutil.rmtree(SHIPPED, ignore_errors=True)
        staged.rename(SHIPPED)
        print(f"shipped: {SHIPPED}")


if __name__ == "__main__":
    main()
