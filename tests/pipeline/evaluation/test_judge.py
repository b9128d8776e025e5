"""The LLM judge (pipeline.evaluation.judge): verdict parsing, the prompt, the per-run cache, the CLI, and
the tiny vLLM model end to end."""

from __future__ import annotations

import polars as pl
import pytest
from eval_fixtures import fake_row

from jobs.cli import main
from pipeline.engine.requests import Completion
from pipeline.evaluation.judge import cache_path, judge_runs, prompt, verdict
from pipeline.evaluation.runs import load_runs
from pipeline.io.output import write_part


class Scripted:
    """A generator that answers prompts by the prediction they carry; records what it was asked."""

    def __init__(self, replies: dict[str, str | Exception]):
        self.replies, self.asked = replies, []

    def generate(self, prompts, samplings, chats):
        self.asked += prompts
        pred = lambda p: p.split("Proposed answer: ")[1].split("\n")[0]  # noqa: E731
        return [r if isinstance(r := self.replies[pred(p)], Exception) else Completion(r) for p in prompts]

    def close(self):
        pass


def judged_run(folder, predictions: list[str], gold="Paris", finished_at=1.0):
    """A run whose rows finished at `finished_at` (a rewrite with a later time replaces them)."""
    rows = []
    for i, p in enumerate(predictions):
        row = fake_row(i, dataset="d", method="m", params={}, f1=0.0, total_s=0.1, gold_answers=[gold])
        row.update(prediction=p, em=float(p == gold), acc=float(gold in p), finished_at=finished_at)
        rows.append(row)
    write_part(str(folder), rows)
    return str(folder)


def test_verdicts_and_the_prompt():
    assert [verdict(t) for t in ("Yes.", " no, it is not", "YES", "Maybe", "", "nope")] == [
        1.0,
        0.0,
        1.0,
        None,
        None,
        None,
    ]
    text = prompt(" Capital of France? ", ["Paris", "City of Paris"], " It is Paris. ")
    assert (
        "Question: Capital of France?\nCorrect answers: Paris | City of Paris\nProposed answer: It is Paris.\n" in text
    )
    assert text.endswith("Reply with one word: yes or no.")


def test_scripted_judge_counts_garbage_as_unjudged_and_asks_nothing_twice(tmp_path):
    run = judged_run(tmp_path / "r", ["Paris", "The answer is Paris.", "Lyon", "Nice", "Rome"])
    gen = Scripted(
        {"Paris": "yes", "The answer is Paris.": "Yes.", "Lyon": "no", "Nice": "hmm", "Rome": RuntimeError("x")}
    )
    [(_, j)] = judge_runs(load_runs([run]), "judge-model", generator=gen)
    assert (j["judged"], j["unjudged"], j["asked"]) == (3, 2, 5)
    assert j["judge_acc"] == pytest.approx(2 / 3) and j["judge_right_em_wrong"] == 1  # the sentence EM misses
    assert j["judge_agree_em"] == pytest.approx(2 / 3) and j["judge_agree_acc"] == 1.0
    cached = pl.read_parquet(cache_path(run, "judge-model"))
    assert cached.height == 5 and cached.filter(pl.col("verdict").is_null()).height == 2

    gen.asked.clear()
    [(_, again)] = judge_runs(load_runs([run]), "judge-model", generator=gen)
    assert gen.asked == [] and again["asked"] == 0 and again["judge_acc"] == j["judge_acc"]
    # a changed prediction (the question answered again) is asked about; the others are not
    judged_run(tmp_path / "r", ["Paris", "The answer is Paris.", "Lyon", "Nice", "Paris, France"], finished_at=2.0)
    gen.replies["Paris, France"] = "yes"
    [(_, third)] = judge_runs(load_runs([run]), "judge-model", generator=gen)
    assert len(gen.asked) == 1 and "Proposed answer: Paris, France" in gen.asked[0] and third["judged"] == 4


def test_cli_judge_column_and_no_model_on_a_cached_rerun(tmp_path, monkeypatch, capsys):
    import pipeline.backends

    run = judged_run(tmp_path / "r", ["Paris", "It is Paris", "Lyon"])
    built = []

    def fake_generator(cfg):
        built.append(cfg.generation)
        return Scripted({"Paris": "yes", "It is Paris": "yes", "Lyon": "no"})

    monkeypatch.setattr(pipeline.backends, "make_generator", fake_generator)
    argv = ["evaluate", run, "--judge", "my-judge", "--out", str(tmp_path / "t"), "--set", "generation.kv_cache_gib=3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "### d: judged by my-judge" in out and "| r | 33.3 | 66.7 | 66.7 | 3 | 0 | 66.7 | 100.0 | 1 |" in out
    assert [(g.model, g.backend, g.kv_cache_gib) for g in built] == [("my-judge", "vllm", 3)]
    assert pl.read_csv(tmp_path / "t" / "evaluation.csv")["judge_acc"].to_list() == [pytest.approx(2 / 3)]
    assert main(argv) == 0 and len(built) == 1  # every verdict cached: no judge engine built
    capsys.readouterr()
    (tmp_path / "r" / "config.resolved.yaml").write_text("generation:\n  backend: none\n")  # no answers to judge
    assert main([*argv[:-2], "--out", str(tmp_path / "t2")]) == 0 and len(built) == 1
    assert "judged by" not in capsys.readouterr().out


def test_tiny_model_judges_end_to_end(tiny_vllm, tmp_path):
    run = judged_run(tmp_path / "r", ["Paris", "Lyon", "The capital is Paris.", "I do not know"])
    [(_, j)] = judge_runs(load_runs([run]), "tiny", generator=tiny_vllm)
    assert j["asked"] == 4 and j["judged"] + j["unjudged"] == 4  # random weights: mostly neither yes nor no
    outputs = pl.read_parquet(cache_path(run, "tiny"))["output"].to_list()
    assert len(outputs) == 4 and all(isinstance(o, str) for o in outputs)
    [(_, again)] = judge_runs(load_runs([run]), "tiny", generator=tiny_vllm)
    assert again["asked"] == 0 and again["judged"] == j["judged"]
