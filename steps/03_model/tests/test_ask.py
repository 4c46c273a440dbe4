"""ask.py, the streaming script: the shipped model's reply printed as it is made, the right code for the default
prompt, the same sampled reply for the same seed, and its JSON record."""
import json
import subprocess
import sys
from pathlib import Path

ASK = Path(__file__).resolve().parents[1] / "ask.py"


def ask(*args: str, json_path: Path | None = None) -> str:
    extra = ["--json", str(json_path)] if json_path else []
    out = subprocess.run([sys.executable, str(ASK), "--device", "cpu", *args, *extra], capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_the_default_prompt_gets_the_right_code(tmp_path):
    out = ask(json_path=tmp_path / "ask.json")
    assert out.rstrip().endswith("Answer: 705126"), out  # record 2 of the default prompt
    record = json.loads((tmp_path / "ask.json").read_text())
    assert record["reply"].strip() == "705126" and record["meta"]["device"] == "cpu"


def test_sampling_with_a_seed_repeats_and_a_question_can_be_given():
    sampled = ask("--temperature", "1.5", "--top-k", "40", "--seed", "7")
    assert sampled == ask("--temperature", "1.5", "--top-k", "40", "--seed", "7")
    question = "Record 1: code 111111. Record 2: code 222222. What is the code of record 1? Answer:"
    assert ask(question).rstrip().endswith("Answer: 111111")
