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


def test_the_header_names_the_bf16_matmul_hardware_torch_does_not():
    # torch reports AVX512 on an AMX Xeon and on an AMD EPYC alike; bf16 matmul runs at very different rates
    flags = records._cpuinfo("flags").split()
    expected = "AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None
    meta = records.meta("cpu")
    assert meta["bf16_matmul_hardware"] == expected
    first = records.header({**meta, "bf16_matmul_hardware": "AMX"}).splitlines()[0]
    assert f", {meta['cpu_capability']}, AMX, {meta['cores']} cores)" in first
    assert "AMX" not in records.header({**meta, "bf16_matmul_hardware": None}).splitlines()[0]
