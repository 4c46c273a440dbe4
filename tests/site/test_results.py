"""The tables tools/mkdocs_hooks.py makes from the records, and the claims the pages make about them.

The hooks read docs/runs/ when the site is built: the home page's results at a glance (`<!-- results -->`), page
05's table of CPU classes (`<!-- results:cpu-classes -->`), the machines page's (`<!-- results:machines -->`) and
"Benchmarks by machine" (`<!-- records:all -->`). These tests check the rules on small made-up folders, then the
real records: every folder described, every class agreeing with its records' headers, and the sentences of
docs/index.md and docs/machines.md that sum the tables up still true of the current records.
"""
import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SPEC = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "tools" / "mkdocs_hooks.py")
hooks = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(hooks)


def row(way, tok_s=None, fraction=0.5, peak=2.0, **more):
    available = tok_s is not None
    return {"way": way, "available": available, "streamed_tok_s": tok_s, "bandwidth_fraction": fraction if available
            else None, "peak_gb": peak if available else None, **more}


def record(folder, name, date, rows, **meta):
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"date": date, "cpu": "Some CPU", "cpu_capability": "AVX2", "bf16_matmul_hardware": None, **meta}
    (folder / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (folder / f"{name}.txt").write_text(f"# recorded {date[:10]} on cpu (Some CPU, AVX2, 2 cores)\n"
                                        "# python 3.11.7 · torch 2.13.0\n$ python steps/05_tpu/bench.py\nok\n")


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """An empty docs/runs/ the hooks read instead of the real one."""
    monkeypatch.setattr(hooks, "RUNS", tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------------------------ the rules

def test_each_way_comes_from_the_newest_record_that_has_it(runs):
    folder = runs / "cpu-e2b-avx2"
    record(folder, "05_tpu", "2026-01-01T00:00:00+00:00",
           [row("rust-eager", 1.0), row("python-eager", 2.0), row("rust-int4", 3.0)])
    record(folder, "05_tpu-peer", "2026-01-02T00:00:00+00:00",
           [row("rust-eager", 4.0), row("rust-int4", 5.0), row("llamacpp-q4_0"),  # crashed
            row("llamacpp-avx2-q4_0", 6.0), row("llamacpp-avx512-q4_0-norepack", 7.0), row("llamacpp-q8_0", 9.0)])
    ways = hooks.class_ways("cpu-e2b-avx2")
    assert ways["rust-eager"]["streamed_tok_s"] == 4.0 and ways["rust-int4"]["streamed_tok_s"] == 5.0
    assert ways["python-eager"]["streamed_tok_s"] == 2.0, "a way only the older record has comes from it"
    assert ways["python-compile"] is None and ways["llamacpp-bf16"] is None
    best = ways["llamacpp-q4_0"]
    assert best["streamed_tok_s"] == 7.0 and best["llamacpp_way"] == "llamacpp-avx512-q4_0-norepack", \
        "the fastest Q4_0 that ran, whatever its build; Q8_0 is not Q4_0"


def test_the_matvec_table_reads_each_kernels_fraction_from_the_printed_lines(runs):
    """The mat-vec fractions come from a record's printed lines, warm and streamed, by kernel; a kernel the class
    cannot run is a blank cell."""
    folder = runs / "cpu-e2b-avx2"
    record(folder, "05_tpu", "2026-01-01T00:00:00+00:00", [row("rust-int4", 3.0)])
    (folder / "05_tpu.txt").write_text(
        "# recorded 2026-01-01 on cpu (Some CPU, AVX2, 2 cores)\n$ python steps/05_tpu/bench.py\n"
        "one [6144 × 1536] mat-vec, warm in cache (best of 7 × 200 calls): bf16 oneDNN 9.0 GB/s (0.40 of the copy), "
        "int4 ATen 8.0 GB/s (0.37 of the copy, 0.30 of the read limit), int4 fma4 (step 08) 23.0 GB/s (1.06 of the "
        "copy, 0.90 of the read limit)\n"
        "one [6144 × 1536] mat-vec, streamed from memory (0.4 GB of distinct copies, best of 7 × 200 calls): int4 ATen "
        "7.5 GB/s (0.35 of the copy), int4 fma4 (step 07) 16.0 GB/s (0.73 of the copy)\n")
    name, fractions = hooks.matvec_fractions("cpu-e2b-avx2")
    assert name == "05_tpu"
    assert fractions == {"warm": {"bf16 oneDNN": 0.40, "int4 ATen": 0.37, "int4 fma4": 1.06},
                         "streamed": {"int4 ATen": 0.35, "int4 fma4": 0.73}}
    table = hooks.matvec_table()
    assert "|  | 1.06 | 0.37 |  | 0.73 | 0.35 |" in table, table


def test_the_peer_table_divides_rust_int4_by_llamacpps_best_q4_0(runs):
    record(runs / "cpu-e2b-avx2", "05_tpu", "2026-01-01T00:00:00+00:00",
           [row("rust-int4", 13.3, 0.76, read_fraction=0.61), row("llamacpp-avx2-q4_0", 12.3, 0.78),
            row("llamacpp-avx2-q4_0-norepack", 8.5)])
    assert "| 13.3 | 0.76 | 0.61 | avx2 build, repacked | 12.3 | 0.78 |  | 1.08 |" in hooks.peer_table()


def long_row(way, tokens, read, decode):
    return {"way": way, "available": True, "prompt_tokens": tokens, "read_tok_s": read, "decode_tok_s": decode}


def test_the_long_prompt_table_takes_each_length_from_the_newest_record_and_llamacpps_best_build(runs):
    folder = runs / "cpu-e2b-avx2"
    folder.mkdir(parents=True)
    for name, date, rows in [
        ("06_longprompt-int4", "2026-01-02T00:00:00+00:00",
         [long_row("rust-int4", 508, 30.0, 14.0), long_row("llamacpp-avx2-q4_0", 508, 25.0, 9.0),
          long_row("llamacpp-avx2-q4_0-norepack", 508, 27.0, 8.0), long_row("rust-eager", 508, 5.0, 3.0)]),
        ("06_longprompt-peer", "2026-01-01T00:00:00+00:00",
         [long_row("rust-int4", 508, 1.0, 1.0), long_row("llamacpp-avx2-q4_0", 508, 1.0, 1.0),
          long_row("rust-int4", 4076, 20.0, 10.0), long_row("llamacpp-avx2-q4_0", 4076, 25.0, 8.0)])]:
        meta = {"date": date, "cpu": "Some CPU", "cpu_capability": "AVX2", "bf16_matmul_hardware": None}
        data = {"meta": meta, "model": "checkpoints/e2b-x/text", "rows": rows}
        (folder / f"{name}.json").write_text(json.dumps(data))
    table = hooks.peer_long_table()
    assert "| 508 | 30.0 | 27.0 | 1.11 | 14.00 | 9.00 | 1.56 |" in table, table
    assert "| 4,076 | 20.0 | 25.0 | 0.80 | 10.00 | 8.00 | 1.25 |" in table, table
    assert table.count("| 508 |") == 1


def test_the_prompt_reads_table_takes_each_length_from_the_newest_record_and_names_the_chunks_way(runs):
    folder = runs / "cpu-e2b-avx2"
    panels = 'weights="int4": torchtpu_fma4_mm; prompt chunks of 128 rows or more by float32 panels (...)'
    record(folder, "05_tpu", "2026-01-02T00:00:00+00:00",
           [row("rust-int4", 20.0, read_tok_s=28.7, weights_reason=panels)])
    for name, date, rows in [
        ("06_longprompt-int4", "2026-01-03T00:00:00+00:00", [long_row("rust-int4", 508, 34.3, 18.0)]),
        ("06_longprompt-peer", "2026-01-01T00:00:00+00:00",
         [long_row("rust-int4", 508, 1.0, 1.0), long_row("rust-int4", 4076, 32.6, 16.0)])]:
        meta = {"date": date, "cpu": "Some CPU", "cpu_capability": "AVX2", "bf16_matmul_hardware": None}
        (folder / f"{name}.json").write_text(json.dumps({"meta": meta, "model": "checkpoints/e2b-x/text",
                                                         "rows": rows}))
    table = hooks.prompt_reads_table()
    assert "| 28.7 | 34.3 | 32.6 | float32 panels |" in table, table
    amx = 'weights="int4": torchtpu_dot4_mm; prompt chunks of 128 rows or more by panels (torchtpu_unpack_panel, ...)'
    record(runs / "cpu-e2b-amx", "05_tpu", "2026-01-02T00:00:00+00:00",
           [row("rust-int4", 30.0, read_tok_s=134.3, weights_reason=amx)], bf16_matmul_hardware="AMX",
           cpu_capability="AVX512")
    assert "| 134.3 |  |  | bf16 panels |" in hooks.prompt_reads_table()


def test_a_rust_int4_aten_row_of_step_08s_engine_is_not_step_07s(runs):
    """Step 07's engine has step 03's sliding rings; a row with bucketed ones is step 08's engine on ATen's kernel,
    which older records ran under that name: not shown as step 07's."""
    folder = runs / "cpu-e2b-amx"
    record(folder, "05_tpu", "2026-01-01T00:00:00+00:00",
           [row("rust-int4", 3.0, sliding_slots="bucket"), row("rust-int4-aten", 2.0, sliding_slots="bucket")])
    assert hooks.class_ways("cpu-e2b-amx")["rust-int4-aten"] is None
    record(folder, "05_tpu-peer", "2026-01-02T00:00:00+00:00", [row("rust-int4-aten", 1.5, sliding_slots="ring")])
    assert hooks.class_ways("cpu-e2b-amx")["rust-int4-aten"]["streamed_tok_s"] == 1.5


def test_a_newer_record_that_says_not_available_wins_over_an_older_run(runs):
    folder = runs / "cpu-e2b"
    record(folder, "05_tpu", "2026-01-01T00:00:00+00:00", [row("python-compile", 3.0)])
    record(folder, "05_tpu-peer", "2026-01-02T00:00:00+00:00", [row("python-compile")])
    assert hooks.cell(hooks.class_ways("cpu-e2b")["python-compile"]) == "n/a"


def test_the_classes_table_blank_where_not_recorded_and_links_from_the_page(runs):
    record(runs / "cpu-e2b-avx2", "05_tpu", "2026-01-01T00:00:00+00:00",
           [row("rust-eager", 3.41, 0.704, 8.067), row("rust-int4", 13.26, 0.755, 2.671)])
    record(runs / "cpu-e2b-amx", "07_budget", "2026-01-01T00:00:00+00:00", [])  # no step-05 record: no row
    table = hooks.cpu_classes_table("steps")
    lines = [line for line in table.splitlines() if line.startswith("| [")]
    assert len(lines) == 1, table
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[0] == "[AVX2 only](../benchmarks.md#cpu-e2b-avx2)"
    assert cells[2] == "**3.4**<br>0.70 · 8.07 GB" and cells[5] == "**13.3**<br>0.76 · 2.67 GB"
    assert cells[3] == cells[4] == cells[6] == cells[7] == "", "python eager, compile and llama.cpp: not recorded"


def test_a_stand_in_is_labelled_and_a_folder_not_in_the_list_described_from_its_records(runs):
    amx = dict(cpu="Intel Xeon", cpu_capability="AVX2", bf16_matmul_hardware="AMX",
               cpu_limits={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    record(runs / "cpu-e2b-amx-avx2", "05_tpu", "2026-01-01T00:00:00+00:00", [row("rust-eager", 3.0)], **amx)
    record(runs / "cpu-e2b-new", "05_tpu", "2026-01-01T00:00:00+00:00", [row("rust-eager", 3.0)], **amx)
    assert "stand-in: an Intel Xeon with AMX" in hooks.cpu_classes_table()
    new = hooks.cpu_class("cpu-e2b-new")
    assert (new.name, new.machine, new.stand_in) == ("AVX2 only", "Intel Xeon", True)


def test_unknown_markers_fail_the_build_and_known_ones_are_replaced(runs):
    record(runs / "cpu-e2b-avx2", "05_tpu", "2026-01-01T00:00:00+00:00", [row("rust-int4", 3.0)])
    with pytest.raises(hooks.PluginError, match="results:nonsense"):
        hooks.generated("text\n<!-- results:nonsense -->\n")
    with pytest.raises(hooks.PluginError, match="did not make"):
        hooks.generated("text <!-- results:cpu-classes --> inside a line\n")
    page = hooks.generated("# Page\n\n<!-- results:cpu-classes -->\n\n<!-- results:machines -->\n", "steps")
    assert "<!--" not in page and page.count("../benchmarks.md#cpu-e2b-avx2") == 2


def test_benchmarks_by_machine_lists_every_record_with_its_header(runs):
    record(runs / "cpu-e2b-avx2", "05_tpu", "2026-01-01T00:00:00+00:00", [])
    record(runs / "cpu-e2b-avx2", "08_budget", "2026-01-03T00:00:00+00:00", [])
    record(runs / "cpu", "01_bridge", "2026-01-01T00:00:00+00:00", [])  # make run's: not a class
    page = hooks.records_page()
    assert "{#cpu-e2b-avx2}" in page and "docs/runs/cpu/" not in page
    assert "| 2026-01-01 | Some CPU, AVX2, 2 cores | python 3.11.7 · torch 2.13.0 |" in page
    assert "per-token budget of a decode step" in page
    assert page.count('--8<-- "docs/runs/cpu-e2b-avx2/') == 2


# -------------------------------------------------------------------------------------------- the records

def test_every_record_folder_is_a_described_cpu_class():
    present = {p.name for p in (REPO / "docs" / "runs").iterdir() if p.is_dir()} - hooks.NOT_CLASSES
    listed = {c.folder for c in hooks.CLASSES}
    assert present <= listed, f"add to CLASSES in tools/mkdocs_hooks.py: {sorted(present - listed)}"
    assert listed <= present, f"CLASSES names folders that are gone: {sorted(listed - present)}"


@pytest.mark.parametrize("c", hooks.CLASSES, ids=lambda c: c.folder)
def test_each_class_agrees_with_its_records_headers(c):
    metas = [json.loads(p.read_text())["meta"] for p in sorted((REPO / "docs" / "runs" / c.folder).glob("*.json"))]
    said = {hooks.class_of_meta(m) for m in metas} - {None}
    assert said == {(c.name, c.stand_in)}, f"{c.folder}: CLASSES says {(c.name, c.stand_in)}, its records {said}"


def home_ways():
    return {f: hooks.class_ways(f) for f in hooks.bench_folders()}


def test_the_home_tables_figures_are_the_records():
    table = hooks.results_table()
    parity = json.loads((REPO / hooks.PARITY).read_text())
    assert f"| greedy tokens the same | {parity['same']} of {parity['of']} |" in table
    assert f"| KL(hf ‖ rust), next token | {parity['kl_hf_rs']:.3g} |" in table
    for folder in hooks.HOME:
        int4 = hooks.class_ways(folder)["rust-int4"]
        assert f"{int4['streamed_tok_s']:.1f} · {int4['peak_gb']:.2f}" in table


def test_the_parity_the_home_page_claims():
    """docs/index.md: 'the same five likeliest next tokens and the same answer' as Transformers."""
    parity = json.loads((REPO / hooks.PARITY).read_text())
    assert parity["top5_rust"]["ids"] == parity["top5_hf"]["ids"]
    assert parity["answers"]["rust"] == parity["answers"]["hf"]
    assert "the same five likeliest next tokens\nand the same answer" in (REPO / "docs" / "index.md").read_text()


def test_rust_int4_beats_llamacpp_on_every_class_recorded():
    """docs/index.md and docs/machines.md: 'faster than llama.cpp on every CPU class recorded'."""
    ratios = {f: w["rust-int4"]["streamed_tok_s"] / w["llamacpp-q4_0"]["streamed_tok_s"]
              for f, w in home_ways().items() if w["rust-int4"] and w["llamacpp-q4_0"]}
    assert ratios and all(r > 1 for r in ratios.values()), ratios
    assert set(ratios) == set(hooks.bench_folders()), "a class without both rows: the pages' 'every class' is wrong"


def test_what_the_machines_page_says_of_the_margins():
    """docs/machines.md: on every class this project's kernels reach a larger fraction of the bandwidth limit than
    llama.cpp's; the margin is smallest on the AMD EPYCs and largest on the Intel Xeons, stand-ins included."""
    ways = home_ways()
    ratio = {f: w["rust-int4"]["streamed_tok_s"] / w["llamacpp-q4_0"]["streamed_tok_s"] for f, w in ways.items()}
    epycs = {f for f in ratio if "AMD EPYC" in hooks.cpu_class(f).machine}
    assert epycs and set(sorted(ratio, key=ratio.get)[:len(epycs)]) == epycs, ratio
    for f, w in ways.items():
        assert w["rust-int4"]["bandwidth_fraction"] > w["llamacpp-q4_0"]["bandwidth_fraction"], f
    text = " ".join((REPO / "docs" / "machines.md").read_text().split())
    assert "The margin is smallest on the AMD EPYCs, and largest on the Intel Xeons" in text


def test_the_int4_kernel_each_class_ran_is_the_one_the_machines_page_names():
    kernels = {hooks.cpu_class(f).name: set() for f in hooks.bench_folders()}
    for f, w in home_ways().items():
        kernels[hooks.cpu_class(f).name].add(hooks.int4_kernel(w["rust-int4"]))
    assert kernels == {"AVX2 only": {"fma4"}, "AVX-512 without bf16": {"fma4"}, "AVX512-BF16": {"dot4"},
                       "AMX": {"dot4"}}
    text = (REPO / "docs" / "machines.md").read_text()
    for name, kernel in (("AVX2 only", "fma4"), ("AVX-512 without bf16", "fma4"), ("AVX512-BF16", "dot4"),
                         ("AMX", "dot4")):
        assert re.search(rf"\| {re.escape(name)} \| `{kernel}` \|", text), name
