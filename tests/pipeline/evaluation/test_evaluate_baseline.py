"""`dynrag evaluate --baseline` and `dynrag report --baseline` over synthetic runs: pairing, exclusions,
the JSON rows against an independent recomputation from the rows, and bad input."""

from __future__ import annotations

import json
import random

import pytest
from eval_fixtures import drrag_like_runs, fake_row, fake_run

from jobs.cli import main
from pipeline.evaluation.comparison import paired_scores
from pipeline.io.output import read_rows, write_part


def scored_run(folder, f1s, *, dataset="d", method="m", ids=None, errors=()):
    """A run whose question `ids[i]` scores f1s[i] (em = acc = f1), with error rows at the `errors` positions."""
    rows = []
    for i, f in enumerate(f1s):
        row = fake_row(i, dataset=dataset, method=method, params={"k": 3}, f1=f, total_s=0.1)
        row.update(question_id=(ids or {}).get(i, f"q{i}"), em=f, acc=f)
        if i in errors:
            row.update(error="boom", em=None, f1=None, acc=None)
        rows.append(row)
    write_part(str(folder), rows)
    return str(folder)


def evaluate_json(capsys, *argv) -> list[dict]:
    assert main(["evaluate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_identical_runs_give_zero_interval_and_p_one(tmp_path, capsys):
    a = scored_run(tmp_path / "a", [1.0, 0.0, 0.5, 1.0] * 10)
    b = scored_run(tmp_path / "b", [1.0, 0.0, 0.5, 1.0] * 10)
    [row] = evaluate_json(capsys, b, "--baseline", a, "--out", str(tmp_path / "t"))
    assert row["run"] == "b" and row["baseline"] == "a" and row["n"] == 40
    for m in ("em", "f1", "acc"):
        assert (row[f"delta_{m}"], row[f"delta_{m}_ci95"], row[f"p_{m}"]) == (0.0, [0.0, 0.0], 1.0)


def test_errors_and_missing_questions_are_excluded_and_counted(tmp_path):
    a = scored_run(tmp_path / "a", [0.0] * 6, errors={1})
    # b lacks q5, answers extra question q9, errors on q2; its q0 scores 1 where a scored 0
    b = scored_run(tmp_path / "b", [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], ids={5: "q9"}, errors={2})
    sa, sb, counts = paired_scores(a, b)
    assert counts == {"errors_excluded": 2, "missing_excluded": 2, "unscored": 0}  # q1, q2; q5, q9
    assert sa.shape == (3, 3) and sa.sum() == 0 and sb[:, 1].tolist() == [1.0, 0.0, 0.0]  # q0, q3, q4


def test_json_rows_match_an_independent_recomputation(tmp_path, capsys):
    rng = random.Random(4)
    fa = [rng.choice([0.0, 0.5, 1.0]) for _ in range(150)]
    fb = [min(1.0, f + rng.choice([0.0, 0.0, 0.5])) for f in fa]  # b better on about a third
    a, b = scored_run(tmp_path / "a", fa), scored_run(tmp_path / "b", fb)
    [row] = evaluate_json(capsys, b, "--baseline", a, "--out", str(tmp_path / "t"))

    # recomputed from the rows with the standard library: its own pairing, bootstrap and sign flips
    ra = dict(zip(*read_rows(a, ["question_id", "f1"]).to_pydict().values()))
    rb = dict(zip(*read_rows(b, ["question_id", "f1"]).to_pydict().values()))
    diffs = [rb[q] - ra[q] for q in ra if q in rb]
    n, delta = len(diffs), sum(diffs) / len(diffs)
    boot = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(4000))
    lo, hi = boot[int(0.025 * 4000)], boot[int(0.975 * 4000)]
    flips = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= abs(sum(diffs)) - 1e-9 for _ in range(4000))
    assert row["n"] == n and row["delta_f1"] == pytest.approx(delta)
    assert row["f1"] == pytest.approx(sum(rb.values()) / n) and row["baseline_f1"] == pytest.approx(sum(fa) / n)
    assert row["delta_f1_ci95"] == [pytest.approx(lo, abs=0.01), pytest.approx(hi, abs=0.01)]
    assert row["p_f1"] == pytest.approx((flips + 1) / 4001, abs=0.02) and row["p_f1"] < 0.01


