"""`dynrag bench answer`: the whole sr-rag pipeline against a bare vLLM `generate` on the same prompts.

Both run in one process on one vLLM engine (started once, not timed). The pipeline run is a full
`run_answer` (load questions, retrieve, build prompts, generate, score, write Parquet); the bare run
is one `LLM.generate` over the very prompts the pipeline sent (already tokenized, greedy, same
max tokens). The figure is generated tokens/s of the pipeline / generated tokens/s of bare vLLM.
Each repeat runs the pipeline, then bare vLLM on its prompts, because this machine's speed drifts
between runs; the median ratio over repeats is reported.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from jobs.bench.rig.rss import GIB, TreeRss

log = logging.getLogger(__name__)


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options

    p = bsub.add_parser(
        "answer",
        help="sr-rag pipeline tokens/s vs bare vLLM generate on the same prompts",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    add_job_options(p, index={"help": "index over the dataset's paragraphs"}, dataset={})
    p.add_argument("--method", default="sr-rag")
    add_job_options(
        p,
        limit={"default": 200, "help": "questions (default 200)"},
        repeats={"help": "alternating bare/pipeline pairs (default 1)"},
        json={},
    )
    add_config_args(p)
    p.set_defaults(func=run)


class _Recorder:
    """Passes generate calls through to the real backend and keeps the prompts it was given."""

    def __init__(self, gen):
        self.gen = gen
        self.calls: list[tuple[list, list, list]] = []
        self.seconds = 0.0

    def generate(self, prompts, samplings, chats):
        self.calls.append((list(prompts), list(samplings), list(chats)))
        t0 = time.perf_counter()
        try:
            return self.gen.generate(prompts, samplings, chats)
        finally:
            self.seconds += time.perf_counter() - t0


def bare_generate(gen, calls) -> tuple[int, float]:
    """One `LLM.generate` over every recorded prompt, pre-tokenized; (generated tokens, seconds)."""
    from vllm.inputs import TokensPrompt

    prompts, params = [], []
    for ps, ss, cs in calls:
        for ids, spec in zip(gen.encode_all(ps, cs, ss), ss):
            if not isinstance(ids, list):  # not run in the recorded run either (an error, or a full window)
                continue
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(gen.sampling_params(spec, len(ids)))
    t0 = time.perf_counter()
    outs = gen.llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs), dt


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.backends.vllm_gen import VllmGenerator
    from pipeline.runtime.answer import generation_dtype

    cfg = config_from_args(args)
    cfg.generation.backend = "vllm"
    cfg.generation.dtype = generation_dtype(cfg)  # recorded with the figures
    cfg.answer.progress = False
    dataset = args.dataset or str(Path(cfg.paths.data_dir) / "hotpotqa" / "dev_400.jsonl")
    t0 = time.perf_counter()
    gen = VllmGenerator(cfg)
    startup = time.perf_counter() - t0
    results = []
    prev_calls: list = []
    mem = TreeRss().start()  # peak RSS of this process and vLLM's engine core, per phase
    try:
        for rep in range(args.repeats):
            result, prev_calls = timed_repeat(rep, args, cfg, dataset, gen, mem, prev_calls)
            results.append(result)
            log.warning(
                "repeat %d: %s",
                rep + 1,
                json.dumps({k: v for k, v in results[-1].items() if k != "time_per_question_s"}),
            )
    finally:
        mem.stop()
        gen.close()
    rss = {k: round(v / GIB, 2) for k, v in mem.peaks.items()}
    figures = {
        "peak_rss_gib": rss,
        "method": args.method,
        "model": cfg.generation.model,
        "dtype": cfg.generation.dtype,
        "questions": args.limit,
        "max_new_tokens": cfg.generation.max_new_tokens,
        "engine_startup_s": round(startup, 1),
        "repeats": results,
        "ratio_median": round(statistics.median(r["ratio"] for r in results), 3),
    }
    if args.json:
        from jobs.jsonout import emit

        emit(figures, indent=2)
    else:
        print_figures(figures)
    return 0


def timed_repeat(rep: int, args: argparse.Namespace, cfg, dataset: str, gen, mem: TreeRss, prev_calls: list):
    """One repeat: the pipeline timed, and bare vLLM on its prompts (odd repeats: bare vLLM first, on the previous
    repeat's prompts); its figures and the prompts the pipeline sent."""
    from pipeline.backends import Backends
    from pipeline.runtime.answer import run_answer

    rec = _Recorder(gen)
    backends = Backends(cfg, args.index, generator=rec)
    answer = {"index": args.index, "method": args.method, "limit": args.limit, "cfg": cfg, "backends": backends}
    with tempfile.TemporaryDirectory(prefix="dynrag-bench-") as out:
        if rep == 0:  # warm the index and the engine once, on batches of the timed run's size (not timed):
            # warmed on 4 questions, the first timed 64-prompt batch ran 2.4x slower than the next ones
            run_answer(dataset, f"{out}/warm", **answer)
            rec.calls.clear()
        rec.seconds = 0.0
        if rep % 2:  # odd repeats time bare vLLM first (on the previous repeat's prompts)
            mem.phase = "bare"
            bare_first = bare_generate(gen, prev_calls)
        mem.phase = "pipeline"
        t1 = time.perf_counter()
        summary = run_answer(dataset, f"{out}/run", **answer)
        pipe_s = time.perf_counter() - t1
    if not summary["answered"]:
        from pipeline.errors import DynragError

        raise DynragError(f"no question was answered; e.g. {summary['error_examples'][:1]}")
    pipe_tokens = round(summary["completion_tokens_per_question"] * summary["answered"])
    mem.phase = "bare"
    bare_tokens, bare_s = bare_first if rep % 2 else bare_generate(gen, rec.calls)
    mem.phase = None
    result = {
        "pipeline_tokens": pipe_tokens,
        "pipeline_s": round(pipe_s, 2),
        "bare_tokens": bare_tokens,
        "bare_s": round(bare_s, 2),
        "pipeline_tok_s": round(pipe_tokens / pipe_s, 2),
        "bare_tok_s": round(bare_tokens / bare_s, 2),
        "ratio": round((pipe_tokens / pipe_s) / (bare_tokens / bare_s), 3),
        # the share of the pipeline's wall time spent inside the backend's generate: the
        # ratio this machine would show if vLLM ran at the same speed in both runs
        "generate_share_of_pipeline": round(rec.seconds / pipe_s, 4),
        "time_per_question_s": summary["time_per_question_s"],
        "em": summary["em"],
        "f1": summary["f1"],
        "prompts": sum(len(c[0]) for c in rec.calls),
        "generate_calls": len(rec.calls),
    }
    backends.close()
    return result, rec.calls


def print_figures(figures: dict) -> None:
    f = figures
    print(
        f"{f['method']} over {f['questions']} questions, {f['model']} ({f['dtype']}), "
        f"{f['max_new_tokens']} new tokens, vLLM startup {f['engine_startup_s']:.1f} s (not timed)"
    )
    for i, r in enumerate(f["repeats"], 1):
        print(
            f"  repeat {i}: pipeline {r['pipeline_tokens']} tok in {r['pipeline_s']} s = {r['pipeline_tok_s']} tok/s; "
            f"bare vLLM {r['bare_tokens']} tok in {r['bare_s']} s = {r['bare_tok_s']} tok/s; "
            f"ratio {r['ratio']} ({r['generate_calls']} generate call(s), {r['prompts']} prompts); "
            f"generate share of pipeline time {r['generate_share_of_pipeline']}"
        )
    print(f"pipeline / bare generated tokens/s: {f['ratio_median']} (median of {len(f['repeats'])}; goal >= 0.85)")
    rss = f["peak_rss_gib"]
    print(
        f"peak RSS of the process tree (this process + vLLM engine core, one engine shared by both sides): "
        f"pipeline phases {rss.get('pipeline')} GiB, bare phases {rss.get('bare')} GiB"
    )
