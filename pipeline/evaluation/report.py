"""The self-contained HTML report: per dataset, the evaluation table and inline SVG plots (`charts`).

Plots (chart ids, `<ds>` = the dataset's slug): the cost-quality front, F1 against LLM calls, tokens and
mean latency per question side by side, each with its Pareto front dashed (`front-<ds>`); F1 and EM against
mean time per question, one series per method (`f1-time-<ds>`, `em-time-<ds>`); gold-document recall against k per retrieval strategy for runs
that vary k (`recall-k-<ds>`); LLM calls per question (`llm-calls-<ds>`); the mean per-stage time per
question (`stage-time-<ds>`). No scripts, no external resources.
"""

from __future__ import annotations

import re
import time
from html import escape
from pathlib import Path
from typing import Any

from pipeline.engine.core import STAGES
from pipeline.evaluation import charts, comparison
from pipeline.evaluation.runs import Run, load_runs
from pipeline.evaluation.table import COLUMNS, cell, record

CSS = (
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}table{border-collapse:collapse;"
    "font-size:13px;margin:8px 0 16px}th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}"
    "th:first-child,td:first-child,th:nth-child(2),td:nth-child(2){text-align:left}th{background:#f4f4f4}"
    ".charts{display:flex;flex-wrap:wrap;gap:12px}.note{color:#666;font-size:13px}"
)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def strategy_names(runs: list[Run]) -> dict[str, str]:
    """Run path -> strategy: its method, plus the non-k params that differ between runs of that method."""
    names = {}
    for method in dict.fromkeys(r.method for r in runs):
        same = [r for r in runs if r.method == method]
        keys = sorted(
            {key for r in same for key in r.params if key != "k" and len({repr(o.params.get(key)) for o in same}) > 1}
        )
        for r in same:
            extra = ", ".join(f"{key}={r.params.get(key)}" for key in keys)
            names[r.path] = f"{method} ({extra})" if extra else method
    return names


def quality_time_chart(ds: str, runs: list[Run], metric: str) -> str | None:
    series: dict[str, list[tuple[float, float, str]]] = {}
    for r in runs:
        x, y = r.summary["time_per_question_s"]["total"], r.summary[metric]
        if x is not None and y is not None:
            series.setdefault(r.method, []).append((x, 100 * y, f"{r.label}: {100 * y:.1f} at {x:.3g} s/q"))
    if not series:
        return None
    return charts.scatter(
        f"{metric}-time-{slug(ds)}",
        f"{ds}: {metric.upper()} vs time per question",
        series,
        "mean seconds per question",
        f"{metric.upper()} (%)",
    )


COSTS = (  # the front's panels: x axis label, the run summary's cost per question
    ("LLM calls per question", lambda s: s["llm_calls_per_question"]),
    ("tokens per question", lambda s: s["tokens_per_question"]),
    ("mean latency per question (s)", lambda s: s["latency_s"]["mean"]),
)


def front_chart(ds: str, runs: list[Run]) -> str | None:
    """F1 against each cost per question, every run a point coloured by method, each panel's Pareto front."""
    panels = []
    for xlabel, cost in COSTS:
        series: dict[str, list[tuple[float, float, str]]] = {}
        for r in runs:
            x, y = cost(r.summary), r.summary["f1"]
            if x is not None and y is not None:
                series.setdefault(r.method, []).append((x, 100 * y, f"{r.label}: F1 {100 * y:.1f} at {x:.3g} {xlabel}"))
        if series:
            panels.append((xlabel, series))
    if not panels:
        return None
    return charts.fronts(f"front-{slug(ds)}", f"{ds}: F1 vs cost per question (dashed: Pareto front)", panels, "F1 (%)")


def recall_k_chart(ds: str, runs: list[Run]) -> str | None:
    names = strategy_names(runs)
    series: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        k, rec = r.params.get("k"), r.summary["support_recall"]
        if isinstance(k, int) and rec is not None:
            series.setdefault(names[r.path], []).append((k, 100 * rec))
    if not any(len({x for x, _ in ps}) > 1 for ps in series.values()):
        return None  # no strategy was run at more than one k
    return charts.lines(
        f"recall-k-{slug(ds)}", f"{ds}: gold-document recall vs k", series, "k (documents)", "gold-doc recall (%)"
    )


def llm_calls_chart(ds: str, runs: list[Run]) -> str:
    bars = [
        (
            r.label,
            {
                "LLM calls": r.summary["llm_calls_per_question"] or 0.0,
                "retrieval calls": r.summary["retrieval_calls_per_question"] or 0.0,
            },
        )
        for r in runs
    ]
    return charts.stacked_bars(
        f"llm-calls-{slug(ds)}", f"{ds}: model and retrieval calls per question", bars, "calls per question"
    )


