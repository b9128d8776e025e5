"""`dynrag bench`: benchmarks that print figures (ratios measured in one run), never assert."""

from __future__ import annotations

import argparse
import importlib

# Each module adds one benchmark with `register(bench_subparsers)`.
BENCH_MODULES = [
    "jobs.bench.index",
    "jobs.bench.scale",
    "jobs.bench.answer",
    "jobs.bench.dragin",
    "jobs.bench.flashrag.run",
    "jobs.bench.pipeline",
    "jobs.bench.experiment",
    "jobs.bench.questions",
    "jobs.bench.all",
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="run a benchmark and print its figures",
        description="Benchmarks print ratios measured in one run on this machine, with repeats stated.",
    )
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for name in BENCH_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(bsub)


def add_simulated_parser(bsub, name: str, help: str, description: str):
    """A `dynrag bench NAME --simulate-gpu` parser: the latency model (rig/simulated.py) as its epilog, the flag
    required."""
    from jobs.bench.rig import simulated

    p = bsub.add_parser(
        name,
        help=help,
        description=description,
        epilog=simulated.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--simulate-gpu",
        action="store_true",
        required=True,
        help="use the latency-model backends (the only mode for now)",
    )
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=simulated.GPU_KV_TOKENS,
        help=f"the simulated KV cache, in tokens, with vLLM's prefix caching over it (default {simulated.GPU_KV_TOKENS:,}: "
        "an 8B model's KV at 128 KiB a token in the 52 GB an 80 GB GPU leaves it at 0.9 utilization; 0: no "
        "prefix cache, every prompt token computed)",
    )
    return p
