"""MkDocs hooks, run when the site is built, so nothing they show is pasted or can go stale (a missing file
fails the build):
- a page line `<!-- changes: OLD NEW -->` becomes the unified diff between two files of the repository;
- generated from the current records under docs/runs/ (one folder per CPU class), each a page line of its own:
  `<!-- results -->` the home page's results at a glance (parity, and decode speed beside the source article's
  TPU figures), `<!-- results:cpu-classes -->` page 05's table of every CPU class, `<!-- results:machines -->`
  each class's int4 kernel and Rust int4 against llama.cpp, `<!-- results:matvec -->`, `<!-- results:peer -->` and
  `<!-- results:peer-long -->` page 08's mat-vec fractions, and decode and a long prompt's read beside llama.cpp,
  `<!-- results:prompt-reads -->` page 08's prompt reads by class,
  `<!-- records:all -->` every record with its header
  ("Benchmarks by machine"). Any other `results`/`records` marker fails the build, so none reaches a page;
- a page line `<!-- colab -->` becomes the "Open in Colab" link to the notebook, made from the repository
  and branch the Pages workflow builds (GITHUB_REPOSITORY, GITHUB_REF_NAME); a build without them (a local
  one) says so instead. The notebook's own page gets the same block at its top, with what its recorded copy
  ran on, and its links to the guide's Markdown pages become links to their built pages.
"""
import difflib
import json
import os
import posixpath
import re
from dataclasses import dataclass
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
             "python-compile": ("33.5", "16.91")},  # on torch 2.14.1; the Rust ways on 2.13.0
}
WAY_NAMES = {"rust-fused": "Rust fused", "rust-eager": "Rust eager", "python-compile": "Python compile",
             "python-eager": "Python eager", "rust-int4": "Rust int4, this project's kernels (step 08)",
             "rust-int4-aten": "Rust int4, ATen's kernel (step 07)",
             "llamacpp-q4_0": "llama.cpp Q4_0, its fastest build here", "llamacpp-bf16": "llama.cpp bf16"}

# ------------------------------------------------------------------------------ the records, by CPU class

RUNS = ROOT / "docs" / "runs"
PARITY = "docs/runs/cpu/04_parity-bfloat16.json"  # make run's parity record: the trained default model, bf16
NOT_CLASSES = {"cpu", "train"}  # make run's records of every step (the trained model) and the trainer's


@dataclass(frozen=True)
class CpuClass:
    """A folder of docs/runs/ holding the E2B-sized benches of one CPU class (`make bench` and its variants)."""
    folder: str
    name: str  # the class, in words
    machine: str  # what its records were made on
    stand_in: bool  # made with env limits on a CPU that has more: what the class runs, not a CPU of the class


# In the order the tables list them; tests/site/test_results.py checks each against its records' headers.
CLASSES = [
    CpuClass("cpu-e2b-avx2", "AVX2 only", "an AMD EPYC Zen 3", False),
    CpuClass("cpu-e2b-amx-avx2", "AVX2 only", "an Intel Xeon with AMX, torch kept to AVX2", True),
    CpuClass("cpu-e2b-amx-avx512core", "AVX-512 without bf16", "an Intel Xeon with AMX, oneDNN kept to AVX512_CORE",
             True),
    CpuClass("cpu-e2b-zen5", "AVX512-BF16", "an AMD EPYC Zen 5", False),
    CpuClass("cpu-e2b", "AVX512-BF16", "an AMD EPYC Zen 4", False),
    CpuClass("cpu-e2b-xeon", "AVX512-BF16", "an Intel Xeon without AMX", False),
    CpuClass("cpu-e2b-amx-avx512", "AVX512-BF16", "an Intel Xeon with AMX, oneDNN kept from AMX", True),
    CpuClass("cpu-e2b-amx", "AMX", "an Intel Xeon with AMX", False),
]
HOME = ("cpu-e2b-avx2", "cpu-e2b-amx")  # the home page's two columns: the class most readers have, the fastest
# what each record is, by the start of its name
KINDS = [(r"05_tpu", "step 05's bench: decode speed, fraction of the bandwidth limit and peak memory of each way"),
         (r"06_longprompt", "step 06's bench: a long prompt read, then decoded after"),
         (r"\d\d_read-budget", "the per-token budget of a prompt read: where its time goes"),
         (r"\d\d_budget", "the per-token budget of a decode step: where its time goes")]
