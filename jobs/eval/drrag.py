"""`dynrag eval-drrag`: DR-RAG's Table 5 (gold-document recall and documents in the prompt for BM25, SM,
QDC, CIS and CFS at k = 3, 4, 6) on the multi-hop dev sets, each over its own paragraphs as the corpus.

    dynrag eval-drrag --classifier models/drrag-clf [--datasets hotpotqa,musique,2wiki] [--k 3,4,6]
                      [--limit N] [--out runs/drrag-table5] [--indexes DIR] [--generate]
    dynrag eval-drrag --classifier DIR --dataset dev.jsonl [--dataset-format musique]   # any file with supporting labels

Every method runs through the answer job (rows under OUT/<dataset>/<method>-k<k>, resumable). By
default no model generates (generation.backend=none): recall and document counts do not depend on the
answer. `--generate` also generates with the configured model and adds EM/F1/Acc columns.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from jobs.cli import add_config_args, add_job_options, add_sequential_arg, config_from_args, csv_choice
from pipeline.errors import DynragError
from pipeline.evaluation.devsets import DEV_SETS, dev_file, dev_index

log = logging.getLogger(__name__)

METHODS = ("bm25", "sm", "qdc", "cis", "cfs")
LABELS = {
    "bm25": "BM25",
    "sm": "Similarity Matching",
    "qdc": "Query Document Concatenation",
    "cis": "Classifier Inverse Selection",
    "cfs": "Classifier Forward Selection",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-drrag",
        help="DR-RAG Table 5: recall and documents for BM25/SM/QDC/CIS/CFS",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--classifier", metavar="DIR", help="trained classifier folder (dynrag train-classifier); needed by cis, cfs"
    )
    p.add_argument("--datasets", default="hotpotqa,musique,2wiki", help="comma-separated: " + ", ".join(DEV_SETS))
    add_job_options(
        p,
        dataset={
            "help": "instead of --datasets: any dev file whose questions carry "
            "supporting paragraphs; its paragraphs become the corpus"
        },
    )
    p.add_argument(
        "--dataset-format",
        metavar="FMT",
        help="--dataset's format (dataset.format: hotpotqa, musique, 2wiki, ...; default: detected)",
    )
    p.add_argument("--k", default="3,4,6", help="comma-separated document budgets (default 3,4,6 as the paper)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    add_job_options(p, limit={"metavar": "N", "help": "first N questions of each dev set"})
    p.add_argument("--out", default="runs/drrag-table5", metavar="DIR", help="rows and the table go here")
    p.add_argument(
        "--indexes",
        metavar="DIR",
        help="folder of per-dataset indexes <DIR>/<dataset> (built there "
        "from the dev set's paragraphs if absent; default OUT/indexes)",
    )
    p.add_argument("--generate", action="store_true", help="also generate answers (EM/F1/Acc)")
    add_sequential_arg(p)
    add_config_args(p)
    p.set_defaults(func=run)


def evaluate(
    cfg,
    classifier: str,
    sources: list[tuple[str, Path, str]],
    ks: list[int],
    methods: list[str],
    limit: int | None,
    out: Path,
    generate: bool,
    dataset_format: str | None = None,
) -> list[dict]:
    """Every (method, k) on every (name, dev file, index) source; one row of Table 5 each."""
    from pipeline.evaluation.experiment import MethodRun, run_methods

    if not generate:
        cfg.generation.backend = "none"
    cfg.answer.progress = False
    rows = []
    for ds, file, index in sources:
        golds = gold_labels(file, cfg, dataset_format) if {"cis", "cfs"} & set(methods) else {}
        runs = [
            MethodRun(f"{m}-k{k}", m, {"k": k, **({"classifier": classifier} if m in ("cis", "cfs") else {})})
            for k in ks
            for m in methods
        ]

        for r, s in zip(
            runs, run_methods(str(file), index, runs, cfg, out / ds, limit=limit, dataset_format=dataset_format)
        ):
            rows.append(
                {
                    "dataset": ds,
                    "k": r.params["k"],
                    "method": r.method,
                    "recall": s["support_recall"],
                    "docs": s["docs_in_prompt_per_question"],
                    "em": s["em"],
                    "f1": s["f1"],
                    "acc": s["acc"],
                    "questions": s["answered"],
                    "errors": s["errors"],
                    "classifier_calls": s["classifier_calls_per_question"],
                    "llm_calls": s["llm_calls_per_question"],
                    "s_per_q": s["time_per_question_s"]["total"],
                    "classifier_auc": classifier_auc(s["out"], golds) if r.method in ("cis", "cfs") else None,
                }
            )
            log.info(
                "%s k=%d %s: recall %.4f, %.2f docs",
                ds,
                r.params["k"],
                r.method,
                rows[-1]["recall"] or 0,
                rows[-1]["docs"] or 0,
            )
    return rows


def gold_labels(file: Path, cfg, dataset_format: str | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """Question id -> (gold supporting titles, their paragraph ids) from the dev file (rows keep only the titles)."""
    from pipeline.io.datasets import load_questions

    return {
        q.id: (list(q.supporting_titles), list(q.supporting_ids))
        for q in load_questions(str(file), cfg, fmt=dataset_format)
    }


def judged_pairs(rows: list[dict], golds: dict[str, tuple[list[str], list[str]]]) -> tuple[list[float], list[bool]]:
    """(P, label) of every pair a CIS/CFS run judged (`extra.judged`: d_i title, candidate title, P, d_i id,
    candidate id): positive when both documents are gold supporting paragraphs (Eq. 2's C(q, d*, d*)), by
    paragraph id as the recall counts them (`is_gold_document`); by title where an entry has no ids or the
    question no gold ids (`golds` lacks it: then the row's gold titles)."""
    import json

    from pipeline.text.metrics import is_gold_document

    scores, labels = [], []
    for r in rows:
        titles, ids = golds.get(r["question_id"]) or (list(r["gold_supporting_titles"] or []), [])
        for entry in (json.loads(r["extra"]) if r["extra"] else {}).get("judged", []):
            first, cand, p, *doc_ids = entry
            first_id, cand_id = doc_ids if len(doc_ids) == 2 else ("", "")
            scores.append(p)
            labels.append(
                is_gold_document(first_id, first, titles, ids if first_id else ())
                and is_gold_document(cand_id, cand, titles, ids if cand_id else ())
            )
    return scores, labels


def classifier_auc(out: str, golds: dict[str, tuple[list[str], list[str]]] | None = None) -> float | None:
    """How well the classifier separated the pairs it was asked about in a CIS/CFS run (`judged_pairs`)."""
    from pipeline.classifier.train import rank_auc
    from pipeline.io.output import read_rows

    rows = read_rows(out, ["question_id", "extra", "gold_supporting_titles"]).to_pylist()
    return rank_auc(*judged_pairs(rows, golds or {}))


def table(rows: list[dict], generate: bool) -> str:
    """Markdown in the shape of DR-RAG Table 5 (recall in %, actual number of documents)."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    head = (
        "| top-k | strategy | "
        + " | ".join(f"{d} recall | {d} docs" + (f" | {d} EM | {d} F1" if generate else "") for d in datasets)
        + " |"
    )
    lines = [head, "|" + "---|" * (2 + len(datasets) * (4 if generate else 2))]
    for k in dict.fromkeys(r["k"] for r in rows):
        for m in dict.fromkeys(r["method"] for r in rows):
            cells = []
            for d in datasets:
                r = next((r for r in rows if (r["dataset"], r["k"], r["method"]) == (d, k, m)), None)
                pct = lambda v: "-" if v is None else f"{100 * v:.2f}"  # noqa: E731
                cells += [pct(r and r["recall"]), "-" if not r or r["docs"] is None else f"{r['docs']:.2f}"]
                if generate:
                    cells += [pct(r and r["em"]), pct(r and r["f1"])]
            lines.append(f"| {k} | {LABELS[m]} | " + " | ".join(cells) + " |")
    aucs = [
        f"{r['dataset']} {r['method']} k={r['k']} {r['classifier_auc']:.3f}"
        for r in rows
        if r.get("classifier_auc") is not None
    ]
    if aucs:
        lines += ["", "classifier AUC on the pairs it judged (positive: both gold): " + "; ".join(aucs)]
    return "\n".join(lines)


def ordering(rows: list[dict]) -> list[str]:
    """The paper's claims per dataset and k: BM25 < SM < QDC <= CFS in recall; CFS above SM with fewer docs."""
    notes = []
    for d in dict.fromkeys(r["dataset"] for r in rows):
        for k in dict.fromkeys(r["k"] for r in rows):
            got = {r["method"]: r for r in rows if r["dataset"] == d and r["k"] == k}
            if not {"bm25", "sm", "qdc", "cfs"} <= set(got):
                continue
            rec = {m: got[m]["recall"] or 0.0 for m in got}
            chain = rec["bm25"] < rec["sm"] < rec["qdc"] <= rec["cfs"]
            goal = rec["cfs"] > rec["sm"] and (got["cfs"]["docs"] or 0) < (got["sm"]["docs"] or 0)
            notes.append(
                f"{d} k={k}, by the means (the intervals below say which differences hold): "
                f"BM25<SM<QDC<=CFS {'holds' if chain else 'does not hold'}; "
                f"CFS above SM with fewer documents: {'yes' if goal else 'no'}"
            )
    return notes


def intervals(out: Path, datasets: list[str], methods: list[str], ks: list[int], generate: bool) -> str:
    """Every method against SM (else the first method) at the same k: paired differences of gold-document
    recall (and EM/F1/Acc with --generate) with 95% bootstrap intervals and randomization p-values."""
    from pipeline.evaluation.comparison import METRICS, against_baseline

    base = "sm" if "sm" in methods else methods[0]
    metrics = ("support_recall", *METRICS) if generate else ("support_recall",)
    blocks = [
        f"k={k}, against {LABELS[base]}:\n\n"
        + against_baseline(
            [(f"{m}-k{k}", str(out / d / f"{m}-k{k}")) for d in datasets for m in methods], f"{base}-k{k}", metrics
        )
        for k in ks
    ]
    return "\n".join(blocks)


def _require_labels(file: Path, cfg, fmt: str | None, sample: int = 20) -> None:
    """Table 5's recall needs gold supporting paragraphs: check the first questions before building anything."""
    from itertools import islice

    from pipeline.io.datasets import load_questions

    if not any(q.supporting_titles for q in islice(load_questions(str(file), cfg, fmt=fmt), sample)):
        raise DynragError(
            f"{file}: its first {sample} questions carry no supporting-paragraph labels; Table 5 needs them"
        )


def _sources(cfg, args, datasets: list[str], indexes: Path) -> list[tuple[str, Path, str]]:
    """(name, dev file, index) per dataset: the kit's dev sets, or --dataset FILE over its own paragraphs."""
    from indexing.corpus.readers import FORMATS
    from pipeline.evaluation.devsets import data_path, ensure_index

    if args.dataset is None:
        return [(ds, dev_file(cfg, ds), dev_index(cfg, ds, indexes)) for ds in datasets]
    file = data_path(cfg, str(Path(args.dataset).resolve()))
    _require_labels(file, cfg, args.dataset_format)
    name = Path(file).name.split(".")[0]
    # a question format the corpus reader does not know (hotpotqa-ircot, ...): its auto detection reads the file
    return [
        (
            name,
            file,
            ensure_index(file, args.dataset_format if args.dataset_format in FORMATS else None, indexes / name, cfg),
        )
    ]


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    datasets = csv_choice(args.datasets, list(DEV_SETS))
    methods = csv_choice(args.methods, list(METHODS))
    try:
        ks = [int(k) for k in csv_choice(args.k, None)]
    except ValueError:
        raise DynragError(f"--k: integers expected, got {args.k!r}") from None
    if {"cis", "cfs"} & set(methods) and not (
        args.classifier and Path(args.classifier, "dynrag-classifier.json").is_file()
    ):
        raise DynragError(f"--classifier {args.classifier}: not a trained classifier folder (dynrag train-classifier)")
    out = Path(args.out)
    indexes = Path(args.indexes) if args.indexes else out / "indexes"
    sources = _sources(cfg, args, datasets, indexes)
    rows = evaluate(
        cfg,
        str(Path(args.classifier).resolve()) if args.classifier else "",
        sources,
        ks,
        methods,
        args.limit,
        out,
        args.generate,
        dataset_format=args.dataset_format,
    )
    names = [name for name, _, _ in sources]
    text = (
        table(rows, args.generate)
        + "\n\n"
        + "\n".join(ordering(rows))
        + "\n\n"
        + intervals(out, names, methods, ks, args.generate)
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "table5.md").write_text(text + "\n", encoding="utf-8")
    import json

    (out / "table5.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(text)
    print(f"\n(written to {out / 'table5.md'} and table5.json)")
    return 0
