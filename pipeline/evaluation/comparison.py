"""Runs against a baseline run, per dataset, on the questions both answered (`paired` statistics).

A question counts when both runs have an error-free row with a score for it. Excluded and counted:
`errors_excluded` (an error row in either run), `missing_excluded` (a row in one run only) and `unscored`
(no value for a compared metric: no gold answer, or no supporting labels). Means, deltas (run - baseline)
and intervals are over the paired questions, so `f1` here can differ from the evaluation table's F1 over
all of a run's answered questions. The compared metrics are EM, F1 and Acc, or gold-document recall where a
run has no answers (generation.backend=none); the papers' jobs choose theirs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DynragError
from pipeline.evaluation.paired import compare
from pipeline.evaluation.runs import Run, load_run, load_runs
from pipeline.io.output import part_files, read_rows

METRICS = ("em", "f1", "acc")
NAMES = {"em": "EM", "f1": "F1", "acc": "Acc", "support_recall": "gold-doc recall"}  # any per-row score column


def resolve_baselines(runs: list[Run], spec: str) -> dict[str, Run]:
    """Dataset -> its baseline run. `spec` is a run folder (or a folder of runs, one per dataset), or the
    label of a run among `runs` (e.g. `sm-k4`: that run in every dataset that has one); a label wins."""
    by_label = {r.dataset: r for r in runs if r.label == spec}
    if by_label:
        return by_label
    if "://" in spec and part_files(spec) or Path(spec).exists():
        found: dict[str, Run] = {}
        for r in load_runs([spec]):
            if r.dataset in found:
                raise DynragError(f"--baseline {spec}: several runs of dataset {r.dataset}; give one run folder")
            found[r.dataset] = r
        return found
    labels = ", ".join(dict.fromkeys(r.label for r in runs))
    raise DynragError(f"--baseline {spec}: no such run folder, and no run labelled so (labels: {labels})")


def paired_scores(a: str, b: str, metrics: tuple[str, ...] = METRICS) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Score matrices (paired questions x metrics, ordered by question id) of runs `a` and `b`, and the counts
    of excluded questions."""
    import polars as pl

    cols = ["question_id", "error", *metrics]
    ra, rb = (pl.from_arrow(read_rows(p, cols)) for p in (a, b))
    both = ra.join(rb, on="question_id", how="inner", suffix="_b")
    missing = ra.height + rb.height - 2 * both.height
    ok = both.filter(pl.col("error").is_null() & pl.col("error_b").is_null())
    scored = ok.drop_nulls([*metrics, *(f"{m}_b" for m in metrics)]).sort("question_id")
    counts = {
        "errors_excluded": both.height - ok.height,
        "missing_excluded": missing,
        "unscored": ok.height - scored.height,
    }
    return (
        scored.select(metrics).to_numpy().astype(float),
        scored.select([f"{m}_b" for m in metrics]).to_numpy().astype(float),
        counts,
    )


def compare_runs(
    a: Run, b: Run, resamples: int = 10_000, seed: int = 0, metrics: tuple[str, ...] = METRICS
) -> dict[str, Any]:
    """One comparison row: run `b` against baseline `a`."""
    sa, sb, counts = paired_scores(a.path, b.path, metrics)
    row: dict[str, Any] = {"run": b.label, "dataset": b.dataset, "method": b.method, "baseline": a.label}
    row["n"] = int(sa.shape[0])
    row.update(counts, metrics=list(metrics))
    for m, res in zip(metrics, compare(sa, sb, resamples, seed)):
        if row["n"] == 0:
            row.update({m: None, f"baseline_{m}": None, f"delta_{m}": None, f"delta_{m}_ci95": None, f"p_{m}": None})
            continue
        row.update(
            {
                m: res.mean_b,
                f"baseline_{m}": res.mean_a,
                f"delta_{m}": res.delta,
                f"delta_{m}_ci95": list(res.ci95),
                f"p_{m}": res.p,
            }
        )
        row["p_exact"] = res.p_exact
    row.update(resamples=resamples, seed=seed, path=b.path, baseline_path=a.path)
    return row


def default_metrics(a: Run, b: Run) -> tuple[str, ...]:
    """EM/F1/Acc where both runs generated answers; gold-document recall where one did not (backend none)."""
    return METRICS if a.summary.get("f1") is not None and b.summary.get("f1") is not None else ("support_recall",)


