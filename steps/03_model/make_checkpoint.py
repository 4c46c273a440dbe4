"""Make a random Gemma 4 checkpoint in the real formats: a -text folder and its -text-emb4 twin.

usage: python make_checkpoint.py [--out DIR] [--size tiny|e2b] [--layout causal|multimodal] [--seed N]

With --out, writes DIR/text and DIR/emb4 (DIR must be new or empty). Without it, prints the cached checkpoint every
step uses by default, making it first if needed. `--size e2b` is the full-size random E2B for benchmarks: about
9 GB on disk and minutes to write.
"""
import argparse
import time
from pathlib import Path

from torchtpu_rs import checkpoints


def describe(folder: Path) -> str:
    files = [f for f in folder.iterdir() if f.is_file()]
    return f"{folder}  {sum(f.stat().st_size for f in files) / 2**20:,.1f} MiB in {len(files)} files"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write here (new or empty folder) instead of the cache")
    ap.add_argument("--size", default="tiny", choices=list(checkpoints.SPECS))
    ap.add_argument("--layout", default="causal", choices=checkpoints.LAYOUTS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    start = time.perf_counter()
    if args.out is None:
        folder = checkpoints.cached(args.size, args.layout, args.seed)
    else:
        try:
            folder = checkpoints.make(args.out, args.size, args.layout, args.seed)
        except FileExistsError as e:
            ap.error(str(e))
    seconds = time.perf_counter() - start
    for twin in ("text", "emb4"):
        print(f"{twin:5s} {describe(folder / twin)}")
    print(f"{args.size} {args.layout} seed {args.seed}: {seconds:.1f} s")


if __name__ == "__main__":
    main()
