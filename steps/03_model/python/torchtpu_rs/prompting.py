"""Prompts in, answers out, the same way in every step: ids as the model expects them, and where an answer ends."""
import json
import random
from pathlib import Path


# --8<-- [start:encode]
def encode(tokenizer, text: str) -> list[int]:
    """Prompt ids as the model expects them: the chat template when the tokenizer has one (the -it model was
    trained on it), and <bos> first: Gemma's tokenizer does not add it, and without it the model echoes."""
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=False)  # Transformers 5 returns a BatchEncoding by default
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    ids = list(ids)
    return ids if ids[:1] == [tokenizer.bos_token_id] else [tokenizer.bos_token_id, *ids]
# --8<-- [end:encode]


def text_config(model_dir: Path) -> dict:
    """The text model's part of a checkpoint's config.json (the multimodal layout nests it as `text_config`)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config.get("text_config", config)


def eos_ids(model_dir: Path) -> list[int]:
    """Every id that ends a reply: `eos_token_id` of config.json and of generation_config.json (each an int or a
    list; the real -it checkpoint lists <eos> and <end_of_turn> in its generation config)."""
    ids = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name
        if not path.exists():
            continue
        config = json.loads(path.read_text())
        for value in (config.get("eos_token_id"), config.get("text_config", {}).get("eos_token_id")):
            ids.update([value] if isinstance(value, int) else value or [])
    return sorted(ids)


def until_stop(tokens: list[int], stop: list[int]) -> list[int]:
    """The tokens before the first stop id (the reply without its end mark)."""
    return next((tokens[:i] for i, t in enumerate(tokens) if t in stop), tokens)


def same_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def record_question(tokenizer, n: int, seed: int) -> tuple[list[int], str]:
    """A question in the default model's format (step 06's, unsized): n records with distinct six-digit codes, then
    a question about one of them, all drawn from `seed`. Returns the prompt ids and the right answer's code."""
    rng = random.Random(seed)
    codes = [str(c) for c in rng.sample(range(100000, 1000000), n)]
    asked = rng.randint(1, n)
    text = " ".join(f"Record {i}: code {c}." for i, c in enumerate(codes, 1))
    return encode(tokenizer, f"{text} What is the code of record {asked}? Answer:"), codes[asked - 1]
