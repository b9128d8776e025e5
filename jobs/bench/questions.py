"""`dynrag bench questions`: N questions answered with the model's cost taken out, for the driver's scale figures.

    dynrag bench questions --sizes 10000 --runtimes local,ray

Workload: sr-rag over the demo's BM25 index (`dynrag demo`'s: the 10,033 packaged Wikipedia lead sections,
built in the work folder as the demo builds it, no ../shared nor model hub), `generation.backend=none` (every
prompt gets an empty answer; `--simulate-gpu`: the latency model of jobs/bench/rig/simulated.py at its own speed,
time scale 1, as `bench pipeline --simulate-gpu` models a GPU), `answer.retrieval_cache=0` (every question is
searched, as N distinct questions would be). The questions are the demo's (jobs/demo.py: the packaged DPR sets'
questions the corpus can answer, all sets, 2,067 distinct), cycled to N with unique ids (`<id>-<i>`), one JSONL
file. `--set` overrides any of these (after them).

Each (N, runtime) runs in a fresh process (rig/questions_child.py): `run_answer` on the file (local: in that
process; ray: `runtime.mode=ray`, a local Ray started by the run, `ray.actors` engine actors (`--ray-actors`),
the configured retrieval pool, `ray.retrieval_actors`, default none), then a resume of the finished run. Per
row: questions/s (N / run_answer's wall seconds, Ray's start included); CPU ms per question of the driver
(getrusage of its process around run_answer), of the engine actors and of the pool actors (Ray: psutil samples
of the Ray processes, rig/questions_child.py; `-` in local mode, where the driver does everything) and of the other
Ray processes (workers and services); the driver's peak RSS (ru_maxrss) and its peak private memory (RSS less
shared pages, sampled), each with its growth from the smallest N of the same runtime; `tail s`: seconds from
the last answer (the newest row's finished_at) to run_answer returning (the last commits, the last merge of parts, the close); `resume s`: run_answer again on the finished output;
files and bytes under the output (Parquet and other files apart); rows and error rows as pyarrow counts them.
With a retrieval pool, the same searches are also measured in one process alone (a line under the table).
Ray runs its workers at nice 15 (Ray's default), the driver at 0: where the cores are busy, the driver's share
of them (Ray Data's scheduling loop) comes first. Figures are of one run each, on a machine others may share: the
header line gives its load average.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.bench.rig.simulated import GPU_KV_TOKENS

RUNTIMES = ("local", "ray")
# before the user's --set: the workload above
DEFAULTS = ["method.name=sr-rag", "index.dense=false", "answer.retrieval_cache=0", "answer.progress=false"]
POOL_LIMIT = 100_000  # demo questions taken from each packaged set: all it has that the corpus can answer
MB = 1e6


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_job_options

    p = bsub.add_parser(
        "questions",
        help="N questions with the model's cost taken out: the driver's CPU, memory, tail, resume and files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", default="10000", help="comma-separated question counts N (default 10000)")
    p.add_argument("--runtimes", default="local,ray", help="comma-separated, of local and ray (default both)")
    p.add_argument(
        "--simulate-gpu",
        action="store_true",
        help="answer on the latency model (jobs/bench/rig/simulated.py, time scale 1) instead of generation.backend=none",
    )
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=GPU_KV_TOKENS,
        help=f"with --simulate-gpu: the simulated KV cache in tokens, with prefix caching (default {GPU_KV_TOKENS:,}, "
        "as `bench pipeline --simulate-gpu`; 0: none)",
    )
    p.add_argument("--ray-actors", type=int, default=2, help="ray.actors: engine actors (default 2)")
    p.add_argument(
        "--work", metavar="DIR", help="where the index, questions and outputs go (default: a temporary folder, removed)"
    )
    add_job_options(p, json={"help": "print one JSON object: {workload, runs: [...]}"})
    add_config_args(p)
    p.set_defaults(func=run)


def parse_options(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    from pipeline.errors import DynragError

    try:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise DynragError(f"--sizes takes comma-separated counts, got {args.sizes!r}") from None
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if not sizes or min(sizes) < 1:
        raise DynragError(f"--sizes: each N must be at least 1, got {args.sizes!r}")
    if not runtimes or set(runtimes) - set(RUNTIMES):
        raise DynragError(f"--runtimes takes {' and '.join(RUNTIMES)}, got {args.runtimes!r}")
    if args.ray_actors < 1:
        raise DynragError(f"--ray-actors must be at least 1, got {args.ray_actors}")
    return sorted(set(sizes)), list(dict.fromkeys(runtimes))


def bench_config(args: argparse.Namespace):
    from pipeline.config import load_config

    backend = [] if args.simulate_gpu else ["generation.backend=none"]
    return load_config(args.config, [*DEFAULTS, *backend, f"ray.actors={args.ray_actors}", *args.overrides])


def demo_index(cfg, work: Path) -> dict:
    """The demo's index (jobs/demo.py): BM25 over the packaged lead sections, built (or reused) under `work`."""
    from indexing import build_index
    from pipeline.assets.embedded import wikipedia_lead_sections

    corpus = wikipedia_lead_sections(cfg.paths.cache_dir)
    report = build_index([str(corpus)], str(work / "index"), cfg.index_settings(), fmt="wiki-lead-sections")
    return {"index": str(work / "index"), "passages": report["passages"], "index_build_s": round(report["seconds"], 2)}


