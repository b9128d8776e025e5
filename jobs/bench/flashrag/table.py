"""`dynrag bench flashrag --table --methods M1,M2,... --limit N [--json]`: a paper's table (several methods over the
same questions) four ways, each a whole process (or, for FlashRAG as its examples run, one process per method)
timed from its command to its last answered row:

- flashrag_per_method: FlashRAG as its examples run a table, one driver process per method (each starts its
  generator and loads its index);
- flashrag_one_process: FlashRAG in one process, one generator and retriever handed to every pipeline in turn;
- dynrag_concurrent: `dynrag experiment` over the methods, the runs answered together through one engine;
- dynrag_sequential: the same with `--sequential` (one run after another, the old order).

Same corpus, questions, model, k, templates and vLLM settings as `--method` (jobs/bench/flashrag/run.py); no warm-up
(startup is part of a table's cost). Each way's figures are also written to WORKDIR/<way>.json as it ends. Per
way: seconds to the last row, the process's wall time, LLM calls, tokens, error rows, load average before and after.
Ratios are dynrag_concurrent's speed over each other way's (their seconds over its seconds; with `--repeats N`, N
rounds of the ways, every other round in reverse order, and each ratio the median of the rounds' ratios, every
round's beside it). `ratio_vs_sequential_after_startup`: the same ratio over the two dynrag ways' seconds after
their startup (`startup_s`: to the first request; the engine and index loading, which scheduling does not touch and
which varies by 10 s from process to process here). `same_as_alone`: each method's predictions, per way, against
the same framework running that method alone (dynrag: concurrent against sequential, where each run has the
engine to itself; FlashRAG: one process against per method). `questions`: every run's questions.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from jobs.bench.flashrag.side import TOTALS  # a way's, summed over its methods

WAYS = ("dynrag_concurrent", "flashrag_one_process", "dynrag_sequential", "flashrag_per_method")


def experiment_file(work: Path, methods: list[str], params: dict[str, dict], out: Path) -> Path:
    path = work / f"experiment-{out.name}.yaml"
    exp = {
        "name": "bench-table",
        "out": str(out),
        "datasets": {
            "bench": {"file": str(work / "questions.jsonl"), "format": "generic", "index": str(work / "index")}
        },
        "methods": [{"method": m, "label": m, "params": params[m]} for m in methods],
    }
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def dynrag_command(args, path: Path, sequential: bool) -> list[str]:
    sets = [*args.overrides, f"retrieval.k={args.k}", f"index.threads={args.threads}"]
    return [
        sys.executable,
        "-m",
        "jobs.cli",
        "experiment",
        str(path),
        *(["--sequential"] if sequential else []),
        *[a for s in sets for a in ("--set", s)],
    ]


def run_figures(run_dir: str, t_cmd: float, said: str = "prediction") -> dict[str, Any]:
    """One dynrag run's figures from its rows: rows, errors, its last row's time after `t_cmd`, LLM calls, tokens (and
    the most one question generated), retrievals and the cache's hit rate, generation and retrieval seconds, and each
    question's `said` column."""
    import polars as pl

    from pipeline.io.output import read_rows

    df = pl.from_arrow(read_rows(run_dir))
    calls = int(df["retrieval_calls"].sum())
    return {
        "rows": df.height,
        "errors": int(df["error"].is_not_null().sum()),
        "last_row_s": round(float(df["finished_at"].max()) - t_cmd, 2),
        "llm_calls": int(df["llm_calls"].sum()),
        "prompt_tokens": int(df["prompt_tokens"].sum()),
        "completion_tokens": int(df["completion_tokens"].sum()),
        "longest_program_tokens": int(df["completion_tokens"].max() or 0),  # one question's: its steps in a row
        "retrievals": calls,
        "retrieval_cache_hit_rate": round(int(df["retrieval_cache_hits"].sum()) / calls, 3) if calls else None,
        "cached_prompt_tokens": int(df["cached_prompt_tokens"].sum()),
        "generation_s": round(float(df["time_generation_s"].sum()), 2),
        "retrieval_s": round(float(df["time_retrieval_s"].sum()), 2),
        "predictions": dict(zip(df["question_id"], df[said])),
    }


