"""Answer metrics with SQuAD normalisation: EM, F1, accuracy (a gold answer contained), token P/R; and
gold-document recall by paragraph.

Every metric takes the best value over the gold answers, as the SQuAD/DPR evaluation scripts do.
"""

from __future__ import annotations

import itertools
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

from indexing.corpus.passages import parent_id

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and articles (a, an, the), collapse whitespace (SQuAD v1.1)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def accuracy(prediction: str, golds: Sequence[str]) -> float:
    """1 if some normalised gold answer occurs in the normalised prediction (as whole tokens)."""
    p = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(g) and f" {normalize_answer(g)} " in p for g in golds))


def _prf(prediction: str, gold: str) -> tuple[float, float, float]:
    p_toks, g_toks = normalize_answer(prediction).split(), normalize_answer(gold).split()
    # yes/no/noanswer must match exactly (HotpotQA's official evaluation)
    specials = {"yes", "no", "noanswer"}
    if (normalize_answer(prediction) in specials or normalize_answer(gold) in specials) and normalize_answer(
        prediction
    ) != normalize_answer(gold):
        return 0.0, 0.0, 0.0
    common = Counter(p_toks) & Counter(g_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(p_toks), same / len(g_toks)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_precision_recall(prediction: str, golds: Sequence[str]) -> tuple[float, float, float]:
    """(F1, precision, recall) of the gold answer with the best F1."""
    if not golds:
        return 0.0, 0.0, 0.0
    return max((_prf(prediction, g) for g in golds), key=lambda t: t[0])


def answer_metrics(prediction: str, golds: Sequence[str]) -> dict[str, float | None]:
    """All answer metrics for one row; None when the question has no gold answer."""
    golds = [g for g in golds if isinstance(g, str) and g.strip()]
    if not golds:
        return {"em": None, "f1": None, "acc": None, "precision": None, "recall": None}
    f1, p, r = f1_precision_recall(prediction, golds)
    return {
        "em": exact_match(prediction, golds),
        "f1": f1,
        "acc": accuracy(prediction, golds),
        "precision": p,
        "recall": r,
    }


def support_recall(
    retrieved: Iterable[tuple[str, str]], gold_titles: Sequence[str], gold_ids: Sequence[str] = ()
) -> float | None:
    """Share of the gold supporting paragraphs among the retrieved passages (id, title); None without labels.

    A gold paragraph with a content id (`indexing.corpus.passages.paragraph_id`, carried from the question file) is
    found when a passage cut from it was retrieved (its id up to the `#i` chunk suffix): paragraphs sharing a
    title (MuSiQue) count apart. A gold known by title alone (files that give only titles) matches by title.
    """
    golds = list(
        dict.fromkeys(
            (t.strip(), i) for t, i in itertools.zip_longest(gold_titles, gold_ids, fillvalue="") if t and t.strip()
        )
    )
    if not golds:
        return None
    ids = {parent_id(pid) for pid, _ in retrieved}
    titles = {title.strip() for _, title in retrieved if title}
    return sum((pid in ids) if pid else (title in titles) for title, pid in golds) / len(golds)


def is_gold_document(doc_id: str, title: str, gold_titles: Sequence[str], gold_ids: Sequence[str] = ()) -> bool:
    """Whether one retrieved passage (id, title) is cut from a gold supporting paragraph, by `support_recall`'s
    rule (content id where the gold has one, else title)."""
    return bool(support_recall([(doc_id, title)], gold_titles, gold_ids))
