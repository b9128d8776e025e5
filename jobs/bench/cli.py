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