def dynrag_way(out: Path, methods: list[str], t_cmd: float, m) -> dict[str, Any]:
    """A dynrag way's figures from its rows (sr-rag's prediction is its raw output, as FlashRAG's is)."""
    import polars as pl

    from jobs.bench.flashrag.launch import parse_failure
    from pipeline.io.output import read_rows

    if m.returncode != 0:
        raise parse_failure(m)
    per = {
        meth: run_figures(str(out / "bench" / meth), t_cmd, "raw_output" if meth == "sr-rag" else "prediction")
        for meth in methods
    }
    # when the first question's first request went out (its row's finished_at less its latency): startup
    first = min(
        float(df.select((pl.col("finished_at") - pl.col("latency_s")).min()).item()) - t_cmd
        for df in (pl.from_arrow(read_rows(str(out / "bench" / meth))) for meth in methods)
    )
    return {"seconds": max(p["last_row_s"] for p in per.values()), "startup_s": round(first, 2), "per_method": per}


def flashrag_result(r: dict, t_cmd: float) -> dict[str, Any]:
    return {
        "rows": r["questions"],
        "errors": r["errors"],
        "last_row_s": round(r["finished_at"] - t_cmd, 2),
        "startup_s": r["startup_s"],
        "pipeline_s": r["seconds"],
        "llm_calls": r["llm_calls"],
        "prompt_tokens": r["prompt_tokens"],
        "completion_tokens": r["completion_tokens"],
        "cached_prompt_tokens": r["cached_prompt_tokens"],
        "retrievals": r["retrievals"],
        "predictions": r["predictions"],
    }


def run_way(way: str, commands: dict, env: dict, work: Path, methods: list[str]) -> dict[str, Any]:
    from jobs.bench.flashrag.launch import parse_failure
    from jobs.bench.rig.rss import GIB, run_measured

    load_before = round(os.getloadavg()[0], 1)
    print(f"table: running {way} ...", file=sys.stderr, flush=True)
    walls, peak = [], 0
    if way == "flashrag_per_method":
        per, spent = {}, 0.0
        for meth, cmd in zip(methods, commands[way]):
            t_cmd = time.time()
            m = run_measured(cmd, env=env)
            if m.returncode != 0 or '"finished_at"' not in m.stdout:
                raise parse_failure(m)
            per[meth] = flashrag_result(_json_lines(m.stdout)[-1], t_cmd)
            spent += per[meth]["last_row_s"]
            walls.append(m.wall_s)
            peak = max(peak, m.peak_rss)
        got: dict[str, Any] = {"seconds": round(spent, 2), "per_method": per}
    else:
        if way.startswith("dynrag"):  # a fresh run: `dynrag experiment` resumes an output folder's answered rows
            shutil.rmtree(work / way, ignore_errors=True)
        t_cmd = time.time()
        m = run_measured(commands[way], env=env)
        walls, peak = [m.wall_s], m.peak_rss
        if way == "flashrag_one_process":
            if m.returncode != 0:
                raise parse_failure(m)
            per = {meth: flashrag_result(r, t_cmd) for meth, r in zip(methods, _json_lines(m.stdout))}
            got = {"seconds": max(p["last_row_s"] for p in per.values()), "per_method": per}
        else:
            got = dynrag_way(work / way, methods, t_cmd, m)
    per = got["per_method"]
    got.update(
        process_wall_s=round(sum(walls), 2),
        peak_rss_gib=round(peak / GIB, 2),
        questions=sum(p["rows"] for p in per.values()),
        errors=sum(p["errors"] for p in per.values()),
        **{key: sum(p[key] for p in per.values()) for key in TOTALS},
        load_average_1min_before=load_before,
        load_average_1min_after=round(os.getloadavg()[0], 1),
    )
    print(f"table: {way} {got['seconds']} s to its last row (load {load_before})", file=sys.stderr, flush=True)
    return got


def run_rounds(order: list[str], repeats: int, commands: dict, env: dict, work: Path, methods: list[str]) -> list[dict]:
    """`--repeats` rounds of the ways, every other round in reverse order (on a host whose speed drifts, no way is
    always first). Each way's figures (predictions included) are saved as it ends, so a cut-short table keeps them:
    WORKDIR/<way>.json, and <way>-roundN.json after the first round."""
    rounds = []
    for r in range(max(repeats, 1)):
        got = {}
        for way in order if r % 2 == 0 else order[::-1]:
            got[way] = run_way(way, commands, env, work, methods)
            (work / f"{way}{f'-round{r + 1}' if r else ''}.json").write_text(json.dumps(got[way], indent=1))
        rounds.append({way: got[way] for way in order})
    return rounds


def prefix_hit_rate(figures: dict) -> float | None:
    """The share of a run's prompt tokens vLLM's prefix cache served (None: no prompt tokens counted)."""
    prompt = figures.get("prompt_tokens")
    return round(figures["cached_prompt_tokens"] / prompt, 3) if prompt else None


