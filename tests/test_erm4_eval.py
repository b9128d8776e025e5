"""The ERM4 evaluation job's pieces: the second set of similar questions and the Table 2 time saving."""

import json

from jobs.eval.erm4 import paraphrase, render_table2, second_set
from pipeline.config import DynragConfig
from pipeline.io.datasets import load_questions


def test_second_set_rephrases_each_first_set_question_keeping_answers(data_dir, tmp_path):
    dev = data_dir / "hotpotqa" / "dev_400.jsonl"
    cfg = DynragConfig()
    out = second_set(cfg, str(dev), 5, tmp_path / "similar.jsonl")
    firsts = list(load_questions(str(dev), cfg))[:5]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"{q.id}-para" for q in firsts]
    for i, (r, q) in enumerate(zip(rows, firsts)):
        assert q.question in r["question"] and r["question"] != q.question
        assert r["question"] == paraphrase(q.question, i) and r["answers"] == q.answers
    # the file loads back as questions with the same gold answers
    again = list(load_questions(str(out), cfg))
    assert [q.answers for q in again] == [q.answers for q in firsts]


def test_table2_reports_the_saving_at_the_fastest_tau_against_tau_one():
    def row(tau, t, hit):
        return {"tau": tau, "time_s": t, "retrieval_s": 0.01, "wall_s": t, "external": 1.0, "memory": 2.0,
                "irrelevant": 0.5, "hit_rate": hit, "f1": hit, "llm_calls": 5.0}

    first = {"questions": 3, "reservoir": 9, "time_s": 2.0, "hit_rate": 0.5}
    text = render_table2([first, row(0.2, 6.0, 0.4), row(0.6, 4.0, 0.5), row(1.0, 8.0, 0.5)])
    assert "Fastest tau = 0.6: 4.00 s/q against 8.00 s/q at tau = 1.0, a time saving of 50.0%" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| 0") or line.startswith("| 1")] \
        == ["| 0.2", "| 0.6", "| 1.0"]
