"""ITER-RETGEN (Shao et al., Findings of EMNLP 2023, "Enhancing Retrieval-Augmented Large Language Models
with Iterative Retrieval-Generation Synergy"), Sec. 3.

For t = 1..T: retrieve with the question concatenated with the previous iteration's generation y_{t-1}
(the question alone at t = 1), then generate y_t from the question and those paragraphs (chain-of-thought,
the whole retrieved set in one prompt); y_T is the output and its answer is the prediction. The paper varies
T (most of its gain comes from the second iteration); the default here is T = 2 (FlashRAG's pipeline uses 3).
The paper's optional generation-augmented retriever adaptation (distillation) is not part of this method.

Fallbacks (documented): an empty y_{t-1} leaves the question alone as the next query; the prediction follows
the project's one extraction rule (after an answer marker, else the first line; "" for an empty y_T).

A full context window (`generation.max_model_len`, pipeline/methods/window.py): the prompt does not grow with t
(the question and one retrieval's paragraphs), but another retrieval's paragraphs may be longer. Where
iteration t > 1's prompt does not leave room for its max_tokens, y_{t-1} is the output (`stopped: window`,
`iterations`: those done); a first prompt that does not fit is the question's error. No code of the authors is
known to dynrag.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pydantic import Field, field_validator

from pipeline.engine.requests import (
    Answer,
    Generate,
    Question,
    Request,
    Retrieve,
    SamplingSpec,
)
from pipeline.methods.prompts import extract_answer
from pipeline.methods.registry import MethodParams, register_method
from pipeline.methods.templates import PromptTemplate, check_template
from pipeline.methods.window import STOPPED, full

PAPER = "ITER-RETGEN (Shao et al., 2023), Sec. 3"

DEFAULT_TEMPLATE = PromptTemplate(
    system="Answer the question using the given documents. Think step by step in one or two short sentences, "
    "then finish with 'So the answer is: <short answer>'.",
    user="Documents:\n{reference}\nQuestion: {question}\nAnswer:",
)


class IterRetGenParams(MethodParams):
    iterations: int = Field(
        2, ge=1, le=10, description="T, retrieval-generation iterations (paper varies T; FlashRAG: 3)"
    )
    k: int | None = Field(None, ge=1, le=100, description="paragraphs retrieved per iteration (None: retrieval.k)")
    max_tokens: int | None = Field(
        None, ge=1, description="new tokens per generation (None: generation.max_new_tokens)"
    )
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    template: PromptTemplate | None = Field(
        None, description="generation prompt; fields {reference} {question}; None: our own (CoT ending in the answer)"
    )

    @field_validator("template")
    @classmethod
    def _fields(cls, v: PromptTemplate | None) -> PromptTemplate | None:
        check_template(v, {"reference", "question"})
        return v


def next_query(question: str, generation: str) -> str:
    """q concatenated with y_{t-1} (one line; the question alone when y_{t-1} is empty)."""
    return " ".join(f"{question} {generation}".split())


@register_method(
    "iter-retgen",
    params=IterRetGenParams,
    paper=PAPER,
    description="T rounds of retrieval with question + previous generation, then generation",
)
def iter_retgen(q: Question, p: IterRetGenParams) -> Generator[Request, Any, Answer]:
    tpl = p.template or DEFAULT_TEMPLATE
    generation, hits, queries = "", [], []
    used: list = []  # the paragraphs of the generation that stands
    done, stopped = 0, "iterations"
    for t in range(1, p.iterations + 1):
        queries.append(next_query(q.question, generation))
        hits = (
            yield Retrieve(
                [queries[-1]],
                k=p.k,
                retriever=p.retriever,
                step=f"iter-{t}",
                path="question" if t == 1 else "question+generation",
            )
        )[0]
        spec = SamplingSpec(max_tokens=p.max_tokens, fit=t > 1)  # the first prompt that does not fit: an error
        out = (
            yield Generate([tpl.render(hits, question=q.question)], sampling=spec, chat=tpl.chat, stage=f"iter-{t}")
        )[0]
        if full(out):  # y_t does not fit the window: y_{t-1} is the output
            stopped = STOPPED
            break
        generation, used, done = out.text, list(hits), t
    extra = {"iterations": done, "queries": queries, "stopped": stopped}
    return Answer(extract_answer(generation), generation, used_docs=used, extra=extra)
