"""The built site in a real browser: served on 127.0.0.1, every page opened in headless Chromium (Debian's
`chromium`) in a 1300-pixel-wide window, no console errors, no recorded-run block wider than its column (each
output block of a page, and each output of the notebook page, measured: no sideways scroll, no right edge past
the content's), the notebook page showing its recorded outputs and no error output, and screenshots of the
home page, the step-05 page (step 04's until docs/steps/05_tpu.md exists) and the notebook page written to
test-artifacts/.

How: the site is served by Python's `http.server` (the class behind `python -m http.server`) on a free port
of 127.0.0.1, in a thread of the test. Chromium runs with `--headless=new --remote-debugging-pipe`, and the
test speaks the DevTools protocol to it over that pipe (JSON messages ending in NUL on fds 3 and 4; no
websocket, no extra package). That is the one reliable way to see console *levels*: `--enable-logging=stderr`
prints every console message as `INFO:CONSOLE`, whatever its level, and never prints failed resource loads.
A page fails on: an uncaught exception (`Runtime.exceptionThrown`), `console.error`/`console.assert`
(`Runtime.consoleAPICalled`), and a browser error entry (`Log.entryAdded`, level error: e.g. a 404 for a
stylesheet or script of the site). Requests to other hosts are refused by a host-resolver rule, the same
offline and in CI; errors about those URLs (the theme's web fonts) are not failures, only reported.

Chromium present: the test runs. Absent: it fails when the environment variable CI is set (`make test`
installs Chromium there), and skips with the reason elsewhere.
"""
import base64
import functools
import http.server
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

BROWSER = "chromium"
PAGE_TIMEOUT_S = 30
SETTLE_S = 0.5  # quiet time after the load event before a page counts as done (late scripts, fetches)
VIEWPORT = {"width": 1300, "height": 2000, "deviceScaleFactor": 1, "mobile": False}
NOTEBOOK_PAGE = "notebooks/walkthrough/index.html"
# recorded-run blocks: output blocks on the pages (every `text` block includes docs/runs/), notebook outputs
RECORDED_BLOCKS = ".md-typeset .language-text pre > code, .jupyter-wrapper .jp-OutputArea-output pre"
OVERFLOW_JS = """(() => {
  const column = document.querySelector(".md-content").getBoundingClientRect().right;
  return [...document.querySelectorAll(%s)].filter(el => el.getClientRects().length).map(el => ({
    first: el.textContent.trim().split("\\n")[0].slice(0, 80),
    scroll: el.scrollWidth, client: el.clientWidth, right: el.getBoundingClientRect().right, column}))
    .filter(b => b.scroll > b.client + 1 || b.right > b.column + 1);
})()""" % json.dumps(RECORDED_BLOCKS)



def browser() -> str:
    path = shutil.which(BROWSER)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but `{BROWSER}` is not on PATH: `make test` installs it (apt-get install chromium)")
    pytest.skip(f"`{BROWSER}` is not on PATH: the browser check needs Debian's chromium (apt-get install chromium)")


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    """The site at http://127.0.0.1:<free port>/ for the duration of the module."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class DevTools:
    """Headless Chromium driven over --remote-debugging-pipe: send commands, collect events."""

    def __init__(self, binary: str, profile: Path):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds_3_and_4():  # Chromium reads commands on fd 3 and writes replies on fd 4
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", f"--user-data-dir={profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds_3_and_4, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.messages: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buffer = b""
        while chunk := os.read(self._from_chrome, 1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                self.messages.put(json.loads(message))
        self.messages.put(None)  # the browser went away

    def _next(self, deadline: float) -> dict:
        try:
            message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("Chromium did not answer in time") from None
        if message is None:
            raise RuntimeError(f"Chromium exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
        return message

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._next(deadline))

    def settle(self, quiet: float, timeout: float) -> None:
        """Collect events until none has come for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.events.append(self._next(min(deadline, time.monotonic() + quiet)))
            except TimeoutError:
                return

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    tools = DevTools(browser(), tmp_path_factory.mktemp("chromium-profile"))
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            tools.send(f"{domain}.enable", session=session)
        tools.send("Emulation.setDeviceMetricsOverride", VIEWPORT, session=session)
        yield tools, session
    finally:
        tools.close()


