"""PAIRS evaluation (Chen et al. 2025, Tables 2 and 3): EM, F1, retrieval-activation (RA) ratio and LLM calls
per question for the PAIRS methods and their baselines, and the gold-document recall of the selected
documents for DPR-AIS against its one-path and fixed-ratio ablations.

    dynrag eval-pairs --dataset ../shared/data/hotpotqa/dev_400.jsonl --index idx/hotpotqa \
        --reranker models/reranker --limit 100 [--methods main|ablation|all|name,...] [--out DIR]
        [--set generation.model=qwen2.5-0.5b-instruct] [--set method.params.prompt_style=fig9]

Every run goes through the answer job with one shared set of backends (one model load), into
OUT/<label> (resumable: a rerun answers only the missing questions, then prints the whole table).
`--set method.params.X=V` applies X to every PAIRS-family run that has the parameter. Gold-document recall
needs supporting labels (multi-hop sets); open-domain sets print "-".
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# label -> (method, params); k = 3 documents and dense retrieval everywhere (PAIRS implementation details)
RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "no-retrieval": ("no-retrieval", {}),
    "sr-rag": ("sr-rag", {"k": 3, "retriever": "dense"}),
    "hyde": ("hyde", {}),
    "q2d": ("q2d", {}),
    "cot": ("cot", {}),
    "pairs": ("pairs", {}),
    "pairs-exclude-num": ("pairs", {"exclude_numeric": True}),
    "dpr-ais": ("dpr-ais", {}),
    "dpr-ais-dynamic": ("dpr-ais-dynamic", {}),
    "rerank": ("rerank", {}),
    "dpr-ais-rerank": ("dpr-ais-rerank", {}),
    "w/o DPR (q only)": ("dpr-ais", {"paths": "query"}),
    "w/o DPR (p only)": ("dpr-ais", {"paths": "pseudo"}),
    "w/o AIS (2q+1p)": ("dpr-ais", {"selection": "fixed-2q1p"}),
    "w/o AIS (1q+2p)": ("dpr-ais", {"selection": "fixed-1q2p"}),
}
GROUPS = {
    "main": ["no-retrieval", "sr-rag", "hyde", "q2d", "cot", "pairs", "dpr-ais", "rerank", "dpr-ais-rerank"],
    "ablation": ["dpr-ais", "w/o DPR (q only)", "w/o DPR (p only)", "w/o AIS (2q+1p)", "w/o AIS (1q+2p)"],
}
GROUPS["all"] = list(dict.fromkeys(GROUPS["main"] + GROUPS["ablation"] + ["dpr-ais-dynamic", "pairs-exclude-num"]))
RERANKED = {"rerank", "dpr-ais-rerank"}


def add_args(p: argparse.ArgumentParser) -> None:
    from jobs.cli import add_job_options

    add_job_options(
        p,
        dataset={"required": True, "help": "question file (any format `dynrag answer` reads)", "metavar": None},
        index={"help": "index over the corpus (dynrag index)"},
    )
    p.add_argument(
        "--reranker",
        metavar="DIR",
        help="(q, d) reranker folder for rerank / dpr-ais-rerank (dynrag train-classifier --set classifier.task=pair)",
    )
    add_job_options(p, limit={"default": 100, "help": "first N questions (default %(default)s)"})
    p.add_argument(
        "--methods", default="main", help="main, ablation, all, or comma-separated labels: " + ", ".join(RUNS)
    )
    p.add_argument("--dataset-format", help="dataset format (default: auto)")
    p.add_argument("--out", default="runs/eval-pairs", metavar="DIR", help="rows per run and table.md go here")


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_sequential_arg

    p = sub.add_parser(
        "eval-pairs",
        help="PAIRS Tables 2-3: EM/F1/RA ratio/LLM calls and DPR-AIS recall ablations",
        description=__doc__.split("\n\n")[0],
    )
    add_args(p)
    add_sequential_arg(p)
    add_config_args(p)
    p.set_defaults(func=run)


def pick(spec: str) -> list[str]:
    from pipeline.errors import DynragError

    if spec in GROUPS:
        return GROUPS[spec]
    labels = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in labels if s not in RUNS]
    if bad or not labels:
        raise DynragError(f"unknown run {bad or spec!r}; choose main, ablation, all or from: {', '.join(RUNS)}")
    return labels


def run_params(label: str, shared: dict) -> tuple[str, dict]:
    """The run's method and params: its own, plus every shared param its method accepts."""
    from pipeline.methods.registry import get_method

    method, own = RUNS[label]
    accepted = get_method(method).params_model.model_fields
    return method, {**{k: v for k, v in shared.items() if k in accepted}, **own}


def _f(x, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}" if pct else f"{x:.2f}"


def table(results: list[tuple[str, dict]]) -> str:
    head = (
        "| run | n | EM | F1 | RA ratio | LLM calls/q | retrieval calls/q | gold-doc recall | docs/q | s/q |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for label, s in results:
        lines.append(
            f"| {label} | {s['answered']} | {_f(s['em'], True)} | {_f(s['f1'], True)} | "
            f"{_f(s['retrieval_triggered_rate'], True)}% | {_f(s['llm_calls_per_question'])} | "
            f"{_f(s['retrieval_calls_per_question'])} | {_f(s['support_recall'], True)} | "
            f"{_f(s.get('docs_in_prompt_per_question'))} | {_f(s['time_per_question_s']['total'])} |"
        )
    return "\n".join(lines)


def intervals(results: list[tuple[str, dict]]) -> str:
    """Every run against sr-rag (else the first run): EM/F1/Acc differences with 95% intervals and p."""
    from pipeline.evaluation.comparison import against_baseline

    labels = [label for label, _ in results]
    base = "sr-rag" if "sr-rag" in labels else labels[0]
    return f"against {base}:\n\n" + against_baseline([(label, s["out"]) for label, s in results], base)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.evaluation.experiment import MethodRun, run_methods

    cfg = config_from_args(args)
    labels = pick(args.methods)
    if any(lab in RERANKED for lab in labels):
        if args.reranker:
            cfg.scoring.classifiers = {**cfg.scoring.classifiers, "reranker": args.reranker}
        elif "reranker" not in cfg.scoring.classifiers:
            from pipeline.errors import DynragError

            raise DynragError("rerank runs need --reranker DIR (or scoring.classifiers.reranker)")
    shared = dict(cfg.method.params)
    out = Path(args.out)
    runs = []
    for label in labels:
        method, params = run_params(label, shared)
        folder = label.replace(" ", "_").replace("/", "").replace("(", "").replace(")", "").replace("+", "")
        runs.append(MethodRun(folder, method, params))
    summaries = run_methods(
        args.dataset,
        args.index,
        runs,
        cfg,
        out,
        limit=args.limit,
        dataset_format=args.dataset_format,
        each=lambda r, s: print(table([(r.label, s)]).splitlines()[-1], flush=True),
    )
    results = list(zip(labels, summaries))
    text = (
        f"dataset {args.dataset} (first {args.limit}), index {args.index}, model {cfg.generation.model}, "
        f"shared params {json.dumps(shared)}\n\n{table(results)}\n\n{intervals(results)}"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text, encoding="utf-8")
    print("\n" + text)
    return 0
