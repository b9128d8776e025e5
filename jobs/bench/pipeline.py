"""`dynrag bench pipeline --simulate-gpu`: the lockstep and the continuous engine on latency-model backends.

Runs each method's real program over synthetic questions against `jobs/bench/rig/simulated.py`'s backends,
whose calls sleep for a GPU-like generator's batch time and stated CPU costs for retrieval, scoring
and embedding (the model is in that module's docstring and printed), and prints per method and engine:
questions/s, generator busy fraction (time with a generate batch in flight / wall time) and mean latency
(first request to answer). Sleeps are `--time-scale` times the modelled seconds.

`--runtime ray` runs the real Ray path instead (`runtime.mode=ray`'s `answer_with_ray`: a local Ray, the
questions read by Ray Data, `ray.actors` engine actors taking `ray.actor_batches` batches at once, a
retrieval and a scorer pool), each actor building the same latency-model backends; rows are written as
Parquet parts. Per method: questions/s and generator busy over the engine actor's active time (its first
batch to its last report; Ray's and the actors' start excluded, and printed), beside the in-process
continuous engine's figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from jobs.bench.cli import add_simulated_parser
from jobs.bench.rig import simulated

METHODS = ("sr-rag", "cfs", "pairs", "dragin")
# also benchmarked when named with --method: the reasoning search methods, Adaptive-RAG's router, DPR-AIS
MORE_METHODS = ("search-r1", "search-o1", "adaptive-rag", "dpr-ais")
# GPU-sized batches for both engines (lockstep: answer.batch_questions=256 per round); --set overrides them
DEFAULTS = ["generation.batch_size=256", "answer.max_in_flight=512"]
PARAMS = {"cfs": {"threshold": 0.5}}  # no trained classifier here: its decision threshold given
# --runtime ray: one engine actor (one GPU replica) beside a retrieval and a scorer pool, on a local Ray whose
# logical CPUs are not this machine's limit (the backends sleep)
RAY_DEFAULTS = [
    "ray.num_cpus=8",
    "ray.batch_questions=128",  # parts of 128 rows; 8 of them held by the actor (actor_batches)
    "ray.actors=1",
    "ray.retrieval_actors=1",
    "ray.retrieval_actor_num_cpus=1",
    "ray.scorer_actors=1",
]


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = add_simulated_parser(
        bsub,
        "pipeline",
        help="lockstep vs continuous engine on latency-model backends",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--method", action="append", choices=METHODS + MORE_METHODS, help=f"repeatable (default: {', '.join(METHODS)})"
    )
    p.add_argument("--questions", type=int, default=2000, help="questions per method and engine (default 2000)")
    p.add_argument(
        "--search-ms",
        type=float,
        default=1.0,
        help="each query's search, in modelled ms (default 1; about 20 is dynrag's BM25 over 21M passages on 2 "
        "CPU cores, 50.7 queries/s in docs/scale.md)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="seconds slept per modelled second (default 0.1 in-process; 1 with --runtime ray, whose per-call "
        "costs are real milliseconds that a faster model would inflate)",
    )
    p.add_argument(
        "--runtime",
        choices=("in-process", "ray"),
        default="in-process",
        help="ray: the engine actors of runtime.mode=ray (and retrieval and scorer pools), beside the "
        "in-process continuous engine",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {method, engine, questions_per_s, generator_busy, mean_latency_s, decode_steps, "
        "mean_running, prompt_tokens, cached_prompt_tokens, kv_evicted_blocks, look_ahead_searches, "
        "look_ahead_used}",
    )
    add_config_args(p)
    p.set_defaults(func=run)


def bench_one(
    cfg, method: str, engine: str, n: int, scale: float, kv_tokens: int | None = None, search_ms: float = 1.0
) -> dict:
    from pipeline.engine.continuous import make_engine
    from pipeline.engine.requests import Question
    from pipeline.methods.registry import get_method

    cfg = cfg.model_copy(deep=True)
    cfg.answer.engine = engine
    backends = sim_model(cfg, scale, kv_tokens, search_ms)(cfg)
    gen = backends.generator
    spec = get_method(method)
    with tempfile.TemporaryDirectory() as clf:
        if method == "adaptive-rag":  # a stand-in classifier folder: SimRouter routes by hash
            from pipeline.classifier.complexity import META

            Path(clf, META).write_text('{"kind": "simulated"}')
            cfg.method.params = {"classifier": clf, **cfg.method.params}
        params = spec.params({**PARAMS.get(method, {}), **cfg.method.params}, cfg)
    questions = [Question(str(i), q) for i, q in numbered_questions(n)]
    eng = make_engine(cfg, backends)
    t0 = time.perf_counter()
    try:
        outcomes = eng.run(questions, spec.program, params)
    finally:
        eng.close()
    wall = time.perf_counter() - t0
    errors = [o.error for o in outcomes if o.error]
    if errors:
        raise RuntimeError(f"{method} on the {engine} engine: {len(errors)} error rows, e.g. {errors[0]}")
    return {
        "method": method,
        "engine": engine,
        "questions_per_s": round(n / wall, 2),
        "generator_busy": round(gen.busy_s / wall, 3),
        "mean_latency_s": round(sum(o.trace.latency_s or 0.0 for o in outcomes) / n, 3),
        "decode_steps": len(gen.steps),
        "mean_running": round(sum(gen.steps) / max(len(gen.steps), 1), 1),
        "prompt_tokens": sum(o.trace.prompt_tokens for o in outcomes),
        "cached_prompt_tokens": sum(o.trace.cached_prompt_tokens for o in outcomes),
        "kv_evicted_blocks": gen.kv.evicted if gen.kv is not None else None,
        "look_ahead_searches": sum(o.trace.look_ahead_searches for o in outcomes),  # answer.look_ahead
        "look_ahead_used": sum(o.trace.look_ahead_used for o in outcomes),
    }


def sim_model(cfg, scale: float, kv_tokens: int | None = None, search_ms: float = 1.0) -> simulated.SimBackends:
    """The latency model (rig/simulated.py) at `scale`: the generator runs at most generation.engine_kwargs.max_num_seqs
    sequences (default 256) over a KV cache of `kv_tokens` (None or 0: none), a query's search takes `search_ms`."""
    max_seqs = cfg.generation.engine_kwargs.max_num_seqs or 256
    return simulated.SimBackends(scale, max_seqs, kv_tokens, search_ms / 1000)