def test_label_baseline_per_dataset_writes_tables(tmp_path, capsys):
    drrag_like_runs(tmp_path / "runs")
    assert main(["evaluate", str(tmp_path / "runs"), "--baseline", "bm25-k4", "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "### hotpotqa: against bm25-k4" in out and "### musique: against bm25-k4" in out
    assert "| no-retrieval | 2 |" in out and "| bm25-k4 | 2 |" not in out  # the baseline is not compared with itself
    csv = (tmp_path / "t" / "comparison.csv").read_text()
    assert "delta_f1_ci95_low" in csv.splitlines()[0] and len(csv.splitlines()) == 1 + 2 * 6
    rows = json.loads((tmp_path / "t" / "comparison.json").read_text())
    nr = next(r for r in rows if r["run"] == "no-retrieval" and r["dataset"] == "musique")
    assert nr["delta_f1"] == -0.5 and nr["p_f1"] == 1.0  # (0,0) vs (1,0): both sign patterns of -1 reach it


def test_report_marks_differences_whose_interval_excludes_zero(tmp_path, capsys):
    a = scored_run(tmp_path / "runs" / "a", [0.0] * 60)
    scored_run(tmp_path / "runs" / "better", [1.0] * 30 + [0.0] * 30)
    scored_run(tmp_path / "runs" / "same", [1.0] + [0.0] * 59)
    html = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "runs"), "--html", str(html), "--baseline", a]) == 0
    text = html.read_text()
    assert text.count('class="significant"') == 3  # EM, F1 and Acc of "better"; "same" is within noise
    row_same = text[text.rindex("<td>same</td>") :].split("</tr>")[0]
    assert "significant" not in row_same and "+1.7 [+0.0, +5.0]" in row_same


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--baseline", "nope"], "no such run folder, and no run labelled so"),
        (["--resamples", "0", "--baseline", "a"], "--resamples: at least 1"),
    ],
)
def test_bad_baseline_is_a_clear_error(tmp_path, capsys, argv, message):
    fake_run(tmp_path / "a", dataset="d", method="m", params={}, f1s=[1.0], times=[0.1])
    assert main(["evaluate", str(tmp_path / "a"), "--out", str(tmp_path / "t"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dynrag: error:") and message in err


def test_papers_tables_print_intervals_against_their_baseline_row(tmp_path):
    from jobs.eval import dragin, drrag, erm4, pairs

    runs = {name: scored_run(tmp_path / name, f1s) for name, f1s in (("base", [0.0] * 40), ("up", [1.0] * 40))}
    text = pairs.intervals([("sr-rag", {"out": runs["base"]}), ("pairs", {"out": runs["up"]})])
    assert text.startswith("against sr-rag:") and "| pairs | 40 | 100.0 | +100.0 [+100.0, +100.0]* |" in text
    text = dragin.intervals([{"method": "dragin", "out": runs["up"]}, {"method": "sr-rag", "out": runs["base"]}])
    assert "against SR-RAG" in text and "| dragin | 40 |" in text and "| sr-rag |" not in text
    text = erm4.intervals1([{"config": "(i) Direct", "out": runs["up"]}, {"config": "(ii) RRR", "out": runs["base"]}])
    assert "against (ii) RRR" in text and "| (i) Direct | 40 | 100.0 | +100.0" in text and "| EM |" not in text
    drrag_like_runs(tmp_path / "t5")  # SM absent: each method against the first (bm25) at the same k
    text = drrag.intervals(tmp_path / "t5", ["hotpotqa"], ["bm25", "cfs"], [3, 4], generate=True)
    assert "k=3, against BM25" in text and "| cfs-k3 | 2 |" in text and "| cfs-k4 | 2 |" in text
    assert "| gold-doc recall | Δgold-doc recall [95% CI] | p | EM |" in text
