"""One way on one long prompt: run it in a fresh process through step 05's runner, and turn what it measured
into a row of the step's table.

    row = measure("rust-eager", prompt, tokenizer, model_dir, emb4_dir, "cpu", "bfloat16", 33024, max_new=12)
"""
from torchtpu_rs.prompting import until_stop
from torchtpu_ways.ways import CHOOSE, label, run_way

from .haystack import Prompt, parse_answer

DEFAULT_WAYS = "rust-fused,rust-eager,python-compile"  # the article's three ways
WAYS_HELP = (f"comma-separated; {CHOOSE} (rust-int4: step 08's, rust-int4-aten: step 07's, when installed; "
             "llama.cpp's after make peer)")
HEADER = f"{'way':<26}{'prompt':>7}{'read s':>8}{'read tok/s':>11}{'decode':>8}{'answer':>9}{'expected':>9}  found"


# --8<-- [start:measure]
def measure(way: str, prompt: Prompt, tokenizer, model, emb4, device: str, dtype: str, ctx: int,
            max_new: int, stop: list[int] | None = None) -> dict:
    """The row of one way: read and decode speed, the answer it gave (read up to the first `stop` id), and
    whether that is the record's code. The cold run reads only a prefix with the prompt's chunk shapes, so a
    long prompt is read in full once."""
    r = run_way(way, model, emb4, device, dtype, ctx, prompt.ids, max_new, batched=False, cold="prefix", stop=stop)
    reply = tokenizer.decode(until_stop(r["tokens"], stop or []), skip_special_tokens=True) if r["available"] else ""
    answer = parse_answer(reply) if r["available"] else None
    return {"way": way, "label": label(r), "available": r["available"], "why": r["why"], "torch": r["torch"],
            "prompt_tokens": len(prompt.ids), "records": prompt.records, "asked": prompt.asked,
            "read_s": r["read_s"], "read_tok_s": r["read_tok_s"], "decode_tok_s": r["streamed_tok_s"],
            "answer": answer, "expected": prompt.expected,
            "found": answer == prompt.expected if r["available"] else None, "tokens": r["tokens"],
            # what a decode step reads, for the bandwidth figure: the weights as held, and the cache's slots
            "bytes_per_token": r["bytes_per_token"],
            "decode_slots": r["decode_slots"], "attention_dtype": r["attention_dtype"],
            "kv_dtype": r["kv_dtype"],
            "sliding_slots": r.get("sliding_slots", "ring"), "kv_read": r.get("kv_read", "slots")}
# --8<-- [end:measure]


def cell(value, spec: str, width: int) -> str:
    return f"{'n/a' if value is None else format(value, spec):>{width}}"


def line(row: dict) -> str:
    """The row as a line of the table under HEADER (decode is n/a when only one token was generated)."""
    if not row["available"]:
        return f"{row['label']:<26}{row['prompt_tokens']:>7}  n/a: {row['why']}"
    return (f"{row['label']:<26}{row['prompt_tokens']:>7}{cell(row['read_s'], '.2f', 8)}"
            f"{cell(row['read_tok_s'], '.0f', 11)}{cell(row['decode_tok_s'], '.1f', 8)}"
            f"{str(row['answer']):>9}{row['expected']:>9}  {'yes' if row['found'] else 'no'}")


def verdict(rows: list[dict]) -> str:
    """Whether every way that ran gave the same answer to one prompt."""
    answers = {r["answer"] for r in rows if r["available"]}
    return f"all ways gave {answers.pop()}" if len(answers) == 1 else f"the ways disagree: {sorted(map(str, answers))}"
