"""`dynrag evaluate` and `dynrag report`: the evaluation table and the HTML report of finished runs.

    dynrag evaluate runs/drrag-table5 runs/pairs [--out DIR]   # table per dataset (.md, .csv, .parquet)
    dynrag report runs/drrag-table5 --html report.html         # one self-contained HTML file with plots

Each OUT_DIR is a run folder (`dynrag answer --out`) or a folder holding run folders at any depth.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="table per dataset of EM/F1/Acc, recall, calls and times of finished runs",
        description=__doc__.split("\n\n")[0],
    )
    ev.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run folders, or folders holding run folders")
    ev.add_argument("--out", metavar="DIR", help="write evaluation.{md,csv,parquet} here (default: the first OUT_DIR)")
    ev.set_defaults(func=run_evaluate)
    rep = sub.add_parser(
        "report",
        help="self-contained HTML report (tables and plots) of finished runs",
        description=__doc__.split("\n\n")[0],
    )
    rep.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run folders, or folders holding run folders")
    rep.add_argument("--html", required=True, metavar="FILE", help="the HTML file to write")
    rep.add_argument("--title", default="dynrag evaluation")
    rep.set_defaults(func=run_report)


def run_evaluate(args: argparse.Namespace) -> int:
    from pipeline.evaluation.table import evaluate

    text, paths = evaluate(args.out_dirs, args.out or args.out_dirs[0])
    print(text)
    print("written: " + ", ".join(paths))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from pipeline.evaluation.report import write_report

    print(f"report written to {write_report(args.out_dirs, args.html, args.title)}")
    return 0
