"""`dynrag answer`: answer a dataset with a method; one Parquet row per question under --out."""

from __future__ import annotations

import argparse
import json
import logging

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options

    p = sub.add_parser(
        "answer",
        help="answer a dataset with a RAG method, one Parquet row per question",
        description="Answer every question of a dataset with a method. Rows go to OUT/parts/*.parquet; "
        "rerunning the same command resumes: questions that have a row are skipped, except rows whose error is not "
        "the question's own (error_kind=system: a backend, index, model or I/O failure), which are "
        "answered again; error rows of bad input (error_kind=input) stay. An output folder holds one "
        "method and configuration: a rerun with other settings is refused.",
    )
    io = p.add_argument_group("input / output")
    add_job_options(
        io,
        dataset={
            "required": True,
            "metavar": "FILE_OR_URI",
            "help": "question file (JSONL/JSON/Parquet, local or fsspec URI) or dpr:<set>, e.g. dpr:nq-test",
        },
    )
    io.add_argument(
        "--dataset-format",
        default=None,
        metavar="FORMAT",
        help="auto (default), hotpotqa, hotpotqa-ircot, 2wiki, musique, qa, triviaqa, strategyqa, dpr-topics, generic",
    )
    add_job_options(
        io, index={"help": "index folder built by `dynrag index` (needed by methods that retrieve)", "required": False}
    )
    io.add_argument("--out", required=True, metavar="DIR", help="output folder (local path or fsspec URI)")
    add_job_options(io, limit={"metavar": "N", "help": "answer only the first N questions of the dataset"})
    p.add_argument("--method", metavar="NAME", help="method name (dynrag methods); default: method.name of the config")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from jobs.quiet import divert_to_output
    from pipeline.runtime.answer import run_answer

    cfg = config_from_args(args)
    with divert_to_output(args.out, getattr(args, "log_level", "INFO")):  # library logs and warnings to OUT/dynrag.log
        summary = run_answer(
            args.dataset,
            args.out,
            index=args.index,
            method=args.method,
            limit=args.limit,
            cfg=cfg,
            dataset_format=args.dataset_format,
            progress=False if args.no_progress else None,
        )
    print(format_summary(summary))
    return 0


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def format_summary(s: dict) -> str:
    t = s["time_per_question_s"]
    lines = [
        f"method {s['method']} {json.dumps(s['method_params'])}  model {s['model']}  runtime {s['runtime']}",
        f"rows {s['rows']} (answered {s['answered']}, errors {s['errors']}, new {s.get('new_rows')}, "
        f"resumed past {s['skipped_already_answered']})  -> {s['out']}",
        f"EM {_fmt(s['em'])}  F1 {_fmt(s['f1'])}  acc {_fmt(s['acc'])}  "
        f"token P {_fmt(s['precision'])} R {_fmt(s['recall'])}  gold-doc recall {_fmt(s['support_recall'])}",
        f"per question: LLM calls {_fmt(s['llm_calls_per_question'])}  retrieval calls "
        f"{_fmt(s['retrieval_calls_per_question'])}  classifier calls {_fmt(s['classifier_calls_per_question'])}  "
        f"tokens in/out {_fmt(s['prompt_tokens_per_question'])}/{_fmt(s['completion_tokens_per_question'])}",
        f"served from caches: prompt tokens (vLLM's prefix cache) {_fmt(s.get('prefix_cache_hit_rate'))}  "
        f"retrievals {_fmt(s.get('retrieval_cache_hit_rate'))}",
        "time per question (s): " + "  ".join(f"{k} {v:.4f}" for k, v in t.items() if v is not None),
        f"wall {_fmt(s.get('wall_time_s'))} s, {_fmt(s.get('questions_per_s'))} questions/s (this run, incl. startup)",
    ]
    if s.get("error_examples"):
        lines.append("errors, e.g.: " + " | ".join(e[:160] for e in s["error_examples"]))
    return "\n".join(lines)
