"""The step-05 table and token-identity lines, shared by run.py and bench.py."""
from torchtpu_rs.prompting import same_prefix

from .ways import label

COLUMNS = [("load s", "load_s", "{:.2f}"), ("first s", "first_s", "{:.2f}"), ("graphs", "graphs", "{}"),
           ("breaks", "breaks", "{}"), ("streamed", "streamed_tok_s", "{:.1f}"),
           ("in batches", "batched_tok_s", "{:.1f}"), ("peak GB", "peak_gb", "{:.2f}")]


def table(rows: list[dict]) -> str:
    """The human table: one row per way; tok/s for streamed and in batches; `-` where a way has no such figure."""
    width = max(len("way"), *(len(label(r)) for r in rows)) + 2
    lines = ["way".ljust(width) + "  ".join(name for name, _, _ in COLUMNS)]
    for row in rows:
        if not row["available"]:
            lines.append(label(row).ljust(width) + f"n/a: {row['why']}")
            continue
        cells = [("-" if row[key] is None else fmt.format(row[key])).rjust(len(name)) for name, key, fmt in COLUMNS]
        lines.append(label(row).ljust(width) + "  ".join(cells))
    return "\n".join(lines)


def identity_lines(rows: list[dict]) -> list[str]:
    """`<way>: first n of N tokens identical to <reference>`: the reference is Python compile where it ran,
    else Python eager."""
    ran = {r["way"]: r for r in rows if r["available"]}
    reference = ran.get("python-compile") or ran.get("python-eager")
    if reference is None:
        return []
    return [f"{label(r)}: first {same_prefix(r['tokens'], reference['tokens'])} of {len(reference['tokens'])} "
            f"tokens identical to {label(reference)}" for r in ran.values() if r is not reference]


def judge(targets: list[tuple[str, float | None, str, float]]) -> tuple[list[dict], list[str]]:
    """Each (target, measured ratio, ">=" or "<=", bound) judged: records for the JSON and lines to print.
    A ratio that could not be measured is "not measured", never met. With op None (a ratio to llama.cpp), there
    is nothing to meet: the figure is shown as measured."""
    checks, lines = [], []
    for name, value, op, bound in targets:
        if op is None:
            checks.append({"target": name, "value": value, "op": None, "bound": None, "met": None})
            lines.append(f"  {name}: {'n/a' if value is None else f'{value:.2f}'}  (measured; no target)")
            continue
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        checks.append({"target": name, "value": value, "op": op, "bound": bound, "met": met})
        shown = "n/a" if value is None else f"{value:.2f}"
        lines.append(f"  {name} {op} {bound}: {shown}  {'met' if met else 'not measured' if met is None else 'MISSED'}")
    return checks, lines