def stage_time_chart(ds: str, runs: list[Run]) -> str:
    used = [s for s in STAGES if any(r.summary["time_per_question_s"][s] for r in runs)] or ["generation"]
    bars = [(r.label, {s: r.summary["time_per_question_s"][s] or 0.0 for s in used}) for r in runs]
    return charts.stacked_bars(
        f"stage-time-{slug(ds)}", f"{ds}: time per question by stage", bars, "mean seconds per question"
    )


def html_table(recs: list[dict[str, Any]]) -> str:
    head = "<tr><th>run</th><th>method</th>" + "".join(f"<th>{escape(h)}</th>" for h, _ in COLUMNS.values()) + "</tr>"
    body = "".join(
        "<tr><td>"
        + escape(r["run"])
        + "</td><td>"
        + escape(r["method"])
        + "</td>"
        + "".join(f"<td>{cell(r[k], f)}</td>" for k, (_, f) in COLUMNS.items())
        + "</tr>"
        for r in recs
    )
    return f'<table class="evaluation">{head}{body}</table>'


def comparison_tables(rows: list[dict[str, Any]]) -> str:
    """One `comparison_table` per set of compared metrics (answers, or gold-document recall without them)."""
    groups = dict.fromkeys(tuple(r["metrics"]) for r in rows)
    return "".join(comparison_table([r for r in rows if tuple(r["metrics"]) == m]) for m in groups)


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """Each run against the baseline: difference in points with its 95% interval and p per metric; a
    difference whose interval excludes 0 is marked (bold, class "significant")."""
    if not rows:
        return ""
    metrics = rows[0]["metrics"]
    head = "<tr><th>run</th><th>n</th>" + "".join(
        f"<th>{comparison.NAMES[m]}</th><th>&Delta;{comparison.NAMES[m]} [95% CI]</th><th>p</th>" for m in metrics
    )
    body = ""
    for r in rows:
        cells = f"<td>{escape(r['run'])}</td><td>{r['n']}</td>"
        for m in metrics:
            sig = comparison.significant(r, m)
            delta = escape(comparison.delta_cell(r, m))
            cells += (
                f"<td>{'-' if r[m] is None else f'{100 * r[m]:.1f}'}</td>"
                + (f'<td class="significant"><b>{delta}</b></td>' if sig else f"<td>{delta}</td>")
                + f"<td>{comparison.p_cell(r[f'p_{m}'])}</td>"
            )
        body += f"<tr>{cells}</tr>"
    r0 = rows[0]
    return (
        f'<p class="note">Against {escape(r0["baseline"])}, on the questions both answered (points; 95% '
        f"percentile paired bootstrap, {r0['resamples']} resamples; p: paired sign-flip randomization). Bold, *: "
        f'the interval excludes 0.</p><table class="comparison">{head}</tr>{body}</table>'
    )


def render(runs: list[Run], title: str = "dynrag evaluation", compared: list[dict[str, Any]] | None = None) -> str:
    """The whole report as one HTML string; `compared`: `comparison.comparisons` rows, shown per dataset."""
    sections = []
    for ds in dict.fromkeys(r.dataset for r in runs):
        these = [r for r in runs if r.dataset == ds]
        charts = [
            front_chart(ds, these),
            quality_time_chart(ds, these, "f1"),
            quality_time_chart(ds, these, "em"),
            recall_k_chart(ds, these),
            llm_calls_chart(ds, these),
            stage_time_chart(ds, these),
        ]
        sections.append(
            f'<section id="dataset-{slug(ds)}"><h2>{escape(ds)}</h2>'
            f"{html_table([record(r) for r in these])}"
            f"{comparison_tables([c for c in compared or [] if c['dataset'] == ds])}"
            f'<div class="charts">{"".join(c for c in charts if c)}</div></section>'
        )
    paths = "".join(f"<li>{escape(r.dataset)} / {escape(r.label)}: <code>{escape(r.path)}</code></li>" for r in runs)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
        f'<p class="note">{len(runs)} runs, generated {time.strftime("%Y-%m-%d %H:%M")}. EM, F1, Acc, P, R, '
        "gold-doc recall and RA ratio in %; s/q and the stage times are means of what a question cost (its "
        "shares of the batched calls); latency p50/p95 are quantiles of each question's own wall time from its "
        f"first request to its answer. Hover a mark for its value.</p>{''.join(sections)}<h2>Runs</h2><ul>{paths}</ul></body></html>\n"
    )


def write_report(
    out_dirs: list[str],
    html: str,
    title: str = "dynrag evaluation",
    baseline: str | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> str:
    """Render the runs at or below `out_dirs` into the file `html` (with each run against `baseline`, a run
    folder or label, when given); returns its path."""
    runs = load_runs(out_dirs)
    compared = comparison.comparisons(runs, baseline, resamples, seed) if baseline else None
    path = Path(html)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(runs, title, compared), encoding="utf-8")
    return str(path)
