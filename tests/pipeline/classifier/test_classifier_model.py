"""Input formatting and truncation of the cross-encoder C(q, d1, d2) / C(q, d)."""

from __future__ import annotations

import pytest

from pipeline.classifier.model import ClassifierError, InputEncoder, fair_share


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    from transformers import AutoTokenizer

    from pipeline.assets.models import is_prepared, resolve_model

    if not is_prepared("all-minilm-l6-v2", cache_dir):
        pytest.skip("all-minilm-l6-v2 is not prepared (dynrag models prepare all-minilm-l6-v2)")
    return AutoTokenizer.from_pretrained(resolve_model("all-minilm-l6-v2", cache_dir))


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_fair_share():
    assert fair_share([3, 100], 50) == [3, 47]  # the short one keeps all, the long one takes the rest
    assert fair_share([100, 100], 50) == [25, 25]
    assert fair_share([100, 3], 50) == [47, 3]
    assert fair_share([10, 20], 100) == [10, 20]
    assert fair_share([10], 4) == [4]
    assert fair_share([5, 5], -3) == [0, 0]


def test_triple_and_pair_layout(tokenizer):
    enc = InputEncoder(tokenizer, max_length=128, max_query_tokens=32)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    q, d1, d2 = _ids(tokenizer, "who wrote it?"), _ids(tokenizer, "Book: a novel."), _ids(tokenizer, "Ann: an author.")
    ids, types = enc.encode_one(("who wrote it?", "Book: a novel.", "Ann: an author."))
    # [CLS] q [SEP] d1 [SEP] d2 [SEP]; the question is segment A, both documents segment B
    assert ids == [cls] + q + [sep] + d1 + [sep] + d2 + [sep]
    assert types == [0] * (len(q) + 2) + [1] * (len(d1) + len(d2) + 2)
    ids, types = enc.encode_one(("who wrote it?", "Book: a novel."))
    assert ids == [cls] + q + [sep] + d1 + [sep]
    assert types == [0] * (len(q) + 2) + [1] * (len(d1) + 1)


def test_truncation_keeps_structure_and_shares_room(tokenizer):
    enc = InputEncoder(tokenizer, max_length=64, max_query_tokens=10)
    sep = tokenizer.sep_token_id
    long_q = " ".join(f"word{i}" for i in range(50))
    long_doc = " ".join(["alpha"] * 200)
    short_doc = "beta gamma"
    ids, types = enc.encode_one((long_q, long_doc, short_doc))
    assert len(ids) == len(types) == 64
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == sep
    assert ids[1:11] == _ids(tokenizer, long_q)[:10] and ids[11] == sep  # question capped at 10 tokens
    # the short document is kept whole, the long one gets the rest: 64 - 4 specials - 10 - 2
    seps = [i for i, t in enumerate(ids) if t == sep]
    assert len(seps) == 3
    assert ids[seps[1] + 1 : seps[2]] == _ids(tokenizer, short_doc)
    assert seps[1] - seps[0] - 1 == 64 - 4 - 10 - len(_ids(tokenizer, short_doc))
    # two long documents: equal shares
    ids, _ = enc.encode_one(("q", long_doc, long_doc))
    seps = [i for i, t in enumerate(ids) if t == sep]
    assert len(ids) == 64 and abs((seps[1] - seps[0]) - (seps[2] - seps[1])) <= 1  # 59 tokens: 29 + 30


def test_batch_padding_and_bad_items(tokenizer):
    enc = InputEncoder(tokenizer, max_length=32, max_query_tokens=8)
    batch = enc.batch([("a question", "doc"), ("q", "a much longer document " * 3, "d2")])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["token_type_ids"].shape
    assert batch["attention_mask"][0].sum() < batch["attention_mask"][1].sum()
    assert int(batch["input_ids"][0, -1]) == tokenizer.pad_token_id
    for bad in [("only one",), ("q", "d1", "d2", "d3"), ("q", 5)]:
        with pytest.raises(ClassifierError):
            enc.encode_one(bad)
