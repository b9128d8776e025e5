"""`dynrag bench experiment --simulate-gpu`: an experiment's runs answered together vs one after another, on
latency-model backends.

Several methods over the same synthetic questions, answered by the experiment's own runner (`run_methods` of
pipeline/evaluation/experiment.py, as `dynrag experiment` runs a dataset) twice, each time on a fresh set of
`jobs/bench/rig/simulated.py`'s backends handed to it as `dynrag experiment`'s real ones are: concurrent
(answer.runs=concurrent: every run's questions in one engine's admission queue) and sequential (`--sequential`: one
run after another, each with the engine to itself). Both modes first answer 2 questions unslept (imports and first
calls out of the timing). Per mode: seconds from the first question to the last row (no process or engine startup:
the model has none), LLM calls, tokens, the generator's decode steps and mean running sequences per step, its busy
fraction, and per run the retrieval cache's hit rate. `ratio_vs_sequential`: the sequential seconds over the
concurrent ones. `model_ratio_vs_sequential`: the same over the modelled seconds of the generator's steps
(`model_s`: as slept at time scale 1 on an idle host; steady where the wall seconds move with the host), and
`model_ratio_bound` the most any scheduling could reach: the sequential mode's modelled seconds over the least the
concurrent mode's tokens need (`model_floor_s`). `same_as_alone`: every run's predictions identical in both modes
(sequential being each run with the engine to itself). A simulation: the figures are the model's (below), not a
GPU's.
Sleeps are `--time-scale` times the modelled seconds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.bench.cli import add_simulated_parser
from jobs.bench.rig import simulated

METHODS = ("sr-rag", "iter-retgen", "flare", "self-ask", "ircot", "sure")
MODES = ("concurrent", "sequential")


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = add_simulated_parser(
        bsub,
        "experiment",
        help="an experiment's runs concurrent vs sequential on latency-model backends",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, one run each with its default params (default: {','.join(METHODS)})",
    )
    p.add_argument("--questions", type=int, default=100, help="questions per run (default 100)")
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="seconds slept per modelled second (default 1; 0: no sleeping)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document: {simulated (the model), time_scale, kv_tokens, scheduling, methods, questions, "
        "ratio_vs_sequential, model_ratio_vs_sequential, model_ratio_bound, same_as_alone, "
        "same_as_alone_per_run, retrieval_cache_hit_rate, modes: {concurrent, sequential}}",
    )
    add_config_args(p)
    p.set_defaults(func=run)


def bench_mode(
    cfg, methods: list[str], n: int, scale: float, mode: str, work: Path, kv_tokens: int | None = None
) -> dict[str, Any]:
    """The runs of `methods` over `n` synthetic questions through `run_methods` with answer.runs=`mode`, on a
    fresh set of latency-model backends; the mode's figures, with each run's predictions (`per_run`)."""
    from jobs.bench.flashrag.table import run_figures
    from jobs.bench.pipeline import numbered_questions, sim_model
    from pipeline.evaluation.experiment import MethodRun, run_methods

    cfg = cfg.model_copy(deep=True)
    cfg.answer.runs, cfg.answer.progress, cfg.dataset.format = mode, False, "generic"
    questions = work / "questions.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    if not questions.exists():
        questions.write_text(
            "".join(
                json.dumps({"id": str(i), "question": q, "answers": ["Paris"]}) + "\n" for i, q in numbered_questions(n)
            )
        )
    out = work / mode
    runs = [MethodRun(m, m, {}) for m in methods]
    backends = sim_model(cfg, scale, kv_tokens)(cfg)
    gen = backends.generator
    t_cmd = time.time()
    t0 = time.perf_counter()
    try:
        run_methods(str(questions), None, runs, cfg, out, limit=n, backends=backends)
        wall = time.perf_counter() - t0
    finally:
        backends.close()
    per = {m: run_figures(str(out / m), t_cmd) for m in methods}
    bad = {m: f"{p['rows']} rows, {p['errors']} errors" for m, p in per.items() if p["errors"] or p["rows"] != n}
    if bad:
        raise RuntimeError(f"{mode} runs: {bad}")
    steps = gen.steps
    return {
        "seconds": round(wall, 2),
        **{key: sum(p[key] for p in per.values()) for key in ("llm_calls", "prompt_tokens", "completion_tokens")},
        "retrievals": sum(p["retrievals"] for p in per.values()),
        "cached_prompt_tokens": sum(p["cached_prompt_tokens"] for p in per.values()),
        "prefix_cache_hit_rate": {
            m: round(p["cached_prompt_tokens"] / max(p["prompt_tokens"], 1), 3) for m, p in per.items()
        },
        "kv_evicted_blocks": gen.kv.evicted if gen.kv is not None else None,
        "model_s": round(gen.model_s, 2),
        "longest_program_tokens": max(p["longest_program_tokens"] for p in per.values()),
        "decode_steps": len(steps),
        "mean_running": round(sum(steps) / max(len(steps), 1), 1),
        "max_running": max(steps, default=0),
        "generator_busy": round(gen.busy_s / wall, 3) if wall else None,
        "per_run": per,
    }


def model_floor_s(mode: dict[str, Any]) -> float:
    """The least modelled time of a mode's work under any scheduling: the steps its longest program needs (one
    question's calls run one after another, a token a step), each at the step's fixed cost, plus the costs per
    running sequence and per uncached prompt token of all its tokens, which no order changes while nothing is
    evicted."""
    uncached = mode["prompt_tokens"] - mode["cached_prompt_tokens"]
    return (
        simulated.STEP_S * mode["longest_program_tokens"]
        + simulated.RUNNING_S * mode["completion_tokens"]
        + uncached / simulated.PREFILL_PER_S
    )


def bench_experiment(cfg, methods: list[str], n: int, scale: float, kv_tokens: int | None = None) -> dict[str, Any]:
    """Both modes (concurrent first) and their comparison; predictions left out of the result."""
    from jobs.bench.flashrag.table import same

    with tempfile.TemporaryDirectory(prefix="dynrag-bench-experiment-") as tmp:
        for mode in MODES:  # warm-up: the first mode would otherwise pay the imports (seconds) in its time
            bench_mode(cfg, methods, 2, 0.0, mode, Path(tmp, "warm-up"))
        modes = {mode: bench_mode(cfg, methods, n, scale, mode, Path(tmp), kv_tokens) for mode in MODES}
    alone = same({"per_method": modes["concurrent"]["per_run"]}, {"per_method": modes["sequential"]["per_run"]})
    for got in modes.values():
        for p in got["per_run"].values():
            p.pop("predictions")
    conc, seq_model = modes["concurrent"]["seconds"], modes["sequential"]["model_s"]
    return {
        "simulated": simulated.__doc__.split("\n\n", 1)[1].strip(),
        "time_scale": scale,
        "kv_tokens": kv_tokens or None,
        "scheduling": cfg.answer.scheduling,
        "methods": methods,
        "questions": n * len(methods),
        "ratio_vs_sequential": round(modes["sequential"]["seconds"] / conc, 2) if conc else None,
        "model_ratio_vs_sequential": round(seq_model / modes["concurrent"]["model_s"], 3),
        "model_ratio_bound": round(seq_model / model_floor_s(modes["concurrent"]), 3),
        "same_as_alone": all(v.split("/")[0] == v.split("/")[1] for v in alone.values()),
        "same_as_alone_per_run": alone,
        "retrieval_cache_hit_rate": {
            mode: {m: p["retrieval_cache_hit_rate"] for m, p in got["per_run"].items()} for mode, got in modes.items()
        },
        "modes": modes,
    }


def run(args: argparse.Namespace) -> None:
    from jobs.bench.pipeline import DEFAULTS
    from pipeline.config import load_config

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    cfg = load_config(args.config, [*DEFAULTS, *args.overrides])
    f = bench_experiment(cfg, methods, args.questions, args.time_scale, args.kv_tokens)
    if args.json:
        from jobs.jsonout import emit

        emit(f, indent=1)
        return
    print(
        f"{args.questions} questions per run, runs {', '.join(methods)} ({f['questions']} questions in all); "
        f"sleeps at {args.time_scale} x the model; at most {cfg.answer.max_in_flight} questions in flight; "
        f"KV cache {args.kv_tokens or 'none'} tokens; scheduling {cfg.answer.scheduling}"
    )
    print(f["simulated"])
    print(
        "| mode | s | LLM calls | prompt (from the prefix cache) / generated tokens | decode steps "
        "| mean (max) running | generator busy |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, w in f["modes"].items():
        print(
            f"| {mode} | {w['seconds']} | {w['llm_calls']} | {w['prompt_tokens']} ({w['cached_prompt_tokens']}) / "
            f"{w['completion_tokens']} | "
            f"{w['decode_steps']} | {w['mean_running']} ({w['max_running']}) | {w['generator_busy']} |"
        )
    print(
        f"modelled seconds (the steps' costs): concurrent {f['modes']['concurrent']['model_s']}, sequential "
        f"{f['modes']['sequential']['model_s']}: {f['model_ratio_vs_sequential']}x; the most any scheduling "
        f"reaches: {f['model_ratio_bound']}x (the longest program, "
        f"{f['modes']['concurrent']['longest_program_tokens']} tokens, one step each)"
    )
    print(
        f"concurrent: {f['ratio_vs_sequential']}x sequential; same as alone: {f['same_as_alone']} "
        f"{f['same_as_alone_per_run']}"
    )
    print(f"retrieval cache hit rate: {f['retrieval_cache_hit_rate']}")
    print(f"prefix cache hit rate: { {mode: w['prefix_cache_hit_rate'] for mode, w in f['modes'].items()} }")
