"""A smoke run of the trainer: the answer loss goes down, the 4-bit phase runs, and a run stopped midway and
resumed ends with exactly the weights of an uninterrupted one."""
import importlib.util
import json
from pathlib import Path

import data
import pytest
import torch

# train/train.py by its path: in the whole suite the name `train` is the repository's train/ folder
_spec = importlib.util.spec_from_file_location("trainer", Path(__file__).resolve().parents[1] / "train.py")
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)

# one thread: a smoke run's tiny products gain nothing from a second, and on a busy machine its threads wait on each
# other (ten minutes against half a minute)
SMOKE = ["--steps", "40", "--tokens", "768", "--warmup", "10", "--qat", "0.75", "--threads", "1"]


def weights(folder):
    return torch.load(folder / "model.pt", weights_only=False)["model"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    train.main([*SMOKE, "--out", str(out)])
    return out


def test_loss_goes_down_and_the_last_phase_is_4_bit(straight):
    log = json.loads((straight / "log.json").read_text())
    steps = log["steps"]
    assert len(steps) == 40 and log["meta"]["device"] == "cpu"
    first, last = [sum(e["loss"] for e in steps[i:i + 8]) / 8 for i in (0, 32)]
    assert last < 0.6 * first
    assert [e["qat"] for e in steps].index(True) == 30
    assert all(k.count("parametrizations") == 0 for k in weights(straight))  # exported as float weights


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(straight, tmp_path, monkeypatch):
    batch = data.batch

    def stop_at_step_33(enc, seed, step, *args, **kwargs):  # past the start of the 4-bit phase
        if step == 33:
            raise KeyboardInterrupt
        return batch(enc, seed, step, *args, **kwargs)

    monkeypatch.setattr(data, "batch", stop_at_step_33)
    with pytest.raises(KeyboardInterrupt):
        train.main([*SMOKE, "--out", str(tmp_path), "--save-every", "0"])
    assert torch.load(tmp_path / "ckpt.pt", weights_only=False)["step"] == 33
    monkeypatch.setattr(data, "batch", batch)
    train.main([*SMOKE, "--out", str(tmp_path), "--save-every", "0"])
    ours, theirs = weights(tmp_path), weights(straight)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_run_with_other_settings_is_not_resumed(straight):
    with pytest.raises(SystemExit, match="other settings"):
        train.main([*SMOKE[:-2], "--threads", "2", "--out", str(straight)])
