"""No page of the built site shows a traceback or an error cell.

Looked for, in every HTML page:
- the text of a Python traceback ("Traceback (most recent call last)") or a Rust panic ("panicked at"),
  with tags stripped so that highlighting spans cannot split the words;
- notebook error output as nbconvert renders it: the classic template's `output_error` class, and the lab
  template's (mkdocs-jupyter's) error block, a `jp-OutputArea-output` with the stderr mime type that holds an
  exception name (`…Error`, `…Exception`). A stderr stream without one (a warning, a progress bar) passes.
"""
import html
import re

TRACEBACK = ("Traceback (most recent call last)", "panicked at")
CLASSIC_ERROR = re.compile(r'class="[^"]*\boutput_error\b')
LAB_STDERR = re.compile(r'<div class="[^"]*\bjp-OutputArea-output\b[^"]*"[^>]*'
                        r'data-mime-type="application/vnd\.jupyter\.stderr"'
                        r'[^>]*>(.*?)</div>', re.S)
EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception)\b")
TAG = re.compile(r"<[^>]+>")


def text_of(markup: str) -> str:
    return html.unescape(TAG.sub("", markup))


def problems_in(markup: str) -> list[str]:
    found = [f"shows {phrase!r}" for phrase in TRACEBACK if phrase in text_of(markup)]
    if CLASSIC_ERROR.search(markup):
        found.append("has a notebook error cell (output_error)")
    for block in LAB_STDERR.findall(markup):
        name = EXCEPTION_NAME.search(text_of(block))
        if name:
            found.append(f"has a notebook error cell ({name.group(0)} in stderr output)")
    return found


def test_no_page_shows_a_traceback_or_an_error_cell(site, pages):
    problems = [f"{page.relative_to(site)}: {p}" for page in pages
                for p in problems_in(page.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_the_check_sees_tracebacks_and_error_cells():
    assert problems_in('<pre><span>Traceback</span> (most recent call last):</pre>')
    assert problems_in("<pre>thread 'main' panicked at src/lib.rs:3:5</pre>")
    assert problems_in('<div class="output_subarea output_text output_error"><pre>x</pre></div>')
    lab = ('<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr">'
           '<pre>{}</pre></div>')
    assert problems_in(lab.format('<span class="ansi-red-fg">ValueError</span>: bad'))
    assert not problems_in(lab.format("loading layers: 100%|##########| 35/35"))
    assert not problems_in("<p>a page about errors, ValueError included</p>")
