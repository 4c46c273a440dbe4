"""The tasks the default model learns, as token ids with a loss mask: a deterministic stream of training batches.

One training sequence is one context of numbered records followed by several questions about it, each answer
ended by `<eos>`:

    <bos>Record 1: code 482913. Record 2: code 610395. … What is the code of record 2? Answer: 610395<eos>
    What are the codes of records 1 to 2? Answer: Record 1: code 482913. Record 2: code 610395.<eos> …

The first question sits exactly where step 06's prompt ends (`torchtpu_longprompt.haystack`), so what the model
learns there is what the steps ask. Later questions make the signal denser: every answer token is a target, the
records and questions are not. The text is word-level (the project's 512-token tokenizer) and numbers split into
digits, so a six-digit code is six tokens after a space mark.
"""
import random
from dataclasses import dataclass

import torch

IGNORE = -100  # the label of a token that is not a target (PyTorch's cross-entropy ignore_index)
MAX_RECORDS = 48  # the most records a training context holds (about 700 tokens)
LOOKUPS, COPIES = 6, 3  # questions of each kind per training sequence (train.py's --lookups, --copies)
COPY_SPAN = (2, 8)  # a copy question asks for 2..8 consecutive records (a span of up to ~105 tokens): step 05's
# five records sit inside the range, not at its edge


def record_text(number: int, code: str) -> str:
    return f"Record {number}: code {code}."


def records_text(codes: list[str]) -> str:
    return " ".join(record_text(i, c) for i, c in enumerate(codes, start=1))


def lookup_question(asked: int) -> str:
    """Step 06's question (haystack._text): the answer is the six digits of that record's code."""
    return f"What is the code of record {asked}? Answer:"


def copy_question(first: int, last: int) -> str:
    """The long deterministic answer for step 05: the records `first..last`, verbatim."""
    return f"What are the codes of records {first} to {last}? Answer:"


def copy_answer(codes: list[str], first: int, last: int) -> str:
    return " " + " ".join(record_text(i, codes[i - 1]) for i in range(first, last + 1))


def codes_for(rng: random.Random, n: int) -> list[str]:
    """n distinct six-digit codes, as haystack._codes draws them."""
    return [str(c) for c in rng.sample(range(100000, 1000000), n)]


@dataclass
class Episode:
    """One training sequence: ids and labels (IGNORE where a token is context, the token itself where a target)."""
    ids: list[int]
    labels: list[int]


class Encoder:
    """Text pieces to ids with the checkpoint's tokenizer, memoized: the same pieces recur (questions, record
    numbers), and a piece's ids never depend on its neighbours because every piece after the first starts at a
    space (the tokenizer's pre-tokenizer splits there; a test holds joined pieces to the whole text)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.bos = tokenizer.bos_token_id
        self.eos = tokenizer.eos_token_id
        self._memo: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        if text not in self._memo:
            self._memo[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return self._memo[text]


def episode(enc: Encoder, rng: random.Random, n: int, lookups: int, copies: int) -> Episode:
    """A context of `n` records, then `lookups` lookup questions and `copies` copy questions in a shuffled order,
    each answered and ended by <eos>."""
    codes = codes_for(rng, n)
    ids = [enc.bos] + enc(records_text(codes))
    labels = [IGNORE] * len(ids)
    questions = [("lookup", rng.randint(1, n)) for _ in range(lookups)]
    for _ in range(copies if n >= COPY_SPAN[0] else 0):
        span = rng.randint(COPY_SPAN[0], min(COPY_SPAN[1], n))
        first = rng.randint(1, n - span + 1)
        questions.append(("copy", (first, first + span - 1)))
    rng.shuffle(questions)
    for kind, arg in questions:
        if kind == "lookup":
            question, answer = lookup_question(arg), " " + codes[arg - 1]
        else:
            question, answer = copy_question(*arg), copy_answer(codes, *arg)
        q, a = enc(" " + question), enc(answer) + [enc.eos]
        ids += q + a
        labels += [IGNORE] * len(q) + a
    return Episode(ids, labels)


@dataclass
class Example:
    """One question the way the steps ask it: the prompt ends at "Answer:", the answer ends with <eos>."""
    prompt: list[int]
    answer: list[int]
    records: int
    expected: str  # the answer's text (a code, or the copied records)


def lookup_example(enc: Encoder, rng: random.Random, n: int) -> Example:
    """Step 06's prompt: n records, a question about one of them."""
    codes = codes_for(rng, n)
    asked = rng.randint(1, n)
    prompt = [enc.bos] + enc(records_text(codes)) + enc(" " + lookup_question(asked))
    return Example(prompt, enc(" " + codes[asked - 1]) + [enc.eos], n, codes[asked - 1])


def copy_example(enc: Encoder, rng: random.Random, n: int, span: int) -> Example:
    """Step 05's prompt: n records, asked to repeat `span` consecutive ones (a long, certain answer)."""
    codes = codes_for(rng, n)
    first = rng.randint(1, n - span + 1)
    answer = copy_answer(codes, first, first + span - 1)
    prompt = [enc.bos] + enc(records_text(codes)) + enc(" " + copy_question(first, first + span - 1))
    return Example(prompt, enc(answer) + [enc.eos], n, answer.strip())


FIRST_CAP = 2  # the curriculum starts with contexts of one or two records
WINDOW = 20  # steps of answer accuracy the curriculum looks at
FOUND = 7  # by this many records the model has found how to look a record up: from here it may move faster


def next_cap(cap: int, recent: list[float], advance: float) -> tuple[int, list[float]]:
    """The curriculum: the most records a context may hold goes up once the exact answers of the last WINDOW
    steps average `advance` — by one record at a time while the model is still finding how to look a record up
    (below FOUND records), then, at `advance - 0.1`, by a quarter. The window starts again after each rise.
    Returns the cap and the window to carry on with."""
    recent = recent[-WINDOW:]
    found = cap >= FOUND
    if cap < MAX_RECORDS and len(recent) == WINDOW and sum(recent) / WINDOW >= advance - (0.1 if found else 0):
        return min(MAX_RECORDS, cap + (max(1, cap // 4) if found else 1)), []
    return cap, recent


def batch(enc: Encoder, seed: int, step: int, cap: int, tokens: int, lookups: int = LOOKUPS,
          copies: int = COPIES):
    """The batch of training step `step`: one record count n for the whole batch (uniform in 1..cap, so short
    contexts keep being seen; half the batches from the upper half, so the longest contexts get their share), as
    many sequences as fit in `tokens`, padded at the end (no mask needed: the
    model is causal and pad positions carry no target). Depends only on (seed, step): a resumed run sees the
    same batches as an uninterrupted one. Returns (ids [B, T], labels [B, T]) as int64 tensors."""
    rng = random.Random(seed * 1_000_003 + step)
    n = rng.randint(1, cap) if rng.random() < 0.5 else rng.randint((cap + 1) // 2, cap)
    first = episode(enc, rng, n, lookups, copies)
    rows = [first] + [episode(enc, rng, n, lookups, copies)
                      for _ in range(max(1, tokens // len(first.ids)) - 1)]
    width = max(len(e.ids) for e in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # <pad> = 0
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, e in enumerate(rows):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        labels[i, :len(e.labels)] = torch.tensor(e.labels)
    return ids, labels
