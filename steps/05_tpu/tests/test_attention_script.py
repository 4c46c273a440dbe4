"""attention.py: both dtypes timed on this CPU and on it limited to AVX2, where the default turns to float32."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "attention.py"
spec = importlib.util.spec_from_file_location("attention", SCRIPT)
attention = importlib.util.module_from_spec(spec)
spec.loader.exec_module(attention)


def test_it_times_both_dtypes_here_and_limited_to_avx2(tmp_path):
    out = tmp_path / "attention.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--slots", "64,512", "--repeat", "2", "--json", str(out)],
                          capture_output=True, text=True, check=True)
    runs = json.loads(out.read_text())["runs"]
    avx2 = runs["limited to AVX2"]
    assert avx2["cpu_capability"] == "AVX2" and not avx2["fast_bf16_matmul"] and avx2["default"] == "float32"
    for run in runs.values():
        assert [r["slots"] for r in run["rows"]] == [64, 512]
        assert all(r["bfloat16_ms"] > 0 and r["float32_ms"] > 0 for r in run["rows"])
    assert len(proc.stdout.splitlines()) == 2 + 2 * 2


@pytest.mark.parametrize("flags, error", [
    (["--slots", "64,0"], "argument --slots: '0': not a whole number of at least 1"),
    (["--slots", "64,x,-3"], "argument --slots: 'x', '-3': not a whole number"),
    (["--repeat", "0"], "--repeat 0: at least 1"),
    (["--json", "/no/such/folder/a.json"], "argument --json: /no/such/folder/a.json: the folder /no/such/folder"),
])
def test_bad_flags_are_refused_before_anything_is_timed(monkeypatch, capsys, flags, error):
    monkeypatch.setattr(attention, "measure", lambda *a: pytest.fail("measured despite a bad flag"))
    monkeypatch.setattr(sys, "argv", ["attention.py", *flags])
    with pytest.raises(SystemExit) as stop:
        attention.main()
    assert stop.value.code == 2 and error in capsys.readouterr().err