def question_pool(cache_dir: str) -> list[dict]:
    """The demo's questions of every packaged DPR set (pipeline/io/demo_questions.py), in set and file order."""
    from pipeline.assets.embedded import DPR_QUESTION_SETS
    from pipeline.io.demo_questions import demo_questions

    pool = []
    for name in DPR_QUESTION_SETS:
        with open(demo_questions(name, POOL_LIMIT, cache_dir), encoding="utf-8") as f:
            pool += [json.loads(line) for line in f]
    return pool


def write_questions(path: Path, n: int, pool: list[dict]) -> None:
    """`n` questions cycling `pool`, the i-th with id `<its id>-<i>`: N distinct ids."""
    with open(path, "w", encoding="utf-8") as f:
        for i, q in enumerate(itertools.islice(itertools.cycle(pool), n)):
            f.write(json.dumps({**q, "id": f"{q['id']}-{i}"}) + "\n")


def measure(cfg, args: argparse.Namespace, work: Path, n: int, runtime: str, index: str) -> dict[str, Any]:
    """One (N, runtime) in a fresh process (rig/questions_child.py); its output folder starts empty."""
    from pipeline.config import with_values
    from pipeline.errors import DynragError

    out = work / f"out-{n}-{runtime}"
    shutil.rmtree(out, ignore_errors=True)
    spec = {
        "config": with_values(cfg, {"runtime.mode": runtime if runtime in RUNTIMES else "local"}).model_dump(
            mode="json"
        ),
        "dataset": str(work / f"questions-{n}.jsonl"),
        "out": str(out),
        "index": index,
        "n": n,
        "runtime": runtime,
        "simulate_gpu": args.simulate_gpu,
        "kv_tokens": args.kv_tokens,
        "result": str(work / f".result-{n}-{runtime}.json"),
        "log_level": _log_level(),
    }
    path = work / f".spec-{n}-{runtime}.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    t = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "jobs.bench.rig.questions_child", str(path)]).returncode
    if code != 0:
        raise DynragError(f"the bench's run of N={n} ({runtime}) failed (exit {code}; its errors are above)")
    result = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    return result | {"process_s": round(time.perf_counter() - t, 1)}


