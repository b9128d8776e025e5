"""`dynrag experiment CONFIG.yaml`: run a grid of datasets x methods x params through the answer job (resumable,
indexes built once and cached), then write the evaluation table and the HTML report.

    dynrag experiment experiments/drrag_table5.yaml [--set paths.data_dir=...] [--set generation.backend=none]

A dataset's runs are answered together through one engine (answer.runs=concurrent); `--sequential` runs them one
after another, as before.

The file format is described in pipeline/evaluation/experiment.py and the examples under experiments/.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args, add_sequential_arg

    p = sub.add_parser(
        "experiment",
        help="run datasets x methods x params, then evaluate and report (resumable)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("experiment", metavar="CONFIG.yaml", help="the experiment file (see experiments/)")
    add_sequential_arg(p)
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.errors import DynragError
    from pipeline.evaluation.experiment import run_experiment

    if args.config:
        raise DynragError("dynrag experiment: put the configuration in the experiment file's `config:` section")
    overrides = [*args.overrides, *(["answer.runs=sequential"] if args.sequential else [])]
    result = run_experiment(args.experiment, overrides)
    print(result["table"])
    print("written: " + ", ".join(result["files"]))
    return 0
