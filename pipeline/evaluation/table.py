"""The evaluation table: one record per run with the papers' columns, written as Parquet, CSV and Markdown.

Quality columns (EM, F1, Acc, token precision/recall, gold-document recall, RA ratio) are means in [0, 1]
in the records and percentages in the Markdown, as the papers print them. `s/q` is the mean time a
question cost (its shares of the batched calls, per stage, summed); `latency p50/p95` are quantiles of the
questions' own wall times from first request to answer (`latency_s`), which include waiting for batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.evaluation.runs import Run, load_runs

# record key -> (Markdown header, format); "%" means a share printed as a percentage
COLUMNS: dict[str, tuple[str, str]] = {
    "questions": ("n", "d"),
    "em": ("EM", "%"),
    "f1": ("F1", "%"),
    "acc": ("Acc", "%"),
    "precision": ("P", "%"),
    "recall": ("R", "%"),
    "gold_doc_recall": ("gold-doc recall", "%"),
    "docs_in_prompt": ("docs/q", ".2f"),
    "llm_calls": ("LLM calls/q", ".2f"),
    "retrieval_calls": ("retrievals/q", ".2f"),
    "ra_ratio": ("RA ratio", "%"),
    "s_per_q": ("s/q", ".3f"),
    "latency_p50": ("latency p50 s", ".3f"),
    "latency_p95": ("latency p95 s", ".3f"),
    "tokens_per_q": ("tokens/q", ".0f"),
    "errors": ("errors", "d"),
    "window_full": ("window full", "d"),  # answered rows a full context window shortened or ended
}


def record(run: Run) -> dict[str, Any]:
    s = run.summary
    return {
        "dataset": run.dataset,
        "run": run.label,
        "method": run.method,
        "k": run.params.get("k"),
        "questions": s["answered"],
        "em": s["em"],
        "f1": s["f1"],
        "acc": s["acc"],
        "precision": s["precision"],
        "recall": s["recall"],
        "gold_doc_recall": s["support_recall"],
        "docs_in_prompt": s.get("docs_in_prompt_per_question"),
        "llm_calls": s["llm_calls_per_question"],
        "retrieval_calls": s["retrieval_calls_per_question"],
        "ra_ratio": s["retrieval_triggered_rate"],
        "s_per_q": s["time_per_question_s"]["total"],
        "latency_p50": s["latency_s"]["p50"],
        "latency_p95": s["latency_s"]["p95"],
        "tokens_per_q": s["tokens_per_question"],
        "errors": s["errors"],
        "window_full": s.get("window_full"),  # None for summaries written before it
        **{f"s_{stage}": v for stage, v in s["time_per_question_s"].items() if stage != "total"},
        "params": run.params,
        "path": run.path,
        "error_example": (s.get("error_examples") or [None])[0],
    }


def records(runs: list[Run]) -> list[dict[str, Any]]:
    """Records ordered by dataset, then in the order the runs were given."""
    order = list(dict.fromkeys(r.dataset for r in runs))
    return sorted((record(r) for r in runs), key=lambda rec: order.index(rec["dataset"]))


def cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if fmt == "%" else format(value, fmt)


def markdown(recs: list[dict[str, Any]]) -> str:
    """One Markdown table per dataset."""
    blocks = []
    for ds in dict.fromkeys(r["dataset"] for r in recs):
        lines = [
            f"### {ds}",
            "",
            "| run | method | " + " | ".join(h for h, _ in COLUMNS.values()) + " |",
            "|---|---|" + "---:|" * len(COLUMNS),
        ]
        for r in (r for r in recs if r["dataset"] == ds):
            lines.append(
                f"| {r['run']} | {r['method']} | " + " | ".join(cell(r[k], f) for k, (_, f) in COLUMNS.items()) + " |"
            )
        lines += [
            f"\n{r['run']}: {r['errors']} error rows, e.g. {r['error_example'][:200]}"
            for r in recs
            if r["dataset"] == ds and r["error_example"]
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def write_tables(recs: list[dict[str, Any]], out_dir: str, name: str = "evaluation") -> list[str]:
    """`name`.parquet, .csv and .md under `out_dir`; returns the paths."""
    import json

    import polars as pl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = pl.DataFrame(
        [{**r, "params": json.dumps(r["params"], sort_keys=True)} for r in recs], infer_schema_length=None
    )
    paths = [out / f"{name}.parquet", out / f"{name}.csv", out / f"{name}.md"]
    df.write_parquet(paths[0])
    df.write_csv(paths[1])
    paths[2].write_text(markdown(recs), encoding="utf-8")
    return [str(p) for p in paths]


def evaluate(out_dirs: list[str], out: str) -> tuple[str, list[str]]:
    """The Markdown tables of the runs at or below `out_dirs`, and the table files written under `out`."""
    recs = records(load_runs(out_dirs))
    return markdown(recs), write_tables(recs, out)
