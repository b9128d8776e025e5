"""The evaluation table over synthetic runs: summary figures, run discovery, Markdown/CSV/Parquet files,
and the experiment file's grid (no model, no index)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from eval_fixtures import drrag_like_runs, fake_row, fake_run

from pipeline.errors import DynragError
from pipeline.evaluation.experiment import Experiment, MethodRuns, grid_runs, load_experiment
from pipeline.evaluation.runs import load_runs
from pipeline.evaluation.table import evaluate, markdown, records
from pipeline.io.output import summarize, write_part


def test_summary_quantiles_and_tokens(tmp_path):
    times = [0.1 * i for i in range(1, 11)]  # 0.1 .. 1.0
    fake_run(tmp_path, dataset="d", method="sr-rag", params={"k": 3}, f1s=[1.0] * 10, times=times)
    s = summarize(str(tmp_path))
    assert s["time_per_question_s"]["total"] == pytest.approx(0.55)
    # latency quantiles by linear interpolation over 10 sorted values (0.3 .. 3.0): p50 at index 4.5, p95 at 8.55;
    # each value read off its histogram bin (pipeline/io/tally.py: 40 a decade, within 3%)
    assert s["latency_s"] == {"mean": pytest.approx(1.65), "p50": pytest.approx(1.65, rel=0.03),
                              "p95": pytest.approx(2.865, rel=0.03)}  # fmt: skip
    assert s["tokens_per_question"] == 105  # 100 prompt + 5 completion tokens


def test_records_markdown_and_files(tmp_path):
    drrag_like_runs(tmp_path / "runs")
    runs = load_runs([str(tmp_path / "runs")])
    assert len(runs) == 14 and {r.label for r in runs} >= {"bm25-k3", "cfs-k6", "no-retrieval"}
    recs = records(runs)
    cfs4 = next(r for r in recs if (r["dataset"], r["run"]) == ("musique", "cfs-k4"))
    assert cfs4["k"] == 4 and cfs4["f1"] == 0.5 and cfs4["gold_doc_recall"] == pytest.approx(0.7)
    assert cfs4["s_per_q"] == pytest.approx(0.6) and cfs4["latency_p95"] == pytest.approx(
        3 * (0.4 + 0.95 * 0.4), rel=0.03
    )
    assert cfs4["docs_in_prompt"] == 4 and cfs4["ra_ratio"] == 1.0
    text = markdown(recs)
    assert text.count("### ") == 2
    assert (
        "| cfs-k4 | cfs | 2 | 50.0 | 50.0 | 50.0 | 50.0 | 50.0 | 70.0 | 4.00 | 1.00 | 1.00 | 100.0 | 0.600 | "
        f"{cfs4['latency_p50']:.3f} | {cfs4['latency_p95']:.3f} |" in text  # 1.800 and 2.340, within 3% (tally.py)
    )
    assert "latency p50 s | latency p95 s" in text
    assert "| no-retrieval | no-retrieval | 2 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | - | 0.00 | 1.00 | 0.00 | 0.0 |" in text
    _, files = evaluate([str(tmp_path / "runs")], str(tmp_path / "table"))
    assert pl.read_parquet(files[0]).height == 14 and pl.read_csv(files[1]).height == 14


def test_sr_rag_k_none_is_resolved_from_the_saved_config(tmp_path):
    fake_run(tmp_path / "a" / "sr", dataset="d", method="sr-rag", params={"k": None}, f1s=[1.0], times=[1.0])
    (tmp_path / "a" / "sr" / "config.resolved.yaml").write_text("retrieval:\n  k: 7\n")
    fake_run(tmp_path / "b" / "sr", dataset="d", method="sr-rag", params={"k": 2}, f1s=[1.0], times=[1.0])
    runs = load_runs([str(tmp_path / "a"), str(tmp_path / "b")])
    assert [r.params["k"] for r in runs] == [7, 2]
    assert len({r.label for r in runs}) == 2  # same folder name in one dataset: labels made unique


def test_missing_runs_are_clear_errors(tmp_path):
    with pytest.raises(DynragError, match="no runs found"):
        load_runs([str(tmp_path)])
    with pytest.raises(DynragError, match="no such folder"):
        load_runs([str(tmp_path / "nope")])


def test_grid_labels_follow_eval_drrag():
    assert grid_runs(MethodRuns(method="cfs", params={"classifier": "c"}), {"k": [3, 4]}) == [
        ("cfs-k3", {"classifier": "c", "k": 3}),
        ("cfs-k4", {"classifier": "c", "k": 4}),
    ]
    assert grid_runs(MethodRuns(method="no-retrieval"), {"k": [3, 4]}) == [("no-retrieval", {})]  # has no k
    assert [
        lab for lab, _ in grid_runs(MethodRuns(method="sr-rag", label="sr", grid={"retriever": ["bm25", "dense"]}), {})
    ] == ["sr-retrieverbm25", "sr-retrieverdense"]


def test_experiment_file_short_forms_and_errors(tmp_path):
    exp = Experiment.model_validate({"name": "x", "datasets": ["hotpotqa"], "methods": ["bm25"]})
    assert exp.datasets["hotpotqa"].file == "hotpotqa/dev_400.jsonl" and exp.methods[0].method == "bm25"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndatasets: [nope]\nmethods: [bm25]\n")
    with pytest.raises(DynragError, match="unknown dataset"):
        load_experiment(str(bad))
    bad.write_text("name: x\ndatasets: [hotpotqa]\nmethods: [bm25]\ntypo: 1\n")
    with pytest.raises(DynragError, match="typo"):
        load_experiment(str(bad))
    bad.write_text("name: x\ndatasets: [hotpotqa]\nmethods: [{method: bm25, params: {kk: 3}}]\n")
    with pytest.raises(DynragError, match="kk"):
        load_experiment(str(bad))
    bad.write_text("name: x\ndatasets: [hotpotqa]\nmethods: [bm25]\ngrid: {k: [3]}\nbaseline: bm25\n")
    with pytest.raises(DynragError, match="baseline 'bm25' is none of the runs \\(bm25-k3\\)"):
        load_experiment(str(bad))


def test_error_rows_are_counted_and_shown(tmp_path):
    fake_run(
        tmp_path,
        dataset="d",
        method="sr-rag",
        params={"k": 3},
        f1s=[1.0, 1.0],
        times=[1.0, 1.0],
        error="generation failed: out of memory",
    )
    text = markdown(records(load_runs([str(tmp_path)])))
    assert "| 0 | - | - |" in text and "2 error rows, e.g. generation failed: out of memory" in text


def test_worked_example_from_predictions_to_the_table(tmp_path):
    """SQuAD normalisation end to end: per-row metrics from predictions, means in the table."""
    from pipeline.text.metrics import answer_metrics

    cases = [
        ("The Eiffel Tower!", ["Eiffel Tower"]),  # articles and punctuation dropped: EM 1
        ("Paris, France", ["Paris"]),  # P 1/2, R 1, F1 2/3; gold contained: Acc 1
        ("an apple", ["Apple Inc"]),
    ]  # [apple] vs [apple, inc]: P 1, R 1/2, F1 2/3; Acc 0
    rows = [answer_metrics(p, g) for p, g in cases]
    assert [r["em"] for r in rows] == [1.0, 0.0, 0.0] and [r["acc"] for r in rows] == [1.0, 1.0, 0.0]
    write_part(
        str(tmp_path / "p0"),
        [fake_row(i, dataset="d", method="sr-rag", params={"k": 3}, total_s=1.0, **m) for i, m in enumerate(rows)],
    )
    rec = records(load_runs([str(tmp_path / "p0")]))[0]
    assert rec["questions"] == 3 and rec["em"] == pytest.approx(1 / 3, abs=1e-4)
    assert rec["f1"] == pytest.approx(7 / 9, abs=1e-4) and rec["acc"] == pytest.approx(2 / 3, abs=1e-4)
    assert rec["precision"] == pytest.approx(5 / 6, abs=1e-4) and rec["recall"] == pytest.approx(5 / 6, abs=1e-4)
    assert "| 3 | 33.3 | 77.8 | 66.7 | 83.3 | 83.3 |" in markdown([rec])


def test_two_runs_with_one_folder_are_refused(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text("name: x\ndatasets: [hotpotqa]\nmethods: [sm, {method: sm, params: {reasoning: true}}]\n")
    with pytest.raises(DynragError, match="more than once"):
        load_experiment(str(f))
    f.write_text(
        "name: x\ndatasets: [hotpotqa]\nmethods: [sm, {method: sm, label: sm-cot, params: {reasoning: true}}]\n"
    )
    assert len(load_experiment(str(f)).methods) == 2


def test_runs_sort_k_by_value(tmp_path):
    for k in (10, 3, 4):
        fake_run(tmp_path / f"bm25-k{k}", dataset="d", method="bm25", params={"k": k}, f1s=[1.0], times=[1.0])
    assert [r.label for r in load_runs([str(tmp_path)])] == ["bm25-k3", "bm25-k4", "bm25-k10"]


def test_extra_summary_means_counts_takes_labels_and_skips_error_rows(tmp_path):
    from eval_fixtures import fake_row

    from pipeline.evaluation.runs import extra_summary

    extras = [
        {"generated_tokens": 10, "entropy": "exact", "backoff": True},
        {"generated_tokens": 20, "entropy": "exact", "backoff": False},
        {"generated_tokens": 999},
    ]  # an error row: not counted
    rows = [
        fake_row(i, dataset="d", method="dragin", params={}, f1=1.0, total_s=1.0, extra=json.dumps(e))
        for i, e in enumerate(extras)
    ]
    rows[2]["error"] = "GenerationError: boom"
    write_part(str(tmp_path / "run"), rows)
    s = extra_summary(str(tmp_path / "run"), ["generated_tokens", "entropy", "backoff", "missing"])
    assert s == {"generated_tokens": 15.0, "entropy": "exact", "backoff": 0.5, "missing": None}


def test_parts_written_before_latency_existed_still_summarize(tmp_path):
    import pyarrow.parquet as pq

    fake_run(tmp_path, dataset="d", method="sr-rag", params={}, f1s=[1.0], times=[1.0])
    (old,) = list((tmp_path / "parts").iterdir())
    pq.write_table(pq.read_table(old).drop_columns(["latency_s"]), old)  # an older run's part
    write_part(str(tmp_path), [fake_row(9, dataset="d", method="sr-rag", params={}, f1=1.0, total_s=2.0)])
    s = summarize(str(tmp_path))
    assert s["rows"] == 2 and s["latency_s"]["p50"] == pytest.approx(6.0, rel=0.03)  # from the new row only
