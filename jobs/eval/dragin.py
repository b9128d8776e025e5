"""DRAGIN's Tables 2 and 3 for the configured model: EM, F1 and retrievals per question of no-retrieval,
sr-rag, fl-rag, fs-rag, flare and dragin on 2WikiMultihopQA and HotpotQA dev, BM25 over each dev
set's own paragraphs (built under --indexes on first use).

    dynrag eval-dragin --limit 50 [--datasets 2wiki,hotpotqa] [--methods ...]
        [--indexes DIR] [--out runs/dragin-tables] [--set generation.model=...]

Every method runs through the answer job (rows under OUT/<dataset>/<method>, resumable) on one set of
backends per dataset (one vLLM engine, one attention model, one index). Prints a Markdown table and
writes it with the rows' figures to OUT/tables.md and OUT/tables.json.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from jobs.cli import csv_choice
from pipeline.config import run_params
from pipeline.evaluation.devsets import DEV_SETS, dev_file, dev_index
from pipeline.evaluation.runs import extra_summary

# table column -> the methods' own count in each row's `extra`
EXTRA_COLUMNS = {
    "gen_tokens": "generated_tokens",
    "triggers": "hallucination_points",
    "forced": "answer_forced",
    "entropy": "entropy",
}
METHODS = ("no-retrieval", "sr-rag", "fl-rag", "fs-rag", "flare", "dragin")
LABELS = {
    "no-retrieval": "wo-RAG",
    "sr-rag": "SR-RAG",
    "fl-rag": "FL-RAG",
    "fs-rag": "FS-RAG",
    "flare": "FLARE",
    "dragin": "DRAGIN",
}


def run_k(summary: dict, cfg) -> int | None:
    """The run's k from its summary's method params (None there: the config's retrieval.k); None for a method
    without k."""
    return run_params(summary.get("method_params"), {"retrieval": {"k": cfg.retrieval.k}}).get("k")


def evaluate(cfg, datasets: list[str], methods: list[str], limit: int | None, out: Path, indexes: Path) -> list[dict]:
    from pipeline.evaluation.experiment import MethodRun, run_methods

    cfg.answer.progress = False
    rows = []
    for ds in datasets:
        runs = [MethodRun(m, m, {}) for m in methods]
        for s in run_methods(str(dev_file(cfg, ds)), dev_index(cfg, ds, indexes), runs, cfg, out / ds, limit=limit):
            e = extra_summary(s["out"], list(EXTRA_COLUMNS.values()))
            rows.append(
                {
                    "dataset": ds,
                    "method": s["label"],
                    "k": run_k(s, cfg),
                    "questions": s["answered"],
                    "errors": s["errors"],
                    "em": s["em"],
                    "f1": s["f1"],
                    "retrievals": s.get("retrieval_calls_per_question"),
                    "llm_calls": s.get("llm_calls_per_question"),
                    **{column: e[key] for column, key in EXTRA_COLUMNS.items()},
                    "s_per_q": s["time_per_question_s"]["total"],
                    "out": s["out"],
                }
            )
            logging.getLogger(__name__).info("%s %s: %s", ds, s["label"], rows[-1])
    return rows


def retrieval_note(rows: list[dict]) -> str:
    """The table's header line on retrieval: each method's k as its rows recorded it."""
    ks = {r["method"]: r["k"] for r in rows if r["k"] is not None}
    return "top-k per method: " + ", ".join(f"{LABELS.get(m, m)} {k}" for m, k in ks.items()) if ks else ""


def comparison(rows: list[dict]) -> list[str]:
    """DRAGIN's retrievals per question against FS-RAG's, where both are known."""
    lines = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        dr, fs = (
            {r["method"]: r["retrievals"] for r in rows if r["dataset"] == d}.get(m) for m in ("dragin", "fs-rag")
        )
        if dr is not None and fs is not None:
            lines.append(
                f"{d}: DRAGIN retrieves {'less' if dr < fs else 'not less'} than FS-RAG "
                f"({dr:.2f} vs {fs:.2f} per question)"
            )
    return lines


def table(rows: list[dict]) -> str:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    head = "| method | " + " | ".join(f"{d} EM | {d} F1 | {d} #ret | {d} tokens" for d in datasets) + " |"
    lines = [head, "|---|" + "---|" * (4 * len(datasets))]
    fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for m in dict.fromkeys(r["method"] for r in rows):
        cells = []
        for d in datasets:
            r = next((r for r in rows if (r["dataset"], r["method"]) == (d, m)), None)
            cells += [
                fmt(r and r["em"]),
                fmt(r and r["f1"]),
                fmt(r and r["retrievals"], 2),
                fmt(r and r["gen_tokens"], 1),
            ]
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def intervals(rows: list[dict]) -> str:
    """Every method against SR-RAG (else the first method) per dataset: EM/F1/Acc differences with 95%
    intervals and p."""
    from pipeline.evaluation.comparison import against_baseline

    methods = list(dict.fromkeys(r["method"] for r in rows))
    base = "sr-rag" if "sr-rag" in methods else methods[0]
    return f"against {LABELS.get(base, base)}:\n\n" + against_baseline([(r["method"], r["out"]) for r in rows], base)


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options, add_sequential_arg

    p = sub.add_parser(
        "eval-dragin",
        help="DRAGIN Tables 2-3: EM/F1/retrievals of wo-RAG, SR/FL/FS-RAG, FLARE, DRAGIN",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--datasets", default="2wiki,hotpotqa", help="comma-separated: " + ", ".join(DEV_SETS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    add_job_options(p, limit={"default": 50, "help": "first N questions of each dev set (default 50)"})
    p.add_argument("--out", default="runs/dragin-tables", metavar="DIR", help="rows and the tables go here")
    p.add_argument(
        "--indexes",
        metavar="DIR",
        help="folder of per-dataset BM25 indexes <DIR>/<dataset> (built there if absent; default OUT/indexes)",
    )
    add_sequential_arg(p)
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    out = Path(args.out)
    rows = evaluate(
        cfg,
        csv_choice(args.datasets, list(DEV_SETS)),
        csv_choice(args.methods, list(METHODS)),
        args.limit,
        out,
        Path(args.indexes) if args.indexes else out / "indexes",
    )
    errors = sum(r["errors"] or 0 for r in rows)
    text = (
        f"model {cfg.generation.model}, {args.limit} questions per dataset, {cfg.retrieval.retriever}; "
        f"{retrieval_note(rows)}"
        + (f"; {errors} error rows, left out of the figures" if errors else "")
        + "\n\n"
        + table(rows)
        + "\n\n"
        + "\n".join(comparison(rows))
        + "\n\n"
        + intervals(rows)
    )
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text(text + "\n")
    (out / "tables.json").write_text(json.dumps(rows, indent=1))
    return 0
