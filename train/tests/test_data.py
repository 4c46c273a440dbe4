"""The training data: step 06's prompt format to the token, targets only on answers, the same batches for the
same (seed, step)."""
import random

import data
import torch


def test_pieces_tokenize_as_the_whole_text(tokenizer):
    """The encoder tokenizes piece by piece (memoized); the pieces must join to the tokens of the whole text."""
    enc = data.Encoder(tokenizer)
    e = data.episode(enc, random.Random(3), 12, lookups=3, copies=2)
    text = tokenizer.decode(e.ids[1:])  # everything after <bos>, <eos> included as text
    whole = []
    for part in text.split("<eos>"):
        whole += tokenizer.encode(part, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert [enc.bos] + whole[:-1] == e.ids
    assert tokenizer.unk_token_id not in e.ids


def test_lookup_prompt_is_step_06s_prompt(tokenizer):
    from torchtpu_longprompt import haystack

    enc = data.Encoder(tokenizer)
    e = data.lookup_example(enc, random.Random(7), 30)
    text = tokenizer.decode(e.prompt[1:])  # "Record 1: code 482913. … What is the code of record K? Answer:"
    codes = [part.split("code ")[1].rstrip(".") for part in text.split(" What is")[0].split(". ")]
    asked = int(text.rsplit("record ", 1)[1].split("?")[0])
    assert e.prompt == haystack._encode(tokenizer, *haystack._text(codes, asked))
    assert e.expected == codes[asked - 1]
    assert tokenizer.decode(e.answer) == " " + e.expected + "<eos>"


def test_targets_are_the_answers_only(tokenizer):
    enc = data.Encoder(tokenizer)
    e = data.episode(enc, random.Random(1), 5, lookups=2, copies=1)
    targets = [t for t, label in zip(e.ids, e.labels) if label != data.IGNORE]
    assert targets == [label for label in e.labels if label != data.IGNORE]
    assert targets.count(tokenizer.eos_token_id) == 3  # every answer ends with <eos>
    answer_text = tokenizer.decode(targets)
    assert "What" not in answer_text and "Answer" not in answer_text and "Record 1: code" in tokenizer.decode(e.ids)


def test_batches_depend_only_on_seed_and_step(tokenizer):
    enc = data.Encoder(tokenizer)
    a = data.batch(enc, 0, 17, cap=20, tokens=2048)
    b = data.batch(data.Encoder(tokenizer), 0, 17, cap=20, tokens=2048)
    c = data.batch(enc, 0, 18, cap=20, tokens=2048)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0][0, :20], c[0][0, :20]) or a[0].shape != c[0].shape
    ids, labels = a
    assert ids.shape == labels.shape and ids.shape[0] * ids.shape[1] <= 2048 + ids.shape[1]
    assert (labels[ids == 0] == data.IGNORE).all()  # padding is never a target


def test_curriculum_adds_records_once_answers_are_right():
    w = data.WINDOW
    assert data.next_cap(2, [1.0] * (w - 1), 0.9) == (2, [1.0] * (w - 1))  # not a full window yet
    assert data.next_cap(2, [0.85] * w, 0.9) == (2, [0.85] * w)
    assert data.next_cap(2, [0.0] * 5 + [1.0] * w, 0.9) == (3, [])  # only the last WINDOW steps count
    assert data.next_cap(data.FOUND - 1, [0.85] * w, 0.9)[0] == data.FOUND - 1  # one at a time, at 0.9
    assert data.next_cap(data.FOUND - 1, [0.9] * w, 0.9) == (data.FOUND, [])
    assert data.next_cap(24, [0.85] * w, 0.9) == (30, [])  # past FOUND: a quarter more, at 0.8
    assert data.next_cap(24, [0.75] * w, 0.9)[0] == 24
    assert data.next_cap(46, [1.0] * w, 0.9) == (data.MAX_RECORDS, [])
    assert data.next_cap(data.MAX_RECORDS, [1.0] * w, 0.9)[0] == data.MAX_RECORDS
