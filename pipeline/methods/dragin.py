"""DRAGIN (Su et al., ACL 2024) and the multi-round baselines of its Table 1, in one shared setting.

All four methods answer with few-shot chain-of-thought in raw-text prompts (exemplars end with
"So the answer is ..."), generate up to `max_tokens` tokens per round (Table 9's "generate
length"; one sampling setting for every question, so a transformers backend batches them too) and
stop once the accepted output reaches that length, put the top-k (Table 8: 3) BM25 documents of the latest retrieval in the prompt (the
"Answer in the same format as before." template of Appendix D), and continue from where the kept
output ends. They differ only in when and what they retrieve (Table 1):

- `dragin`: RIND (Eq. 5) over each generated chunk; at the first token above theta, truncate before it
  (Eq. 6), query with QFS (top-n attended words in text order), continue with the documents.
- `flare`: at the first sentence holding a token with probability below `prob_threshold`, truncate
  before that sentence; query = the sentence without its low-probability words.
- `fl-rag`: retrieve every `window` tokens; query = the last window (the question at first).
- `fs-rag`: retrieve every sentence; query = the last sentence (the question at first).

The final answer follows Appendix B: the words after "So the answer is"; if the output lacks it,
" So the answer is" is appended and the model generates again. Entropy and attention come from the
`attention` backend (a transformers forward pass; the entropy is exact over the whole vocabulary:
rows record `entropy: "exact"`); generation is the run's generation backend (vLLM by default).
Rows' `extra` hold retrievals, generated tokens, hallucination points (triggers), queries.

A full context window (`generation.max_model_len`, pipeline/methods/window.py): every round after the first runs
only where its prompt leaves room for its max_tokens. Where it does not, the rounds end as at the generate
length, and the answer follows Appendix B as always (the forced " So the answer is" continuation, from the
reasoning alone where the documents leave it no room); the row's `stopped` is "window". DRAGIN's code
(oneal2000/DRAGIN src/generate.py) has no window check: its loops end at `generate_max_length` tokens, the
answer sentence, or no progress. A first prompt that does not fit is the question's error.

Tokens are the generator's own: DRAGIN's attention pass scores the prompt ids and output ids the
generator ran (`Completion.prompt_token_ids`, `token_ids`), never a re-encoding of the texts. FLARE and
FS-RAG place tokens in the output by `Completion.token_spans`, which the generator reads from its ids
the way a detokenizer does (decode(ids[:i+1]) minus decode(ids[:i]); pipeline/backends/detok.py), the
same reading the attention pass uses. vLLM's per-token `decoded_token` strings are not used: each is one
id decoded alone, so byte pieces of a multi-byte character and SentencePiece's leading spaces do not lay
end to end along the text.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
from pydantic import Field, field_validator

import pipeline.backends.attention  # noqa: F401  registers the "attention" backend
from indexing import Hit
from pipeline.backends.dragin_math import (
    Candidate,
    ends_sentence,
    first_above,
    qfs_query,
    rind,
    semantic_mask,
    sentence_relative,
    sentence_spans,
    truncate,
    word_spans,
)
from pipeline.engine.requests import (
    Answer,
    Call,
    Completion,
    Generate,
    Prompt,
    Question,
    Request,
    Retrieve,
    SamplingSpec,
)
from pipeline.errors import DynragError
from pipeline.methods import dragin_authors as authors
from pipeline.methods.dragin_authors import SWITCH as AUTHORS_SWITCH
from pipeline.methods.dragin_authors import AuthorsPrompt
from pipeline.methods.prompts import SO_THE_ANSWER_IS, extract_answer, marked_answer
from pipeline.methods.registry import MethodParams, register_method
from pipeline.methods.templates import PromptTemplate, check_template
from pipeline.methods.window import STOPPED, full

PAPER = "DRAGIN (Su et al., ACL 2024), Sec. 3-4.3, Table 1, App. B-C"

# Our own exemplars in the style of the paper's CoT prompts (App. A, D): reasoning, then the answer.
EXEMPLARS = [
    (
        "Who was born earlier, the composer of the opera Tosca or the author of Dracula?",
        "The opera Tosca was composed by Giacomo Puccini, born on 22 December 1858. Dracula was written by "
        "Bram Stoker, born on 8 November 1847. Thus, Bram Stoker was born earlier. So the answer is Bram Stoker.",
    ),
    (
        "In which country is the university where the inventor of the World Wide Web studied?",
        "The World Wide Web was invented by Tim Berners-Lee. Tim Berners-Lee studied at the University of "
        "Oxford. The University of Oxford is in England. So the answer is England.",
    ),
    (
        "Are the rivers Danube and Volga both in Europe?",
        "The Danube flows through central and eastern Europe. The Volga flows through Russia in Europe. "
        "Thus, both are in Europe. So the answer is yes.",
    ),
    (
        "What is the capital of the country where the film Amelie was made?",
        "The film Amelie was made in France. The capital of France is Paris. So the answer is Paris.",
    ),
]

# Table 9 (Llama2-7b-chat row, the smallest LLM of the paper): (generate length, theta, top n tokens)
TABLE9 = {"2wiki": (64, 1.2, 40), "hotpot": (100, 1.3, 35), "iirc": (128, 1.3, 35), "strategy": (100, 0.75, 35)}
TABLE9_OTHER = (100, 1.2, 35)


def table9(dataset: str) -> tuple[int, float, int]:
    key = dataset.lower().replace("_", "")
    return next((v for k, v in TABLE9.items() if k in key), TABLE9_OTHER)


class MultiRoundParams(MethodParams):
    k: int = Field(3, ge=1, le=20, description="documents per retrieval (Table 8: 3)")
    max_tokens: int | None = Field(
        None, ge=8, le=1024, description="generate length (None: Table 9 for the question's dataset)"
    )
    max_retrievals: int = Field(8, ge=0, le=50, description="retrievals per question at most")
    doc_words: int = Field(120, ge=10, description="each document is cut to this many words in the prompt")
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    authors: AuthorsPrompt | None = Field(None, description=AUTHORS_SWITCH)


class DraginParams(MultiRoundParams):
    theta: float | None = Field(None, gt=0, description="RIND threshold (None: Table 9 for the dataset)")
    top_n: int | None = Field(None, ge=1, le=200, description="QFS query tokens (None: Table 9 for the dataset)")
    qfs_skip_stop_words: bool = Field(True, description="QFS never picks stop words (as the official code)")
    attention_norm: Literal["sentence", "none"] = Field(
        "sentence",
        description="sentence: a_max relative to its sentence's mean, as the official code (theta ~1); "
        "none: the raw a_max of Eq. 3",
    )
    skip_bound: bool = Field(
        True,
        description="skip the attention pass where a bound from the generator's top log-probabilities proves "
        "no token can exceed theta (the same decisions, fewer passes)",
    )
    bound_logprobs: int = Field(20, ge=1, le=20, description="top log-probabilities per token for that bound")


class FlareParams(MultiRoundParams):
    prob_threshold: float = Field(0.4, gt=0, lt=1, description="a token below this probability triggers retrieval")
    mean_threshold: float = Field(
        0.08,
        gt=0,
        lt=1,
        description="authors setting: a sentence whose tokens' mean 1 - p passes this triggers (DRAGIN's FLARE config)",
    )
    template: PromptTemplate | None = Field(
        None,
        description="prompt; fields {reference} (the documents in the prompt) {question}; the answer so far starts "
        "the model's turn and the prediction is the whole answer (no marker). None: the few-shot chain of thought",
    )
    keep_docs: bool = Field(
        True,
        description="documents stay in the prompt until the next retrieval (DRAGIN's setting); False: only the "
        "sentence regenerated after a retrieval sees them (FLARE's Sec. 3: a step uses its own retrieval only)",
    )

    @field_validator("template")
    @classmethod
    def _fields(cls, v: PromptTemplate | None) -> PromptTemplate | None:
        check_template(v, {"reference", "question"})
        return v


class FlRagParams(MultiRoundParams):
    window: int = Field(25, ge=1, description="tokens between retrievals (Sec. 5.4: 25)")


class FsRagParams(MultiRoundParams):
    pass


# -- prompts and answers ---------------------------------------------------------------------------
def cot_prompt(
    question: str, docs: Sequence[Hit], answer_so_far: str, doc_words: int
) -> tuple[str, list[tuple[int, int]]]:
    """(raw prompt, character spans QFS may read: the question and the answer so far)."""
    parts = [f"Question: {q}\nAnswer: {a}\n\n" for q, a in EXEMPLARS]
    if docs:
        lines = [f"[{i}] {h.title}: {' '.join(h.text.split()[:doc_words])}" for i, h in enumerate(docs, 1)]
        parts.append("Context:\n" + "\n".join(lines) + "\nAnswer in the same format as before.\n\n")
    head = "".join(parts) + "Question: "
    q_span = (len(head), len(head) + len(question))
    prompt = f"{head}{question}\nAnswer:"
    spans = [q_span]
    if answer_so_far:
        spans.append((len(prompt), len(prompt) + len(answer_so_far)))
        prompt += answer_so_far
    return prompt, spans


def complete(text: str) -> bool:
    """The reasoning has reached its answer sentence ("So the answer is ...", Appendix B) and finished it."""
    return any(ends_sentence(text[m.end() :].split("\n", 1)[0]) for m in SO_THE_ANSWER_IS.finditer(text))


# -- the shared loop ---------------------------------------------------------------------------------
@dataclass
class Rounds:
    """One question's multi-round generation state."""

    q: Question
    p: MultiRoundParams
    budget: int
    text: str = ""  # the accepted output
    used: int = 0  # tokens accepted
    docs: list[Hit] = field(default_factory=list)  # the latest retrieval's
    show_docs: bool = True  # the prompt holds `docs`
    retrievals: int = 0
    triggers: int = 0
    generated: int = 0  # every token generated, accepted or not
    queries: list[str] = field(default_factory=list)
    at_tokens: list[int] = field(default_factory=list)  # answer tokens accepted when each retrieval ran (the trigger)
    seen_docs: dict[str, Hit] = field(default_factory=dict)
    ran: bool = False  # a prompt has run (every later one must fit the window with its max_tokens)
    window: bool = False  # the last prompt did not fit the window (not run): the loop ends, the answer follows

    @property
    def template(self) -> PromptTemplate | None:
        return getattr(self.p, "template", None)

    def prompt(self) -> tuple[Prompt, list[tuple[int, int]]]:
        """(prompt, character spans QFS may read: none with a template)."""
        docs = self.docs if self.show_docs else []
        if self.template:
            return self.template.render(docs, continuation=self.text, question=self.q.question), []
        return cot_prompt(self.q.question, docs, self.text, self.p.doc_words)

    def generate(self, max_tokens: int, logprobs: int | None = None, token_spans: bool = False):
        prompt, spans = self.prompt()
        spec = SamplingSpec(
            max_tokens=max(1, max_tokens),
            temperature=0.0,
            stop=("\n",),
            logprobs=logprobs,
            token_spans=token_spans,
            fit=self.ran,
        )
        chat = self.template.chat if self.template else False
        out = (yield Generate([prompt], sampling=spec, chat=chat, stage="answer"))[0]
        self.window = full(out)
        self.ran = self.ran or not self.window
        self.generated += out.completion_tokens
        return prompt, spans, out

    def retrieve(self, query: str):
        hits = (
            yield Retrieve(
                [query], k=self.p.k, retriever=self.p.retriever, step=f"round-{self.retrievals + 1}", path="query"
            )
        )[0]
        self.retrievals += 1
        self.queries.append(query)
        self.at_tokens.append(self.used)
        self.docs, self.show_docs = list(hits), True
        for h in hits:
            self.seen_docs.setdefault(h.id, h)

    def accept(self, piece: str, tokens: int) -> None:
        self.text += piece
        self.used += tokens

    def trigger(self, query: str, kept: str, offsets: Sequence[tuple[int, int]]):
        """A hallucination point with a new query (none, or the last retrieval's, is not): keep the output before
        it (`kept`; its tokens: those of `offsets` that end within it) and retrieve. Whether it retrieved."""
        if not query or query in self.queries[-1:]:
            return False
        self.triggers += 1
        self.accept(kept, sum(1 for s, e in offsets if e <= len(kept)))
        yield from self.retrieve(query)
        return True

    def take(self, out: Completion, end: int | None = None) -> bool:
        """Accept the output, or its first `end` characters (the tokens that end within them). Whether the loop
        ends: the answer sentence is finished, or generation stopped before the length within what was kept."""
        text = out.text if end is None else out.text[:end]
        tokens = out.completion_tokens if end is None else sum(1 for s, e in token_spans(out) if e <= end)
        self.accept(text, tokens)
        stopped = out.finish_reason not in ("length", "") and len(text) >= len(out.text.rstrip())
        return complete(self.text) or stopped

    def can_retrieve(self) -> bool:
        return self.retrievals < self.p.max_retrievals

    def left(self) -> int:
        return self.budget - self.used

    def finish(self, extra: dict[str, Any]):
        """Appendix B: read the answer after "So the answer is", generating it when absent; with a template,
        the answer is the output itself (`extract_answer`)."""
        raw = self.text
        ans = extract_answer(raw) if self.template else marked_answer(raw, marker=SO_THE_ANSWER_IS)
        forced = not ans and not self.template
        stopped = self.window
        if forced:
            self.text = raw.rstrip() + " So the answer is"
            _, _, out = yield from self.generate(24)
            if self.window and self.show_docs and self.docs:  # a full window: the answer from the reasoning alone
                self.show_docs = False
                _, _, out = yield from self.generate(24)
            stopped = stopped or self.window
            raw = self.text + out.text
            ans = marked_answer(raw, marker=SO_THE_ANSWER_IS) or ""
        if stopped:
            extra = {"stopped": STOPPED, **extra}
        extra = {
            "retrievals": self.retrievals,
            "generated_tokens": self.generated,
            "hallucination_points": self.triggers,
            "retrieval_at_tokens": self.at_tokens,
            "queries": self.queries,
            "answer_forced": forced,
            **extra,
        }
        return Answer(
            cast(str, ans),
            raw.strip(),
            used_docs=list(self.docs) if self.show_docs else [],
            retrieval_triggered=self.retrievals > 0,
            extra=extra,
        )  # ans: the marked answer, or the forced one ("" at worst)


