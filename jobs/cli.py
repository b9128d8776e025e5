"""The `dynrag` command: one subcommand per job; each job module adds its own parser."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from typing import Any

from indexing import IndexingError
from pipeline.config import DynragConfig, load_config
from pipeline.errors import DynragError
from platform_shims import DeviceError

log = logging.getLogger("dynrag")

# Each module has `register(subparsers)`; imports inside them stay lazy so `--help` is fast.
JOB_MODULES = [
    "jobs.demo",
    "jobs.models",
    "jobs.data",
    "jobs.answer",
    "jobs.methods",
    "jobs.bench.cli",
    "jobs.train_classifier",
    "jobs.index",
    "jobs.submit",
    "jobs.eval.drrag",
    "jobs.eval.pairs",
    "jobs.eval.dragin",
    "jobs.eval.erm4",
    "jobs.evaluate",
    "jobs.experiment",
    "jobs.conform.run",
]


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The options every job shares: a YAML config file and `section.key=value` overrides."""
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", metavar="FILE", help="YAML configuration file (see README, 'Configuration')")
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one value, e.g. --set generation.max_new_tokens=64 (repeatable)",
    )


# the options many jobs declare, as most declare them; a job gives its own default and help where they differ
JOB_OPTIONS: dict[str, dict[str, Any]] = {
    "index": {"required": True, "metavar": "DIR"},
    "dataset": {"metavar": "FILE", "help": "default: hotpotqa/dev_400.jsonl of paths.data_dir"},
    "limit": {"type": int},
    "repeats": {"type": int, "default": 1},
    "json": {"action": "store_true", "help": "print the figures as JSON"},
}


def add_job_options(parser: argparse._ActionsContainer, **options: dict[str, Any]) -> None:
    """Declare some of `JOB_OPTIONS` (--index, --dataset, --limit, --repeats, --json) in the order given, each with
    the job's own settings over the shared ones: `add_job_options(p, index={}, limit={"default": 20})`."""
    for name, own in options.items():
        parser.add_argument(f"--{name}", **{**JOB_OPTIONS[name], **own})


def add_sequential_arg(parser: argparse.ArgumentParser) -> None:
    """`--sequential` of the jobs that answer several runs (answer.runs=sequential)."""
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="answer the runs one after another (default: together, through one engine: answer.runs=concurrent)",
    )


def config_from_args(args: argparse.Namespace) -> DynragConfig:
    sequential = ["answer.runs=sequential"] if getattr(args, "sequential", False) else []
    return load_config(getattr(args, "config", None), [*getattr(args, "overrides", []), *sequential])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynrag",
        description="Batch retrieval-augmented question answering over Wikipedia: "
        "build indexes, answer datasets with adaptive RAG methods, evaluate.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in JOB_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock", "huggingface_hub", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        if not getattr(args, "json", False):
            return int(args.func(args) or 0)
        from jobs.jsonout import json_stdout

        # stdout holds the one JSON document only; the CLI's own process (argv None) keeps fd 1 on stderr to exit
        with json_stdout(restore=argv is not None):
            return int(args.func(args) or 0)
    except (DynragError, IndexingError, DeviceError) as exc:
        print(f"dynrag: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dynrag methods | head`: the reader left; nothing more to say
        with contextlib.suppress(OSError, ValueError):  # Python's flush at exit would fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a missing file, an output on a read-only or full filesystem
        print(f"dynrag: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dynrag: interrupted", file=sys.stderr)
        return 130


def csv_choice(text: str, known) -> list[str]:
    """A comma-separated command-line list, checked against `known` (None: anything)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if known is not None and t not in known]
    if bad or not items:
        raise DynragError(
            f"unknown or empty choice {bad or text!r}" + (f"; pick from {', '.join(known)}" if known else "")
        )
    return items


if __name__ == "__main__":
    sys.exit(main())
