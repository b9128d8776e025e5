"""`dynrag methods`: list the registered methods with their parameters and defaults."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "methods",
        help="list the RAG methods with their parameters and defaults",
        description="Methods are chosen with --method NAME (or method.name) and tuned with "
        "--set method.params.KEY=VALUE.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="show only these methods")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.methods.registry import all_methods, get_method

    specs = [get_method(n) for n in args.names] if args.names else list(all_methods().values())
    for spec in specs:
        print(f"{spec.name}: {spec.description}")
        if spec.paper:
            print(f"  paper: {spec.paper}")
        rows = spec.defaults()
        if not rows:
            print("  (no parameters)")
        for name, typ, default, desc in rows:
            print(f"  --set method.params.{name}=...  {typ}, default {default!r}  {desc}")
    return 0
