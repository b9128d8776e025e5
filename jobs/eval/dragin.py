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
from pipeline.evaluation.devsets import DEV_SETS, dev_file, dev_index
from pipeline.evaluation.runs import extra_summary

# table column -> the methods' own count in each row's `extra`
EXTRA_COLUMNS = {"gen_tokens": "generated_tokens", "triggers": "hallucination_points", "forced": "answer_forced",
                 "entropy": "entropy"}
METHODS = ("no-retrieval", "sr-rag", "fl-rag", "fs-rag", "flare", "dragin")
LABELS = {"no-retrieval": "wo-RAG", "sr-rag": "SR-RAG", "fl-rag": "FL-RAG", "fs-rag": "FS-RAG", "flare": "FLARE",
          "dragin": "DRAGIN"}


def evaluate(cfg, datasets: list[str], methods: list[str], limit: int | None, out: Path, indexes: Path) -> list[dict]:
    from pipeline.runtime.answer import run_answer
    from pipeline.backends import Backends

    cfg.answer.progress = False
    rows = []
    for ds in datasets:
        dev, index = dev_file(cfg, ds), dev_index(cfg, ds, indexes)
        backends = Backends(cfg, index)
        try:
            for m in methods:
                s = run_answer(str(dev), str(out / ds / m), index=index, method=m, limit=limit, cfg=cfg.model_copy(deep=True),
                               backends=backends, progress=False)
                e = extra_summary(str(out / ds / m), list(EXTRA_COLUMNS.values()))
                extras = {column: e[key] for column, key in EXTRA_COLUMNS.items()}
                rows.append({"dataset": ds, "method": m, "questions": s["answered"], "errors": s["errors"],
                             "em": s["em"], "f1": s["f1"], "retrievals": s.get("retrieval_calls_per_question"),
                             "llm_calls": s.get("llm_calls_per_question"), **extras,
                             "s_per_q": s["time_per_question_s"]["total"]})
                logging.getLogger(__name__).info("%s %s: %s", ds, m, rows[-1])
        finally:
            backends.close()
    return rows


def table(rows: list[dict]) -> str:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    head = "| method | " + " | ".join(f"{d} EM | {d} F1 | {d} #ret | {d} tokens" for d in datasets) + " |"
    lines = [head, "|---|" + "---|" * (4 * len(datasets))]
    fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for m in dict.fromkeys(r["method"] for r in rows):
        cells = []
        for d in datasets:
            r = next((r for r in rows if (r["dataset"], r["method"]) == (d, m)), None)
            cells += [fmt(r and r["em"]), fmt(r and r["f1"]), fmt(r and r["retrievals"], 2), fmt(r and r["gen_tokens"], 1)]
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = sub.add_parser("eval-dragin", help="DRAGIN Tables 2-3: EM/F1/retrievals of wo-RAG, SR/FL/FS-RAG, FLARE, DRAGIN",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="2wiki,hotpotqa", help="comma-separated: " + ", ".join(DEV_SETS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    p.add_argument("--limit", type=int, default=50, help="first N questions of each dev set (default 50)")
    p.add_argument("--out", default="runs/dragin-tables", metavar="DIR", help="rows and the tables go here")
    p.add_argument("--indexes", metavar="DIR", help="folder of per-dataset BM25 indexes <DIR>/<dataset> (built there "
                                                    "if absent; default OUT/indexes)")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    out = Path(args.out)
    rows = evaluate(cfg, csv_choice(args.datasets, list(DEV_SETS)), csv_choice(args.methods, list(METHODS)), args.limit,
                    out, Path(args.indexes) if args.indexes else out / "indexes")
    text = (f"model {cfg.generation.model}, {args.limit} questions per dataset, BM25 top-3\n\n" + table(rows))
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text(text + "\n")
    (out / "tables.json").write_text(json.dumps(rows, indent=1))
    dr = {r["dataset"]: r["retrievals"] for r in rows if r["method"] == "dragin"}
    fs = {r["dataset"]: r["retrievals"] for r in rows if r["method"] == "fs-rag"}
    for d in dr.keys() & fs.keys():
        print(f"{d}: DRAGIN retrieves {'less' if dr[d] < fs[d] else 'not less'} than FS-RAG ({dr[d]:.2f} vs {fs[d]:.2f} per question)")

    return 0