def run(args: argparse.Namespace) -> int:
    sizes, runtimes = parse_options(args)
    cfg = bench_config(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="dynrag-bench-questions-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        workload = demo_index(cfg, work)
        pool = question_pool(cfg.paths.cache_dir)
        for n in sizes:
            write_questions(work / f"questions-{n}.jsonl", n, pool)
        workload |= {
            "method": cfg.method.name,
            "generation": "latency model (time scale 1)" if args.simulate_gpu else cfg.generation.backend,
            "distinct_questions": len({q["question"] for q in pool}),
            "retrieval_cache": cfg.answer.retrieval_cache,
            "ray_actors": cfg.ray.actors,
            "ray_retrieval_actors": cfg.ray.retrieval_actors,
            "ray_num_cpus": cfg.ray.num_cpus,
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        runs = [measure(cfg, args, work, n, rt, workload["index"]) for rt in runtimes for n in sizes]
        if cfg.ray.retrieval_actors and "ray" in runtimes:  # the pool's CPU a query, against the same search here
            workload["search_alone"] = measure(cfg, args, work, max(sizes), "search", workload["index"])
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    add_growth(runs)
    if args.json:
        from jobs.jsonout import emit

        emit({"workload": workload, "runs": runs}, indent=1)
    else:
        print(text(workload, runs))
    return 0


def add_growth(runs: list[dict]) -> None:
    """Each run's driver peak RSS growth from the smallest N of its runtime."""
    for r in runs:
        base = min((x for x in runs if x["runtime"] == r["runtime"]), key=lambda x: x["n"])
        r["driver_rss_growth_bytes"] = r["driver_peak_rss_bytes"] - base["driver_peak_rss_bytes"]
        r["driver_private_growth_bytes"] = r["driver_peak_private_bytes"] - base["driver_peak_private_bytes"]


def _ms(r: dict, kind: str) -> str:
    if r["runtime"] != "ray":
        return "-"
    return f"{1000 * r[f'{kind}_cpu_s'] / r['n']:.2f}"


HEAD = (
    f"{'N':>9} {'runtime':7} {'q/s':>8} {'driver':>7} {'engine':>7} {'pool':>6} {'Ray else':>8} "
    f"{'peak RSS':>8} {'growth':>7} {'private':>7} {'growth':>7} {'tail s':>7} {'resume s':>8} {'parquet':>16} {'other files':>16} "
    f"{'rows':>9} {'errors':>6}"
)


def text(w: dict, runs: list[dict]) -> str:
    lines = [
        f"{w['method']} over the demo index ({w['passages']:,} passages, BM25), generation {w['generation']}, "
        f"{w['distinct_questions']:,} distinct demo questions cycled to N (unique ids), retrieval cache "
        f"{w['retrieval_cache']}; ray: {w['ray_actors']} engine actor(s), {w['ray_retrieval_actors']} retrieval "
        f"actor(s), num_cpus {w['ray_num_cpus'] or 'Ray default'}; {w['cpus']} CPUs, load {w['load_average']}",
        "CPU columns: ms per question (driver: getrusage around run_answer; Ray processes: psutil samples); "
        "RSS: the driver's peak, MB (local: its JVM's heap of 512 MB committed at start); private: its RSS less its "
        "shared pages (Ray's object store read by the driver), the peak of samples; tail: the last answer to "
        "run_answer returning",
        HEAD,
    ]
    for r in runs:
        lines.append(
            f"{r['n']:>9,} {r['runtime']:7} {r['questions_per_s']:>8,.1f} "
            f"{1000 * r['driver_cpu_s'] / r['n']:>7.2f} {_ms(r, 'engine'):>7} {_ms(r, 'pool'):>6} "
            f"{_ray_else(r):>8} {r['driver_peak_rss_bytes'] / MB:>8.0f} {r['driver_rss_growth_bytes'] / MB:>+7.0f} "
            f"{r['driver_peak_private_bytes'] / MB:>7.0f} {r['driver_private_growth_bytes'] / MB:>+7.0f} "
            f"{r['last_answer_to_return_s']:>7.2f} {r['resume_s']:>8.2f} "
            f"{_files(r, 'parquet'):>16} {_files(r, 'other'):>16} {r['rows']:>9,} {r['error_rows']:>6,}"
        )
    if "search_alone" in w:
        s = w["search_alone"]
        lines.append(
            f"the same searches in one process alone (Backends.search, {s['call']} queries a call, N={s['n']:,}): "
            f"{1000 * s['search_cpu_s'] / s['n']:.2f} ms of CPU a query"
        )
    lines.append(
        "resume: "
        + "; ".join(f"{r['n']:,} {r['runtime']} skipped {r['resume_skipped']:,}" for r in runs)
        + "; process seconds: "
        + ", ".join(f"{r['n']:,} {r['runtime']} {r['process_s']}" for r in runs)
    )
    return "\n".join(lines)


def _ray_else(r: dict) -> str:
    if r["runtime"] != "ray":
        return "-"
    return f"{1000 * (r['ray_workers_cpu_s'] + r['ray_services_cpu_s']) / r['n']:.2f}"


def _files(r: dict, kind: str) -> str:
    return f"{r[f'{kind}_files']:,} / {r[f'{kind}_bytes'] / MB:.1f} MB"


def _log_level() -> str:
    import logging

    return logging.getLevelName(logging.getLogger().getEffectiveLevel())
