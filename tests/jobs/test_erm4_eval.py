"""The ERM4 evaluation job's pieces: the second set of similar questions and the Table 2 time saving."""

import json

import yaml

from jobs.eval.erm4 import merge_repeats, paraphrase, render_table2, second_set, tau_sweep
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


def _row(tau, t, hit, times=None):
    return {
        "tau": tau,
        "time_s": t,
        "times": times or [t],
        "retrieval_s": 0.01,
        "wall_s": t,
        "external": 1.0,
        "memory": 2.0,
        "irrelevant": 0.5,
        "hit_rate": hit,
        "f1": hit,
        "llm_calls": 5.0,
    }


FIRST = {"questions": 3, "reservoir": 9, "time_s": 2.0, "hit_rate": 0.5}


def test_table2_reports_the_saving_at_the_fastest_tau_against_tau_one_with_its_spread():
    text = render_table2(
        [FIRST, _row(0.2, 6.0, 0.4, [6.0, 6.0]), _row(0.6, 4.0, 0.5, [3.0, 5.0]), _row(1.0, 8.0, 0.5, [6.0, 10.0])]
    )
    # per pass: 1 - 3/6 = 50%, 1 - 5/10 = 50%
    assert (
        "Fastest tau = 0.6: 4.00 s/q against 8.00 s/q at tau = 1.0, a time saving of 50.0% (passes: 50.0%, 50.0%)"
        in text
    )
    assert "| 0.6 | 4.00 | 3.00-5.00 |" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| 0") or line.startswith("| 1")] == [
        "| 0.2",
        "| 0.6",
        "| 1.0",
    ]


def test_table2_says_when_the_fastest_tau_used_no_memory():
    rows = [FIRST, {**_row(0.6, 4.0, 0.5), "memory": 0.0}, _row(1.0, 5.0, 0.5)]
    assert "At tau = 0.6 no query was answered from memory" in render_table2(rows)
    rows[1]["memory"] = 2.0
    assert "no query was answered from memory" not in render_table2(rows)


def test_tau_sweep_gives_no_saving_from_run_order_alone():
    """A fake engine whose first run is 2x slower and whose taus cost the same: without the warm-up the first
    tau would look 2x slower; with it, in either order, every tau times the same and the saving is 0."""
    for taus in ([0.6, 1.0], [1.0, 0.6]):
        calls = []

        def run_one(tau, folder, calls=calls):
            calls.append((tau, folder))
            return {"time_s": 2.0 if len(calls) == 1 else 1.0, "tau": tau}

        runs = tau_sweep(taus, 2, run_one)
        assert calls[0][1] == "warm-up" and [t for t, _ in calls[1:]] == taus + taus[::-1]  # alternating passes
        rows = [FIRST] + [{**_row(tau, None, 0.5), **merge_repeats(tau, r)} for tau, r in runs.items()]
        assert {r["time_s"] for r in rows[1:]} == {1.0}
        assert "a time saving of 0.0%" in render_table2(rows)


def test_table2_second_set_reads_the_first_sets_own_reservoir(tmp_path):
    """Table 2 end to end with fakes: the first set fills its run's own reservoir; each tau run answers the
    second set reading it (named as reservoir_path, never updated), through run_methods on the given backends."""
    from erm4_fakes import PASSAGES, WordEmbedder, reply
    from fakes import MemoryRetriever, RecordingGenerator

    from jobs.eval.erm4 import table2
    from pipeline.backends import Backends
    from pipeline.methods.reservoir import RUN_RESERVOIR, Reservoir

    dev = tmp_path / "dev.jsonl"
    dev.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": q, "answers": ["James Cameron"]}) + "\n"
            for i, q in enumerate(
                [
                    "who directed the film that won best picture in 1998?",
                    "which film won in 1998?",
                    "what is the capital of Italy?",
                ]
            )
        )
    )
    cfg = DynragConfig()
    cfg.paths.cache_dir = str(tmp_path / "cache")
    cfg.answer.progress = False
    gen = RecordingGenerator(reply)
    backends = Backends(cfg, generator=gen, retriever=MemoryRetriever(PASSAGES), embedder=WordEmbedder())
    out = tmp_path / "out"
    rows = table2(cfg, backends, str(dev), None, first=2, taus=[0.3, 1.0], theta=1, out=out, repeats=1)
    base = out / "table2" / "first-set" / RUN_RESERVOIR
    size = len(Reservoir(base))
    assert rows[0]["questions"] == 2 and rows[0]["reservoir"] == size > 0
    assert [r["tau"] for r in rows[1:]] == [0.3, 1.0] and all(r["questions"] == 2 for r in rows[1:])
    assert all(r["errors"] == 0 for r in rows)
    # tau 0.3 answers a query of each rephrased question from memory (the cached "James Cameron"), tau 1.0 none
    assert rows[1]["memory"] == 1.0 and rows[2]["memory"] == 0.0 and rows[1]["external"] <= rows[2]["external"]
    for folder in ("warm-up", "repeat1/second-set-tau0.3", "repeat1/second-set-tau1.0"):
        assert (out / "table2" / folder / "parts").is_dir()
        assert not (out / "table2" / folder / RUN_RESERVOIR).exists()  # no reservoir of its own
        resolved = yaml.safe_load((out / "table2" / folder / "config.resolved.yaml").read_text())
        assert resolved["method"]["params"]["reservoir_path"] == str(base)
        assert resolved["method"]["params"]["update_reservoir"] is False
    assert len(Reservoir(base)) == size
