"""Training examples for the DR-RAG classifier C(q, d1, d2), from multi-hop supporting labels.

The rule is the paper's Eq. (2) (Sec. 2.2.2): with d* the documents needed to answer q (Table 1: "the
relevant documents for correctly answering q", i.e. the supporting paragraphs) and dΔ the others (the
distractor paragraphs of the same question),

    C(q, d*, d*) = positive,   C(q, d*, dΔ) = negative,   C(q, dΔ, dΔ) = negative,

sampled so that positives and negatives are 1:1 (App. A.1). Positives are every ordered pair of two
different supporting documents (CFS asks C(q, d_i, d') and CIS asks C(q, d', d_i), Eqs. 3-4, so both
orders occur at inference); as many negatives are drawn for the same question, a share of them mixing a
supporting with a non-supporting document (in either order) and the rest pairing two non-supporting ones.
Everything is deterministic given a seed; the dev split is by question, so no question is on both sides.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import DynragError

log = logging.getLogger(__name__)

POSITIVE = "gold+gold"
GOLD_DISTRACTOR = "gold+distractor"
DISTRACTOR_GOLD = "distractor+gold"
DISTRACTOR_DISTRACTOR = "distractor+distractor"
PAIR_GOLD = "pair:gold"  # task "pair" (a reranker K(d, q), PAIRS Eq. 7): (q, supporting doc) = positive
PAIR_DISTRACTOR = "pair:distractor"  # (q, non-supporting doc of the same question) = negative
KINDS = (POSITIVE, GOLD_DISTRACTOR, DISTRACTOR_GOLD, DISTRACTOR_DISTRACTOR, PAIR_GOLD, PAIR_DISTRACTOR)


class ClassifierDataError(DynragError, ValueError):
    """An unknown dataset name, a missing training file or a file in an unexpected format."""


def format_document(title: str, text: str) -> str:
    """One document as the classifier reads it; callers at inference must format documents the same way."""
    title, text = title.strip(), text.strip()
    return f"{title}: {text}" if title else text


@dataclass(frozen=True)
class Record:
    """One training question with its context documents and which of them support the answer."""

    qid: str
    dataset: str
    question: str
    docs: tuple[str, ...]
    gold: tuple[bool, ...]


@dataclass(frozen=True)
class Example:
    qid: str
    dataset: str
    question: str
    doc1: str
    doc2: str | None  # None: a pair example (q, doc1)
    label: int  # 1 positive, 0 negative
    kind: str  # one of KINDS

    @property
    def item(self) -> tuple[str, ...]:
        return (self.question, self.doc1) if self.doc2 is None else (self.question, self.doc1, self.doc2)


# -- readers -------------------------------------------------------------------------------------


def _dedupe(docs: list[tuple[str, bool]]) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """Identical texts appear more than once in some contexts: keep one, supporting if any copy is."""
    seen: dict[str, bool] = {}
    for text, is_gold in docs:
        seen[text] = seen.get(text, False) or is_gold
    return tuple(seen), tuple(seen.values())


def read_official(path: Path, dataset: str) -> list[Record]:
    """HotpotQA / 2WikiMultihopQA official format: context [[title, [sentences]]], supporting_facts [[title, i]]."""
    records = []
    for row in _load_json_list(path):
        try:
            gold_titles = {title for title, _ in row["supporting_facts"]}
            titles = set()
            docs = []
            for title, sentences in row["context"]:
                if title in titles:  # the official readers also keep the first paragraph of a title
                    continue
                titles.add(title)
                docs.append((format_document(title, " ".join(s.strip() for s in sentences)), title in gold_titles))
            qid, question = str(row["_id"]), row["question"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ClassifierDataError(
                f"{path}: not the official {dataset} format ({type(exc).__name__}: {exc})"
            ) from None
        records.append(Record(qid, dataset, question, *_dedupe(docs)))
    return records


def read_musique(path: Path, dataset: str = "musique") -> list[Record]:
    """MuSiQue official format: paragraphs [{idx, title, paragraph_text, is_supporting}]."""
    records = []
    for row in _load_json_list(path):
        try:
            docs = [
                (format_document(p["title"], p["paragraph_text"]), bool(p["is_supporting"])) for p in row["paragraphs"]
            ]
            qid, question = str(row["id"]), row["question"]
        except (KeyError, TypeError) as exc:
            raise ClassifierDataError(f"{path}: not the MuSiQue format ({type(exc).__name__}: {exc})") from None
        records.append(Record(qid, dataset, question, *_dedupe(docs)))
    return records


def _load_json_list(path: Path) -> list[dict]:
    if not path.is_file():
        raise ClassifierDataError(f"training file not found: {path} (set paths.data_dir or $DYNRAG_DATA)")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # JSON lines
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ClassifierDataError(f"{path}: neither JSON nor JSON lines ({exc})") from None
    if not isinstance(data, list):
        raise ClassifierDataError(f"{path}: expected a list of questions, got {type(data).__name__}")
    return data


# name -> (file under the data kit, reader); aliases map to a name
TRAIN_FILES = {
    "hotpotqa": ("hotpotqa/train_100.json", read_official),
    "2wiki": ("2wikimultihopqa/train_500.json", read_official),
    "musique": ("musique/train_100.json", read_musique),
}
ALIASES = {"hotpot": "hotpotqa", "2wikimultihopqa": "2wiki", "2wikimqa": "2wiki"}


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in TRAIN_FILES:
        raise ClassifierDataError(f"unknown training dataset {name!r}; known: {', '.join(TRAIN_FILES)}")
    return key


def load_records(data_dir: str | Path, names: list[str]) -> list[Record]:
    data_dir = Path(data_dir)
    canon = [canonical_name(n) for n in names]  # check every name before reading anything
    if not data_dir.is_dir():
        raise ClassifierDataError(f"data folder not found: {data_dir} (set paths.data_dir or $DYNRAG_DATA)")
    records: list[Record] = []
    for name in dict.fromkeys(canon):
        rel, reader = TRAIN_FILES[name]
        part = reader(data_dir / rel, name)
        log.info("read %d questions from %s", len(part), data_dir / rel)
        records.extend(part)
    return records


# -- examples (Eq. 2, App. A.1) ----------------------------------------------------------------


def build_examples(record: Record, rng: random.Random, mixed_fraction: float = 0.5) -> list[Example]:
    """The positives of one question and as many negatives (1:1, App. A.1), in a deterministic order."""
    gold = [d for d, g in zip(record.docs, record.gold) if g]
    other = [d for d, g in zip(record.docs, record.gold) if not g]

    def ex(d1: str, d2: str, label: int, kind: str) -> Example:
        return Example(record.qid, record.dataset, record.question, d1, d2, label, kind)

    # C(q, d*, d*) = positive: two different supporting documents, both orders.
    positives = [ex(a, b, 1, POSITIVE) for a in gold for b in gold if a != b]
    if not positives:
        return []
    # C(q, d*, dΔ) = negative (either order) and C(q, dΔ, dΔ) = negative.
    mixed = [(a, b, GOLD_DISTRACTOR) for a in gold for b in other] + [
        (b, a, DISTRACTOR_GOLD) for a in gold for b in other
    ]
    both_other = [(a, b, DISTRACTOR_DISTRACTOR) for a in other for b in other if a != b]
    n = len(positives)
    n_mixed = min(round(n * mixed_fraction), len(mixed))
    n_other = min(n - n_mixed, len(both_other))
    n_mixed = min(n - n_other, len(mixed))  # one pool short: fill from the other
    picked = rng.sample(mixed, n_mixed) + rng.sample(both_other, n_other)
    negatives = [ex(a, b, 0, kind) for a, b, kind in picked]
    if len(negatives) < n:  # too few distractors for 1:1: keep the ratio by dropping positives
        positives = rng.sample(positives, len(negatives))
    return positives + negatives


def build_pair_examples(record: Record, rng: random.Random) -> list[Example]:
    """Task "pair": (q, supporting doc) positive, as many (q, non-supporting doc) negatives, 1:1."""
    gold = [d for d, g in zip(record.docs, record.gold) if g]
    other = [d for d, g in zip(record.docs, record.gold) if not g]
    n = min(len(gold), len(other))
    if not n:
        return []
    pos = [Example(record.qid, record.dataset, record.question, d, None, 1, PAIR_GOLD) for d in rng.sample(gold, n)]
    neg = [
        Example(record.qid, record.dataset, record.question, d, None, 0, PAIR_DISTRACTOR) for d in rng.sample(other, n)
    ]
    return pos + neg


@dataclass
class Splits:
    train: list[Example]
    dev: list[Example]
    summary: dict = field(default_factory=dict)


def _question_seed(seed: int, qid: str) -> int:
    return int.from_bytes(f"{seed}:{qid}".encode(), "little") % (2**61 - 1)


def make_splits(
    records: list[Record],
    *,
    seed: int = 0,
    dev_fraction: float = 0.2,
    mixed_fraction: float = 0.5,
    max_per_dataset: int | None = None,
    max_examples: int | None = None,
    task: str = "triple",
) -> Splits:
    """Examples per question (triples of Eq. 2, or pairs for task "pair"), capped by whole questions, then
    split by question within each dataset."""
    rng = random.Random(seed)
    by_dataset: dict[str, list[Record]] = {}
    for r in records:
        by_dataset.setdefault(r.dataset, []).append(r)
    per_q: dict[str, list[list[Example]]] = {}
    for name, recs in by_dataset.items():
        order = sorted(recs, key=lambda r: r.qid)
        random.Random(f"{seed}:{name}").shuffle(order)  # a dataset's split does not depend on the others chosen
        chosen, total = [], 0
        for r in order:
            # each question gets its own generator, so its examples do not depend on the others
            qrng = random.Random(_question_seed(seed, r.qid))
            exs = build_pair_examples(r, qrng) if task == "pair" else build_examples(r, qrng, mixed_fraction)
            if not exs:
                continue
            if max_per_dataset is not None and total + len(exs) > max_per_dataset:
                continue
            chosen.append(exs)
            total += len(exs)
        per_q[name] = chosen
    if max_examples is not None:  # across datasets: interleave questions, stop at the cap
        per_q = _cap_total(per_q, max_examples)
    train: list[Example] = []
    dev: list[Example] = []
    for questions in per_q.values():
        n_dev = max(1, round(len(questions) * dev_fraction)) if len(questions) > 1 else 0
        for exs in questions[:n_dev]:
            dev.extend(exs)
        for exs in questions[n_dev:]:
            train.extend(exs)
    rng.shuffle(train)
    summary = {
        "train": describe(train),
        "dev": describe(dev),
        "seed": seed,
        "dev_fraction": dev_fraction,
        "mixed_negative_fraction": mixed_fraction,
        "max_examples_per_dataset": max_per_dataset,
        "max_examples": max_examples,
        "task": task,
    }
    return Splits(train, dev, summary)


def _cap_total(per_q: dict[str, list[list[Example]]], cap: int) -> dict[str, list[list[Example]]]:
    out: dict[str, list[list[Example]]] = {name: [] for name in per_q}
    total, i = 0, 0
    while any(i < len(qs) for qs in per_q.values()):
        for name, qs in per_q.items():
            if i < len(qs) and total + len(qs[i]) <= cap:
                out[name].append(qs[i])
                total += len(qs[i])
        i += 1
    return out


def describe(examples: list[Example]) -> dict:
    return {
        "examples": len(examples),
        "questions": len({(e.dataset, e.qid) for e in examples}),
        "positive": sum(e.label for e in examples),
        "by_kind": dict(sorted(Counter(e.kind for e in examples).items())),
        "by_dataset": dict(sorted(Counter(e.dataset for e in examples).items())),
    }
