#!/usr/bin/env python3
"""The house prose targets, checked: how every page of the guide and every README reads.

usage: python tools/prose_check.py [FILE.md|FILE.ipynb ...]
       (default: README.md, docs/**/*.md, the notebooks' markdown cells, steps/*/README.md)

This mirrors `../shared/tools/prose_metrics.py`, the script the targets were set with: the same rules and the
same targets, kept here so the check runs from a clone alone (tests/site/test_prose.py runs it in `make test`).
Prose only: fenced code, tables, headings, snippet markers, HTML comments and tags are left out; a paragraph or a
list item ends a sentence, and a sentence also ends at `.`, `!` or `?` before a capital or `(`. Link text counts,
link targets do not; inline code counts as one word.

Targets for every page: mean sentence <= 22 words, 90th percentile <= 40, parentheses <= 0.30 a sentence, no
commit hashes and no ISO dates in the prose, <= 3 numbers a paragraph, <= 3,000 prose words a page (the top
README <= 800). Prints a row per page, a `*` beside each figure over its target, and exits 1 when any page is
over one.
"""
import glob
import json
import math
import re
import sys
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
WORD = re.compile(r"\S*[A-Za-z0-9]\S*")
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")
NUM = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*%?(?![\w])")
SKIP = re.compile(r"^(#|\||--8<--|\{\{#|\$\$|(!!!|\?\?\?\+?)\s|\[[^\]]+\]:\s|(-{3,}|\*{3,}|_{3,}|={3,})$|!\[.*\]\(.*\)$"
                  r"|(<[^>]*>\s*)+$)")
TARGETS = {"mean": 22, "p90": 40, "parens": 0.30, "hashes": 0, "dates": 0, "nums": 3.0}
WORDS_PAGE, WORDS_README = 3000, 800


def text_of(path: str) -> str:
    """The page's text, HTML comments out; a notebook's markdown cells only."""
    raw = open(path, encoding="utf-8").read()
    if path.endswith(".ipynb"):
        cells = json.loads(raw)["cells"]
        raw = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.sub(r"<!--.*?-->", " ", raw, flags=re.S)


def blocks_of(raw: str) -> list[str]:
    """The prose paragraphs and list items, each joined into one line."""
    out, fence = [], None
    for line in raw.split("\n"):
        m = FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            out.append("")
            continue
        s = line.strip()
        if fence or SKIP.match(s):
            out.append("")
            continue
        s = re.sub(r"^(>\s*)+", "", s)
        if re.match(r"^([-*+]|\d+[.)])\s+", s):
            out.append("")
            s = re.sub(r"^([-*+]|\d+[.)])\s+", "", s)
        out.append(s)
    blocks, cur = [], []
    for s in out + [""]:
        if s:
            cur.append(s)
        elif cur:
            blocks.append(" ".join(cur))
            cur = []
    return blocks


def clean(block: str) -> str:
    block = re.sub(r"<[^>]+>", " ", block)
    block = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", block)
    block = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", block)
    block = re.sub(r"`[^`]+`", "CODE", block)
    block = re.sub(r"\*\*|__", "", block)
    return re.sub(r"\s+", " ", block).strip()


def metrics(path: str) -> dict:
    blocks = blocks_of(text_of(path))
    prose = " ".join(blocks)
    paras = [c for c in (clean(b) for b in blocks) if WORD.search(c)]
    sents = [s for p in paras for s in SPLIT.split(p) if WORD.search(s)]
    lens = sorted(len(WORD.findall(s)) for s in sents) or [0]
    n = max(len(sents), 1)
    return {"words": sum(lens), "sents": len(sents), "mean": sum(lens) / n,
            "p90": lens[max(0, math.ceil(0.9 * len(lens)) - 1)],
            "parens": sum(s.count("(") for s in sents) / n,
            "hashes": len(HASH.findall(prose)), "dates": len(DATE.findall(prose)),
            "nums": sum(len(NUM.findall(p)) for p in paras) / max(len(paras), 1)}


def over(path: str, m: dict) -> list[str]:
    """The targets a page misses (by the metrics' names); the top README has the smaller word limit."""
    limit = WORDS_README if path.endswith("README.md") and "/" not in path.strip("./") else WORDS_PAGE
    bad = [k for k, t in TARGETS.items() if m[k] > t]
    return bad + (["words"] if m["words"] > limit else [])


def pages(root: Path = Path(".")) -> list[str]:
    """Every page the targets hold, as paths relative to root: README.md, docs/ and its notebooks, step READMEs."""
    def found(pattern: str) -> list[str]:
        return sorted(str(Path(p).relative_to(root)) for p in glob.glob(str(root / pattern), recursive=True))

    return (found("README.md") + found("docs/**/*.md") + found("docs/notebooks/*.ipynb")
            + found("steps/*/README.md"))


def row(path: str, m: dict, bad: list[str]) -> str:
    def cell(k, fmt):
        return format(m[k], fmt) + ("*" if k in bad else " ")

    return (f"{path:44s} " + cell("words", "6d") + format(m["sents"], "5d") + " " + cell("mean", "5.1f")
            + cell("p90", "4d") + cell("parens", "5.2f") + cell("hashes", "4d") + cell("dates", "4d")
            + cell("nums", "7.1f"))


def main(paths: list[str]) -> int:
    paths = paths or pages()
    print(f"{'page':44s} {'words':>6s} {'sents':>5s} {'mean':>5s} {'p90':>4s} {'paren':>5s} {'hash':>4s} "
          f"{'date':>4s} {'num/par':>7s}")
    failing = []
    for p in paths:
        m = metrics(p)
        bad = over(p, m)
        if bad:
            failing.append(f"{p}: {', '.join(bad)}")
        print(row(p, m, bad))
    print(f"pages over a house target: {len(failing)} of {len(paths)}")
    for line in failing:
        print(f"  {line}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
