"""SuRe (Kim et al., ICLR 2024, "SuRe: Summarizing Retrievals using Answer Candidates for Open-domain QA
of LLMs"), Sec. 3.

With the top-N retrieved passages C_N (the paper: N = 10):
1. candidates  ỹ = [ỹ_1..ỹ_K] = M(p_can(q, C_N)), K = 2 in the paper, in one output "(a) .., (b) ..";
2. summaries   s_k = M(p_sum(q, C_N, ỹ_k)), a summary of C_N supporting candidate k (one request, K prompts);
3. validity    v(s_k) = 1 if M(p_val(q, ỹ_k, s_k)) is True else 0 (one request, K prompts);
4. ranking     r(s_k) = Σ_{i≠k} r_pair(s_k, s_i), r_pair = 1 if M(p_rank(q, s_k, s_i)) prefers s_k, 0 if it
               prefers s_i, 0.5 when it names neither (one request over every ordered pair);
5. prediction  ỹ_{k*}, k* = argmax_k v(s_k) + r(s_k) (ties: the earlier candidate).
Each unordered pair is shown in both orders and r_pair(s_k, s_i) is the mean of the two judgments, so the
order a pair is shown in does not decide it (`both_orders=false`: each pair once, k before i).

With `constrained` (default) the candidate, validity and ranking outputs are held to their formats by the
generator's structured outputs (vLLM; other backends parse what comes). Malformed outputs (documented):
candidates are read from "(a)"-style labels, else one candidate from the whole output (extract_answer);
with one candidate it is the prediction (no summaries are needed); with none the prediction is "" and the
row says `candidates_parsed: false`. A validity output without "true" counts 0; a ranking output naming
neither passage counts 0.5.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Generator, Sequence
from typing import Any

from pydantic import Field, field_validator

from indexing import Hit
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

PAPER = "SuRe (Kim et al., ICLR 2024), Sec. 3"

# Field names follow the usual ones of such templates (FlashRAG's included): pred = the candidate.
FIELDS = {
    "candidates": {"reference", "question", "N", "n"},
    "summary": {"reference", "question", "pred"},
    "validity": {"question", "pred", "summary"},
    "rank": {"question", "summary1", "summary2"},
}
_DOC = "Passage {idx}: {title}. {text}\n"
DEFAULTS = {
    "candidates": PromptTemplate(
        doc=_DOC,
        system="Read the passages and give {n} different short candidate answers "
        "to the question, each at most three words, as: (a) first, (b) second.",
        user="{reference}\nQuestion: {question}\nCandidates:",
    ),
    "summary": PromptTemplate(
        doc=_DOC,
        system="Summarise the passages in a few sentences that support the given "
        "answer to the question. Use only what the passages say.",
        user="{reference}\nQuestion: {question}\nAnswer: {pred}\nSummary:",
    ),
    "validity": PromptTemplate(
        system="Does the summary support the answer to the question? Reply True or False.",
        user="Question: {question}\nAnswer: {pred}\nSummary: {summary}\nSupported:",
    ),
    "rank": PromptTemplate(
        system="Which summary is more informative for answering the question? Reply Summary 1 or Summary 2.",
        user="Question: {question}\nSummary 1: {summary1}\nSummary 2: {summary2}\nBetter:",
    ),
}
VALIDITY_CHOICES = ("True", "False")
RANK_CHOICES = ("Summary 1", "Summary 2")
_LABEL = re.compile(r"\(([a-z])\)\s*([^()\n]*)", re.IGNORECASE)


class SureParams(MethodParams):
    k: int = Field(10, ge=1, le=100, description="passages retrieved, N (paper: 10)")
    candidates: int = Field(2, ge=1, le=6, description="answer candidates K (paper: 2)")
    summary_tokens: int = Field(96, ge=8, le=1024, description="new tokens per summary")
    both_orders: bool = Field(True, description="judge each pair in both orders (mean), else once")
    constrained: bool = Field(True, description="hold candidate/validity/ranking outputs to their formats")
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    templates: dict[str, PromptTemplate] | None = Field(
        None, description="prompts by step (candidates, summary, validity, rank); missing ones: our own"
    )

    @field_validator("templates")
    @classmethod
    def _fields(cls, v: dict[str, PromptTemplate] | None) -> dict[str, PromptTemplate] | None:
        for step, tpl in (v or {}).items():
            if step not in FIELDS:
                raise ValueError(f"unknown template {step!r}; known: {sorted(FIELDS)}")
            check_template(tpl, FIELDS[step], step)
        return v

    def template(self, step: str) -> PromptTemplate:
        return (self.templates or {}).get(step, DEFAULTS[step])


def parse_candidates(text: str, n: int) -> list[str]:
    """Candidates from "(a) x, (b) y" (distinct, in order, at most n); else the whole output as one; [] if empty."""
    labelled = [extract_answer(m.group(2).strip().rstrip(",;").strip()) for m in _LABEL.finditer(text)]
    found = labelled if any(labelled) else [extract_answer(text)]
    seen: dict[str, str] = {}
    for c in found:
        if c and c.lower() not in seen:
            seen[c.lower()] = c
    return list(seen.values())[:n]


def validity(text: str) -> int:
    """v(s_k): 1 when the judgment says true (and not false first), else 0."""
    t = text.lower()
    return int("true" in t and ("false" not in t or t.index("true") < t.index("false")))


def prefers_first(text: str) -> float:
    """r_pair from one judgment: 1 for the first summary, 0 for the second, 0.5 when neither is named."""
    m = re.search(r"(?:summary|passage)\s*#?\s*([12])", text, re.IGNORECASE)
    return 0.5 if m is None else 1.0 if m.group(1) == "1" else 0.0


def pairs(n: int, both_orders: bool) -> list[tuple[int, int]]:
    return list(itertools.permutations(range(n), 2) if both_orders else itertools.combinations(range(n), 2))


def ranking_scores(n: int, judged: Sequence[tuple[tuple[int, int], float]]) -> list[float]:
    """r(s_k) = Σ_{i≠k} r_pair(s_k, s_i), r_pair averaged over the orders each pair was judged in."""
    seen: dict[tuple[int, int], list[float]] = {}
    for (a, b), first in judged:
        seen.setdefault((a, b), []).append(first)
        seen.setdefault((b, a), []).append(1.0 - first)
    return [sum(sum(v) / len(v) for (a, _), v in seen.items() if a == k) for k in range(n)]


def candidate_regex(n: int) -> str:
    labels = "abcdefgh"
    return ", ".join(rf"\({labels[i]}\) [^,()\n]{{1,40}}" for i in range(n))


def _ask(prompts: list, tpl: PromptTemplate, stage: str, spec: SamplingSpec) -> Generator[Request, Any, list[str]]:
    return [o.text for o in (yield Generate(prompts, sampling=spec, chat=tpl.chat, stage=stage))]


def _spec(p: SureParams, max_tokens: int, choice: tuple[str, ...] = (), regex: str | None = None) -> SamplingSpec:
    return SamplingSpec(
        max_tokens=max_tokens, choice=choice if p.constrained else (), regex=regex if p.constrained else None
    )


@register_method(
    "sure",
    params=SureParams,
    paper=PAPER,
    description="answer candidates, a summary per candidate, validity + pairwise ranking pick one",
)
def sure(q: Question, p: SureParams) -> Generator[Request, Any, Answer]:
    hits: list[Hit] = (yield Retrieve([q.question], k=p.k, retriever=p.retriever, step="retrieve", path="query"))[0]
    tpl = p.template("candidates")
    prompt = tpl.render(hits, question=q.question, n=p.candidates, N=len(hits))
    spec = _spec(p, 32 * p.candidates, regex=candidate_regex(p.candidates))
    raw = (yield from _ask([prompt], tpl, "candidates", spec))[0]
    cands = parse_candidates(raw, p.candidates)
    extra: dict[str, Any] = {"candidates": cands, "candidates_parsed": bool(cands)}
    if len(cands) < 2:
        return Answer(cands[0] if cands else "", raw, used_docs=list(hits), extra=extra)
    tpl = p.template("summary")
    summaries = yield from _ask(
        [tpl.render(hits, question=q.question, pred=c) for c in cands],
        tpl,
        "summarize",
        SamplingSpec(max_tokens=p.summary_tokens),
    )
    tpl = p.template("validity")
    checks = yield from _ask(
        [tpl.render(question=q.question, pred=c, summary=s) for c, s in zip(cands, summaries)],
        tpl,
        "validate",
        _spec(p, 4, choice=VALIDITY_CHOICES),
    )
    order = pairs(len(cands), p.both_orders)
    tpl = p.template("rank")
    judged = yield from _ask(
        [tpl.render(question=q.question, summary1=summaries[a], summary2=summaries[b]) for a, b in order],
        tpl,
        "rank",
        _spec(p, 4, choice=RANK_CHOICES),
    )
    valid = [validity(t) for t in checks]
    ranks = ranking_scores(len(cands), [(ab, prefers_first(t)) for ab, t in zip(order, judged)])
    scores = [v + r for v, r in zip(valid, ranks)]
    best = max(range(len(cands)), key=lambda k: (scores[k], -k))
    extra |= {"summaries": summaries, "validity": valid, "ranking": ranks, "scores": scores, "best": best}
    return Answer(cands[best], raw, used_docs=list(hits), extra=extra)
