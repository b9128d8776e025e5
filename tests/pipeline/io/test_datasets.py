"""Dataset loaders on the real files, and bad input rows that become error rows."""

from __future__ import annotations

import json

import polars as pl
import pytest
from fakes import RecordingGenerator

from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.io import datasets
from pipeline.io.datasets import DatasetError, load_questions, pending_questions
from pipeline.io.id_set import IdSet
from pipeline.runtime.answer import run_answer

FILES = {
    "hotpotqa/dev_400.jsonl": ("hotpotqa", True),
    "hotpotqa/train_100.json": ("hotpotqa", True),
    "2wikimultihopqa/dev_124.jsonl": ("2wikimultihopqa", True),
    "musique/dev_150.jsonl": ("musique", True),
    "nq_open/dev_3610.jsonl": ("nq_open", False),
    "triviaqa/sample_150.json": ("triviaqa", False),
    "popqa/test_14267.jsonl": ("popqa", False),
    "webquestions/test_2032.jsonl": ("webquestions", False),
    "squad/dev_qa_10570.jsonl": ("squad", False),
    "strategyqa/sample_229.jsonl": ("strategyqa", False),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_real_files_load(data_dir, kit_records, name):
    (dataset, multihop), n = FILES[name], kit_records[name]  # every record of the file (kit or fixture kit)
    qs = list(load_questions(str(data_dir / name)))
    assert len(qs) == n and not [q for q in qs if q.error]
    assert {q.dataset for q in qs} == {dataset}
    assert all(q.question and q.answers for q in qs)
    assert len({q.id for q in qs}) == n
    assert all(q.supporting_titles for q in qs) == multihop


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_resume_reads_an_answered_record_no_further_than_its_id(data_dir, name, monkeypatch):
    """`answered`: a record whose own id a resumed run has is not parsed, and the run's pending questions and
    skips are those of a full read (each format's id fields are those its parser reads)."""
    path = str(data_dir / name)
    qs = list(load_questions(path))
    done = IdSet(q.id for q in qs[::2])
    parsed: list[int] = []
    for fmt, parse in list(datasets.PARSERS.items()):
        monkeypatch.setitem(datasets.PARSERS, fmt, lambda r, parse=parse: parsed.append(1) or parse(r))
    counts: dict[str, int] = {}
    resumed = list(pending_questions(load_questions(path, answered=done), done, None, counts))
    assert len(parsed) == len(qs) - len(done)
    assert [q.to_dict() for q in resumed] == [q.to_dict() for q in qs[1::2]]
    assert counts == {"skipped": len(done)}


def test_a_resume_keeps_duplicates_bad_lines_and_the_limit_of_a_full_read(tmp_path):
    rows = [{"id": i, "question": f"q {i}?", "answer": ["x"]} for i in ("a", "b", "a", "dynrag:x", "c", "b", "d")]
    lines = [json.dumps(r) for r in rows]
    lines.insert(3, "{not json")
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(lines) + "\n")
    done = IdSet(["a", "b", "dynrag:dup2-a", "dynrag:line-4", "c"])
    for limit in (2, 4, 6, None):
        full: dict[str, int] = {}
        fast: dict[str, int] = {}
        want = [q.to_dict() for q in pending_questions(load_questions(str(f)), done, limit, full)]
        got = [q.to_dict() for q in pending_questions(load_questions(str(f), answered=done), done, limit, fast)]
        assert got == want and fast == full, limit
    assert [q["id"] for q in want] == ["dynrag:line-5", "dynrag:dup2-b", "d"]  # a kept prefix's id: line 5


def test_known_record_fields(data_dir):
    q = next(load_questions(str(data_dir / "hotpotqa/dev_400.jsonl")))
    assert q.id == "5a8c7595554299585d9e36b6" and q.answers == ["Chief of Protocol"]
    assert set(q.supporting_titles) == {"Shirley Temple", "Kiss and Tell (1945 film)"}
    m = next(load_questions(str(data_dir / "musique/dev_150.jsonl")))
    assert m.answers[0] == "Stanley" and len(m.supporting_titles) == 2


