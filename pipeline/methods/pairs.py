"""PAIRS (Chen et al. 2025, "Parametric-Verified Adaptive Information Retrieval and Selection for
Efficient RAG"), Methodology and Algorithm 1; the math lives in `pipeline.methods.ais`.

- `pairs`: parametric verification. â1 = G(P(q)) and a pseudo-context p; â2 = G(P(q, p)). If â1 and â2
  agree (`pipeline.methods.ais.answers_agree`: equal after SQuAD normalisation and no echo of the question;
  option `exclude_numeric`, Table 5) â1 is returned with no retrieval (3 LLM calls); otherwise DPR-AIS selects k documents and
  G(P(q, D_k)) answers (4 LLM calls).
- `dpr-ais` (Algorithm 1, for every question): p, then top n by q and top n by p (dense), merged
  and de-duplicated, scored by Eq. (4) on normalised embeddings, top k kept (n = 5, k = 3: the paper's
  implementation details). `dpr-ais-dynamic`: Eq. (5) with α from Eq. (8). `dpr-ais-rerank`: Eq. (7)
  with a trained reranker K (`reranker` param: a `scoring.classifiers` name or a folder).
- Table 3's ablations as params: `paths=query|pseudo` (one path retrieving 2n, then AIS) and
  `selection=fixed-2q1p|fixed-1q2p` (fixed shares, no AIS).

Prompts are the paper's Fig. 9 templates (a) pseudo-context, (b) direct answer, (c) answer with context;
answers are read from <answer>...</answer>. `prompt_style=short` swaps (b) and (c) for the project's
short-answer prompts (a 135M model answers Fig. 9 (b) with whole sentences, which never match).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from typing import Any, Literal, cast

import numpy as np
from pydantic import Field, model_validator

from indexing import Hit
from indexing.shards.embed import embed_input
from pipeline.classifier.data import format_document
from pipeline.engine.requests import (
    Answer,
    Embed,
    Generate,
    LookAhead,
    Prompt,
    Question,
    Request,
    Retrieve,
    SamplingSpec,
    Score,
)
from pipeline.methods.ais import (
    ais_score,
    answers_agree,
    dynamic_alpha,
    dynamic_score,
    fixed_ratio,
    is_echo,
    is_numeric,
    merge_paths,
    rerank_score,
    top_k,
)
from pipeline.methods.prompts import direct_prompt, extract_answer, format_docs, rag_prompt
from pipeline.methods.registry import MethodParams, register_method

PromptStyle = Literal["fig9", "short"]

PAPER = "PAIRS (Chen et al., 2025), Methodology, Eqs. 1-8, Algorithm 1, Fig. 9"

# -- Fig. 9 prompt templates --------------------------------------------------------------------------

_TAG = (
    "Please directly provide the {what} inside <answer> and </answer> without detailed description, "
    "e.g., <answer>Beijing</answer>."
)


def pseudo_context_prompt(question: str) -> str:
    """Fig. 9 (a)."""
    return f"Your task is to write a detailed passage to answer the given question.\nQuestion: {question}"


def direct_answer_prompt(question: str) -> str:
    """Fig. 9 (b)."""
    return f"Your task is to answer the given question. {_TAG.format(what='concise answer')}\nQuestion: {question}"


def context_answer_prompt(question: str, context: str) -> str:
    """Fig. 9 (c); the context is the pseudo-context or the retrieved documents."""
    return (
        f"Your task is to answer the given question based on the Context. {_TAG.format(what='answer')}\n"
        f"Context: {context}\nQuestion: {question}"
    )


_TAGGED = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.IGNORECASE | re.DOTALL)


def tagged_answer(text: str) -> str:
    """The text inside <answer>...</answer> (a missing close tag is allowed: it is the stop string), else
    the first line of the output."""
    m = _TAGGED.search(text)
    if m and m.group(1).strip():
        return extract_answer(m.group(1))
    return extract_answer(re.sub(r"</?answer>", " ", text, flags=re.IGNORECASE))


ANSWER_STOP = ("</answer>",)


def answer_prompt(
    question: str, style: PromptStyle, docs: Sequence[Hit] | None = None, context: str | None = None
) -> Prompt:
    """The direct answer prompt (no docs, no context), or the answer-with-context prompt over retrieved
    docs or a pseudo-context: Fig. 9 (b) / (c), or the project's short-answer prompts (pipeline.methods.prompts)."""
    if docs is None and context is None:
        return direct_answer_prompt(question) if style == "fig9" else direct_prompt(question)
    if style == "fig9":
        return context_answer_prompt(
            question, context if context is not None else (format_docs(cast(Sequence[Hit], docs)) or "(none)")
        )
    # docs is set when context is None (the direct prompt returned above)
    return rag_prompt(
        question, cast(Sequence[Hit], docs) if context is None else [Hit("pseudo-context", "", context, 0.0)]
    )


def doc_text(h: Hit) -> str:
    """A document as the reranker was trained to read it (title: text)."""
    return format_document(h.title, h.text)


