"""Every page of the guide (the notebook's markdown too) and every README meets the house prose targets:
mean sentence <= 22 words, 90th percentile <= 40, parentheses <= 0.30 a sentence, no commit hashes or ISO dates in
the prose, <= 3 numbers a paragraph, <= 3,000 prose words a page (the top README <= 800). tools/prose_check.py
measures them, by the same rules as ../shared/tools/prose_metrics.py; `python tools/prose_check.py` prints the table.
"""
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("prose_check", REPO / "tools" / "prose_check.py")
prose = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(prose)
PAGES = prose.pages(REPO)


def test_the_check_finds_the_pages():
    assert "README.md" in PAGES and "docs/index.md" in PAGES and "docs/notebooks/walkthrough.ipynb" in PAGES
    assert any(p.startswith("steps/") for p in PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_meets_the_house_targets(page):
    m = prose.metrics(str(REPO / page))
    bad = prose.over(page, m)
    assert not bad, f"{page} is over {', '.join(bad)}: " + ", ".join(
        f"{k} {m[k]:.2f} (target {prose.TARGETS.get(k, 'words')})" for k in bad)


def test_the_check_sees_each_target(tmp_path):
    def over(text, name="page.md"):
        path = tmp_path / name.replace("/", "-")
        path.write_text(text)
        return prose.over(name, prose.metrics(str(path)))

    assert over("A short sentence. Another one.\n") == []
    assert over(" ".join(["word"] * 45) + ".\n") == ["mean", "p90"]
    assert "parens" in over("One (a). Two (b).\n")
    assert over("It was fixed in a654166 at last.\n") == ["hashes"]
    assert over("Recorded on 2026-12-06 on a Xeon.\n") == ["dates"]
    assert over("Figures 1, 2, 3 and 4 in one paragraph.\n") == ["nums"]
    assert over("```text\nload 0.0 (1, 4, 5, 32) 2026-12-06 a654166\n```\n\n| 1 | 2 | 3 | 4 |\n") == []
    words = "\n\n".join(["Ten words in this sentence make it long enough for us."] * 90)
    assert over(words, "README.md") == ["words"] and over(words, "docs/page.md") == []