def test_dpr_topics_lines_parse_defensively(tmp_path):
    f = tmp_path / "topics.txt"
    # the second and third lines are as in the DPR TriviaQA test topics: CSV-quoted, not Python literals
    f.write_text(
        "who sang it?\t['The Beatles', 'Beatles']\n"
        'which anthem?\t"[\'Zadok The Priest\', \'""""""Zadok the Priest""""""\']"\n'
        'which album?\t"[\'""Michael Jackson\\\'s """"Thriller""""""\', \'MJ\']"\n',
        encoding="utf-8",
    )
    qs = list(load_questions(str(f)))
    assert qs[0].answers == ["The Beatles", "Beatles"]
    assert qs[1].answers == ["Zadok The Priest", "Zadok the Priest"]
    assert qs[2].answers[-1] == "MJ" and qs[2].answers[0].startswith("Michael Jackson's")
    assert not any(q.error for q in qs) and qs[0].dataset


def test_generic_fields(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"key": "a1", "q": "what?", "gold": "x", "docs": ["T1"]}) + "\n")
    cfg = DynragConfig()
    cfg.dataset.format = "generic"
    cfg.dataset.id_field, cfg.dataset.question_field, cfg.dataset.answers_field = "key", "q", "gold"
    cfg.dataset.supporting_field = "docs"
    (q,) = load_questions(str(f), cfg)
    assert (q.id, q.question, q.answers, q.supporting_titles) == ("a1", "what?", ["x"], ["T1"])


def test_unreadable_files_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        list(load_questions(str(tmp_path / "missing.jsonl")))
    f = tmp_path / "x.jsonl"
    f.write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(DatasetError, match="cannot detect"):
        list(load_questions(str(f)))


def test_bad_rows_become_error_rows_and_others_are_answered(tmp_path):
    good = [{"id": f"g{i}", "question": f"question number {i}?", "answer": ["x"]} for i in range(3)]
    lines = [
        json.dumps(good[0]).encode(),
        json.dumps({"id": "empty", "question": "  ", "answer": ["x"]}).encode(),
        json.dumps(good[1]).encode(),
        json.dumps({"id": "g0", "question": "a duplicate id", "answer": ["x"]}).encode(),
        json.dumps({"id": "long", "question": "why " * 2000, "answer": ["x"]}).encode(),
        b'{"id": "latin1", "question": "caf\xe9?", "answer": ["x"]}',
        b'{"id": "broken", "question": ',
        json.dumps(good[2]).encode(),
    ]
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    gen = RecordingGenerator()
    cfg = DynragConfig()
    cfg.answer.progress = False
    summary = run_answer(
        str(f), str(tmp_path / "out"), method="no-retrieval", cfg=cfg, backends=Backends(cfg, generator=gen)
    )
    df = pl.read_parquet(f"{tmp_path}/out/parts/*.parquet")
    assert df.height == 8 and df["question_id"].n_unique() == 8
    errors = dict(zip(df["question_id"], df["error"]))
    assert [errors[f"g{i}"] for i in range(3)] == [None] * 3
    assert "no question" in errors["empty"]
    assert "duplicate question id 'g0'" in errors["dynrag:dup2-g0"]
    assert "characters" in errors["long"]
    assert "UTF-8" in errors["dynrag:line-6"] and "JSON" in errors["dynrag:line-7"]
    assert gen.calls == [3]  # only the good rows reached the model
    assert summary["answered"] == 3 and summary["errors"] == 5


def test_a_resumed_run_parses_no_answered_record_past_its_first(tmp_path, monkeypatch):
    """run_answer hands its answered ids to the dataset's reader once its output is open (AnsweredIds): only the
    first record (read before, to fail fast on a bad file) and the unanswered ones are parsed."""
    f = tmp_path / "q.jsonl"
    f.write_text(
        "".join(json.dumps({"id": f"g{i}", "question": f"question {i}?", "answer": ["x"]}) + "\n" for i in range(6))
    )
    cfg = DynragConfig()
    cfg.answer.progress = False

    def answer(limit=None):
        backends = Backends(cfg, generator=RecordingGenerator())
        return run_answer(str(f), str(tmp_path / "out"), method="no-retrieval", cfg=cfg, backends=backends, limit=limit)

    answer(limit=4)
    parsed: list[str] = []
    parse = datasets.PARSERS["qa"]
    monkeypatch.setitem(datasets.PARSERS, "qa", lambda r: parsed.append(r["id"]) or parse(r))
    summary = answer()
    assert parsed == ["g0", "g4", "g5"]
    assert summary["skipped_already_answered"] == 4 and summary["rows"] == 6
