"""MkDocs hooks, run when the site is built, so nothing they show is pasted or can go stale (a missing file
fails the build):
- a page line `<!-- changes: OLD NEW -->` becomes the unified diff between two files of the repository;
- a page line `<!-- results -->` becomes the results-at-a-glance table, read from the recorded runs' JSON,
  beside the source article's figures;
- a page line `<!-- colab -->` becomes the "Open in Colab" link to the notebook, made from the repository
  and branch the Pages workflow builds (GITHUB_REPOSITORY, GITHUB_REF_NAME); a build without them (a local
  one) says so instead. The notebook's own page gets the same block at its top, with what its recorded copy
  ran on, and its links to the guide's Markdown pages become links to their built pages.
"""
import difflib
import json
import os
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.utils import get_relative_url

MARKER = re.compile(r"^<!-- changes: (\S+) (\S+) -->$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/walkthrough.ipynb"  # under docs/
RECORDED = re.compile(r"^# recorded (\S+) on (\S+) \((.*)\)$", re.M)


def diff_block(old: str, new: str) -> str:
    before = (ROOT / old).read_text().splitlines()
    after = (ROOT / new).read_text().splitlines()
    lines = difflib.unified_diff(before, after, old, new, lineterm="", n=2)
    return "```diff\n" + "\n".join(lines) + "\n```"


# The source article's figures (notes/reference-figures.md): parity on the CPU with the real E2B checkpoint,
# speed and memory on one Colab TPU v5e-1. Quoted, attributed; never this project's.
ARTICLE = {
    "top5": "yes", "kl": "1.87e-5", "max_abs_diff": "0.375", "same": "64 of 64",
    "ways": {"rust-fused": ("15.1", "7.75"), "rust-eager": ("4.8", "8.62"),
             "python-compile": ("33.5 (torch 2.14.1)", "16.91 (torch 2.14.1)")},
}
WAY_NAMES = {"rust-fused": "Rust fused", "rust-eager": "Rust eager", "python-compile": "Python compile",
             "python-eager": "Python eager"}


def results_table() -> str:
    parity = json.loads((ROOT / "docs/runs/cpu/04_parity-bfloat16.json").read_text())
    bench = json.loads((ROOT / "docs/runs/cpu-e2b/05_tpu.json").read_text())
    ways = {r["way"]: r for r in bench["rows"]}
    m = bench["meta"]
    p = parity["meta"]
    rows = [
        "| | this project | the source article |",
        "|---|---:|---:|",
        "| **parity with Transformers** (bf16) | default checkpoint, CPU | the real E2B, CPU |",
        f"| next-token top-5 identical | {'yes' if parity['top5_rust']['ids'] == parity['top5_hf']['ids'] else 'no'} "
        f"| {ARTICLE['top5']} |",
        f"| KL(hf ‖ rust), next token | {parity['kl_hf_rs']:.3g} | {ARTICLE['kl']} |",
        f"| max abs logit difference | {parity['max_abs_diff']:.3g} | {ARTICLE['max_abs_diff']} |",
        f"| greedy tokens the same | {parity['same']} of {parity['of']} | {ARTICLE['same']} |",
        "| **decode speed**, tok/s streamed | E2B-shaped (random weights), CPU | the real E2B, TPU v5e-1 |",
    ]
    for way in ("rust-fused", "rust-eager", "python-compile", "python-eager"):
        ours, theirs = ways.get(way), ARTICLE["ways"].get(way, ("not measured", "not measured"))
        if ours is None and way not in ARTICLE["ways"]:
            continue
        speed = f"{ours['streamed_tok_s']:.1f}" if ours and ours["available"] else "n/a (a TPU mode)"
        rows.append(f"| {WAY_NAMES[way]} | {speed} | {theirs[0]} |")
    rows.append("| **peak memory**, GB | same run | same runs |")
    for way in ("rust-fused", "rust-eager", "python-compile", "python-eager"):
        ours, theirs = ways.get(way), ARTICLE["ways"].get(way, ("not measured", "not measured"))
        if ours is None and way not in ARTICLE["ways"]:
            continue
        peak = f"{ours['peak_gb']:.2f}" if ours and ours["available"] else "n/a"
        rows.append(f"| {WAY_NAMES[way]} | {peak} | {theirs[1]} |")
    facts = (f"This project's column is read from the recorded runs when the site is built: parity recorded "
             f"{p['date'][:10]} (`docs/runs/cpu/04_parity-bfloat16.json`), speed recorded {m['date'][:10]} on "
             f"{m['cpu']} ({m['cores']} cores), torch {m['torch']}, tch {m['tch']}, memory bandwidth "
             f"{bench['bandwidth_gb_s']:.1f} GB/s (`docs/runs/cpu-e2b/05_tpu.json`). The article's column is its "
             "own figures (Gemma 4 E2B-it QAT, W4A16 `-text` + `-text-emb4`, 64 greedy tokens, 33,024-token "
             "context; the Rust ways on torch 2.13.0, compiled Python on 2.14.1), quoted, not measured here.")
    return "\n".join(rows) + "\n\n" + facts


def colab_url(env=os.environ) -> str | None:
    """The notebook on Colab, from the repository and branch being built; None without both (a local build)."""
    repository, branch = env.get("GITHUB_REPOSITORY", ""), env.get("GITHUB_REF_NAME", "")
    if not (repository and branch):
        return None
    return f"https://colab.research.google.com/github/{repository}/blob/{branch}/docs/{NOTEBOOK}"


def notebook_facts() -> tuple[str | None, str | None]:
    """Where the committed notebook's recorded run ran ("cpu (its CPU, n cores), date"), from its header cell,
    and the repository its setup cell clones."""
    path = ROOT / "docs" / NOTEBOOK
    if not path.is_file():
        return None, None
    cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
    recorded = next((m for c in cells for m in [RECORDED.search(c)] if m), None)
    repo = next((m[1] for c in cells for m in [re.search(r'^REPOSITORY = "([^"]*)"', c, re.M)] if m), None)
    return (f"{recorded[2]} ({recorded[3]}), {recorded[1]}" if recorded else None), repo


def colab_block(env=os.environ) -> str:
    """Markdown: the Colab link (or why there is none), what is known to run on a TPU runtime, what is not."""
    url = colab_url(env)
    ran_on, clones = notebook_facts()
    if url:
        link = (f"[Open the notebook in Colab]({url}){{ .md-button .md-button--primary #open-in-colab }}\n\n"
                f"It opens `docs/{NOTEBOOK}` from `{env['GITHUB_REPOSITORY']}` at `{env['GITHUB_REF_NAME']}`, the "
                "repository and branch this guide was built from.")
        if clones != env["GITHUB_REPOSITORY"]:
            link += (f" Its setup cell clones the repository named in its `REPOSITORY` field "
                     f"(`{clones or 'empty'}` in this copy): on a fresh runtime set it to "
                     f"`{env['GITHUB_REPOSITORY']}` and `BRANCH` to `{env['GITHUB_REF_NAME']}` in Colab's form.")
    else:
        link = ('No "Open in Colab" link in this build: the link is made from the repository and branch being '
                "built, which the Pages workflow passes in (`GITHUB_REPOSITORY`, `GITHUB_REF_NAME`) and a local "
                "build does not have. The published guide has it.")
    tpu = "tpu" in (ran_on or "").split(" ")[0]
    status = (f"The outputs shown here were recorded on **{ran_on}**." if ran_on else
              "This copy of the notebook has no recorded outputs yet (`make run` writes them).")
    tried = ("" if tpu else
             " **Nothing of it has been run on a TPU runtime by this project yet**: no TPU was available while it "
             "was written. The setup cell's Colab path (clone, rustup, `make setup`, `pip install .[tpu]`) was tested "
             "only against a fake Colab environment that runs no command, and the TPU paths of the steps only "
             "follow what is known about TorchTPU 0.2.0.")
    return ('!!! tip "Run it on a Colab TPU"\n'
            + "\n".join("    " + line if line else "" for line in (
                link + "\n\n"
                "Choose *Runtime → Change runtime type → TPU* (the article used a v5e-1), then *Runtime → Run "
                "all*. On a TPU runtime the setup cell clones the repository, installs Rust into `.venv/cargo` when "
                "the runtime's is missing or too old, runs `make setup` (the pinned torch 2.13.0 into `.venv`, "
                "every step built: minutes) and `pip install .[tpu]` (torch-tpu 0.2.0) into `.venv`, then every "
                "step runs on the chip, each in its own process; step 04 stays on the CPU. "
                f"{status}{tried}\n\n"
                "To show a TPU run here: on the TPU runtime, after the setup cell, run "
                "`!.venv/bin/python tools/record.py notebook` in a new cell (it executes this notebook again, "
                f"with a fresh kernel, and writes `docs/{NOTEBOOK}` with its outputs and a first cell naming the "
                "TPU, the versions and the date), download that file (Colab's *Files* pane, or "
                f"`from google.colab import files; files.download(\"docs/{NOTEBOOK}\")`) and commit it to "
                f"`docs/{NOTEBOOK}`; `make run DEVICE=tpu` on a TPU VM records it with the rest.").splitlines()))


def on_page_markdown(markdown: str, **kwargs) -> str:
    markdown = MARKER.sub(lambda m: diff_block(m[1], m[2]), markdown)
    markdown = markdown.replace("<!-- colab -->", colab_block())
    return markdown.replace("<!-- results -->", results_table())


def on_page_content(html: str, page, config, files, **kwargs) -> str:
    """The notebook's page: the Colab block on top; its links to `../x.md` pages made into the built pages."""
    if page.file.src_uri != NOTEBOOK:
        return html

    def built(m):
        target = files.get_file_from_path(os.path.normpath(os.path.join(os.path.dirname(NOTEBOOK), m[1])))
        if target is None:
            raise PluginError(f"{NOTEBOOK} links to {m[1]}, which is not a page of the guide")
        return f'href="{get_relative_url(target.url, page.url)}{m[2] or ""}"'

    html = re.sub(r'href="([^":#]+\.md)(#[^"]*)?"', built, html)
    import markdown as md  # the Colab block is Markdown: convert it with the site's own extensions

    block = md.markdown(colab_block(), extensions=config["markdown_extensions"],
                        extension_configs=config["mdx_configs"])
    return block + html