HEADER_LINE = re.compile(r"^# recorded (\S+) on (\S+) \((.*)\)$")
LLAMACPP = re.compile(r"^llamacpp-(?:(?P<build>[a-z0-9]+)-)?(?P<quant>q4_0|q8_0|bf16)(?P<norepack>-norepack)?$")


def folders() -> list[str]:
    """Every class folder under docs/runs/: the known ones in CLASSES' order, then any other, by name."""
    present = sorted(p.name for p in RUNS.iterdir() if p.is_dir() and p.name not in NOT_CLASSES)
    known = [c.folder for c in CLASSES if c.folder in present]
    return known + [f for f in present if f not in known]


# oneDNN's ISA names without a bf16 dot product (step 08's cpu.rs has the same list)
BELOW_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def class_of_meta(meta: dict) -> tuple[str, bool] | None:
    """(class, stand-in) as a record's meta says it ran: ATen's ISA, the bf16 hardware, the limits it ran under. None
    for a record older than the `bf16_matmul_hardware` field. A stand-in had hardware its limits kept from it."""
    if "bf16_matmul_hardware" not in meta:
        return None
    hardware, limits = meta["bf16_matmul_hardware"], meta.get("cpu_limits") or {}
    onednn = limits.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if meta.get("cpu_capability") != "AVX512":
        name = "AVX2 only"
    elif hardware is None or onednn in BELOW_BF16:
        name = "AVX-512 without bf16"
    elif hardware == "AMX" and onednn != "ALL" and "AMX" not in onednn:
        name = "AVX512-BF16"
    else:
        name = hardware
    return name, bool(limits) and hardware is not None


def cpu_class(folder: str) -> CpuClass:
    """The class of a folder: from CLASSES, or, for a folder not listed there, from its newest record's meta."""
    for c in CLASSES:
        if c.folder == folder:
            return c
    metas = sorted((json.loads(p.read_text())["meta"] for p in (RUNS / folder).glob("*.json")),
                   key=lambda m: m.get("date", ""))
    meta = metas[-1] if metas else {}
    name, stand_in = class_of_meta(meta) or (meta.get("cpu_capability") or "unknown", False)
    return CpuClass(folder, name, meta.get("cpu", "a CPU not named"), stand_in)


def bench_records(folder: str) -> list[tuple[str, dict]]:
    """Step 05's E2B bench records in a folder (05_tpu.json, 05_tpu-peer.json, ...), newest first."""
    found = []
    for path in (RUNS / folder).glob("05_tpu*.json"):
        data = json.loads(path.read_text())
        if isinstance(data.get("rows"), list) and all("streamed_tok_s" in r for r in data["rows"]):
            found.append((path.stem, data))
    return sorted(found, key=lambda r: r[1]["meta"]["date"], reverse=True)


def step_07s(row: dict) -> bool:
    """Whether a `rust-int4-aten` row is step 07's engine. Records older than step 08 ran that way as step 08's engine
    on ATen's kernel; its row gives it away by its bucketed sliding rings, which only step 08 has."""
    return row["way"] != "rust-int4-aten" or row.get("sliding_slots", "ring") == "ring"


def bench_ways(folder: str) -> dict[str, tuple[dict, str]]:
    """Each way step 05's bench recorded in a folder: its row (and record name) from the newest record that has it."""
    ways: dict[str, tuple[dict, str]] = {}
    for name, data in bench_records(folder):
        for row in filter(step_07s, data["rows"]):
            ways.setdefault(row["way"], (row, name))
    return ways


def llamacpp_label(way: str) -> str:
    """`avx2 build, repacked`: the build and repacking of a llama.cpp way, as the records' tables name them."""
    m = LLAMACPP.match(way)
    if not m:
        return way
    return f"{m['build'] or 'native'} build, " + ("no repack" if m["norepack"] else "repacked")


