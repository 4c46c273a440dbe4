"""What the guide shows comes from files, not from typing: checks on the Markdown under docs/.

A fenced block whose body consists only of snippet lines, `--8<-- "path"` or `--8<-- "path:section"`
(pymdownx.snippets, paths from the repository root), is an *include*. Then, by the block's language:

- output (`text`, `txt`, `console`, `output`, `plaintext`, or no language): must be an include of files under
  `docs/runs/`, each starting with the header tools/record.py writes: `# recorded <date> on <device> (<cpu>,
  <n> cores)`, then a versions line `# python … · torch …`, then the command, `$ python …`.
- `python`, `py`, `bash`, `sh`, `shell`: an include, or a *usage example* typed in the page — the commands to
  run, a few lines calling the engine. The convention: a typed block is at most 12 lines and defines nothing
  (no `def`/`class`): code that defines something belongs in a file the tests run, included from there.
- any other language (`rust`, `toml`, …): must be an include. Source is never pasted.

Every include must name a file that exists and, with `:section`, a file holding both
`--8<-- [start:section]` and `--8<-- [end:section]`. (mkdocs' `check_paths` covers files; this covers sections
too, and runs without building.)
"""
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from torchtpu_rs.records import CPU_LIMITS

OUTPUT = {"text", "txt", "console", "output", "plaintext", ""}
USAGE = {"python", "py", "bash", "sh", "shell"}
USAGE_MAX_LINES = 12
DEFINES = re.compile(r"^\s*(async\s+def|def|class)\s+\w+")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
SNIPPET = re.compile(r"""^\s*-{1,}8<-{1,}\s+(?P<q>["'])(?P<target>[^"']+)(?P=q)\s*$""")
HEADER = re.compile(r"^# recorded \d{4}-\d{2}-\d{2} on \S+ \(.+, \d+ cores\)$")
# the command as typed: `$ python …`, after any CPU limits it ran under
COMMAND = re.compile(rf"^\$ (({'|'.join(CPU_LIMITS)})=\S+ )*python ")
VERSIONS = re.compile(r"^# python \S+ · torch \S+")


@dataclass
class Block:
    file: Path
    line: int
    lang: str
    body: list[str]

    def where(self, root: Path) -> str:
        return f"{self.file.relative_to(root)}:{self.line}"

    def includes(self) -> list[str] | None:
        """The snippet targets, when the body is nothing but snippet lines (blank lines aside); else None."""
        lines = [line for line in self.body if line.strip()]
        matches = [SNIPPET.match(line) for line in lines]
        return [m["target"] for m in matches] if lines and all(matches) else None


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (at any indentation: inside admonitions and tabs too)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info = m["fence"], m["indent"], m["info"].strip()
        lang = info.split()[0].strip("{}").lstrip(".").lower() if info else ""
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:j]]
        found.append(Block(path, i + 1, lang, body))
        i = j + 1
    return found


def split_target(target: str) -> tuple[str, str | None]:
    """`path:section` -> (path, section); `path:3:8` (a line range) -> (path, None)."""
    path, _, rest = target.partition(":")
    return path, (rest if rest and not rest.replace(":", "").isdigit() else None)


def include_problems(repo: Path, target: str) -> list[str]:
    path, section = split_target(target)
    file = repo / path
    if not file.is_file():
        return [f"includes {path}, which does not exist"]
    if section:
        text = file.read_text(encoding="utf-8")
        missing = [m for m in (f"--8<-- [start:{section}]", f"--8<-- [end:{section}]") if m not in text]
        if missing:
            return [f"includes {target}, but {path} has no {' / '.join(missing)}"]
    return []


def recorded_problems(repo: Path, path: str) -> list[str]:
    if not path.startswith("docs/runs/"):
        return [f"output included from {path}: recorded outputs live under docs/runs/ (tools/record.py)"]
    file = repo / path
    if not file.is_file():
        return []  # reported by include_problems
    head = file.read_text(encoding="utf-8").splitlines()[:3] + ["", "", ""]
    found = []
    if not HEADER.match(head[0]):
        found.append(f"{path}: line 1 is not '# recorded <date> on <device> (<cpu>, <n> cores)': {head[0]!r}")
    if not VERSIONS.match(head[1]):
        found.append(f"{path}: line 2 is not a versions line '# python … · torch …': {head[1]!r}")
    if not COMMAND.match(head[2]):
        found.append(f"{path}: line 3 is not the recorded command '$ python …': {head[2]!r}")
    return found