def token_spans(out: Completion) -> list[tuple[int, int]]:
    """Each generated token's (start, end) in the output text, as the generator read its ids."""
    if out.token_spans is None or len(out.token_spans) != len(out.token_ids):
        raise DynragError("the generator returned no span per token id (SamplingSpec.token_spans)")
    return [(int(s), int(e)) for s, e in out.token_spans]


def sentence_of(text: str, pos: int) -> tuple[int, int]:
    """The (start, end) of the sentence holding character `pos`."""
    spans = sentence_spans(text)
    return next((sp for sp in spans if pos < sp[1]), spans[-1] if spans else (0, len(text)))


# -- dragin -------------------------------------------------------------------------------------------
def qfs(stats: dict, i: int, n: int, skip_stop_words: bool) -> str:
    """QFS for generated token i: candidates are the context tokens and the generated tokens before i."""
    before = len(stats["cand_words"]) - len(stats["offsets"]) + i
    cands = [Candidate(w, o) for w, o in zip(stats["cand_words"][:before], stats["cand_order"][:before])]
    return qfs_query(np.asarray(stats["cand_attn"][i][:before]), cands, n, skip_stop_words)


def rind_trigger(st: dict, new: str, theta: float, attention_norm: str) -> int | None:
    """RIND (Eq. 5) over the pass's statistics: the first generated token whose score exceeds theta."""
    offsets = [tuple(o) for o in st["offsets"]]
    amax = sentence_relative(st["amax"], new, offsets) if attention_norm == "sentence" else st["amax"]
    return first_above(rind(st["entropy"], amax, semantic_mask(new, offsets)), theta)


