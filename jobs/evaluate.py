"""`dynrag evaluate` and `dynrag report`: the evaluation table and the HTML report of finished runs.

    dynrag evaluate runs/drrag-table5 runs/pairs [--out DIR]   # table per dataset (.md, .csv, .parquet)
    dynrag evaluate runs/b --baseline runs/a [--json]           # paired differences, 95% intervals, p-values
    dynrag evaluate runs/drrag-table5 --baseline sm-k4          # every run against the run labelled sm-k4
    dynrag evaluate runs/demo --judge qwen2.5-0.5b-instruct     # an LLM judge's accuracy beside EM/Acc
    dynrag report runs/drrag-table5 --html report.html         # one self-contained HTML file with plots

Each OUT_DIR is a run folder (`dynrag answer --out`) or a folder holding run folders at any depth.
"""

from __future__ import annotations

import argparse

from pipeline.errors import DynragError

BASELINE_HELP = (
    "compare every run with this one, per dataset, on the questions both answered: a run folder (or a folder "
    "with one run per dataset), or the label of one of the runs (e.g. sm-k4). Adds the difference of mean "
    "EM/F1/Acc with a 95%% percentile paired bootstrap interval and a two-sided paired randomization p-value"
)


def add_stat_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resamples",
        type=int,
        default=10_000,
        metavar="R",
        help="bootstrap and randomization resamples (default 10000)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the resamples (default 0)")


def register(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="table per dataset of EM/F1/Acc, recall, calls and times of finished runs; --baseline adds significance",
        description=__doc__.split("\n\n")[0],
        epilog="\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run folders, or folders holding run folders")
    ev.add_argument("--out", metavar="DIR", help="write evaluation.{md,csv,parquet} here (default: the first OUT_DIR)")
    ev.add_argument("--baseline", metavar="RUN", help=BASELINE_HELP + "; also writes comparison.{md,csv,json}")
    ev.add_argument(
        "--json",
        action="store_true",
        help="print the rows as JSON instead of Markdown (with --baseline: the comparison rows, each with run, "
        "dataset, n, em/f1/acc, delta_*, delta_*_ci95 [low, high], p_*)",
    )
    add_stat_args(ev)
    ev.add_argument(
        "--judge",
        metavar="MODEL",
        help="also judge every answer with this model (a name from `dynrag models` or a folder), on the first "
        "run's generation backend: judge Acc beside EM/Acc and the agreement with each; verdicts cached under "
        "each run (RUN/judge/), so a rerun asks only about new answers. Prompt: pipeline/evaluation/judge.py",
    )
    ev.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --judge: override the judge's configuration, e.g. --set generation.kv_cache_gib=2",
    )
    ev.set_defaults(func=run_evaluate)
    rep = sub.add_parser(
        "report",
        help="self-contained HTML report (tables and plots) of finished runs",
        description=__doc__.split("\n\n")[0],
    )
    rep.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run folders, or folders holding run folders")
    rep.add_argument("--html", required=True, metavar="FILE", help="the HTML file to write")
    rep.add_argument("--title", default="dynrag evaluation")
    rep.add_argument("--baseline", metavar="RUN", help=BASELINE_HELP)
    add_stat_args(rep)
    rep.set_defaults(func=run_report)


def check_stat_args(args: argparse.Namespace) -> None:
    if args.resamples < 1:
        raise DynragError(f"--resamples: at least 1, got {args.resamples}")


def run_evaluate(args: argparse.Namespace) -> int:
    from pipeline.evaluation import comparison
    from pipeline.evaluation.runs import load_runs
    from pipeline.evaluation.table import markdown, records, write_tables

    check_stat_args(args)
    runs = load_runs(args.out_dirs)
    out = args.out or args.out_dirs[0]
    recs = records(runs)
    text = markdown(recs)
    if args.judge:
        from pipeline.evaluation import judge

        judged = judge.judge_runs(runs, args.judge, args.overrides)
        by_path = {run.path: j for run, j in judged}
        for rec in recs:  # runs without answers were not judged
            rec.update({k: v for k, v in by_path.get(rec["path"], {}).items() if k != "cache"})
        text += "\n" + judge.markdown(judged)
    paths = write_tables(recs, out)
    rows: list = recs
    if args.baseline:
        rows = comparison.comparisons(runs, args.baseline, args.resamples, args.seed)
        text += "\n" + comparison.markdown(rows)
        paths += comparison.write_comparison(rows, out)
    if args.json:
        from jobs.jsonout import emit

        emit(rows, indent=1)
    else:
        print(text)
        print("written: " + ", ".join(paths))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from pipeline.evaluation.report import write_report

    check_stat_args(args)
    path = write_report(args.out_dirs, args.html, args.title, args.baseline, args.resamples, args.seed)
    print(f"report written to {path}")
    return 0
