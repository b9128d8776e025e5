"""`dynrag bench all`: every benchmark of `dynrag bench`, one after another, each in its own process
(so one's engines and JVM never share memory with the next), printing every figure and each
process's peak RSS. The benchmarks that answer questions need an index over the dataset's paragraphs:
`--index DIR`, or one is built (once, reused) under `--workdir`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs.bench.rig.rss import GIB, run_measured

# name -> extra arguments; {index} is replaced by the index folder. --quick uses the second list.
BENCHES = {
    "index": ([], ["--passages", "1000", "--queries", "200", "--search-repeats", "3"]),
    "answer": (["--index", "{index}"], ["--index", "{index}", "--limit", "64"]),
    "dragin": (["--index", "{index}"], ["--index", "{index}", "--limit", "8"]),
    "flashrag": ([], ["--limit", "16"]),
}


def register(bsub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = bsub.add_parser("all", help="run every benchmark and print every figure", description=__doc__)
    p.add_argument(
        "--index", metavar="DIR", help="index over hotpotqa/dev_400.jsonl's paragraphs (default: built under --workdir)"
    )
    p.add_argument("--workdir", help="default: <cache_dir>/bench/all")
    p.add_argument("--only", nargs="+", choices=list(BENCHES), help="run only these benchmarks")
    p.add_argument("--quick", action="store_true", help="fewer questions and repeats (a smoke run, noisier figures)")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args

    cfg = config_from_args(args)
    work = Path(args.workdir or Path(cfg.paths.cache_dir) / "bench" / "all")
    work.mkdir(parents=True, exist_ok=True)
    index = args.index
    if index is None:
        from indexing import build_index

        index = str(work / "index-hotpotqa")
        build_index(
            [str(Path(cfg.paths.data_dir) / "hotpotqa" / "dev_400.jsonl")], index, cfg.index_settings()
        )  # incremental: reused
    shared = [*(["--config", args.config] if args.config else []), *[a for o in args.overrides for a in ("--set", o)]]
    failed = []
    for name in args.only or list(BENCHES):
        extra = [a.format(index=index) for a in BENCHES[name][1 if args.quick else 0]]
        cmd = [sys.executable, "-m", "jobs.cli", "--log-level", "WARNING", "bench", name, *extra, *shared]
        print(f"== dynrag bench {name} {' '.join(extra)}", flush=True)
        m = run_measured(cmd)
        print(m.stdout.rstrip())
        print(
            f"   (bench {name}: exit {m.returncode}, {m.wall_s:.0f} s, peak RSS of its process tree "
            f"{m.peak_rss / GIB:.2f} GiB)",
            flush=True,
        )
        if m.returncode:
            failed.append(name)
            print("\n".join(m.stderr.strip().splitlines()[-10:]), file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