def _json_lines(stdout: str) -> list[dict]:
    return [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]


def warm_disk_caches(pythons: list[str], model_path, env: dict) -> None:
    """Import each side's vLLM (and torch) once and read the model's files before any way is timed. The ways run in a
    fixed order, and the first process to load them from disk paid it: 44.9 s from the command to the first request
    on a fresh machine against 25.9-29.7 s for the same command after it (2026-11-28)."""
    import subprocess

    t0 = time.perf_counter()
    for py in pythons:
        try:
            subprocess.run([py, "-c", "import vllm"], env=env, capture_output=True, check=False)
        except OSError:  # a side that cannot start says so when its way runs
            pass
    for f in Path(model_path).rglob("*"):
        if f.is_file():
            with f.open("rb") as fh:
                while fh.read(1 << 24):
                    pass
    print(f"table: disk caches warmed in {time.perf_counter() - t0:.1f} s (not timed)", file=sys.stderr, flush=True)


def chosen_ways(names: str | None) -> list[str]:
    """`--ways`: the ways to run, in the table's order (dynrag_concurrent always: the ratios are its speed)."""
    from pipeline.errors import DynragError

    asked = {w.strip() for w in (names or ",".join(WAYS)).split(",") if w.strip()}
    if unknown := sorted(asked - set(WAYS)):
        raise DynragError(f"--ways: {unknown} are not among {', '.join(WAYS)}")
    return [w for w in WAYS if w in asked or w == "dynrag_concurrent"]


def same(a: dict, b: dict) -> dict[str, str]:
    """Per method: how many questions have the same (stripped) prediction in way `a` as in way `b`."""
    out = {}
    for meth, pa in a["per_method"].items():
        pb = b["per_method"][meth]["predictions"]
        ids = [q for q in pa["predictions"] if q in pb]
        out[meth] = f"{sum((pa['predictions'][q] or '').strip() == (pb[q] or '').strip() for q in ids)}/{len(ids)}"
    return out


def table_commands(args, cfg, work: Path, methods: list[str], py, model_path) -> dict[str, Any]:
    """Each way's command: FlashRAG per method and in one process (their configs and templates written to `work`,
    the BM25 index built once), dynrag concurrent and sequential (one experiment file each)."""
    from jobs.bench.flashrag.launch import dump_templates, flashrag_command, run_driver
    from jobs.bench.flashrag.methods import dynrag_params
    from jobs.bench.flashrag.prepare import driver_config

    configs, params = [], {}
    for meth in methods:
        dcfg = driver_config(
            cfg, model_path, work, args.k, False, args.flashrag_batch, meth, args.flashrag_framework, args.threads
        )
        path = work / f"flashrag-{meth}.json"
        path.write_text(json.dumps(dcfg, indent=1))
        configs.append(path)
        if meth == methods[0]:
            run_driver(py, path, "--bm25")
        dumped = None if meth == "sr-rag" else dump_templates(py, path, work / f"templates-{meth}.json")
        params[meth] = dynrag_params(meth, dumped, args.k, cfg.generation.max_new_tokens)
    commands: dict[str, Any] = {
        "flashrag_per_method": [flashrag_command(py, c) for c in configs],
        "flashrag_one_process": flashrag_command(py, "--table", *configs),
    }
    for way, seq in (("dynrag_concurrent", False), ("dynrag_sequential", True)):
        commands[way] = dynrag_command(args, experiment_file(work, methods, params, work / way), seq)
    return commands


