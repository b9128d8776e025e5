"""DR-RAG (Hei et al., "Applying Dynamic Document Relevance to Retrieval-Augmented Generation for
Question-Answering"), Sec. 2.2, Eqs. (1)-(4), Algorithm 1, App. A.2: retrieval strategies that all end in
ONE LLM call per question with a budget of k = k1 + k2 documents.

- `bm25`, `sm`: top-k by the question (BM25 / dense similarity matching).
- `qdc` (Eq. 1): k1 first-stage documents d_i for q; for each d_i, retrieve with q*_i = Concat(q, d_i)
  and add the first document of that list not already in the context, until the context holds k.
- `cis` (Eq. 3): QDC, then drop every second-stage d' with C(q, d', d_i) negative for every d_i.
- `cfs` (Eq. 4, Algorithm 1): for each d_i, walk its second-stage list in order and add the first d'
  not yet in the context with C(q, d_i, d') positive; a list with no positive adds nothing, so fewer
  than k documents may result. The walk stops once the context holds k.

The selection rules are pure functions over document ids (tested on hand-made cases); the programs
drive them with Retrieve and Score requests that the engine batches across questions. CFS classifies
lazily: each round asks only for the next `score_window` unjudged candidates of the list the walk is
blocked on, so with the default window of 1 it makes exactly the classifications Algorithm 1 makes
(lines 9-12) and never scores a list it does not walk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from indexing import Hit
from pipeline.classifier.data import format_document
from pipeline.engine.requests import Answer, Generate, Question, Request, Retrieve, Score
from pipeline.methods.prompts import extract_answer
from pipeline.methods.registry import MethodParams, register_method

PAPER = "DR-RAG (Hei et al.), Sec. 2.2, Eqs. 1-4, Algorithm 1"

# -- the selection rules ----------------------------------------------------------------------------


def qdc_select(first: Sequence[str], second: Sequence[Sequence[str]], k: int) -> list[str]:
    """Eq. (1): the first-stage ids, then from each second-stage list in turn its first id not yet in
    the context, until k ids are held."""
    cnt = list(dict.fromkeys(first))[:k]
    for ranked in second:
        if len(cnt) >= k:
            break
        new = next((d for d in ranked if d not in cnt), None)
        if new is not None:
            cnt.append(new)
    return cnt


def cis_keep(first: Sequence[str], selected: Sequence[str], positive: Callable[[str, str], bool]) -> list[str]:
    """Eq. (3): keep the first-stage ids; keep a second-stage id d' only if C(q, d', d_i) is positive
    for some first-stage d_i (`positive(d', d_i)`)."""
    firsts = set(first)
    return [d for d in selected if d in firsts or any(positive(d, di) for di in first)]


def cfs_walk(
    first: Sequence[str], second: Sequence[Sequence[str]], k: int, verdict: Callable[[int, str], bool | None]
) -> tuple[list[str], int | None]:
    """Eq. (4) / Algorithm 1 with early stop: for list i (of first-stage d_i), the first id not already in
    the context whose `verdict(i, d')` = C(q, d_i, d') is positive is added; at most k ids in all.

    Returns (context, None) when done, or (partial context, i) when list i needs a verdict that is not
    known yet (`verdict` returned None): score more of list i only (a later list is scored when the walk
    reaches it, so a list the walk never reaches is never scored) and walk again.
    """
    cnt = list(dict.fromkeys(first))[:k]
    for i, ranked in enumerate(second):
        if len(cnt) >= k:
            break
        for d in ranked:
            if d in cnt:
                continue
            v = verdict(i, d)
            if v is None:
                return cnt, i
            if v:
                cnt.append(d)
                break
    return cnt, None


# -- prompt (in the spirit of the paper's Table 9) -------------------------------------------------

READER_SYSTEM = "You are an expert at reading comprehension. Answer the question using the documents given to you."


def reader_prompt(question: str, docs: Sequence[Hit], reasoning: bool) -> list[dict[str, str]]:
    body = "\n\n".join(f"Document {i}: {format_document(h.title, h.text)}" for i, h in enumerate(docs, 1))
    how = (
        "Think it through step by step, then end with one line of the form 'Answer: <short answer>'."
        if reasoning
        else "Reply with one line of the form 'Answer: <short answer>' and nothing else."
    )
    return [
        {"role": "system", "content": READER_SYSTEM},
        {"role": "user", "content": f"Documents\n\n{body or '(none)'}\n\nQuestion: {question}\n\n{how}"},
    ]


# -- parameters --------------------------------------------------------------------------------------


class TopKParams(MethodParams):
    k: int = Field(3, ge=1, le=100, description="documents in the prompt (DR-RAG Table 5 uses 3, 4, 6)")
    reasoning: bool = Field(
        False,
        description="ask for step-by-step reasoning before 'Answer:' (Table 9); "
        "needs a larger generation.max_new_tokens",
    )


class TwoStageParams(TopKParams):
    k1: int | None = Field(
        None,
        ge=1,
        description="first-stage documents; None: ceil(k / 2) (k1 + k2 = k; the paper does not state its split)",
    )
    depth: int = Field(
        10,
        ge=1,
        le=100,
        description="length of each second-stage list (Algorithm 1's k2 per list; not given by the paper)",
    )
    retriever: Literal["bm25", "dense"] = Field("dense", description="the paper's Retriever is similarity matching")

    @model_validator(mode="after")
    def _check(self):
        if self.k1 is not None and self.k1 > self.k:
            raise ValueError(f"k1={self.k1} exceeds k={self.k}")
        return self

    @property
    def first_k(self) -> int:
        return self.k1 if self.k1 is not None else math.ceil(self.k / 2)


class ClassifierParams(TwoStageParams):
    classifier: str = Field(
        "default",
        description="classifier name (scoring.classifiers; 'default' is "
        "classifier.path) or a folder from `dynrag train-classifier`",
    )
    threshold: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="C(...) = positive when P(positive) >= "
        "threshold; None: the one saved with the classifier (tuned on held-out pairs by "
        "`dynrag train-classifier`), else 0.5",
    )
    score_window: int = Field(
        1,
        ge=1,
        description="CFS: candidates of the list being walked classified per round; "
        "1 classifies exactly what Algorithm 1 does, more saves rounds but may classify "
        "candidates after the first positive",
    )

    def with_config(self, cfg) -> ClassifierParams:
        if self.threshold is not None:
            return self
        from pipeline.backends.scoring import classifier_path
        from pipeline.classifier.meta import saved_threshold

        return self.model_copy(update={"threshold": saved_threshold(classifier_path(cfg, self.classifier))})

    @property
    def decision_threshold(self) -> float:
        return 0.5 if self.threshold is None else self.threshold


# -- programs ----------------------------------------------------------------------------------------


def _answer(q: Question, docs: list[Hit], p: TopKParams, extra: dict) -> Generator[Request, Any, Answer]:
    out = (yield Generate([reader_prompt(q.question, docs, p.reasoning)], stage="answer"))[0]
    return Answer(extract_answer(out.text), out.text, used_docs=docs, retrieval_triggered=True, extra=extra)


def _top_k(q: Question, p: TopKParams, retriever: str) -> Generator[Request, Any, Answer]:
    hits = (yield Retrieve([q.question], k=p.k, retriever=retriever, step="first", path="query"))[0]
    return (yield from _answer(q, list(hits), p, {"strategy": retriever}))


@register_method(
    "bm25",
    params=TopKParams,
    one_call=True,
    paper=PAPER + ", App. A.2",
    description="DR-RAG baseline: top-k by BM25, one LLM call",
)
def bm25(q: Question, p: TopKParams):
    return (yield from _top_k(q, p, "bm25"))


@register_method(
    "sm",
    params=TopKParams,
    one_call=True,
    paper=PAPER + ", App. A.2",
    description="DR-RAG baseline: top-k by dense similarity matching, one LLM call",
)
def sm(q: Question, p: TopKParams):
    return (yield from _top_k(q, p, "dense"))


def concat_query(q: str, d: Hit) -> str:
    """q*_i = Concat(q, d_i) (Eq. 1)."""
    return f"{q} {d.title}: {d.text}"


def _two_stage(q: Question, p: TwoStageParams) -> Generator[Request, Any, tuple[list[Hit], list[list[Hit]]]]:
    first = list((yield Retrieve([q.question], k=p.first_k, retriever=p.retriever, step="first", path="query"))[0])
    if not first:
        return [], []
    second = yield Retrieve(
        [concat_query(q.question, d) for d in first], k=p.depth, retriever=p.retriever, step="second", path="query+doc"
    )
    return first, [list(s) for s in second]


def _by_id(first: list[Hit], second: list[list[Hit]]) -> dict[str, Hit]:
    return {h.id: h for h in [*first, *(h for s in second for h in s)]}


def _ids(hits: Sequence[Hit]) -> list[str]:
    return [h.id for h in hits]


@register_method(
    "qdc",
    params=TwoStageParams,
    one_call=True,
    paper=PAPER + ", Eq. 1",
    description="DR-RAG query-document concatenation: k1 by q, then one new doc per Concat(q, d_i)",
)
def qdc(q: Question, p: TwoStageParams):
    first, second = yield from _two_stage(q, p)
    docs = _by_id(first, second)
    chosen = qdc_select(_ids(first), [_ids(s) for s in second], p.k)
    return (yield from _answer(q, [docs[i] for i in chosen], p, {"strategy": "qdc", "first_stage": len(first)}))


@register_method(
    "cis",
    params=ClassifierParams,
    one_call=True,
    paper=PAPER + ", Eq. 3",
    description="DR-RAG classifier inverse selection: QDC, then drop second-stage docs C rejects",
)
def cis(q: Question, p: ClassifierParams):
    first, second = yield from _two_stage(q, p)
    docs = _by_id(first, second)
    chosen = qdc_select(_ids(first), [_ids(s) for s in second], p.k)
    added = chosen[len(first) :]
    positive: dict[tuple[str, str], bool] = {}
    judged = []  # [d_i title, candidate title, P(positive), d_i id, candidate id], for diagnostics
    if added:
        pairs = [(d, di.id) for d in added for di in first]
        text = {i: format_document(docs[i].title, docs[i].text) for i in chosen}
        scores = yield Score([(q.question, text[d], text[di]) for d, di in pairs], classifier=p.classifier)
        positive = {pair: s >= p.decision_threshold for pair, s in zip(pairs, scores)}
        judged = [[docs[di].title, docs[d].title, round(s, 4), di, d] for (d, di), s in zip(pairs, scores)]
    kept = cis_keep(_ids(first), chosen, lambda d, di: positive[(d, di)])
    return (
        yield from _answer(
            q,
            [docs[i] for i in kept],
            p,
            {"strategy": "cis", "first_stage": len(first), "removed": len(chosen) - len(kept), "judged": judged},
        )
    )


@register_method(
    "cfs",
    params=ClassifierParams,
    one_call=True,
    paper=PAPER + ", Eq. 4, Algorithm 1",
    description="DR-RAG classifier forward selection: per d_i, the first new doc C accepts",
)
def cfs(q: Question, p: ClassifierParams):
    first, second = yield from _two_stage(q, p)
    docs = _by_id(first, second)
    first_ids, lists = _ids(first), [_ids(s) for s in second]
    text = {i: format_document(h.title, h.text) for i, h in docs.items()}
    known: dict[tuple[int, str], bool] = {}
    judged = []  # [d_i title, candidate title, P(positive), d_i id, candidate id] of every classification
    while True:
        chosen, blocked = cfs_walk(first_ids, lists, p.k, lambda i, d: known.get((i, d)))
        if blocked is None:
            break
        # only the list being walked: its next unjudged candidates not already in the context
        todo = [d for d in lists[blocked] if d not in chosen and (blocked, d) not in known]
        need = [(blocked, d) for d in todo[: p.score_window]]
        scores = yield Score([(q.question, text[first_ids[i]], text[d]) for i, d in need], classifier=p.classifier)
        known.update({key: s >= p.decision_threshold for key, s in zip(need, scores)})
        judged += [
            [docs[first_ids[i]].title, docs[d].title, round(s, 4), first_ids[i], d] for (i, d), s in zip(need, scores)
        ]
    return (
        yield from _answer(
            q,
            [docs[i] for i in chosen],
            p,
            {"strategy": "cfs", "first_stage": len(first), "classified": len(judged), "judged": judged},
        )
    )
