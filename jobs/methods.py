"""`dynrag methods`: one line a method, grouped by family; `dynrag methods NAME` for its parameters."""

from __future__ import annotations

import argparse
from typing import Any

# family -> {method: the paper it comes from, short}; the full citation (sections, equations) is the registry's
FAMILIES: dict[str, dict[str, str]] = {
    "Baselines": {"no-retrieval": "wo-RAG / Direct", "sr-rag": "Lewis et al. 2020"},
    "Query expansion, rerank": {
        "hyde": "Gao et al. 2023",
        "q2d": "Wang et al. 2023",
        "cot": "Jagerman et al. 2023",
        "rerank": "Glass et al. 2022",
    },
    "DR-RAG": {"bm25": "Hei et al.", "sm": "Hei et al.", "qdc": "Hei et al.", "cis": "Hei et al.", "cfs": "Hei et al."},
    "PAIRS": {
        "pairs": "Chen et al. 2025",
        "dpr-ais": "Chen et al. 2025",
        "dpr-ais-dynamic": "Chen et al. 2025",
        "dpr-ais-rerank": "Chen et al. 2025",
    },
    "DRAGIN and its baselines": {
        "dragin": "Su et al. 2024",
        "flare": "Jiang et al. 2023",
        "fl-rag": "Ram et al. 2023",
        "fs-rag": "Trivedi et al. 2022",
    },
    "ERM4": {"erm4": "Shi et al.", "erm4-rewriter": "Shi et al.", "rewrite-retrieve-read": "Ma et al. 2023"},
    "Multi-step": {
        "ircot": "Trivedi et al. 2023",
        "iter-retgen": "Shao et al. 2023",
        "self-ask": "Press et al. 2023",
        "sure": "Kim et al. 2024",
        "adaptive-rag": "Jeong et al. 2024",
    },
    "Reasoning with search": {"search-r1": "Jin et al. 2025", "search-o1": "Li et al. 2025"},
}
OTHER = "Other"
WIDTH = 140  # a listing line is cut here; `dynrag methods NAME` has the whole description


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_job_options

    p = sub.add_parser(
        "methods",
        help="list the RAG methods (one line each); NAME: its parameters, defaults and sources",
        description="Methods are chosen with --method NAME (or method.name) and tuned with "
        "--set method.params.KEY=VALUE.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="show these methods' parameters")
    add_job_options(p, json={"help": "print every (or each NAME's) method with its parameters"})
    p.set_defaults(func=run)


def family_of(name: str) -> tuple[str, str]:
    """(family, short paper) of a method; one missing from FAMILIES is listed under Other with its citation."""
    for family, members in FAMILIES.items():
        if name in members:
            return family, members[name]
    return OTHER, ""


def describe(spec) -> dict[str, Any]:
    family, short = family_of(spec.name)
    params = [{"name": n, "type": t, "default": d, "source": s} for n, t, d, s in spec.defaults()]
    return {
        "name": spec.name,
        "family": family,
        "paper_short": short or spec.paper.split(";")[0][:30],
        "paper": spec.paper,
        "description": spec.description,
        "params": params,
    }


def listing(methods: list[dict]) -> list[str]:
    """One line a method under one heading a family, in FAMILIES' order."""
    lines = []
    for family in [*FAMILIES, OTHER]:
        order = list(FAMILIES.get(family, {}))
        rows = sorted(
            (m for m in methods if m["family"] == family),
            key=lambda m: order.index(m["name"]) if m["name"] in order else len(order),
        )
        if rows:
            lines.append(f"{family}:")
        for m in rows:
            line = f"  {m['name']:<22}{m['paper_short']:<21}{m['description']}"
            lines.append(line if len(line) <= WIDTH else line[: WIDTH - 3] + "...")
    return lines


def details(m: dict) -> list[str]:
    lines = [f"{m['name']} ({m['family']}): {m['description']}", f"  paper: {m['paper']}"]
    if not m["params"]:
        return [*lines, "  (no parameters)"]
    lines.append("  parameters (--set method.params.NAME=VALUE): name, type, default, what it is and its source")
    for p in m["params"]:
        lines.append(f"    {p['name']}  {p['type']} = {p['default']!r}  {p['source']}".rstrip())
    return lines


def run(args: argparse.Namespace) -> int:
    from pipeline.methods.registry import all_methods, get_method

    specs = [get_method(n) for n in args.names] if args.names else list(all_methods().values())
    methods = [describe(s) for s in specs]
    if args.json:
        from jobs.jsonout import emit

        emit(methods, indent=1, ensure_ascii=False)
    elif args.names:
        print("\n\n".join("\n".join(details(m)) for m in methods))
    else:
        print("\n".join(listing(methods)))
        print("`dynrag methods NAME` for a method's parameters; --json for all of them")
    return 0