def bench_ray(cfg, method: str, n: int, scale: float, kv_tokens: int | None = None, search_ms: float = 1.0) -> dict:
    """`method` through `answer_with_ray` (engine actors and pools on a local Ray) over latency-model backends."""
    import tempfile
    from pathlib import Path

    from pipeline.io.commit import committing
    from pipeline.io.output_lock import output_lock
    from pipeline.runtime.ray_runner import answer_with_ray

    cfg = cfg.model_copy(deep=True)
    cfg.runtime.mode, cfg.method.name, cfg.dataset.format = "ray", method, "generic"
    cfg.method.params = {**PARAMS.get(method, {}), **cfg.method.params}
    make = sim_model(cfg, scale, kv_tokens, search_ms)
    with tempfile.TemporaryDirectory(prefix="dynrag-bench-ray-") as tmp:
        dataset, out = Path(tmp) / "questions.jsonl", str(Path(tmp) / "out")
        dataset.write_text("".join(json.dumps({"id": str(i), "question": q}) + "\n" for i, q in numbered_questions(n)))
        row_args = dict(run_id="bench", method=method, params_json="{}", chash="bench", model="simulated")
        t0 = time.perf_counter()
        rows = errors = 0
        last: dict[int, dict] = {}  # engine actor (pid) -> its latest generator figures
        with output_lock(out), committing(out, row_args["run_id"]) as committer:
            committer.open()
            reports = answer_with_ray(
                str(dataset), out, cfg, "simulated", row_args, header=None, done=set(), limit=n, make_backends=make
            )
            for report in committer.each(reports):
                rows, errors = rows + report["rows"], errors + report["errors"]
                if report.get("generator"):
                    last[report["generator"]["pid"]] = report["generator"]
        wall = time.perf_counter() - t0
    if errors or rows != n:
        raise RuntimeError(f"{method} through Ray: {rows} rows of {n}, {errors} error rows")
    active = max(g["active_s"] for g in last.values())
    return {
        "method": method,
        "engine": "ray",
        "questions_per_s": round(n / active, 2),
        "generator_busy": round(sum(g["busy_s"] / g["active_s"] for g in last.values()) / len(last), 3),
        "actors": len(last),
        "startup_s": round(wall - active, 1),
    }


def numbered_questions(n: int) -> list[tuple[int, str]]:
    return [(i, f"Who directed the film number {i} that was shot in {simulated.WORDS[i % 9]}?") for i in range(n)]


def run(args: argparse.Namespace) -> None:
    from pipeline.config import load_config

    extra = RAY_DEFAULTS if args.runtime == "ray" else []
    if args.time_scale is None:
        args.time_scale = 1.0 if args.runtime == "ray" else 0.1
    cfg = load_config(args.config, [*DEFAULTS, *extra, *args.overrides])
    engines = ("continuous", "ray") if args.runtime == "ray" else ("lockstep", "continuous")
    results = [
        bench_ray(cfg, m, args.questions, args.time_scale, args.kv_tokens, args.search_ms)
        if e == "ray"
        else bench_one(cfg, m, e, args.questions, args.time_scale, args.kv_tokens, args.search_ms)
        for m in args.method or METHODS
        for e in engines
    ]
    if args.json:
        from jobs.jsonout import emit

        emit(results, indent=1)
        return
    a = cfg.answer
    print(
        f"{args.questions} questions per run, sleeps at {args.time_scale} x the model; lockstep: "
        f"{a.batch_questions} questions per batch; continuous: at most {a.max_in_flight} in flight, "
        f"prompts streamed to the generator, other batches wait up to {a.batch_wait_s} s"
    )
    print(simulated.__doc__.split("\n\n", 1)[1].strip())
    if args.runtime == "ray":
        from pipeline.runtime.replica import batches_held as actor_batches

        rc = cfg.ray
        batch = rc.batch_questions or a.batch_questions
        print(
            f"ray: {rc.actors} engine actor(s), {actor_batches(cfg, batch)} batches of {batch} questions each "
            f"at once, {rc.retrieval_actors} retrieval "
            f"and {rc.scorer_actors} scorer pool actor(s); "
            "its rate and busy fraction are over the engine actor's active time"
        )
    for r in results:
        if r["engine"] == "ray":
            print(
                f"  {r['method']:8s} {'ray':10s} {r['questions_per_s']:8.2f} q/s  generator busy "
                f"{r['generator_busy']:.3f}  ({r['actors']} actor(s); Ray and actor start {r['startup_s']} s)"
            )
            continue
        print(
            f"  {r['method']:8s} {r['engine']:10s} {r['questions_per_s']:8.2f} q/s  generator busy "
            f"{r['generator_busy']:.3f}  mean latency {r['mean_latency_s']:.3f} s  "
            f"{r['decode_steps']} decode steps of {r['mean_running']} sequences"
        )