@register_method(
    "dragin",
    params=DraginParams,
    description="RIND (entropy x max later attention x stop-word mask) decides when, QFS what to retrieve",
    paper=PAPER,
)
def dragin(q: Question, p: DraginParams) -> Generator[Request, Any, Answer]:
    length, theta, top_n = table9(q.dataset)
    theta = p.theta or theta
    top_n = p.top_n or top_n
    if p.authors is not None:
        return (yield from dragin_as_authors(q, p, p.authors, p.max_tokens or length, theta, top_n))
    rounds = Rounds(q, p, p.max_tokens or length)
    skipped = 0
    while rounds.left() > 0:
        bound = p.skip_bound and rounds.can_retrieve()
        prompt, spans, out = yield from rounds.generate(rounds.budget, logprobs=p.bound_logprobs if bound else None)
        if rounds.window:
            break
        new = out.text
        if not new.strip():
            break
        if rounds.can_retrieve():
            item: dict[str, Any] = {
                "prompt": prompt,
                "prompt_ids": out.prompt_token_ids,
                "generated": new,
                "generated_ids": out.token_ids,
                "context": spans,
            }
            if bound and out.logprobs:
                tops = [list(t.top.values()) for t in out.logprobs]
                item["skip_bound"] = {"theta": theta, "attention_norm": p.attention_norm, "top_logprobs": tops}
            st = (yield Call("attention", "stats", [item], stage="attention"))[0]
            skipped += bool(st.get("skipped"))
            i = None if st.get("skipped") else rind_trigger(st, new, theta, p.attention_norm)
            if i is not None:
                offsets = [tuple(o) for o in st["offsets"]]
                query = qfs(st, i, top_n, p.qfs_skip_stop_words)
                if (yield from rounds.trigger(query, truncate(new, offsets, i), offsets)):
                    continue
        if rounds.take(out):
            break
    return (
        yield from rounds.finish(
            {
                "entropy": "exact",
                "attention_norm": p.attention_norm,
                "theta": theta,
                "top_n": top_n,
                "max_tokens": rounds.budget,
                "attention_skipped": skipped,
            }
        )
    )


