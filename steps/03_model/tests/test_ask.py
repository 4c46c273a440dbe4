"""ask.py, the streaming script: the shipped model's reply printed as it is made, the right code for the default
prompt, the same sampled reply for the same seed, and its JSON record. Run in this process (its `main(argv)`),
so torch and Transformers load once."""
import importlib.util
import json
from pathlib import Path

spec = importlib.util.spec_from_file_location("ask", Path(__file__).resolve().parents[1] / "ask.py")
ask_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ask_script)


def ask(capsys, *args: str) -> str:
    capsys.readouterr()
    ask_script.main(["--device", "cpu", *args])
    return capsys.readouterr().out


def test_the_default_prompt_gets_the_right_code(capsys, tmp_path):
    out = ask(capsys, "--json", str(tmp_path / "ask.json"))
    assert out.rstrip().endswith("Answer: 705126"), out  # record 2 of the default prompt
    record = json.loads((tmp_path / "ask.json").read_text())
    assert record["reply"].strip() == "705126" and record["meta"]["device"] == "cpu"


def test_sampling_with_a_seed_repeats_and_a_question_can_be_given(capsys):
    # temperature 2: on a record the prompt lacks the trained model is sure of its guess at temperature 1 (every
    # seed tried gave the greedy reply), so the draws are flattened until other seeds can make other guesses
    missing = "Record 1: code 482913. Record 2: code 705126. What is the code of record 9? Answer:"
    sampled = ask(capsys, "--temperature", "2.0", "--seed", "7", missing)
    assert sampled == ask(capsys, "--temperature", "2.0", "--seed", "7", missing)
    assert sampled != ask(capsys, "--temperature", "2.0", "--seed", "8", missing) or \
        sampled != ask(capsys, "--temperature", "2.0", "--seed", "9", missing), "other seeds, other guesses"
    question = "Record 1: code 111111. Record 2: code 222222. What is the code of record 1? Answer:"
    assert ask(capsys, question).rstrip().endswith("Answer: 111111")
