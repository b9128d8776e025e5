"""`dynrag train-classifier`: train the DR-RAG classifier C(q, d1, d2), or with `--task complexity` Adaptive-RAG's
question-complexity classifier (pipeline/classifier/complexity.py), and write a model folder.

    dynrag train-classifier --out models/drrag-clf [--model features|cross-encoder] [--datasets hotpotqa,2wiki,musique]
                            [--max-examples N] [--epochs E] [--config FILE] [--set classifier.KEY=VALUE ...]

The default model is a small MLP over frozen embeddings and lexical features (minutes on a CPU); the
cross-encoder is the paper's fine-tuned encoder (hours on a CPU). The folder holds the model
(safetensors and dynrag-classifier.json with its kind and threshold), metrics.json (held-out accuracy,
AUC, precision, recall, F1, per example kind and dataset) and config.resolved.yaml. The answer job
loads it with `--set classifier.path=DIR`.
"""

from __future__ import annotations

import argparse
import json

from jobs.cli import add_config_args, config_from_args
from pipeline.config import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-classifier",
        help="train the DR-RAG classifier C(q, d1, d2) on multi-hop supporting labels",
        description="Train the DR-RAG classifier C(q, d1, d2) on Eq. 2's examples (App. A.1): by default a small "
        "MLP over frozen embeddings and lexical features, or the paper's fine-tuned cross-encoder; evaluate it on held-out questions and write a model folder with its metrics and config.",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--out", required=True, metavar="DIR", help="model folder to write (must not exist unless --overwrite)"
    )
    out.add_argument("--overwrite", action="store_true", help="replace an existing model folder")
    data = p.add_argument_group("data and training (shortcuts for --set classifier.*)")
    data.add_argument("--model", choices=["features", "cross-encoder"], help="classifier kind (default: features)")
    data.add_argument(
        "--datasets", metavar="LIST", help="comma-separated: hotpotqa, 2wiki, musique (default: all three)"
    )
    data.add_argument("--max-examples", type=int, metavar="N", help="cap on examples (train + dev), whole questions")
    data.add_argument("--epochs", type=float, metavar="E", help="training epochs (fractions allowed)")
    data.add_argument("--data-dir", metavar="DIR", help="benchmark data kit (default: paths.data_dir)")
    cx = p.add_argument_group("complexity (Adaptive-RAG's router, --task complexity)")
    cx.add_argument(
        "--task",
        choices=["triple", "pair", "complexity"],
        help="triple: DR-RAG's C(q, d1, d2); pair: a (q, d) reranker; complexity: Adaptive-RAG's A/B/C "
        "question classifier for `--set method.params.classifier=DIR` (default: classifier.task)",
    )
    cx.add_argument(
        "--silver",
        action="append",
        default=[],
        metavar="DIR",
        help="answer output folder of no-retrieval, sr-rag or ircot whose EM gives silver labels (repeatable); "
        "questions without one take their dataset's label (single-hop B, multi-hop C)",
    )
    cx.add_argument("--per-dataset", type=int, default=300, metavar="N", help="questions per kit dataset (300)")
    add_config_args(p)
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> list[str]:
    extra = []
    if args.datasets is not None:
        names = [n.strip() for n in args.datasets.split(",") if n.strip()]
        if not names:
            raise ConfigError("--datasets: give at least one of hotpotqa, 2wiki, musique")
        extra.append(f"classifier.datasets=[{', '.join(json.dumps(n) for n in names)}]")
    if args.task in ("triple", "pair"):
        extra.append(f"classifier.task={args.task}")
    if args.model is not None:
        extra.append(f"classifier.model={args.model}")
    if args.max_examples is not None:
        extra.append(f"classifier.max_examples={args.max_examples}")
    if args.epochs is not None:
        extra.append(f"classifier.epochs={args.epochs}")
    if args.data_dir is not None:
        extra.append(f"paths.data_dir={json.dumps(args.data_dir)}")
    return extra


def run(args: argparse.Namespace) -> int:
    args.overrides = list(args.overrides) + _overrides(args)
    cfg = config_from_args(args)

    if args.task == "complexity":
        return _run_complexity(args, cfg)

    from pipeline.classifier.data import canonical_name
    from pipeline.classifier.train import train_classifier

    for name in cfg.classifier.datasets:  # fail on a bad name before any model is loaded
        canonical_name(name)
    result = train_classifier(cfg, args.out, overwrite=args.overwrite)
    dev, tr = result["dev"], result["training"]
    print(
        f"held-out ({dev['n']} examples, {result['data']['dev']['questions']} questions): "
        f"accuracy {dev['accuracy']:.4f}  AUC {dev['auc'] or 0:.4f}  precision {dev['precision']:.4f}  recall {dev['recall']:.4f}  "
        f"f1 {dev['f1']:.4f}  (majority baseline {dev['majority_baseline_accuracy']:.4f})"
    )
    for kind, m in dev["by_kind"].items():
        print(f"  {kind:<22} n={m['n']:<5} accuracy {m['accuracy']:.4f}")
    if "threshold_tuning" in dev:
        t = dev["threshold_tuning"]
        print(
            f"threshold {t['chosen']:.2f} saved with the model (chosen on {t['calibration_n']} held-out examples; on "
            f"the other {t['held_out_n']}: accuracy {t['held_out_accuracy_at_chosen']:.4f} vs "
            f"{t['held_out_accuracy_at_default']:.4f} at {t['default']:.2f})"
        )
    print(
        f"trained on {result['data']['train']['examples']} examples in {tr['seconds']} s "
        f"({tr['examples_per_second']} examples/s); model folder: {args.out}"
    )
    print(f"total: {result['total_seconds'] / 60:.1f} min wall, {result['total_cpu_seconds']:.0f} s of CPU")
    return 0


def _run_complexity(args: argparse.Namespace, cfg) -> int:
    from pipeline.classifier.complexity import train_complexity

    unused = [f for f, v in (("--model", args.model), ("--datasets", args.datasets), ("--epochs", args.epochs)) if v]
    if unused or args.max_examples is not None:
        raise ConfigError(f"{', '.join(unused) or '--max-examples'}: not used by --task complexity")
    if args.per_dataset < 1:
        raise ConfigError("--per-dataset: give at least 1")
    r = train_complexity(cfg, args.out, silver=args.silver, per_dataset=args.per_dataset, overwrite=args.overwrite)
    dev = r["dev"]
    print(
        f"held-out ({dev['questions']} questions, labels {dev['labels']}): accuracy {dev['accuracy']:.4f}  "
        f"(majority class {dev['majority_label']}: {dev['majority_baseline_accuracy']:.4f})"
    )
    print(
        f"trained on {r['train']['questions']} questions (labels {r['train']['labels']}; "
        f"{r['silver_labelled']} silver) in {r['seconds']} s; model folder: {args.out}"
    )
    return 0
