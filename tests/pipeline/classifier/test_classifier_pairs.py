"""Pair examples (classifier.task=pair) for the reranker K(d, q) of PAIRS Eq. (7)."""

from __future__ import annotations

import random

from pipeline.classifier.data import PAIR_DISTRACTOR, PAIR_GOLD, Record, build_pair_examples, make_splits


def _record(qid: str, n_gold: int, n_other: int) -> Record:
    docs = tuple(f"{qid} gold {i}" for i in range(n_gold)) + tuple(f"{qid} other {i}" for i in range(n_other))
    return Record(qid, "hotpotqa", f"question {qid}?", docs, (True,) * n_gold + (False,) * n_other)


def test_pairs_are_one_to_one_supporting_vs_other():
    r = _record("q1", 2, 8)
    exs = build_pair_examples(r, random.Random(0))
    pos = [e for e in exs if e.label == 1]
    neg = [e for e in exs if e.label == 0]
    assert len(pos) == len(neg) == 2
    assert {e.doc1 for e in pos} == {"q1 gold 0", "q1 gold 1"} and all(e.kind == PAIR_GOLD for e in pos)
    assert all("other" in e.doc1 and e.kind == PAIR_DISTRACTOR for e in neg)
    assert all(e.item == (r.question, e.doc1) for e in exs)  # a pair, not a triple


def test_pairs_limited_by_the_smaller_side_and_empty_without_gold():
    assert len(build_pair_examples(_record("q", 3, 1), random.Random(0))) == 2
    assert build_pair_examples(_record("q", 0, 5), random.Random(0)) == []


def test_make_splits_pair_task_splits_by_question():
    recs = [_record(f"q{i}", 2, 4) for i in range(10)]
    s = make_splits(recs, seed=1, dev_fraction=0.2, task="pair")
    assert s.summary["task"] == "pair"
    assert len(s.train) == 32 and len(s.dev) == 8
    assert not {e.qid for e in s.train} & {e.qid for e in s.dev}
    assert all(len(e.item) == 2 for e in s.train + s.dev)
    # the default task is unchanged: triples
    assert all(len(e.item) == 3 for e in make_splits(recs, seed=1).train)
