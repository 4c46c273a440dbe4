"""MkDocs hooks, run when the site is built, so nothing they show is pasted or can go stale (a missing file
fails the build):
- a page line `<!-- changes: OLD NEW -->` becomes the unified diff between two files of the repository;
- a page line `<!-- results -->` becomes the results-at-a-glance table, read from the recorded runs' JSON.
"""
import difflib
import json
import re
from pathlib import Path

MARKER = re.compile(r"^<!-- changes: (\S+) (\S+) -->$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[1]


def diff_block(old: str, new: str) -> str:
    before = (ROOT / old).read_text().splitlines()
    after = (ROOT / new).read_text().splitlines()
    lines = difflib.unified_diff(before, after, old, new, lineterm="", n=2)
    return "```diff\n" + "\n".join(lines) + "\n```"


def results_table() -> str:
    parity = json.loads((ROOT / "docs/runs/cpu/04_parity-bfloat16.json").read_text())
    bench = json.loads((ROOT / "docs/runs/cpu-e2b/05_tpu.json").read_text())
    ways = {r["way"]: r for r in bench["rows"] if r["available"]}
    m = bench["meta"]
    rows = [
        "| this project, recorded on the CPU | value |",
        "|---|---:|",
        f"| parity with Transformers, tiny checkpoint, bf16: top-5 identical | "
        f"{parity['top5_rust']['ids'] == parity['top5_hf']['ids']} |",
        f"| … KL(hf‖rs) · max abs diff · same n of {parity['of']} | "
        f"{parity['kl_hf_rs']:.2g} · {parity['max_abs_diff']:.3g} · {parity['same']} |",
        *(f"| E2B-shaped, decode tok/s (streamed) · peak GB: {w.replace('-', ' ')} | "
          f"{ways[w]['streamed_tok_s']:.1f} · {ways[w]['peak_gb']:.2f} |" for w in ways),
    ]
    facts = (f"Recorded {m['date'][:10]} on {m['cpu']} ({m['cores']} cores), torch {m['torch']}, tch {m['tch']}; "
             f"memory bandwidth {bench['bandwidth_gb_s']:.1f} GB/s.")
    return "\n".join(rows) + "\n\n" + facts


def on_page_markdown(markdown: str, **kwargs) -> str:
    markdown = MARKER.sub(lambda m: diff_block(m[1], m[2]), markdown)
    return markdown.replace("<!-- results -->", results_table())
