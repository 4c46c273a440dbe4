"""MkDocs hook: a page line `<!-- changes: OLD NEW -->` becomes the unified diff between two files of the
repository, made when the site is built — so "what changed since the previous step" is never pasted and cannot
go stale. A missing file fails the build."""
import difflib
import re
from pathlib import Path

MARKER = re.compile(r"^<!-- changes: (\S+) (\S+) -->$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[1]


def diff_block(old: str, new: str) -> str:
    before = (ROOT / old).read_text().splitlines()
    after = (ROOT / new).read_text().splitlines()
    lines = difflib.unified_diff(before, after, old, new, lineterm="", n=2)
    return "```diff\n" + "\n".join(lines) + "\n```"


def on_page_markdown(markdown: str, **kwargs) -> str:
    return MARKER.sub(lambda m: diff_block(m[1], m[2]), markdown)
