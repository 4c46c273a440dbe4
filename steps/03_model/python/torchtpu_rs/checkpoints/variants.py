"""Small checkpoints with one thing in their config changed: what the config-reading tests of both engines (step
03's Rust engine, step 05's baseline) compare with Transformers."""
import json
import shutil
from pathlib import Path

from .random_weights import random_tensor
from .tokenizer import write_tokenizer
from .with_ct import write_twin


def edit_config(folder: Path, edit) -> Path:
    """`edit(config)` applied to `folder/config.json`, in place."""
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def variant(folder: Path, spec: dict, emb4: bool = False, edit=None, seed: int = 3) -> Path:
    """A random causal checkpoint of `spec` (the emb4 twin with `emb4`) in `folder`, its config then edited."""
    write_twin(folder, spec, "causal", emb4, lambda name, shape: random_tensor(name, shape, seed))
    write_tokenizer(folder)
    return edit_config(folder, edit) if edit else folder


def copy_edited(source: Path, folder: Path, edit) -> Path:
    """A copy of the checkpoint folder `source` in `folder`, its config edited (the source is left as it is)."""
    shutil.copytree(source, folder)
    return edit_config(folder, edit)