def comparisons(
    runs: list[Run],
    baseline: str,
    resamples: int = 10_000,
    seed: int = 0,
    metrics: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """Every run (but the baseline itself) against its dataset's baseline; runs of datasets without one
    skipped. `metrics`: per-row score columns (default: `default_metrics`)."""
    base = resolve_baselines(runs, baseline)
    rows = [
        compare_runs(base[r.dataset], r, resamples, seed, metrics or default_metrics(base[r.dataset], r))
        for r in runs
        if r.dataset in base
    ]
    return [r for r in rows if os.path.normpath(r["path"]) != os.path.normpath(r["baseline_path"])]


def significant(row: dict[str, Any], metric: str) -> bool:
    """Whether the run's 95% interval for the metric's difference excludes 0."""
    ci = row.get(f"delta_{metric}_ci95") or (0.0, 0.0)
    return ci[0] > 0 or ci[1] < 0


def delta_cell(row: dict[str, Any], metric: str) -> str:
    """'+4.5 [+1.0, +8.0]*' in points; '*' where the interval excludes 0."""
    if row.get(f"delta_{metric}") is None:
        return "-"
    lo, hi = row[f"delta_{metric}_ci95"]
    mark = "*" if significant(row, metric) else ""
    return f"{100 * row[f'delta_{metric}']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]{mark}"


def p_cell(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table per dataset: each run's EM/F1/Acc, its difference from the baseline with the 95% interval, p."""
    if not rows:
        return "(no run to compare with the baseline)\n"
    blocks = []
    for ds, metrics in dict.fromkeys((r["dataset"], tuple(r["metrics"])) for r in rows):
        these = [r for r in rows if (r["dataset"], tuple(r["metrics"])) == (ds, metrics)]
        head = "| run | n | " + " | ".join(f"{NAMES[m]} | Δ{NAMES[m]} [95% CI] | p" for m in metrics)
        lines = [
            f"### {ds}: against {these[0]['baseline']}",
            "",
            head + " | excluded: errors / missing / no score |",
            "|---|---:|" + "---:|---:|---:|" * len(metrics) + "---:|",
        ]
        for r in these:
            cells = []
            for m in metrics:
                cells += ["-" if r[m] is None else f"{100 * r[m]:.1f}", delta_cell(r, m), p_cell(r[f"p_{m}"])]
            excl = f"{r['errors_excluded']} / {r['missing_excluded']} / {r['unscored']}"
            lines.append(f"| {r['run']} | {r['n']} | " + " | ".join(cells) + f" | {excl} |")
        blocks.append("\n".join(lines))
    r0 = rows[0]
    note = (
        f"\nPoints (x100), run minus baseline, on the questions both answered. 95% CI: percentile paired "
        f"bootstrap ({r0['resamples']} resamples, seed {r0['seed']}); p: two-sided paired sign-flip "
        "randomization (exact where every sign pattern fits in the resamples, else (count+1)/(R+1)). "
        "* the interval excludes 0.\n"
    )
    return "\n\n".join(blocks) + "\n" + note


def write_comparison(rows: list[dict[str, Any]], out_dir: str, name: str = "comparison") -> list[str]:
    """`name`.md, .csv (intervals as _low/_high columns) and .json under `out_dir`; returns the paths."""
    import json

    import polars as pl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flat = []
    for r in rows:
        f = {k: v for k, v in r.items() if not k.endswith("_ci95") and k != "metrics"}
        for m in r["metrics"]:
            lo, hi = r.get(f"delta_{m}_ci95") or (None, None)
            f[f"delta_{m}_ci95_low"], f[f"delta_{m}_ci95_high"] = lo, hi
        flat.append(f)
    paths = [out / f"{name}.md", out / f"{name}.csv", out / f"{name}.json"]
    paths[0].write_text(markdown(rows), encoding="utf-8")
    pl.DataFrame(flat, infer_schema_length=None).write_csv(paths[1])
    paths[2].write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return [str(p) for p in paths]


def against_baseline(
    runs: list[tuple[str, str]],
    baseline: str,
    metrics: tuple[str, ...] | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> str:
    """The papers' tables' interval section: Markdown of each (label, run folder) against the one labelled
    `baseline` (per dataset, as `comparisons`)."""
    return markdown(comparisons([load_run(path, label) for label, path in runs], baseline, resamples, seed, metrics))
