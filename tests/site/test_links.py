"""Every internal link of the built site resolves: each href/src that is not an external URL names a file of
the site, and each `#fragment` (on the same page or another) names an id that exists in the target page.
External links (with a scheme, or `//host`) are not fetched: they are listed at the end of the run and written
to test-artifacts/external-links.txt."""
import posixpath
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK_ATTRS = {"href", "src"}
NOT_LINKS = ("mailto:", "javascript:", "data:", "tel:")


class Page(HTMLParser):
    """The ids a page defines (id=…, and name=… on anchors) and the links it makes (href, src, srcset)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (name == "name" and tag == "a"):
                self.ids.add(value)
            elif name in LINK_ATTRS:
                self.links.append(value.strip())
            elif name == "srcset":
                self.links += [part.split()[0] for part in value.split(",") if part.strip()]


_parsed: dict[Path, Page] = {}


def parse(path: Path) -> Page:
    if path not in _parsed:
        _parsed[path] = Page(path.read_text(encoding="utf-8"))
    return _parsed[path]


def target_file(site: Path, page: Path, path: str) -> Path:
    """The file a relative (or site-absolute) link path points to, the way a static server resolves it."""
    base = "/" + page.parent.relative_to(site).as_posix() + "/"
    joined = posixpath.normpath(posixpath.join(base, unquote(path)) if not path.startswith("/") else unquote(path))
    file = site / joined.lstrip("/")
    if path.endswith("/") or file.is_dir():
        file = file / "index.html"
    return file


def problems_of(site: Path, page: Path, external: dict[str, set[str]]) -> list[str]:
    where = page.relative_to(site).as_posix()
    found = []
    for link in parse(page).links:
        if not link or link.startswith(NOT_LINKS):
            continue
        parts = urlsplit(link)
        if parts.scheme or link.startswith("//"):
            external.setdefault(link, set()).add(where)
            continue
        file = target_file(site, page, parts.path) if parts.path else page
        if not file.is_file():
            shown = file.relative_to(site) if file.is_relative_to(site) else file
            found.append(f"{where}: {link!r} -> {shown} does not exist")
            continue
        fragment = unquote(parts.fragment)
        if fragment and file.suffix == ".html" and fragment not in parse(file).ids:
            found.append(f"{where}: {link!r} -> no id {fragment!r} in {file.relative_to(site).as_posix()}")
    return list(dict.fromkeys(found))  # once per page and link


def test_every_internal_link_and_anchor_resolves(site, pages, external_links, artifacts):
    problems = [p for page in pages for p in problems_of(site, page, external_links)]
    (artifacts / "external-links.txt").write_text(
        "".join(f"{url}\t{' '.join(sorted(where))}\n" for url, where in sorted(external_links.items())))
    assert not problems, f"{len(problems)} broken internal link(s):\n" + "\n".join(problems)


def test_the_link_checker_sees_a_broken_link(tmp_path):
    """The checker itself: a page with a missing file, a missing anchor and a good link."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text('<h1 id="top">A</h1>')
    page = tmp_path / "index.html"
    page.write_text('<a href="a/#top">ok</a> <a href="a/#nope">bad anchor</a> <a href="b/">no page</a>'
                    '<a href="#here" id="here">self</a> <img src="x.png"> <a href="https://example.org/">ext</a>')
    external = {}
    found = problems_of(tmp_path, page, external)
    assert len(found) == 3, found
    assert any("'nope'" in f for f in found) and any("b/index.html" in f for f in found)
    assert any("x.png" in f for f in found)
    assert external == {"https://example.org/": {"index.html"}}