def dragin_as_authors(q: Question, p: DraginParams, a: authors.AuthorsPrompt, length: int, theta: float, top_n: int):
    """AttnWeightRAG's loop with its own RIND and query (authors.attn_weight): theta is the code's
    hallucination_threshold, top_n its retrieve_keep_top_k."""
    return (yield from authors.attn_weight(q, a, length, p.k, p.retriever, theta, top_n))


# -- flare ----------------------------------------------------------------------------------------------
@register_method(
    "flare",
    params=FlareParams,
    description="retrieve before a sentence with a low-probability token; query = the sentence without them",
    paper=f"FLARE (Jiang et al., 2023) as set in {PAPER}",
)
def flare(q: Question, p: FlareParams) -> Generator[Request, Any, Answer]:
    length = table9(q.dataset)[0]
    if p.authors is not None:
        return (yield from authors.token(q, p.authors, p.max_tokens or length, p.k, p.retriever, p.mean_threshold))
    rounds = Rounds(q, p, p.max_tokens or length)
    while rounds.left() > 0:
        _, _, out = yield from rounds.generate(rounds.budget, logprobs=1, token_spans=True)
        if rounds.window:
            break
        new = out.text
        if not new.strip():
            break
        if rounds.docs and rounds.show_docs and not p.keep_docs:  # the sentence regenerated with its retrieval: kept
            rounds.show_docs = False
            if rounds.take(out, sentence_of(new, 0)[1]):
                break
            continue
        if rounds.can_retrieve() and out.logprobs:
            offsets = token_spans(out)
            low = [
                k
                for k, t in enumerate(out.logprobs)
                if np.exp(t.logprob) < p.prob_threshold and offsets[k][1] > offsets[k][0]
            ]
            low = [k for k in low if word_spans(new, [offsets[k]])[0] is not None]  # punctuation never triggers
            if low:
                s0, s1 = sentence_of(new, offsets[low[0]][1] - 1)
                masked = {word_spans(new, [offsets[k]])[0] for k in low}
                words = [m for m in re.finditer(r"\w+", new[s0:s1]) if (s0 + m.start(), s0 + m.end()) not in masked]
                query = " ".join(m.group() for m in words) or q.question
                if (yield from rounds.trigger(query, new[:s0].rstrip(), offsets)):
                    continue
        if rounds.take(out):
            break
    return (
        yield from rounds.finish(
            {
                "entropy": "none (token probabilities from generation logprobs)",
                "prob_threshold": p.prob_threshold,
                "keep_docs": p.keep_docs,
                "max_tokens": rounds.budget,
            }
        )
    )