def run_table(args, cfg, dataset: str, work: Path) -> int:
    from jobs.bench.flashrag.env import ensure_flashrag
    from jobs.bench.flashrag.launch import side_env
    from jobs.bench.flashrag.prepare import prepare
    from pipeline.assets.models import resolve_model

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    env = side_env(cfg, args.threads)
    py = ensure_flashrag(cfg.paths.cache_dir, log=lambda s: print(s, file=sys.stderr, flush=True))
    sizes = prepare(cfg, dataset, args.limit, 0, work)
    model_path = resolve_model(cfg.generation.model, cfg.paths.cache_dir)
    commands = table_commands(args, cfg, work, methods, py, model_path)
    warm_disk_caches([str(py), sys.executable], model_path, env)
    rounds = run_rounds(chosen_ways(args.ways), args.repeats, commands, env, work, methods)
    ways = rounds[0]  # the first round's figures in full; every round's seconds and ratios beside them
    conc = [r["dynrag_concurrent"]["seconds"] for r in rounds]  # none when a round's concurrent took no time
    per_round = {way: [r[way]["seconds"] / c for r, c in zip(rounds, conc)] for way in ways} if all(conc) else {}

    def ratio(way: str) -> float | None:
        return round(statistics.median(per_round[way]), 2) if way in per_round else None

    def busy(got: dict) -> float:  # a dynrag way's seconds after its startup (the engine's and index's loading)
        return got["seconds"] - got["startup_s"]

    after = [(busy(r["dynrag_sequential"]), busy(r["dynrag_concurrent"])) for r in rounds if "dynrag_sequential" in r]
    seq_busy = [s / c for s, c in after] if all(c > 0 for _, c in after) else []

    pairs = {
        "dynrag_concurrent_vs_sequential": ("dynrag_concurrent", "dynrag_sequential"),
        "flashrag_one_process_vs_per_method": ("flashrag_one_process", "flashrag_per_method"),
    }
    alone = {name: same(ways[a], ways[b]) for name, (a, b) in pairs.items() if a in ways and b in ways}
    every = [same(r[a], r[b]) for r in rounds for a, b in pairs.values() if a in r and b in r]
    alone_all = all(v.split("/")[0] == v.split("/")[1] for d in every for v in d.values()) if alone else None
    for got in (g for r in rounds for g in r.values()):
        for p in got["per_method"].values():
            p.pop("predictions", None)
    figures = {
        "methods": methods,
        "limit": args.limit,
        "questions": sum(ways["dynrag_concurrent"]["per_method"][m]["rows"] for m in methods),
        "ratio_vs_flashrag_per_method": ratio("flashrag_per_method"),
        "ratio_vs_flashrag_one_process": ratio("flashrag_one_process"),
        "ratio_vs_sequential": ratio("dynrag_sequential"),
        "ratio_vs_sequential_after_startup": round(statistics.median(seq_busy), 2) if seq_busy else None,
        "repeats": len(rounds),
        "ratios_per_round": {w: [round(x, 3) for x in v] for w, v in per_round.items() if w != "dynrag_concurrent"},
        "seconds_per_round": {w: [r[w]["seconds"] for r in rounds] for w in ways},
        "startup_s_per_round": {w: [r[w].get("startup_s") for r in rounds] for w in ways},
        "computed_prompt_tokens_per_round": {
            w: [r[w].get("prompt_tokens", 0) - r[w].get("cached_prompt_tokens", 0) for r in rounds] for w in ways
        },
        "same_as_alone": alone_all,
        "same_as_alone_per_method": alone,
        "retrieval_cache_hit_rate": {
            m: ways["dynrag_concurrent"]["per_method"][m]["retrieval_cache_hit_rate"] for m in methods
        },
        "prefix_cache_hit_rate": {
            way: {m: prefix_hit_rate(got["per_method"][m]) for m in methods} for way, got in ways.items()
        },
        "threads": args.threads,
        "k": args.k,
        "model": str(model_path),
        "dtype": cfg.generation.dtype,
        "flashrag_framework": args.flashrag_framework,
        "flashrag_batch": args.flashrag_batch,
        "passages": sizes["passages"],
        "ways": ways,
    }
    if args.json:
        from jobs.jsonout import emit

        emit(figures, indent=1)
    else:
        print_table(figures)
    return 0


def print_table(f: dict) -> None:
    print(f"table of {', '.join(f['methods'])}: {f['questions']} questions in all, {f['threads']} threads")
    print(
        "| way | s to last row | process s | LLM calls | prompt tok (prefix-cached) | generated tok | errors | load before |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, w in f["ways"].items():
        print(
            f"| {name} | {w['seconds']} | {w['process_wall_s']} | {w['llm_calls']} | {w['prompt_tokens']} "
            f"({w['cached_prompt_tokens']}) | {w['completion_tokens']} | {w['errors']} | {w['load_average_1min_before']} |"
        )
    print(
        f"dynrag concurrent: {f['ratio_vs_flashrag_per_method']}x FlashRAG per method, "
        f"{f['ratio_vs_flashrag_one_process']}x FlashRAG one process, {f['ratio_vs_sequential']}x sequential; "
        f"same as alone: {f['same_as_alone']} {f['same_as_alone_per_method']}"
    )
    if f["repeats"] > 1:
        print(f"ratios per round (median above): {f['ratios_per_round']}")
    print(f"retrieval cache hit rate: {f['retrieval_cache_hit_rate']}")
