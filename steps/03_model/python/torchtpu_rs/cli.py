"""The flags every engine script shares (--model, --emb4, --device, --dtype, --ctx, --json) and what they
resolve to, so steps 03-06 mean the same thing by each; and the argparse types the scripts' other flags share
(a file to write, a list of counts)."""
import argparse
from pathlib import Path

from . import checkpoints
from .prompting import text_config

ARTICLE_CTX = 33024  # the article's context: 33,024 tokens


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", type=Path,
                    help="a -text checkpoint folder (default: the trained model step 03 ships)")
    ap.add_argument("--emb4", type=Path,
                    help="its -text-emb4 twin (default: the shipped twin when --model is not given)")
    ap.add_argument("--no-emb4", action="store_true", help="run on the -text checkpoint alone")
    ap.add_argument("--random", action="store_true",
                    help="the tests' tiny random-weight checkpoint instead of the trained model (made on first use)")
    ap.add_argument("--layout", default="causal", choices=checkpoints.LAYOUTS,
                    help="layout of the default checkpoint: Gemma4ForCausalLM or the multimodal one")
    ap.add_argument("--device", default="auto", choices=["auto", "tpu", "cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--ctx", type=int,
                    help=f"context length (default: {ARTICLE_CTX} for E2B-sized configs, 2048 for small ones)")
    ap.add_argument("--json", metavar="PATH", type=output_path,
                    help="also write the results, with a meta block, as JSON")


def output_path(text: str) -> str:
    """argparse `type` of a file a script writes at its end (`--json`, a chart): refused at once when its folder
    does not exist, rather than after a long run."""
    if not Path(text).parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {Path(text).parent} does not exist")
    return text


def positive_ints(text: str) -> list[int]:
    """argparse `type` of a comma-separated list of whole numbers, each at least 1 (`--lengths 61,4081`): a bad
    item is named in argparse's error for the flag."""
    items = text.split(",")
    if bad := [item for item in items if not item.strip().isdecimal() or int(item) < 1]:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))}: not a whole number of at least 1 (a "
                                         "comma-separated list of them is expected)")
    return [int(item) for item in items]


def default_ctx(model_dir: Path) -> int:
    """The article's 33,024 tokens for a real-sized model; 2,048 for a toy one (hidden size under 1,024)."""
    text = text_config(model_dir)
    return min(ARTICLE_CTX if text["hidden_size"] >= 1024 else 2048, text["max_position_embeddings"])


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in the defaults: the shipped trained checkpoint (or with --random the tiny random one) and its twin,
    and the context length for the model."""
    if args.model is None:
        folder = checkpoints.tiny(args.layout) if args.random else checkpoints.trained(args.layout)
        args.model, args.emb4 = folder / "text", args.emb4 or folder / "emb4"
    if args.no_emb4:
        args.emb4 = None
    if args.ctx is None:
        args.ctx = default_ctx(args.model)
    return args
