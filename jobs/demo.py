"""`dynrag demo`: the main job on the embedded default, with no GPU, no ../shared and no model hub.

Real Wikipedia lead sections and real DPR questions come from PyPI packages (pipeline/assets/embedded.py);
the index is built (or reused: builds are incremental), questions are answered with `sr-rag`
and the rows, the resolved config and a summary land under --out.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args
    from pipeline.assets.embedded import DPR_QUESTION_SETS

    p = sub.add_parser(
        "demo", help="index packaged Wikipedia text and answer real questions (no GPU, hub or data kit needed)",
        description="Build BM25 and FAISS indexes over 10,033 Wikipedia lead sections carried by a PyPI package, "
        "then answer DPR questions (also packaged) with single-round RAG, writing one Parquet row per question.",
    )
    p.add_argument("--out", default="runs/demo", help="output folder (index, rows, summary); default: %(default)s")
    p.add_argument("--questions", default="trivia-test", choices=sorted(DPR_QUESTION_SETS),
                   help="packaged DPR question set; default: %(default)s")
    p.add_argument("--limit", type=int, default=100, help="number of questions; default: %(default)s")
    p.add_argument("--method", default="sr-rag", help="answer method; default: %(default)s")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from indexing import build_index
    from jobs.cli import config_from_args
    from pipeline.config import save_resolved
    from pipeline.assets.embedded import dpr_questions, wikipedia_lead_sections

    cfg = config_from_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = cfg.paths.cache_dir

    corpus = wikipedia_lead_sections(cache)
    questions = dpr_questions(args.questions, cache)
    index_dir = out / "index"
    log.info("building the index over %s into %s (reused when unchanged)", corpus.name, index_dir)
    report = build_index([str(corpus)], str(index_dir), cfg.index_settings(), fmt="wiki-lead-sections")
    log.info("index ready: %s", report)
    save_resolved(cfg, out)

    from pipeline.runtime.answer import run_answer

    summary = run_answer(str(questions), str(out / "answers"), index=str(index_dir), method=args.method,
                         limit=args.limit, cfg=cfg, dataset_format="dpr-topics")
    from jobs.answer import format_summary

    print(f"\nindex:   {index_dir}\nanswers: {out / 'answers'} (Parquet rows, summary.json, resolved config)")
    print(format_summary(summary))
    return 0