def best(ways: dict[str, tuple[dict, str]], quant: str) -> tuple[str, dict] | None:
    """llama.cpp's fastest way of one quantization that ran (any build, repacked or not), or None."""
    ran = [(w, row) for w, (row, _) in ways.items()
           if (m := LLAMACPP.match(w)) and m["quant"] == quant and row["available"]]
    return max(ran, key=lambda r: r[1]["streamed_tok_s"], default=None)


def class_ways(folder: str) -> dict[str, dict | None]:
    """The columns the tables show for a folder: each way's row, llama.cpp's best Q4_0 and bf16 under their own keys
    (with the way that made them as `llamacpp_way`); None where not recorded."""
    ways = bench_ways(folder)
    out: dict[str, dict | None] = {w: ways[w][0] if w in ways else None
                                   for w in ("rust-fused", "rust-eager", "python-eager", "python-compile",
                                             "rust-int4", "rust-int4-aten")}
    for quant in ("q4_0", "bf16"):
        found = best(ways, quant)
        out[f"llamacpp-{quant}"] = {**found[1], "llamacpp_way": found[0]} if found else None
    return out


def tok_s(row: dict | None) -> str:
    if row is None:
        return ""
    return f"{row['streamed_tok_s']:.1f}" if row["available"] else "n/a"


def cell(row: dict | None) -> str:
    """A way's cell: decode tok/s in bold, then its fraction of the bandwidth limit and its peak GB."""
    if row is None:
        return ""
    if not row["available"]:
        return "n/a"
    text = f"**{row['streamed_tok_s']:.1f}**<br>{row['bandwidth_fraction']:.2f} · {row['peak_gb']:.2f} GB"
    return text + (f"<br>{llamacpp_label(row['llamacpp_way'])}" if "llamacpp_way" in row else "")


def int4_kernel(row: dict | None) -> str:
    """The kernel a Rust int4 row's decode ran, from its weights_reason."""
    reason = (row or {}).get("weights_reason") or ""
    if m := re.search(r"torchtpu_(dot4|fma4)_mm", reason):
        return m[1]
    return "ATen's" if "aten::" in reason else "not recorded"


def class_link(c: CpuClass, page_dir: str) -> str:
    target = posixpath.relpath("benchmarks.md", page_dir or ".")
    return f"[{c.name}]({target}#{c.folder})"


def made_on(c: CpuClass) -> str:
    return f"stand-in: {c.machine}" if c.stand_in else c.machine


def bench_folders() -> list[str]:
    return [f for f in folders() if bench_records(f)]


