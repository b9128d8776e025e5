"""DR-RAG classifier examples (Eq. 2, App. A.1) from hand-written official-format records."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from pipeline.classifier.data import (
    DISTRACTOR_DISTRACTOR,
    DISTRACTOR_GOLD,
    GOLD_DISTRACTOR,
    POSITIVE,
    ClassifierDataError,
    Record,
    build_examples,
    canonical_name,
    format_document,
    load_records,
    make_splits,
    read_musique,
    read_official,
)

HOTPOT = [
    {
        "_id": "q1",
        "question": "Which city hosts the museum founded by the author of Book X?",
        "answer": "Paris",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [["Book X", 0], ["Museum Y", 1], ["Book X", 1]],
        "context": [
            ["Book X", ["Book X is a novel by Ann Author.", " Ann founded Museum Y."]],
            ["Museum Y", ["Museum Y is a museum.", "It is in Paris."]],
            ["Noise A", ["Noise A is about rivers."]],
            ["Noise B", ["Noise B is about trains."]],
            ["Noise C", ["Noise C is about bread."]],
            ["Noise A", ["A second paragraph with a repeated title."]],
        ],
    }
]


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_official_reader_documents_and_gold(tmp_path):
    (r,) = read_official(_write(tmp_path, "h.json", HOTPOT), "hotpotqa")
    assert r.qid == "q1" and r.dataset == "hotpotqa"
    # a repeated title keeps its first paragraph, as the official readers do; sentences are joined
    assert r.docs == (
        "Book X: Book X is a novel by Ann Author. Ann founded Museum Y.",
        "Museum Y: Museum Y is a museum. It is in Paris.",
        "Noise A: Noise A is about rivers.",
        "Noise B: Noise B is about trains.",
        "Noise C: Noise C is about bread.",
    )
    assert r.gold == (True, True, False, False, False)


def test_examples_follow_eq2_exactly(tmp_path):
    (r,) = read_official(_write(tmp_path, "h.json", HOTPOT), "hotpotqa")
    bx, my, na, nb, nc = r.docs
    exs = build_examples(r, random.Random(0), mixed_fraction=0.5)
    pos = {(e.doc1, e.doc2) for e in exs if e.label == 1}
    # C(q, d*, d*) = positive: the two supporting documents, in both orders, and nothing else
    assert pos == {(bx, my), (my, bx)}
    assert all(e.kind == POSITIVE for e in exs if e.label == 1)
    neg = [e for e in exs if e.label == 0]
    # sampled 1:1 (App. A.1): as many negatives as positives
    assert len(neg) == len(pos) == 2
    kinds = Counter(e.kind for e in neg)
    assert kinds[DISTRACTOR_DISTRACTOR] == 1 and kinds[GOLD_DISTRACTOR] + kinds[DISTRACTOR_GOLD] == 1
    for e in neg:  # every negative is exactly one of Eq. 2's negative forms
        g1, g2 = e.doc1 in (bx, my), e.doc2 in (bx, my)
        assert (g1, g2) != (True, True)
        assert (
            e.kind
            == {(True, False): GOLD_DISTRACTOR, (False, True): DISTRACTOR_GOLD, (False, False): DISTRACTOR_DISTRACTOR}[
                (g1, g2)
            ]
        )
        assert e.doc1 != e.doc2
    assert all(e.question == r.question and e.item[0] == r.question for e in exs)


def test_mixed_fraction_extremes_and_determinism():
    r = Record("q", "x", "Q?", tuple(f"d{i}" for i in range(6)), (True, True, True, False, False, False))
    only_mixed = build_examples(r, random.Random(1), mixed_fraction=1.0)
    assert Counter(e.label for e in only_mixed) == {1: 6, 0: 6}  # 3 supporting -> 6 ordered positives
    assert all(e.kind in (GOLD_DISTRACTOR, DISTRACTOR_GOLD) for e in only_mixed if e.label == 0)
    only_dd = build_examples(r, random.Random(1), mixed_fraction=0.0)
    assert all(e.kind == DISTRACTOR_DISTRACTOR for e in only_dd if e.label == 0)
    assert build_examples(r, random.Random(7)) == build_examples(r, random.Random(7))


def test_ratio_kept_when_distractors_are_few():
    # 3 supporting and 1 distractor: 6 positives but only 6 mixed and 0 distractor pairs -> 6 negatives
    r = Record("q", "x", "Q?", ("a", "b", "c", "z"), (True, True, True, False))
    exs = build_examples(r, random.Random(0))
    assert Counter(e.label for e in exs) == {1: 6, 0: 6}
    # one supporting document: no positive exists, so the question gives no examples
    assert build_examples(Record("q", "x", "Q?", ("a", "z", "y"), (True, False, False)), random.Random(0)) == []


def test_musique_reader(tmp_path):
    rows = [
        {
            "id": "2hop_1",
            "question": "Q?",
            "answer": "A",
            "paragraphs": [
                {"idx": 0, "title": "T0", "paragraph_text": "zero", "is_supporting": False},
                {"idx": 1, "title": "T1", "paragraph_text": "one", "is_supporting": True},
                {"idx": 2, "title": "T1", "paragraph_text": "one", "is_supporting": False},  # duplicate text
                {"idx": 3, "title": "T1", "paragraph_text": "other part of T1", "is_supporting": True},
            ],
        }
    ]
    (r,) = read_musique(_write(tmp_path, "m.json", rows))
    assert r.docs == ("T0: zero", "T1: one", "T1: other part of T1") and r.gold == (False, True, True)


def test_split_by_question_never_leaks_and_is_deterministic():
    recs = [
        Record(
            f"q{i}",
            "ds" if i % 2 else "other",
            f"question {i}?",
            tuple(f"q{i}-d{j}" for j in range(6)),
            (True, True, False, False, False, False),
        )
        for i in range(40)
    ]
    s1 = make_splits(recs, seed=3, dev_fraction=0.25)
    s2 = make_splits(recs, seed=3, dev_fraction=0.25)
    assert s1.train == s2.train and s1.dev == s2.dev
    train_q, dev_q = {e.qid for e in s1.train}, {e.qid for e in s1.dev}
    assert not train_q & dev_q and len(train_q | dev_q) == 40
    assert len(dev_q) == 10  # 25% of each dataset's 20 questions
    assert {e.dataset for e in s1.dev} == {"ds", "other"}
    assert sum(e.label for e in s1.train) * 2 == len(s1.train)
    assert make_splits(recs, seed=4, dev_fraction=0.25).dev != s1.dev
    capped = make_splits(recs, seed=3, max_examples=30)
    assert len(capped.train) + len(capped.dev) <= 30 and len(capped.train) % 4 == 0  # whole questions only


def test_names_and_missing_files(tmp_path):
    assert canonical_name("2WikiMultihopQA") == "2wiki" and canonical_name(" hotpot ") == "hotpotqa"
    with pytest.raises(ClassifierDataError, match="unknown training dataset 'nq'"):
        load_records(tmp_path, ["hotpotqa", "nq"])
    with pytest.raises(ClassifierDataError, match="data folder not found"):
        load_records(tmp_path / "absent", ["hotpotqa"])
    with pytest.raises(ClassifierDataError, match="training file not found"):
        load_records(tmp_path, ["musique"])
    _write(tmp_path, "bad.json", {"not": "a list"})
    with pytest.raises(ClassifierDataError, match="expected a list"):
        read_official(tmp_path / "bad.json", "hotpotqa")


def test_format_document():
    assert format_document(" Title ", " text ") == "Title: text"
    assert format_document("", "text") == "text"


def test_real_train_files_give_balanced_examples(data_dir):
    recs = load_records(data_dir, ["hotpotqa", "2wiki", "musique"])
    assert {r.dataset for r in recs} == {"hotpotqa", "2wiki", "musique"}
    s = make_splits(recs, seed=0, max_per_dataset=2300)
    for part in (s.train, s.dev):
        assert sum(e.label for e in part) * 2 == len(part)
    assert not {(e.dataset, e.qid) for e in s.train} & {(e.dataset, e.qid) for e in s.dev}
    # App. A.1's ~2300 per dataset (train + dev)
    assert s.summary["train"]["by_dataset"]["2wiki"] + s.summary["dev"]["by_dataset"]["2wiki"] <= 2300


def test_a_datasets_split_does_not_depend_on_the_others():
    def recs(ds, n):
        return [
            Record(f"{ds}{i}", ds, "Q?", tuple(f"{ds}{i}-{j}" for j in range(5)), (True, True, False, False, False))
            for i in range(n)
        ]

    alone = make_splits(recs("a", 20), seed=1)
    mixed = make_splits(recs("b", 30) + recs("a", 20), seed=1)
    assert {e.qid for e in alone.dev} == {e.qid for e in mixed.dev if e.dataset == "a"}
