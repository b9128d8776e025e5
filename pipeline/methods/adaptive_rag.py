"""Adaptive-RAG (Jeong et al., NAACL 2024, "Adaptive-RAG: Learning to Adapt Retrieval-Augmented Large Language
Models through Question Complexity"), Sec. 3.

A query-complexity classifier (Sec. 3.2; trained by `dynrag train-classifier --task complexity`, see
`pipeline.classifier.complexity`) routes each question: A -> no retrieval, B -> single-step (sr-rag),
C -> multi-step (IRCoT, as in the paper). The classifier call is batched across questions like any other
request; each question then runs its route's own program, so questions of all three kinds share one batch.
The row's `extra` holds the route, its probability, and the routed program's own record.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

from pydantic import Field

from pipeline.backends import register_backend
from pipeline.engine.requests import Answer, Call, LookAhead, Question, Request, Retrieve
from pipeline.methods.baselines import NoRetrievalParams, SrRagParams, no_retrieval, sr_rag
from pipeline.methods.ircot import IrcotParams, ircot
from pipeline.methods.registry import MethodError, MethodParams, register_method

PAPER = "Adaptive-RAG (Jeong et al., NAACL 2024), Sec. 3"
TRAIN = "train one with `dynrag train-classifier --task complexity --out DIR`"


@register_backend("complexity")
class ComplexityBackend:
    """`Call("complexity", "route", [{"classifier": folder, "question": text}])` -> (label, probability) each;
    one classifier loaded per folder."""

    def __init__(self, cfg, backends=None):
        self.cfg = cfg
        self._models: dict[str, Any] = {}

    def route(self, items: list[dict]) -> list[tuple[str, float]]:
        from pipeline.classifier.complexity import ComplexityClassifier

        out: list[Any] = [None] * len(items)
        for folder in dict.fromkeys(it["classifier"] for it in items):
            if folder not in self._models:
                self._models[folder] = ComplexityClassifier.load(folder, self.cfg.paths.cache_dir)
            idx = [i for i, it in enumerate(items) if it["classifier"] == folder]
            for i, r in zip(idx, self._models[folder].predict([items[i]["question"] for i in idx])):
                out[i] = r
        return out


class AdaptiveRagParams(MethodParams):
    classifier: str | None = Field(None, description=f"complexity classifier folder (required; {TRAIN})")
    k: int | None = Field(None, ge=1, le=100, description="passages per retrieval, routes B and C (None: retrieval.k)")
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    max_steps: int = Field(8, ge=1, le=50, description="route C: IRCoT's reasoning steps at most")

    def with_config(self, cfg) -> AdaptiveRagParams:
        from pipeline.classifier.complexity import META

        if not self.classifier:
            raise MethodError(f"adaptive-rag needs method.params.classifier=DIR: {TRAIN}")
        if not (Path(self.classifier) / META).is_file():
            raise MethodError(f"adaptive-rag: {self.classifier} is not a complexity classifier folder; {TRAIN}")
        return self


def route_program(label: str, p: AdaptiveRagParams) -> tuple[Any, Any]:
    if label == "A":
        return no_retrieval, NoRetrievalParams()
    if label == "B":
        return sr_rag, SrRagParams(k=p.k, retriever=p.retriever)
    return ircot, IrcotParams(k=p.k, retriever=p.retriever, max_steps=p.max_steps)


@register_method(
    "adaptive-rag",
    params=AdaptiveRagParams,
    paper=PAPER,
    description="route by a complexity classifier: A no retrieval, B single-step (sr-rag), C multi-step (ircot)",
)
def adaptive_rag(q: Question, p: AdaptiveRagParams) -> Generator[Request, Any, Answer]:
    item = {"classifier": p.classifier, "question": q.question}
    # routes B (sr-rag) and C (ircot) search the question first, with these k and retriever: looked up while the
    # classifier runs (wasted on route A)
    yield LookAhead(Retrieve([q.question], k=p.k, retriever=p.retriever))
    label, prob = (yield Call("complexity", "route", [item], stage="classification"))[0]
    program, params = route_program(label, p)
    answer = yield from program(q, params)
    answer.extra = {"route": label, "route_probability": round(float(prob), 4), **answer.extra}
    return answer
