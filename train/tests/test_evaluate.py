"""How evaluate.py judges an answer: teacher-forced greedy tokens against the expected ones, and what a miss does."""
import data
import evaluate
import torch

EOS = 1


def greedy_as(tokens_after_prompt, prompt):
    """A logits function whose argmax after the prompt is `tokens_after_prompt` (one-hot logits, vocab 10)."""
    def logits_fn(ids):
        out = torch.zeros(*ids.shape, 10)
        for t, token in enumerate(tokens_after_prompt):
            out[:, len(prompt) - 1 + t, token] = 1.0
        return out
    return logits_fn


def test_each_kind_of_miss_is_named():
    prompt = [2, 3, 4]
    example = data.Example(prompt, [5, 6, EOS], records=1, expected="5 6")
    cases = {"right": [5, 6, EOS], "stopped early": [5, EOS, EOS], "ran on": [5, 6, 7], "wrong token": [5, 8, EOS]}
    for verdict, greedy in cases.items():
        assert evaluate.verdicts(greedy_as(greedy, prompt), [example]) == [verdict], greedy
        assert evaluate.right(greedy_as(greedy, prompt), [example]) == [verdict == "right"]
