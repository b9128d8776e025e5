"""Baselines: no retrieval (wo-RAG / "Direct") and single-round RAG (SR-RAG / "Standard RAG")."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Literal

from pydantic import Field

from pipeline.engine.requests import Answer, Generate, Question, Request, Retrieve
from pipeline.methods import dragin_authors as authors
from pipeline.methods.dragin import table9
from pipeline.methods.dragin_authors import SWITCH as AUTHORS_SWITCH
from pipeline.methods.dragin_authors import AuthorsPrompt
from pipeline.methods.prompts import direct_prompt, extract_answer, rag_prompt
from pipeline.methods.registry import MethodParams, register_method


class NoRetrievalParams(MethodParams):
    authors: AuthorsPrompt | None = Field(None, description=AUTHORS_SWITCH)


@register_method(
    "no-retrieval",
    params=NoRetrievalParams,
    one_call=True,
    description="answer from the model's parameters only (wo-RAG / Direct)",
    paper="baseline in DR-RAG (Hui et al., 2024), PAIRS, DRAGIN (Su et al., 2024)",
)
def no_retrieval(q: Question, p: NoRetrievalParams) -> Generator[Request, Any, Answer]:
    if p.authors is not None:  # DRAGIN's wo-RAG: few-shot chain of thought (pipeline/methods/dragin_authors.py)
        return (yield from authors.no_retrieval(q, p.authors, table9(q.dataset)[0]))
    out = (yield Generate([direct_prompt(q.question)], stage="answer"))[0]
    return Answer(extract_answer(out.text), out.text, retrieval_triggered=False)


class SrRagParams(MethodParams):
    k: int | None = Field(None, ge=1, le=100, description="documents in the prompt (None: retrieval.k)")
    retriever: Literal["bm25", "dense"] | None = Field(None, description="None: retrieval.retriever")
    authors: AuthorsPrompt | None = Field(None, description=AUTHORS_SWITCH)


@register_method(
    "sr-rag",
    params=SrRagParams,
    one_call=True,
    description="single-round RAG: retrieve top-k for the question, answer from them (Standard RAG)",
    paper="Lewis et al., 2020; 'SR-RAG' in DR-RAG (Hui et al., 2024)",
)
def sr_rag(q: Question, p: SrRagParams) -> Generator[Request, Any, Answer]:
    if p.authors is not None:  # DRAGIN's SR-RAG
        return (yield from authors.single(q, p.authors, table9(q.dataset)[0], p.k or 3, p.retriever))
    hits = (yield Retrieve([q.question], k=p.k, retriever=p.retriever, step="retrieve", path="query"))[0]
    out = (yield Generate([rag_prompt(q.question, hits)], stage="answer"))[0]
    return Answer(extract_answer(out.text), out.text, used_docs=list(hits))
