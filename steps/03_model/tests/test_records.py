"""A record's header says where it ran — and, when torch was told to use less of the CPU than it has, says so."""
from torchtpu_rs import records


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
    meta = records.meta("cpu")
    assert meta["cpu_limits"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert "(limited: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)" in records.header(meta)
    assert records.env_prefix(meta["cpu_limits"]) == "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
    assert records.env_prefix({}) == ""
