"""Checks of the built guide: the site MkDocs wrote (`SITE_DIR`, default `<repo>/site`) and the Markdown under
`docs/` it was built from. `make test` builds the site with `mkdocs build --strict` and then runs
`python -m pytest tests/site`; the root `python -m pytest` does not collect these (testpaths = ["steps"]).

    SITE_DIR=/tmp/site python -m pytest tests/site      # check a site built elsewhere
"""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
ARTIFACTS = REPO / "test-artifacts"  # screenshots and the list of external links (ignored by git)

_external: dict[str, set[str]] = {}  # external link -> pages that use it, filled by test_links.py


def site_dir() -> Path:
    return Path(os.environ.get("SITE_DIR", REPO / "site")).resolve()


@pytest.fixture(scope="session")
def site() -> Path:
    """The built site; the site checks skip, saying why, when it has not been built."""
    path = site_dir()
    if not (path / "index.html").is_file():
        pytest.skip(f"no built site at {path} (run `mkdocs build --strict --site-dir site` first, or set SITE_DIR)")
    return path


@pytest.fixture(scope="session")
def pages(site) -> list[Path]:
    """Every HTML page of the built site."""
    return sorted(site.rglob("*.html"))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def docs() -> Path:
    return DOCS


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def external_links() -> dict[str, set[str]]:
    return _external


def pytest_terminal_summary(terminalreporter):
    """External links are not fetched (no network in the checks): list them, so a person can look."""
    if not _external:
        return
    terminalreporter.section(f"external links, not fetched ({len(_external)})")
    for url in sorted(_external):
        where = sorted(_external[url])
        terminalreporter.write_line(f"{url}  <- {', '.join(where) if len(where) <= 3 else f'{len(where)} pages'}")
