"""End to end: a tiny experiment (bm25 and sm at k = 2, 3 on the first HotpotQA dev questions, no generation)
builds its index from the dev paragraphs, answers, resumes (a larger limit answers only the new questions; a
rerun answers nothing and builds nothing), and ends with the evaluation table and the HTML report."""

from __future__ import annotations

import yaml
from engine_fixtures import hotpot_subset

from jobs.cli import main
from pipeline.evaluation.experiment import run_experiment
from pipeline.io.output import part_files


def write_experiment(path, dataset, out, limit):
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "out": str(out),
                "limit": limit,
                "datasets": {"hotpotqa": {"file": str(dataset), "corpus_format": "hotpotqa"}},
                "grid": {"k": [2, 3]},
                "methods": ["bm25", "sm"],
                "config": {"generation": {"backend": "none"}},
            }
        )
    )
    return path


def test_tiny_experiment_runs_resumes_and_reports(data_dir, tmp_path, monkeypatch, capsys):
    dataset = hotpot_subset(data_dir, tmp_path / "hotpot8.jsonl", 8)
    out = tmp_path / "exp"
    labels = ["bm25-k2", "bm25-k3", "sm-k2", "sm-k3"]

    first = run_experiment(str(write_experiment(tmp_path / "e.yaml", dataset, out, 3)))
    assert [s["new_rows"] for s in first["summaries"]] == [3, 3, 3, 3]
    assert (out / "indexes" / "hotpotqa" / "CURRENT").is_file()
    assert all(s["errors"] == 0 and s["support_recall"] is not None for s in first["summaries"])

    import indexing

    monkeypatch.setattr(indexing, "build_index", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
    second = run_experiment(str(write_experiment(tmp_path / "e.yaml", dataset, out, 5)))
    assert [(s["new_rows"], s["skipped_already_answered"]) for s in second["summaries"]] == [(2, 3)] * 4
    parts = {lab: part_files(str(out / "hotpotqa" / lab)) for lab in labels}

    assert main(["experiment", str(tmp_path / "e.yaml")]) == 0  # the CLI: nothing left to do
    assert {lab: part_files(str(out / "hotpotqa" / lab)) for lab in labels} == parts
    printed = capsys.readouterr().out
    assert "### hotpotqa" in printed and all(f"| {lab} |" in printed for lab in labels)

    md = (out / "evaluation.md").read_text()
    assert md.count("| 5 |") >= 4  # every run has its 5 questions
    html = (out / "report.html").read_text()
    assert 'id="recall-k-hotpotqa"' in html and html.count('data-series="bm25"') == 1  # recall vs k only
    for chart in ("llm-calls", "stage-time"):
        assert f'id="{chart}-hotpotqa"' in html
    assert 'id="f1-time-hotpotqa"' not in html  # generation.backend=none: no answers, so no quality plot
    assert "| bm25-k2 | bm25 | 5 | - | - | - | - | - |" in md  # ... and EM/F1 are unknown, not 0
    # every run against the first (bm25-k2) on gold-document recall, the one score without answers
    assert "### hotpotqa: against bm25-k2" in printed and "| sm-k3 | 5 | " in printed
    assert "Δgold-doc recall [95% CI]" in (out / "comparison.md").read_text() and 'class="comparison"' in html
