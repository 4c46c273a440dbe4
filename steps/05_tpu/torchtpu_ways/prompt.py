"""The prompts the ways read, tokenized with the checkpoint's own tokenizer.

`PROMPT` (run.py) asks the default model, trained on numbered records, to repeat five of them: a 65-token
answer it knows for certain, so the ways can be compared on tokens that are right or wrong, not on the
near-ties of a random model. `BENCH_PROMPT` (bench.py, a random E2B-shaped checkpoint): a plain sentence of
19 tokens, the length of the article's prompt.
"""
from pathlib import Path

RECORDS = ("Record 1: code 482913. Record 2: code 705126. Record 3: code 610395. Record 4: code 238470. "
           "Record 5: code 220431. Record 6: code 957302. Record 7: code 318864.")
PROMPT = RECORDS + " What are the codes of records 2 to 6? Answer:"
ANSWER = (" Record 2: code 705126. Record 3: code 610395. Record 4: code 238470. Record 5: code 220431."
          " Record 6: code 957302.")
BENCH_PROMPT = "Here is a short story about a man who made his own home by the water ."


def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer  # seconds to import: only the parent process needs it

    return AutoTokenizer.from_pretrained(model_dir)


def encode(model_dir: Path, text: str) -> list[int]:
    """Prompt ids as the model expects them (torchtpu_rs.prompting.encode: <bos> first, chat template if any)."""
    from torchtpu_rs import prompting

    return prompting.encode(tokenizer(model_dir), text)


def expected(model_dir: Path, text: str) -> list[int] | None:
    """The ids of the right answer, <eos> included, when `text` is PROMPT; None for any other prompt."""
    if text != PROMPT:
        return None
    tok = tokenizer(model_dir)
    return tok.encode(ANSWER, add_special_tokens=False) + [tok.eos_token_id]
