"""A record's header says where it ran — and, when torch was told to use less of the CPU than it has, says so; its
JSON is written whole or not at all, to a folder the flags checked."""
import argparse
import json

import pytest
from torchtpu_rs import cli, records


def test_a_plain_run_names_the_cpu_and_no_limits(monkeypatch):
    for key in records.CPU_LIMITS:
        monkeypatch.delenv(key, raising=False)
    meta = records.meta("cpu")
    assert "cpu_limits" not in meta
    first = records.header(meta).splitlines()[0]
    assert first.startswith(f"# recorded {meta['date'][:10]} on cpu (")
    assert meta["cpu_capability"] in first and "limited" not in first


def test_a_run_limited_to_avx2_says_so_as_a_command_prefix(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)  # make test's AVX2 tier sets it: set it below
    meta = records.meta("cpu")
    assert meta["cpu_limits"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert "(limited: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)" in records.header(meta)
    assert records.env_prefix(meta["cpu_limits"]) == "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
    assert records.env_prefix({}) == ""
    # MKL's own switch (it reads neither of the others) is a limit too, named in the same order
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert records.env_prefix(records.meta("cpu")["cpu_limits"]) == (
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ")


@pytest.mark.parametrize("flags, hardware", [("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AMX"),
                                             ("fpu avx2 avx512f avx512_bf16", "AVX512-BF16"),
                                             ("fpu avx2 fma", None)])
def test_the_header_names_the_bf16_matmul_hardware_torch_does_not(monkeypatch, flags, hardware):
    # torch reports AVX512 on an AMX Xeon and on an AMD EPYC alike; their bf16 matmuls run at very different rates
    for key in records.CPU_LIMITS:  # a run limited to AVX2 (make test's second tier) adds "(limited: …)"
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(records, "_cpuinfo", lambda field: flags if field == "flags" else "Some CPU")
    meta = records.meta("cpu")
    assert meta["bf16_matmul_hardware"] == hardware
    first = records.header(meta).splitlines()[0]
    assert first.endswith(f"(Some CPU, {meta['cpu_capability']}{f', {hardware}' if hardware else ''}, "
                          f"{meta['cores']} cores)")


def test_cpuinfo_reads_this_machines_model_and_flags():
    assert records.cpu_model() != "unknown" and records._cpuinfo("flags")


def test_write_json_leaves_the_old_file_when_it_cannot_write_the_new_one(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"old": true}')
    with pytest.raises(TypeError):
        records.write_json(str(path), "cpu", rows=[object()])  # JSON cannot hold it
    assert path.read_text() == '{"old": true}' and list(tmp_path.iterdir()) == [path]
    records.write_json(str(path), "cpu", rows=[1])
    written = json.loads(path.read_text())
    assert written["rows"] == [1] and written["meta"]["device"] and list(tmp_path.iterdir()) == [path]


def test_a_json_path_in_a_folder_that_is_not_there_is_refused_as_the_flags_are_parsed(tmp_path, capsys):
    ap = argparse.ArgumentParser()
    cli.add_engine_args(ap)
    assert ap.parse_args(["--json", str(tmp_path / "run.json")]).json == str(tmp_path / "run.json")
    with pytest.raises(SystemExit) as stop:
        ap.parse_args(["--json", str(tmp_path / "nowhere" / "run.json")])
    assert stop.value.code == 2 and f"the folder {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