# -- parameters ---------------------------------------------------------------------------------------


class GenerationParams(MethodParams):
    k: int = Field(3, ge=1, le=100, description="documents passed to the LLM (PAIRS: top 3)")
    retriever: Literal["dense", "bm25"] = Field(
        "dense", description="PAIRS retrieves densely (bge-large there, the index's embedder here)"
    )
    pseudo_max_tokens: int = Field(
        128, ge=8, le=2048, description="tokens of the generated pseudo-context (not stated in the paper)"
    )
    answer_max_tokens: int | None = Field(
        None, ge=1, description="tokens of an answer (None: generation.max_new_tokens)"
    )
    prompt_style: PromptStyle = Field(
        "fig9",
        description="answer prompts: fig9, the paper's Fig. 9 (b), (c) with "
        "<answer> tags; short, the project's short-answer prompts (no-retrieval, "
        "sr-rag), which small models follow better",
    )


Selection = Literal["ais", "dynamic", "rerank", "fixed-2q1p", "fixed-1q2p"]
SELECTION_HELP = (
    "ais: Eq. 4; dynamic: Eqs. 5, 8; rerank: Eq. 7 with the reranker; fixed-*: Table 3's 'w/o AIS' "
    "(2 query + 1 pseudo-context documents, or 1 + 2; k must be 3)"
)


class DprAisParams(GenerationParams):
    n: int = Field(5, ge=1, le=100, description="documents per retrieval path (PAIRS: 5, so 2n = 10 candidates)")
    paths: Literal["dual", "query", "pseudo"] = Field(
        "dual",
        description="dual: top n by q and by p (DPR); query / pseudo: Table 3's 'w/o DPR', one path retrieves 2n",
    )
    selection: Selection = Field("ais", description=SELECTION_HELP)
    reranker: str = Field(
        "reranker",
        description="selection=rerank: scoring.classifiers name or a model folder "
        "of a (q, d) reranker (dynrag train-classifier --set classifier.task=pair)",
    )

    @model_validator(mode="after")
    def _fixed_needs_dual(self):
        if self.selection.startswith("fixed") and (self.paths != "dual" or self.k != 3):
            raise ValueError(f"selection={self.selection} takes 3 documents from the two paths: needs paths=dual, k=3")
        return self


class DprAisDynamicParams(DprAisParams):
    selection: Selection = Field("dynamic", description=SELECTION_HELP)


class DprAisRerankParams(DprAisParams):
    selection: Selection = Field("rerank", description=SELECTION_HELP)


class PairsParams(DprAisParams):
    exclude_numeric: bool = Field(
        False, description="retrieve whenever the direct answer holds a number (Table 5, 'Exclude num')"
    )


# -- shared steps (sub-programs used with `yield from`) --------------------------------------------------


def pseudo_context(question: str, p: GenerationParams, stage: str = "pseudo-context") -> Generator[Request, Any, str]:
    out = (
        yield Generate([pseudo_context_prompt(question)], SamplingSpec(max_tokens=p.pseudo_max_tokens), stage=stage)
    )[0]
    return out.text.strip()


def answer_from_docs(
    question: str, docs: Sequence[Hit], p: GenerationParams
) -> Generator[Request, Any, tuple[str, str]]:
    """Fig. 9 (c) with the documents as the Context; returns (answer, raw output)."""
    out = (
        yield Generate(
            [answer_prompt(question, p.prompt_style, docs=docs)],
            SamplingSpec(max_tokens=p.answer_max_tokens, stop=ANSWER_STOP),
            stage="answer",
        )
    )[0]
    return tagged_answer(out.text), out.text


def query_search(question: str, p: DprAisParams) -> Retrieve | None:
    """Algorithm 1's search by the question itself (None where `p.paths` leaves it out): known before any model
    call, so the methods look it up ahead (LookAhead) while the model makes the pseudo-context."""
    if p.paths not in ("dual", "query"):
        return None
    return Retrieve(
        [question], k=p.n if p.paths == "dual" else 2 * p.n, retriever=p.retriever, step="dpr", path="query"
    )


def look_ahead(question: str, p: DprAisParams) -> Generator[Request, Any, None]:
    if (search := query_search(question, p)) is not None:
        yield LookAhead(search)


