"""attention.py: both dtypes timed on this CPU and on it limited to AVX2, where the default turns to float32."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "attention.py"


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
