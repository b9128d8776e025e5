"""PAIRS' comparison baselines (Chen et al. 2025, Sec. "Baselines", Table 2): query expansion by an LLM
and reranking. Each retrieves with one signal, keeps k documents and answers with Fig. 9 (c), as the
PAIRS methods do (pipeline/methods/pairs.py), so only the retrieval signal differs.

- `hyde` (Gao et al. 2023): retrieve with an LLM-written passage instead of the question (one
  hypothetical document; HyDE averages several with the query vector, which a text Retrieve cannot).
- `q2d` (Query2doc, Wang et al. 2023): retrieve with the question concatenated with a generated
  pseudo-document; for BM25 the question is repeated `query_repeats` times first (Query2doc Sec. 2).
- `cot` (Jagerman et al. 2023): the model answers with its rationale; the question plus that output
  (question repeated for BM25) is the retrieval signal.
- `rerank` (Glass et al. 2022): top `depth` by the question, reranked by a trained (q, d) reranker, top k.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pydantic import Field

from pipeline.engine.requests import Answer, Generate, Question, Request, Retrieve, SamplingSpec, Score
from pipeline.methods.ais import top_k
from pipeline.methods.pairs import GenerationParams, answer_from_docs, doc_text
from pipeline.methods.registry import register_method

PAPER = "PAIRS (Chen et al., 2025) baselines"

HYDE_PROMPT = "Please write a passage to answer the question.\nQuestion: {q}\nPassage:"  # HyDE's web-search prompt
Q2D_PROMPT = "Write a passage that answers the given query.\nQuery: {q}\nPassage:"  # Query2doc, zero-shot
COT_PROMPT = "Answer the following query: {q}\nGive the rationale before answering."  # Jagerman et al., CoT


class ExpansionParams(GenerationParams):
    query_repeats: int = Field(
        5,
        ge=1,
        le=20,
        description="retriever=bm25: times the question is repeated before the "
        "generated text (Query2doc / Jagerman et al.: 5)",
    )


class RerankParams(GenerationParams):
    depth: int = Field(10, ge=1, le=200, description="documents retrieved by the question and reranked (PAIRS: 10)")
    reranker: str = Field("reranker", description="scoring.classifiers name or a model folder of a (q, d) reranker")


def expanded_query(question: str, generated: str, retriever: str, repeats: int) -> str:
    """Question + generated text; for sparse retrieval the question is repeated to keep its weight."""
    head = " ".join([question] * repeats) if retriever == "bm25" else question
    return f"{head}\n{generated}".strip()


def _retrieve_answer(
    q: Question, query: str, path: str, p: GenerationParams, extra: dict
) -> Generator[Request, Any, Answer]:
    hits = (yield Retrieve([query], k=p.k, retriever=p.retriever, step="retrieve", path=path))[0]
    answer, raw = yield from answer_from_docs(q.question, hits, p)
    return Answer(answer, raw, used_docs=list(hits), retrieval_triggered=True, extra=extra)


def _generate(prompt: str, p: GenerationParams, stage: str) -> Generator[Request, Any, str]:
    return (yield Generate([prompt], SamplingSpec(max_tokens=p.pseudo_max_tokens), stage=stage))[0].text.strip()


@register_method(
    "hyde",
    params=GenerationParams,
    paper=f"{PAPER}; Gao et al., 2023 (HyDE)",
    description="retrieve with an LLM-written hypothetical passage, answer from the top k",
)
def hyde(q: Question, p: GenerationParams) -> Generator[Request, Any, Answer]:
    passage = yield from _generate(HYDE_PROMPT.format(q=q.question), p, "hypothetical-document")
    return (
        yield from _retrieve_answer(
            q, passage or q.question, "hypothetical-document", p, {"empty_expansion": not passage}
        )
    )


@register_method(
    "q2d",
    params=ExpansionParams,
    paper=f"{PAPER}; Wang, Yang and Wei, 2023 (Query2doc)",
    description="retrieve with the question concatenated with a generated pseudo-document",
)
def q2d(q: Question, p: ExpansionParams) -> Generator[Request, Any, Answer]:
    doc = yield from _generate(Q2D_PROMPT.format(q=q.question), p, "pseudo-document")
    query = expanded_query(q.question, doc, p.retriever, p.query_repeats)
    return (yield from _retrieve_answer(q, query, "query+pseudo-document", p, {"empty_expansion": not doc}))


@register_method(
    "cot",
    params=ExpansionParams,
    paper=f"{PAPER}; Jagerman et al., 2023 (CoT query expansion)",
    description="retrieve with the question plus the model's rationale and answer",
)
def cot(q: Question, p: ExpansionParams) -> Generator[Request, Any, Answer]:
    rationale = yield from _generate(COT_PROMPT.format(q=q.question), p, "rationale")
    query = expanded_query(q.question, rationale, p.retriever, p.query_repeats)
    return (yield from _retrieve_answer(q, query, "query+rationale", p, {"empty_expansion": not rationale}))


@register_method(
    "rerank",
    params=RerankParams,
    paper=f"{PAPER}; Glass et al., 2022 (Re2G)",
    description="top `depth` by the question, reranked by a (q, d) reranker, top k kept",
)
def rerank(q: Question, p: RerankParams) -> Generator[Request, Any, Answer]:
    hits = (yield Retrieve([q.question], k=p.depth, retriever=p.retriever, step="retrieve", path="query"))[0]
    scores = (yield Score([(q.question, doc_text(h)) for h in hits], classifier=p.reranker)) if hits else []
    chosen = top_k(hits, scores, p.k)
    answer, raw = yield from answer_from_docs(q.question, chosen, p)
    return Answer(
        answer,
        raw,
        used_docs=chosen,
        retrieval_triggered=True,
        extra={"rerank_scores": [round(float(s), 4) for s in scores]},
    )