def dpr_ais_select(question: str, pseudo: str, p: DprAisParams) -> Generator[Request, Any, tuple[list[Hit], dict]]:
    """Algorithm 1: retrieve by path(s), merge and de-duplicate, score, keep the top k."""
    two_n = 2 * p.n
    q_hits: list[Hit] = []
    p_hits: list[Hit] = []
    if (search := query_search(question, p)) is not None:
        q_hits = (yield search)[0]
    if p.paths in ("dual", "pseudo"):
        p_hits = (
            yield Retrieve(
                [pseudo],
                k=p.n if p.paths == "dual" else two_n,
                retriever=p.retriever,
                step="dpr",
                path="pseudo-context",
            )
        )[0]
    cands, found_by = merge_paths({"query": q_hits, "pseudo-context": p_hits})
    info: dict[str, Any] = {"candidates": len(cands), "from_both_paths": sum(len(f) == 2 for f in found_by)}
    if not cands:
        return [], info
    if p.selection == "fixed-2q1p":
        chosen = fixed_ratio(q_hits, p_hits, 2, 1)
    elif p.selection == "fixed-1q2p":
        chosen = fixed_ratio(q_hits, p_hits, 1, 2)
    elif p.selection == "rerank":
        ks = yield Score([(q, doc_text(h)) for q in (question, pseudo) for h in cands], classifier=p.reranker)
        scores = rerank_score(ks[: len(cands)], ks[len(cands) :])
        chosen = top_k(cands, scores, p.k)
        info["scores"] = [round(float(s), 4) for s in scores]
    else:
        vecs = np.asarray((yield Embed([question, pseudo] + [embed_input(h.title, h.text) for h in cands])))
        qv, pv, docs = vecs[0], vecs[1], vecs[2:]
        s1, s2 = docs @ qv, docs @ pv
        if p.selection == "dynamic":
            info["alpha"] = round(dynamic_alpha(float(qv @ pv)), 4)
            scores = dynamic_score(s1, s2, info["alpha"])
        else:
            scores = ais_score(s1, s2)
        chosen = top_k(cands, scores, p.k)
        info["scores"] = [round(float(s), 4) for s in scores]
    by_id = dict(zip((h.id for h in cands), found_by))
    info["selected_paths"] = [by_id[h.id] for h in chosen]
    return chosen, info


# -- the methods -----------------------------------------------------------------------------------------


def _dpr_ais(q: Question, p: DprAisParams) -> Generator[Request, Any, Answer]:
    yield from look_ahead(q.question, p)
    pseudo = yield from pseudo_context(q.question, p)
    docs, info = yield from dpr_ais_select(q.question, pseudo or q.question, p)
    answer, raw = yield from answer_from_docs(q.question, docs, p)
    return Answer(
        answer,
        raw,
        used_docs=docs,
        retrieval_triggered=True,
        extra={"selection": p.selection, "paths": p.paths, "empty_pseudo_context": not pseudo, **info},
    )


register_method(
    "dpr-ais",
    params=DprAisParams,
    paper=PAPER,
    description="PAIRS Algorithm 1 for every question: dual-path retrieval (q and pseudo-context p), "
    "AIS score cos(θ1 + θ2) (Eq. 4), top k",
)(_dpr_ais)
register_method(
    "dpr-ais-dynamic",
    params=DprAisDynamicParams,
    paper=PAPER,
    description="DPR-AIS with the dynamic weight cos(α·θ1 + (1 − α)·θ2), α = 0.058·θ0 + 0.455 (Eqs. 5, 8)",
)(_dpr_ais)
register_method(
    "dpr-ais-rerank",
    params=DprAisRerankParams,
    paper=PAPER,
    description="DPR-AIS with reranker scores K(d, q) + K(d, p) (Eq. 7)",
)(_dpr_ais)


@register_method(
    "pairs",
    params=PairsParams,
    paper=PAPER,
    description="parametric verification: answer directly when G(P(q)) and G(P(q, p)) agree, else DPR-AIS",
)
def pairs(q: Question, p: PairsParams) -> Generator[Request, Any, Answer]:
    yield from look_ahead(q.question, p)  # wasted where the two answers agree
    direct = (
        yield Generate(
            [answer_prompt(q.question, p.prompt_style)],
            SamplingSpec(max_tokens=p.answer_max_tokens, stop=ANSWER_STOP),
            stage="direct-answer",
        )
    )[0]
    pseudo = yield from pseudo_context(q.question, p)
    a1, a2 = tagged_answer(direct.text), ""  # no pseudo-context: nothing verifies â1
    if pseudo:
        second = (
            yield Generate(
                [answer_prompt(q.question, p.prompt_style, context=pseudo)],
                SamplingSpec(max_tokens=p.answer_max_tokens, stop=ANSWER_STOP),
                stage="pseudo-context-answer",
            )
        )[0]
        a2 = tagged_answer(second.text)
    gate = {
        "a1": a1,
        "a2": a2,
        "a1_numeric": is_numeric(a1),
        "exclude_numeric": p.exclude_numeric,
        "echo": is_echo(a1, q.question),
    }
    if answers_agree(a1, a2, question=q.question, exclude_numeric=p.exclude_numeric):
        return Answer(a1, direct.text, retrieval_triggered=False, extra={"gate": gate})
    docs, info = yield from dpr_ais_select(q.question, pseudo or q.question, p)
    answer, raw = yield from answer_from_docs(q.question, docs, p)
    return Answer(
        answer,
        raw,
        used_docs=docs,
        retrieval_triggered=True,
        extra={"gate": gate, "selection": p.selection, "paths": p.paths, **info},
    )
