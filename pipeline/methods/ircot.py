"""IRCoT (Trivedi et al., ACL 2023, "Interleaving Retrieval with Chain-of-Thought Reasoning for
Knowledge-Intensive Multi-Step Questions"), Sec. 3.1.

Retrieve K paragraphs with the question, then alternate two steps:
- reason: from the question, the paragraphs collected so far and the CoT so far, generate the next CoT
  sentence; only the first generated sentence is kept (the rest is dropped);
- retrieve: if that sentence holds "answer is:" stop; else the sentence is the next query, and its K
  paragraphs join the collection (deduplicated by id) while it holds fewer than 15 (the paper's cap);
until the answer or `max_steps` reasoning steps (the paper stops at 8). K is tuned per dataset in the paper
(from {2, 4, 6, 8}); here it defaults to `retrieval.k`. The paper keeps the generated paragraphs in a random
order; here they stay in the order found (deterministic).

The prediction is the text after the marker. Fallback (documented, `answer_forced` in the row): when the
steps run out, the model writes nothing, or the marker has nothing after it, the CoT is continued once from
"So the answer is:" and the first line of that continuation is the prediction ("" when it is empty too).

A full context window (`generation.max_model_len`, pipeline/methods/window.py) is handled as IRCoT's code
handles it: before every call, `fit_prompt_into_given_limit` (StonyBrookNLP/ircot, commaqa/inference/
prompt_reader.py; called by commaqa/models/llm_client_generator.py with the generation length reserved) drops
the few-shot demonstrations, the first first, and where the test example alone is still too long, the prompt's
first lines, which are its oldest paragraphs; the reasoning goes on. Here a prompt that does not leave room
for `sentence_tokens` drops our exemplars, the first first (a given template's are not separable: none), then
the oldest paragraphs, whole; the row counts them (`dropped_exemplars`, `dropped_paragraphs`) and `used_docs`
are the paragraphs the last prompt held. Where the question and the CoT alone do not fit, the first step is
the question's error and a later one stops (`stopped: window`) with the forced answer ("" if that does not fit).
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from indexing import Hit
from pipeline.backends.dragin_math import sentence_spans
from pipeline.engine.requests import (
    Answer,
    Completion,
    Question,
    Request,
    Retrieve,
    SamplingSpec,
)
from pipeline.methods.dragin import EXEMPLARS
from pipeline.methods.prompts import extract_answer, marked_answer
from pipeline.methods.registry import MethodParams, register_method
from pipeline.methods.templates import PromptTemplate, check_template
from pipeline.methods.window import STOPPED, fit_generate, full, too_long

PAPER = "IRCoT (Trivedi et al., ACL 2023), Sec. 3.1"

ANSWER_IS = re.compile(r"\banswer\s+is\b\s*:?[ \t]*", re.IGNORECASE)
FORCE = "So the answer is:"
FIELDS = {"reference", "question", "cot"}

# Our own few-shot exemplars (shared with DRAGIN) in IRCoT's shape: paragraphs, question, CoT ending in the answer.
SHOTS = [f"Question: {q}\nAnswer: {a.replace('So the answer is', FORCE)}\n\n" for q, a in EXEMPLARS]
_TEST = "{reference}Question: {question}\nAnswer: {cot}"
DEFAULT_TEMPLATE = PromptTemplate(
    system="", chat=False, doc="Wikipedia Title: {title}\n{text}\n\n", user="".join(SHOTS) + _TEST
)


class IrcotParams(MethodParams):
    k: int | None = Field(
        None,
        ge=1,
        le=100,
        description="paragraphs retrieved per step, K (paper: tuned in {2,4,6,8}; None: retrieval.k)",
    )
    max_steps: int = Field(8, ge=1, le=50, description="reasoning steps at most (paper: 8)")
    max_paragraphs: int = Field(15, ge=1, le=200, description="paragraphs collected at most (paper: 15)")
    sentence_tokens: int = Field(64, ge=4, le=512, description="new tokens per reasoning step (one sentence kept)")
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    template: PromptTemplate | None = Field(
        None,
        description="reasoning prompt; fields {reference} {question} {cot} (without {cot}: the CoT so far starts the "
        "model's turn); None: our own",
    )

    @field_validator("template")
    @classmethod
    def _fields(cls, v: PromptTemplate | None) -> PromptTemplate | None:
        check_template(v, FIELDS)
        return v


def next_sentence(generated: str) -> str:
    """The first sentence of the first line; the whole line when the answer marker starts in that sentence
    (an answer such as "St. Louis" must not be cut at its period)."""
    line = generated.strip().split("\n", 1)[0].strip()
    if not line:
        return ""
    spans = sentence_spans(line)
    first = line[: spans[0][1]].strip() if spans else line
    marker = ANSWER_IS.search(line)
    return line if marker and marker.start() < len(first) else first


def add_paragraphs(have: list[Hit], new: list[Hit], cap: int) -> list[Hit]:
    """`have` with the unseen paragraphs of `new` appended, in order, up to `cap` in all."""
    seen = {h.id for h in have}
    out = list(have)
    for h in new:
        if len(out) >= cap:
            break
        if h.id not in seen:
            seen.add(h.id)
            out.append(h)
    return out


@dataclass
class Chain:
    """One question's reasoning state. `dropped`: the parts the prompt leaves out to fit the window, as IRCoT's
    code drops them (module docstring): the exemplars first (our own template only), then the oldest paragraphs."""

    q: Question
    p: IrcotParams
    paragraphs: list[Hit] = field(default_factory=list)
    cot: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    dropped: int = 0

    @property
    def shots(self) -> list[str]:
        """The exemplars the prompt can drop (those of our own template)."""
        return SHOTS if self.p.template is None else []

    def split(self, dropped: int) -> tuple[int, int]:
        """(exemplars, paragraphs) left out when `dropped` parts are."""
        return min(dropped, len(self.shots)), max(0, dropped - len(self.shots))

    def shown(self) -> list[Hit]:
        """The paragraphs the prompt holds."""
        return self.paragraphs[self.split(self.dropped)[1] :]

    def sizes(self) -> list[int]:
        """Characters of each part the prompt can drop, in the order they go."""
        return [len(x) for x in self.shots] + [len(h.title) + len(h.text) + 20 for h in self.paragraphs]

    def prompt(self, suffix: str = "", dropped: int = 0) -> Any:
        shots, paras = self.split(dropped)
        tpl = self.p.template or DEFAULT_TEMPLATE.model_copy(update={"user": "".join(SHOTS[shots:]) + _TEST})
        cot = " ".join(self.cot + ([suffix] if suffix else []))
        if "{cot}" in tpl.user:
            return tpl.render(self.paragraphs[paras:], question=self.q.question, cot=cot)
        return tpl.render(self.paragraphs[paras:], continuation=cot, question=self.q.question)

    def retrieve(self, query: str) -> Generator[Request, Any, None]:
        step = f"step-{len(self.queries)}"
        hits = (
            yield Retrieve(
                [query],
                k=self.p.k,
                retriever=self.p.retriever,
                step=step,
                path="question" if not self.queries else "cot",
            )
        )[0]
        self.queries.append(query)
        self.paragraphs = add_paragraphs(self.paragraphs, list(hits), self.p.max_paragraphs)

    def reason(self, max_tokens: int, suffix: str = "") -> Generator[Request, Any, Completion]:
        """The next output; `full` where the prompt does not fit even with every droppable part dropped."""
        spec = SamplingSpec(max_tokens=max_tokens, stop=("\n",))
        tpl = self.p.template or DEFAULT_TEMPLATE
        out, self.dropped = yield from fit_generate(
            lambda d: self.prompt(suffix, d), self.sizes(), spec, tpl.chat, "reason", self.dropped
        )
        return out


@register_method(
    "ircot",
    params=IrcotParams,
    paper=PAPER,
    description="interleave retrieval with chain-of-thought: each CoT sentence is the next query",
)
def ircot(q: Question, p: IrcotParams) -> Generator[Request, Any, Answer]:
    chain = Chain(q, p)
    yield from chain.retrieve(q.question)
    answer, stopped = None, "max_steps"
    for step in range(p.max_steps):
        out = yield from chain.reason(p.sentence_tokens)
        if full(out):  # not even the question and the CoT so far fit
            if not chain.cot:
                raise too_long(out)
            stopped = STOPPED
            break
        sentence = next_sentence(out.text)
        if not sentence:
            stopped = "empty"
            break
        chain.cot.append(sentence)
        if ANSWER_IS.search(sentence):
            answer = marked_answer(sentence, marker=ANSWER_IS) or None
            stopped = "answer" if answer else "empty answer"
            break
        if step + 1 < p.max_steps and len(chain.paragraphs) < p.max_paragraphs:
            yield from chain.retrieve(sentence)
    forced = answer is None
    if forced:  # continue the CoT from the marker (already written when it had nothing after it)
        suffix = "" if stopped == "empty answer" else FORCE
        out = yield from chain.reason(32, suffix=suffix)
        answer = "" if full(out) else extract_answer(out.text.split("\n", 1)[0])
    shots, paras = chain.split(chain.dropped)
    extra = {
        "cot": chain.cot,
        "steps": len(chain.cot),
        "queries": chain.queries,
        "paragraphs": len(chain.paragraphs),
        "stopped": stopped,
        "answer_forced": forced,
        "dropped_exemplars": shots,
        "dropped_paragraphs": paras,
    }
    return Answer(answer or "", " ".join(chain.cot), used_docs=chain.shown(), extra=extra)