def cpu_classes_table(page_dir: str = "") -> str:
    """Page 05's table: one row per CPU class with a step-05 E2B record, each way's speed, bandwidth share, peak."""
    cols = ["rust-eager", "python-eager", "python-compile", "rust-int4", "llamacpp-q4_0", "llamacpp-bf16"]
    heads = ["Rust eager", "Python eager", "Python compile", "Rust int4 (step 08)", "llama.cpp Q4_0, best",
             "llama.cpp bf16"]
    rows = ["| CPU class | made on | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * len(cols)]
    for folder in bench_folders():
        c, ways = cpu_class(folder), class_ways(folder)
        rows.append(f"| {class_link(c, page_dir)} | {made_on(c)} | " + " | ".join(cell(ways[w]) for w in cols) + " |")
    return ("Each cell: decode tok/s in bold, then the fraction of the bandwidth limit it reached and the peak "
            "memory of its process. Blank: not recorded on that class; n/a: recorded as not available. Each way "
            "comes from the newest record of its class that has it; the class links to its records.\n\n"
            + "\n".join(rows))


def machines_table(page_dir: str = "") -> str:
    """What each CPU class's records show: the int4 kernel its decode ran, Rust int4 against llama.cpp's Q4_0."""
    rows = ["| CPU class | made on | int4 kernel | attention | Rust int4 (step 08) | ATen's int4 (step 07) "
            "| Rust eager, bf16 | llama.cpp Q4_0, best | Rust int4 ÷ llama.cpp |",
            "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for folder in bench_folders():
        c, ways = cpu_class(folder), class_ways(folder)
        int4, peer = ways["rust-int4"], ways["llamacpp-q4_0"]
        ratio = ""
        if int4 and peer and int4["available"]:
            ratio = f"{int4['streamed_tok_s'] / peer['streamed_tok_s']:.2f}×"
        attention = (int4 or ways["rust-eager"] or {}).get("attention_dtype") or "not recorded"
        rows.append(f"| {class_link(c, page_dir)} | {made_on(c)} | {int4_kernel(int4)} | {attention} | "
                    f"{tok_s(int4)} | {tok_s(ways['rust-int4-aten'])} | {tok_s(ways['rust-eager'])} | "
                    f"{tok_s(peer)} | {ratio} |")
    return ("Decode tok/s of the E2B-shaped checkpoint, from each class's newest step-05 records. Above 1 in the "
            "last column, this project's 4-bit engine decodes faster than llama.cpp's fastest Q4_0 build on that "
            "class. Blank: not recorded there.\n\n" + "\n".join(rows))


def results_table(page_dir: str = "") -> str:
    """The home page's results at a glance: parity, then decode speed on two CPU classes beside the article's TPU."""
    parity = json.loads((ROOT / PARITY).read_text())
    top5 = "yes" if parity["top5_rust"]["ids"] == parity["top5_hf"]["ids"] else "no"
    answers = parity.get("answers") or {}
    attention = parity.get("attention_dtype") or "not recorded"
    rows = [
        f"| parity with Transformers, bf16 | this project: the trained default model, CPU, attention in {attention} "
        "| the article: the real E2B, CPU |",
        "|---|---:|---:|",
        f"| next-token top-5 identical | {top5} | {ARTICLE['top5']} |",
        f"| KL(hf ‖ rust), next token | {parity['kl_hf_rs']:.3g} | {ARTICLE['kl']} |",
        f"| max abs logit difference | {parity['max_abs_diff']:.3g} | {ARTICLE['max_abs_diff']} |",
        f"| greedy tokens the same | {parity['same']} of {parity['of']} | {ARTICLE['same']} |",
        f"| the answer | {'the same' if answers.get('rust') == answers.get('hf') else 'not the same'} | not stated |",
    ]
    classes = [cpu_class(f) for f in HOME if bench_records(f)]
    ways = {c.folder: class_ways(c.folder) for c in classes}
    speed = ["| decode tok/s · peak GB | " + " | ".join(f"{class_link(c, page_dir)}: {c.machine}" for c in classes)
             + " | the article: TPU v5e-1 |",
             "|---|" + "---:|" * (len(classes) + 1)]
    for way in ("rust-fused", "rust-eager", "python-eager", "python-compile", "rust-int4", "rust-int4-aten",
                "llamacpp-q4_0", "llamacpp-bf16"):
        cells = []
        for c in classes:
            row = ways[c.folder][way]
            if row is None:
                cells.append("not recorded")
            elif not row["available"]:
                cells.append("n/a: a TPU mode" if way == "rust-fused" else "n/a")
            else:
                cells.append(f"{row['streamed_tok_s']:.1f} · {row['peak_gb']:.2f}")
        theirs = ARTICLE["ways"].get(way)
        cells.append(f"{theirs[0]} · {theirs[1]}" if theirs else "not measured")
        speed.append(f"| {WAY_NAMES[way]} | " + " | ".join(cells) + " |")
    benchmarks = posixpath.relpath("benchmarks.md", page_dir or ".")
    runs = sorted({f"{data['max_new']} greedy tokens after a {len(data['prompt_ids'])}-token prompt"
                   for c in classes for _, data in bench_records(c.folder)})
    parity_page = posixpath.relpath("steps/04_parity.md", page_dir or ".")
    note = (f"Read from the records when the site is built: parity from `{PARITY}`, which "
            f"[page 04]({parity_page}) explains, speed from step 05's records of "
            f"an E2B-shaped checkpoint with random weights, {' or '.join(runs)}. "
            f"[Benchmarks by machine]({benchmarks}) lists every record with its date, CPU and versions. The "
            "article's column is its own figures, quoted, not measured here: Gemma 4 E2B-it QAT, 64 greedy tokens, its "
            "compiled Python on torch 2.14.1.")
    return "\n".join(rows) + "\n\n" + "\n".join(speed) + "\n\n" + note


def record_kind(name: str) -> str:
    return next((what for start, what in KINDS if re.match(start, name)), "a record")


def records_page(page_dir: str = "") -> str:
    """Benchmarks by machine: every class folder, what it is, and each record's header, links and text."""
    out = []
    up = posixpath.relpath("runs", page_dir or ".")
    for folder in folders():
        c = cpu_class(folder)
        out.append(f"## {c.name}: {c.machine} {{#{folder}}}\n")
        what = (f"A stand-in: made on {c.machine}, by env limits, so it runs what a CPU of this class runs."
                if c.stand_in else f"Made on {c.machine}.")
        out.append(f"{what} The folder is `docs/runs/{folder}/`.\n")
        out.append("| record | what it is | recorded | CPU, as the header names it | versions | files |")
        out.append("|---|---|---|---|---|---|")
        texts = sorted((RUNS / folder).glob("*.txt"))
        for txt in texts:
            head = txt.read_text(encoding="utf-8").splitlines()[:2] + ["", ""]
            m = HEADER_LINE.match(head[0])
            date, cpu = (m[1], m[3]) if m else ("", "")
            versions = head[1].removeprefix("# ").replace("|", "\\|")
            files = [f"[text]({up}/{folder}/{txt.name})"]
            files += [f"[{kind}]({up}/{folder}/{txt.stem}{ext})" for kind, ext in (("JSON", ".json"), ("chart", ".png"))
                      if txt.with_suffix(ext).is_file()]
            out.append(f"| {txt.stem} | {record_kind(txt.stem)} | {date} | {cpu.replace('|', chr(92) + '|')} | "
                       f"{versions} | {' · '.join(files)} |")
        out.append("")
        for txt in texts:
            out.append(f'??? note "{txt.stem}: the whole record"\n    ```text\n'
                       f'    --8<-- "docs/runs/{folder}/{txt.name}"\n    ```\n')
    return "\n".join(out)


# One kernel's rate in a record's mat-vec line: `int4 fma4 (step 08) 23.9 GB/s (1.06 of the copy, ...)`.
MATVEC = re.compile(r"(?:, |: )(bf16 oneDNN|bf16 ATen|int4 ATen|int4 dot4|int4 fma4)(?: \(step 0\d\))? "
                    r"[\d.]+ GB/s \(([\d.]+) of the copy")
MATVEC_KERNELS = [("dot4", "int4 dot4"), ("fma4", "int4 fma4"), ("ATen's", "int4 ATen")]


def matvec_fractions(folder: str) -> tuple[str, dict[str, dict[str, float]]] | None:
    """The newest step-05 record of a folder with mat-vec lines: its name, and each kernel's fraction of the copy,
    warm and streamed, as its printed lines give them (the printed lines: some older JSON holds labels there)."""
    for name, _ in bench_records(folder):
        text = (RUNS / folder / f"{name}.txt").read_text(encoding="utf-8")
        starts = {kind: f"one [6144 × 1536] mat-vec, {kind}" for kind in ("warm", "streamed")}
        lines = {kind: next((line for line in text.splitlines() if line.startswith(start)), None)
                 for kind, start in starts.items()}
        if all(lines.values()):
            return name, {kind: {k: float(f) for k, f in MATVEC.findall(line)} for kind, line in lines.items()}
    return None


def matvec_table(page_dir: str = "") -> str:
    """Page 08's table: each int4 kernel's mat-vec as a fraction of the copy, warm and streamed, per class."""
    heads = [f"{name} {kind}" for kind in ("warm", "streamed") for name, _ in MATVEC_KERNELS]
    rows = ["| CPU class | made on | record | " + " | ".join(heads) + " |", "|---|---|---|" + "---:|" * len(heads)]
    for folder in bench_folders():
        found = matvec_fractions(folder)
        if found is None:
            continue
        name, fractions = found
        c = cpu_class(folder)
        cells = [f"{fractions[kind][key]:.2f}" if key in fractions[kind] else ""
                 for kind in ("warm", "streamed") for _, key in MATVEC_KERNELS]
        rows.append(f"| {class_link(c, page_dir)} | {made_on(c)} | `{folder}/{name}` | " + " | ".join(cells) + " |")
    return ("One [6144 × 1536] mat-vec through each int4 kernel, as a fraction of the copy in the same run, from each "
            "class's newest step-05 record. Blank: a kernel the class cannot run.\n\n" + "\n".join(rows))


def peer_table(page_dir: str = "") -> str:
    """Page 08's decode table: Rust int4 beside llama.cpp's fastest Q4_0 of the same records, per class."""
    rows = ["| CPU class | made on | Rust int4 tok/s | of the copy | of the read limit | llama.cpp's best Q4_0 | tok/s "
            "| of the copy | of the read limit | ratio |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]

    def read(row: dict) -> str:  # blank in a record older than the read limit
        return f"{row['read_fraction']:.2f}" if row.get("read_fraction") is not None else ""

    for folder in bench_folders():
        c, ways = cpu_class(folder), class_ways(folder)
        int4, peer = ways["rust-int4"], ways["llamacpp-q4_0"]
        if not (int4 and peer and int4["available"]):
            continue
        rows.append(f"| {class_link(c, page_dir)} | {made_on(c)} | {int4['streamed_tok_s']:.1f} | "
                    f"{int4['bandwidth_fraction']:.2f} | {read(int4)} | {llamacpp_label(peer['llamacpp_way'])} | "
                    f"{peer['streamed_tok_s']:.1f} | {peer['bandwidth_fraction']:.2f} | {read(peer)} | "
                    f"{int4['streamed_tok_s'] / peer['streamed_tok_s']:.2f} |")
    return ("Decode tok/s after a 19-token prompt at a 33,024-token context, and each as a fraction of the copy's rate "
            "and of the read limit, from each class's newest step-05 records (the read limit blank in a record made "
            "before it was measured).\n\n" + "\n".join(rows))


def long_records(folder: str) -> list[dict]:
    """Step 06's E2B bench records in a folder (06_longprompt*.json), newest first."""
    found = [json.loads(p.read_text()) for p in (RUNS / folder).glob("06_longprompt*.json")]
    found = [d for d in found if isinstance(d.get("rows"), list) and "e2b" in str(d.get("model", ""))]
    return sorted(found, key=lambda d: d["meta"]["date"], reverse=True)


def peer_long_table(page_dir: str = "") -> str:
    """Page 08's long-prompt table: per class and prompt length, Rust int4's read and its decode after the prompt
    beside llama.cpp's fastest Q4_0 build in each, from the newest step-06 record that ran both at that length."""
    rows = ["| CPU class | made on | prompt | Rust int4 read tok/s | llama.cpp's best | ratio | Rust int4 decode "
            "after | llama.cpp's best | ratio |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for folder in folders():
        done = set()
        for data in long_records(folder):
            ran = [r for r in data["rows"] if r["available"]]
            for tokens in sorted({r["prompt_tokens"] for r in ran} - done):
                at = [r for r in ran if r["prompt_tokens"] == tokens]
                int4 = next((r for r in at if r["way"] == "rust-int4"), None)
                peers = [r for r in at if (m := LLAMACPP.match(r["way"])) and m["quant"] == "q4_0"]
                if int4 is None or not peers:
                    continue
                done.add(tokens)
                read = max(r["read_tok_s"] for r in peers)
                decode = max(r["decode_tok_s"] for r in peers)
                c = cpu_class(folder)
                rows.append(f"| {class_link(c, page_dir)} | {made_on(c)} | {tokens:,} | {int4['read_tok_s']:.1f} | "
                            f"{read:.1f} | {int4['read_tok_s'] / read:.2f} | {int4['decode_tok_s']:.2f} | "
                            f"{decode:.2f} | {int4['decode_tok_s'] / decode:.2f} |")
    return ("Read tok/s of an E2B-shaped prompt and decode tok/s after it, Rust int4 beside llama.cpp's fastest Q4_0 "
            "build in each column, from each class's newest step-06 record at that length.\n\n" + "\n".join(rows))


def chunk_way(row: dict | None) -> str:
    """How a Rust int4 row's prompt chunks of 128 rows or more were multiplied, from its weights_reason."""
    reason = (row or {}).get("weights_reason") or ""
    if m := re.search(r"prompt chunks of \d+ rows or more by (float32 panels|panels)", reason):
        return "bf16 panels" if m[1] == "panels" else m[1]
    return int4_kernel(row) if row else ""


def prompt_reads_table(page_dir: str = "") -> str:
    """Page 08's prompt reads by class: Rust int4's read tok/s of step 05's 19-token prompt and of step 06's longer
    ones, each from the newest record of its class that has it."""
    rows = ["| CPU class | made on | 19 tokens | 508 tokens | 4,076 tokens | long chunks by |",
            "|---|---|---:|---:|---:|---|"]
    for folder in folders():
        int4 = class_ways(folder)["rust-int4"]
        longs: dict[int, dict] = {}
        for data in long_records(folder):
            for r in data["rows"]:
                if r["way"] == "rust-int4" and r["available"]:
                    longs.setdefault(r["prompt_tokens"], r)
        if not (int4 and int4["available"]) and not longs:
            continue
        c = cpu_class(folder)
        short = f"{int4['read_tok_s']:.1f}" if int4 and int4["available"] and "read_tok_s" in int4 else ""
        at = [f"{longs[n]['read_tok_s']:.1f}" if n in longs else "" for n in (508, 4076)]
        way = chunk_way(int4)  # step 06's rows do not say: step 05's record of the same class does
        rows.append(f"| {class_link(c, page_dir)} | {made_on(c)} | {short} | {at[0]} | {at[1]} | {way} |")
    return ("Rust int4's read speed in tokens a second: step 05's bench for the 19-token prompt, step 06's for the "
            "longer two, each from the newest record of its class that has it. The last column is how the record's "
            "engine multiplied chunks of 128 rows or more. Blank: not recorded on that class.\n\n" + "\n".join(rows))


GENERATED = {"results": results_table, "results:cpu-classes": cpu_classes_table,
             "results:machines": machines_table, "results:matvec": matvec_table, "results:peer": peer_table,
             "results:peer-long": peer_long_table, "results:prompt-reads": prompt_reads_table,
             "records:all": records_page}
GENERATED_MARKER = re.compile(r"^<!-- ((?:results|records)(?::[\w-]+)?) -->$", re.MULTILINE)


def generated(markdown: str, page_dir: str = "") -> str:
    """Every `<!-- results… -->` / `<!-- records… -->` line made into its table; an unknown one fails the build."""
    def made(m):
        if m[1] not in GENERATED:
            raise PluginError(f"unknown marker <!-- {m[1]} -->: the hooks know {', '.join(sorted(GENERATED))}")
        return GENERATED[m[1]](page_dir)

    markdown = GENERATED_MARKER.sub(made, markdown)
    left = re.search(r"<!--\s*(results|records)\b[^>]*-->", markdown)
    if left:
        raise PluginError(f"a marker the hooks did not make (alone on its line, exactly as named?): {left[0]}")
    return markdown


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


def on_page_markdown(markdown: str, page=None, **kwargs) -> str:
    markdown = MARKER.sub(lambda m: diff_block(m[1], m[2]), markdown)
    markdown = markdown.replace("<!-- colab -->", colab_block())
    return generated(markdown, posixpath.dirname(page.file.src_uri) if page is not None else "")


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
