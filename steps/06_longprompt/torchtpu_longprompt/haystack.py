"""The long-prompt experiment: numbered records, each with a random code, and a question about one of them.

    Record 1: code 482913. Record 2: code 610395. … What is the code of record 2?

The prompt is sized to a token budget with the checkpoint's own tokenizer, and knows its answer.
"""
import random
import re
from dataclasses import dataclass

from torchtpu_rs import prompting

# The article's prompt lengths in its 33,024-token context: 61, 4,081 and 32,761 tokens.
ARTICLE_FRACTIONS = (61 / 33024, 4081 / 33024, 32761 / 33024)


@dataclass
class Prompt:
    ids: list[int]
    records: int  # how many records it holds
    asked: int  # the record the question names
    expected: str  # that record's code


def default_lengths(ctx: int, smallest: int) -> list[int]:
    """The article's lengths as fractions of `ctx` (so a 2,048 context gets a short, a middle and a nearly
    full prompt), none shorter than the smallest prompt that holds one record and the question."""
    return [max(smallest, round(f * ctx)) for f in ARTICLE_FRACTIONS]


def _text(codes: list[str], asked: int) -> tuple[str, str]:
    records = " ".join(f"Record {i}: code {code}." for i, code in enumerate(codes, start=1))
    return records, f"What is the code of record {asked}? Answer:"


def _encode(tokenizer, records: str, question: str) -> list[int]:
    """Ids as the model expects them (torchtpu_rs.prompting.encode); a chat turn puts the question on a paragraph
    of its own, plain text (the default model's training format) one space after the records."""
    text = f"{records}\n\n{question}" if tokenizer.chat_template else f"{records} {question}"
    return prompting.encode(tokenizer, text)


# --8<-- [start:build]
def _codes(seed: int, n: int) -> list[str]:
    """n distinct six-digit codes from a seeded generator."""
    return [str(c) for c in random.Random(seed).sample(range(100000, 1000000), n)]


def _prompt(tokenizer, n: int, seed: int) -> Prompt:
    codes = _codes(seed, n)
    asked = random.Random(seed * 1000003 + n).randint(1, n)  # the record to ask about, also seeded
    return Prompt(_encode(tokenizer, *_text(codes, asked)), n, asked, codes[asked - 1])


def shortest(tokenizer, seed: int = 0) -> int:
    """Tokens in the smallest prompt: one record and the question."""
    return len(_prompt(tokenizer, 1, seed).ids)


def build_prompt(tokenizer, target: int, seed: int = 0) -> Prompt:
    """As many records as fit in `target` tokens (question included), each with a distinct six-digit code;
    the question names one of them. Same seed, same prompt."""
    one = shortest(tokenizer, seed)
    if target < one:
        raise ValueError(f"target {target} tokens: the smallest prompt (one record and the question) has {one}")
    per_record = max(1, len(_prompt(tokenizer, 2, seed).ids) - one)
    n = max(1, (target - one) // per_record + 1)  # a first guess, then step to the exact fit
    while n > 1 and len(_prompt(tokenizer, n, seed).ids) > target:
        n -= 1
    while len(_prompt(tokenizer, n + 1, seed).ids) <= target:
        n += 1
    return _prompt(tokenizer, n, seed)
# --8<-- [end:build]


def parse_answer(text: str) -> str | None:
    """The first number in the model's reply, read up to its end mark (digits split by spaces joined first), or
    None. Callers cut the reply at the checkpoint's eos ids before decoding it (measure.py)."""
    joined = re.sub(r"(?<=\d)\s+(?=\d)", "", text)
    match = re.search(r"\d+", joined)
    return match.group() if match else None