def console_errors(events: list[dict]) -> list[tuple[str, str]]:
    """(message, url) for each error event: uncaught exceptions, console.error/assert, browser error entries."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            found.append((f"uncaught: {text.splitlines()[0] if text else '?'}", details.get("url", "")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            frames = params.get("stackTrace", {}).get("callFrames", [])
            found.append((f"console.{params['type']}: {args}", frames[0]["url"] if frames else ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            found.append((f"{entry.get('source', 'browser')}: {entry['text']}", entry.get("url", "")))
    return found


def visit(tab, url: str, screenshot: Path | None = None) -> list[tuple[str, str]]:
    tools, session = tab
    tools.events.clear()
    result = tools.send("Page.navigate", {"url": url}, session=session)
    if result.get("errorText"):
        return [(f"navigation failed: {result['errorText']}", url)]
    tools.wait_for("Page.loadEventFired", PAGE_TIMEOUT_S)
    tools.settle(SETTLE_S, PAGE_TIMEOUT_S)
    if screenshot:
        shot = tools.send("Page.captureScreenshot", {"format": "png"}, session=session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    return console_errors(tools.events)


def evaluate(tab, expression: str):
    tools, session = tab
    reply = tools.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session)
    if "exceptionDetails" in reply:
        raise RuntimeError(f"{expression[:60]}…: {reply['exceptionDetails']}")
    return reply["result"].get("value")


def page_url(base: str, site: Path, page: Path) -> str:
    rel = page.relative_to(site).as_posix()
    return base + (rel[: -len("index.html")] if rel.endswith("index.html") else rel)


def screenshot_pages(site: Path, docs: Path) -> dict[str, Path]:
    step = "05_tpu" if (docs / "steps" / "05_tpu.md").exists() else "04_parity"
    return {"home.png": site / "index.html", f"step-{step}.png": site / "steps" / step / "index.html",
            "notebook.png": site / NOTEBOOK_PAGE}


def test_every_page_loads_without_console_errors(site, pages, docs, served, tab, artifacts):
    shots = screenshot_pages(site, docs)
    missing = [str(p.relative_to(site)) for p in shots.values() if not p.is_file()]
    assert not missing, f"pages to screenshot are not in the built site (rebuild it): {missing}"
    shot_of = {page: artifacts / name for name, page in shots.items()}
    failures, elsewhere, wide, blocks = [], set(), [], 0
    for page in pages:
        for message, url in visit(tab, page_url(served, site, page), shot_of.get(page)):
            if url and not url.startswith(served):
                elsewhere.add(f"{url}: {message}")  # another host: refused on purpose (no network)
            else:
                failures.append(f"{page.relative_to(site)}: {message} {url}".rstrip())
        if page.name == "index.html" and evaluate(tab, "!!document.querySelector('.md-content')"):
            blocks += evaluate(tab, f"document.querySelectorAll({json.dumps(RECORDED_BLOCKS)}).length")
            wide += [f"{page.relative_to(site)}: {b['first']!r} is {b['scroll']} px wide in a {b['client']} px box "
                     f"(right edge {b['right']:.0f}, column {b['column']:.0f})" for b in evaluate(tab, OVERFLOW_JS)]
    for png in shot_of.values():
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no screenshot {png}"
    if elsewhere:
        print("not loaded (other hosts, refused on purpose):\n" + "\n".join(sorted(elsewhere)))
    assert not failures, f"{len(failures)} console error(s):\n" + "\n".join(failures)
    assert blocks, f"no recorded-run block found on any page ({RECORDED_BLOCKS})"
    assert not wide, (f"{len(wide)} recorded-run block(s) wider than the column at {VIEWPORT['width']} px:\n"
                      + "\n".join(wide))


def test_the_notebook_page_shows_its_outputs_and_no_error(site, served, tab):
    """Every output the notebook holds (the copy the site was built from) is on its page, as text in an output
    area; none is an error."""
    page = site / NOTEBOOK_PAGE
    assert page.is_file(), f"{NOTEBOOK_PAGE} is not in the built site"
    nb = json.loads((page.parent / "walkthrough.ipynb").read_text(encoding="utf-8"))  # include_source's copy
    # other hosts are refused on purpose (no network), as in the check of every page
    assert not [(m, url) for m, url in visit(tab, page_url(served, site, page)) if not url or url.startswith(served)]
    shown = evaluate(tab, "[...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText).join('\\n')")
    errors = evaluate(tab, "[...document.querySelectorAll('.jp-OutputArea-output')].filter(e => "
                           "e.dataset.mimeType === 'application/vnd.jupyter.stderr' && /\\w+(Error|Exception)\\b/"
                           ".test(e.innerText)).map(e => e.innerText.slice(0, 200))")
    assert not errors, f"error output on the notebook page: {errors}"
    lines = [line.split("\r")[-1].strip() for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
             if o["output_type"] == "stream" for line in "".join(o["text"]).replace("\r\n", "\n").split("\n")]
    lines = [line for line in lines if line]
    assert lines, "the committed notebook holds no outputs (make run records them)"
    missing = [line for line in lines if " ".join(line.split()) not in " ".join(shown.split())]
    assert not missing, f"{len(missing)} of {len(lines)} output lines not on the page, e.g. {missing[:3]}"


def test_the_console_check_sees_errors(tab, tmp_path):
    """The capture itself, on a page with an uncaught exception, a console.error and a missing image."""
    page = tmp_path / "bad.html"
    page.write_text('<p>x</p><img src="missing.png"><script>console.log("fine"); console.error("planted");'
                    'throw new Error("boom");</script>')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = " | ".join(m for m, _ in visit(tab, f"http://127.0.0.1:{server.server_address[1]}/bad.html"))
    finally:
        server.shutdown()
        server.server_close()
    assert "planted" in found and "boom" in found and "404" in found, found
    assert "fine" not in found, found