# -- fixed-rule baselines ------------------------------------------------------------------------------
@register_method(
    "fl-rag",
    params=FlRagParams,
    description="retrieve every n tokens with the last n tokens as the query (the question first)",
    paper=f"FL-RAG (Khandelwal et al., 2019; Ram et al., 2023) as set in {PAPER}",
)
def fl_rag(q: Question, p: FlRagParams) -> Generator[Request, Any, Answer]:
    return (yield from fixed_rule(q, p, p.window, {"window": p.window}))


@register_method(
    "fs-rag",
    params=FsRagParams,
    description="retrieve every sentence with the last sentence as the query (the question first)",
    paper=f"FS-RAG (Trivedi et al., 2022) as set in {PAPER}",
)
def fs_rag(q: Question, p: FsRagParams) -> Generator[Request, Any, Answer]:
    return (yield from fixed_rule(q, p, None, {}))


def fixed_rule(q: Question, p: MultiRoundParams, window: int | None, extra: dict[str, Any]):
    """FL-RAG's loop (retrieve every `window` tokens, the last window the next query) or, `window` None, FS-RAG's
    (retrieve every sentence, the last sentence the next query); the question is the first query."""
    length = p.max_tokens or table9(q.dataset)[0]
    if p.authors is not None:
        return (yield from authors.fixed(q, p.authors, length, p.k, p.retriever, window))
    rounds = Rounds(q, p, length)
    query = q.question
    while rounds.left() > 0:
        if rounds.can_retrieve():
            yield from rounds.retrieve(query)
        _, _, out = yield from rounds.generate(window or rounds.budget, token_spans=window is None)
        new = out.text
        if rounds.window or not new.strip():
            break
        spans = sentence_spans(new) if window is None else []
        end = spans[0][1] if spans else len(new)
        query = new[:end].strip()
        if rounds.take(out, None if window else end):
            break
    return (yield from rounds.finish({"entropy": "none", **extra, "max_tokens": rounds.budget}))
