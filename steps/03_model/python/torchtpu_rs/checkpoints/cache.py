"""Making random checkpoints on demand and caching them, so a reader never sees half a checkpoint."""
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from .random_weights import random_tensor
from .specs import E2B, LAYOUTS, SPECS, TINY
from .streamed import write_random
from .tokenizer import write_tokenizer
from .with_ct import write_twin

# Bump whenever the bytes `make` writes for a given (size, layout, seed) change: it is part of the cache key.
GENERATOR_VERSION = 2


def make(out_dir, size="tiny", layout="causal", seed=0):
    """Write `out_dir/text/` (the -text format) and `out_dir/emb4/` (the -text-emb4 twin) of a random Gemma 4 of
    `size` ("tiny" or "e2b") and `layout` ("causal" or "multimodal"), each with a tokenizer. Same arguments, same
    bytes. Refuses to write into an existing non-empty folder (FileExistsError): it never overwrites anything."""
    if size not in SPECS or layout not in LAYOUTS:
        raise ValueError(f"size must be one of {tuple(SPECS)} and layout one of {LAYOUTS}, got {size!r}, {layout!r}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; make() writes only into a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    if size == "tiny":
        for twin, emb4 in (("text", False), ("emb4", True)):
            write_twin(out / twin, TINY, layout, emb4, lambda name, shape: random_tensor(name, shape, seed))
    else:
        write_random(out, E2B, seed, layout)
    for twin in ("text", "emb4"):
        write_tokenizer(out / twin)
    return out


def cache_root():
    """$TORCHTPU_RS_CACHE if set; else `.cache/checkpoints` at the top of the git checkout holding the working
    directory; else ~/.cache/torchtpu_rs/checkpoints."""
    if "TORCHTPU_RS_CACHE" in os.environ:
        return Path(os.environ["TORCHTPU_RS_CACHE"])
    cwd = Path.cwd().resolve()
    top = next((d for d in (cwd, *cwd.parents) if (d / ".git").exists()), None)
    return top / ".cache" / "checkpoints" if top else Path.home() / ".cache" / "torchtpu_rs" / "checkpoints"


def cache_path(size="tiny", layout="causal", seed=0):
    """Where `cached(size, layout, seed)` keeps its checkpoint: `<cache_root>/<size>-<layout>-seed<seed>-<key>`,
    the key a hash of the arguments and GENERATOR_VERSION."""
    key = hashlib.sha256(json.dumps([size, layout, seed, GENERATOR_VERSION]).encode()).hexdigest()[:12]
    return cache_root() / f"{size}-{layout}-seed{seed}-{key}"


def cached(size="tiny", layout="causal", seed=0):
    """The cached `make(size, layout, seed)` folder, made on first use. It is made in a temporary sibling and renamed
    into place, so a reader never sees half a checkpoint; if another process renamed its copy first, that one wins."""
    final = cache_path(size, layout, seed)
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        make(tmp, size, layout, seed)
        try:
            tmp.rename(final)
        except OSError:  # another process renamed its copy first: use the winner's
            if not final.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def tiny(layout="causal", seed=0):
    """The cached tiny checkpoint folder (holding `text/` and `emb4/`)."""
    return cached("tiny", layout, seed)


def e2b(seed=0):
    """The cached full-size random E2B checkpoint folder (about 9 GB; minutes to make once)."""
    return cached("e2b", "causal", seed)