def problems_of(repo: Path, block: Block) -> list[str]:
    targets = block.includes()
    if targets is None:
        if block.lang in OUTPUT:
            return [f"a typed output block ({block.lang or 'no language'}): include the recorded file from docs/runs/"]
        if block.lang in USAGE:
            lines = [line for line in block.body if line.strip()]
            if len(lines) > USAGE_MAX_LINES:
                return [f"a typed {block.lang} block of {len(lines)} lines (usage examples: at most "
                        f"{USAGE_MAX_LINES}); include the code from a file the tests run"]
            if any(DEFINES.match(line) for line in lines):
                return [f"a typed {block.lang} block defines code; include it from a file the tests run"]
            return []
        return [f"pasted {block.lang} code: a {block.lang} block must be a --8<-- include of a file"]
    found = [p for t in targets for p in include_problems(repo, t)]
    if block.lang in OUTPUT:
        found += [p for t in targets for p in recorded_problems(repo, split_target(t)[0])]
    return found


def markdown_files(docs: Path) -> list[Path]:
    return sorted(p for p in docs.rglob("*.md") if "runs" not in p.relative_to(docs).parts)


def test_every_block_comes_from_a_file(repo, docs):
    files = markdown_files(docs)
    assert files, f"no Markdown under {docs}"
    problems = [f"{b.where(repo)}: {p}" for f in files for b in blocks(f) for p in problems_of(repo, b)]
    assert not problems, f"{len(problems)} block(s) not from files:\n" + "\n".join(problems)


def test_every_recorded_run_names_device_versions_and_date(repo, docs):
    runs = sorted((docs / "runs").rglob("*.txt"))
    if not runs:
        pytest.skip("no recorded runs under docs/runs/ yet")
    problems = [p for run in runs for p in recorded_problems(repo, run.relative_to(repo).as_posix())]
    assert not problems, "\n".join(problems)


def test_the_rules_catch_typed_output_and_pasted_source(tmp_path):
    (tmp_path / "docs" / "runs" / "cpu").mkdir(parents=True)
    (tmp_path / "docs" / "runs" / "cpu" / "good.txt").write_text(
        "# recorded 2026-11-29 on cpu (Some CPU, 2 cores)\n# python 3.11.7 · torch 2.13.0\n$ python run.py\nok\n")
    (tmp_path / "docs" / "runs" / "cpu" / "bare.txt").write_text("ok\n")
    (tmp_path / "src.rs").write_text("// --8<-- [start:f]\nfn f() {}\n// --8<-- [end:f]\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("\n".join([
        '```text', '--8<-- "docs/runs/cpu/good.txt"', '```',          # fine
        '```text', 'load 0.1 (1, 4, 5, 32)', '```',                   # typed output
        '```text', '--8<-- "docs/runs/cpu/bare.txt"', '```',          # no header
        '```rust title="src.rs"', '--8<-- "src.rs:f"', '```',         # fine
        '```rust', '--8<-- "src.rs:g"', '```',                        # no such section
        '```rust', 'fn main() {}', '```',                             # pasted source
        '!!! note', '    ```python', '    def f(): pass', '    ```',  # a definition, inside an admonition
        '```bash', 'python steps/03_model/run.py', '```',             # a usage example: fine
    ]))
    found = [(b.line, p) for b in blocks(page) for p in problems_of(tmp_path, b)]
    lines = sorted({line for line, _ in found})
    assert lines == [4, 7, 13, 16, 20], found


def absolute_paths(value) -> list[str]:
    """Every string in a recorded JSON that is an absolute path: one machine's folders, which a record must not hold."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in absolute_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in absolute_paths(v)]
    return [value] if isinstance(value, str) and value.startswith("/") else []


def test_recorded_runs_name_checkpoints_without_a_machines_folders(docs):
    import json

    found = {str(p.relative_to(docs)): absolute_paths(json.loads(p.read_text()))
             for p in sorted((docs / "runs").rglob("*.json"))}
    assert not {k: v for k, v in found.items() if v}, "record paths relative to the repository (records.name)"
