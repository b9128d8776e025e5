"""Self-Ask with retrieval (Press et al., Findings of EMNLP 2023, "Measuring and Narrowing the
Compositionality Gap in Language Models"), Sec. 3 (Self-Ask) and Sec. 3.2 (Self-Ask + Search Engine).

The model writes, after the question, "Are follow up questions needed here: Yes/No.", then "Follow up: ...".
Generation stops at "Intermediate answer:" (the paper's stop); the follow-up is answered outside the model, and
that answer is inserted after "Intermediate answer:" before the model goes on. The paper asks a search engine
for the answer; here the follow-up retrieves k passages and the run's generator answers it from them (one
short-answer RAG prompt). It ends when the model writes "So the final answer is: ...". As in the paper there is
no retrieval for the original question: a model that says "No." answers from its parameters
(`retrieve_question` puts the question's own passages in the prompt first, as FlashRAG's single-hop variant).

Fallback (documented, `answer_forced` in the row): after `max_follow_ups` follow-ups, or when an output holds
neither a follow-up nor a final answer (or the final answer is empty), "So the final answer is:" is appended
and the model's next line is the prediction ("" when it is empty too). An empty intermediate answer is
inserted as "unknown".

A full context window (`generation.max_model_len`, pipeline/methods/window.py): every prompt after the first
step's runs only where it leaves room for its max_tokens. A step or a follow-up's answering prompt that does not
fit stops the chain there (`stopped: window`) with the forced answer; where that does not fit either, the
prediction is the last intermediate answer ("" without one, or for "unknown"). The paper's code (ofirpress/self-ask, its notebook
over the OpenAI API) has no window check: its chains end at the final answer.
"""

from __future__ import annotations

import re
from collections.abc import Generator
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
from pipeline.methods.prompts import RAG_SYSTEM, extract_answer, marked_answer
from pipeline.methods.registry import MethodParams, register_method
from pipeline.methods.templates import PromptTemplate, check_template
from pipeline.methods.window import STOPPED, fitting, full

PAPER = "Self-Ask (Press et al., 2023), Sec. 3, 3.2"

FOLLOW_UP = re.compile(r"^[ \t]*Follow up:[ \t]*(.*)$", re.IGNORECASE | re.MULTILINE)
FINAL = re.compile(r"So the final answer is:?[ \t]*", re.IGNORECASE)
FORCE = "So the final answer is:"
STOPS = ("Intermediate answer:", "\nQuestion:", "\n\n")

# Our own exemplars in the paper's format (Fig. 3).
_SHOTS = [
    (
        "Who was born earlier, the composer of the opera Tosca or the author of Dracula?",
        [
            ("Who composed the opera Tosca?", "Giacomo Puccini."),
            ("When was Giacomo Puccini born?", "22 December 1858."),
            ("Who wrote Dracula?", "Bram Stoker."),
            ("When was Bram Stoker born?", "8 November 1847."),
        ],
        "Bram Stoker",
    ),
    (
        "What is the capital of the country where the film Amelie was made?",
        [("In which country was the film Amelie made?", "France."), ("What is the capital of France?", "Paris.")],
        "Paris",
    ),
    ("What is the capital of Italy?", [], "Rome"),
]


def _shot(question: str, steps: list[tuple[str, str]], final: str) -> str:
    body = "".join(f"Follow up: {f}\nIntermediate answer: {a}\n" for f, a in steps)
    return (
        f"Question: {question}\nAre follow up questions needed here: {'Yes' if steps else 'No'}.\n"
        f"{body}{FORCE} {final}\n\n"
    )


DEFAULT_TEMPLATE = PromptTemplate(
    chat=False, user="".join(_shot(*s) for s in _SHOTS) + "Question: {question}\nAre follow up questions needed here:"
)
DEFAULT_ANSWER_TEMPLATE = PromptTemplate(
    system=RAG_SYSTEM,
    user="The following are given documents.\n\n{reference}\nAnswer the question: {question}\nAnswer:",
)


class SelfAskParams(MethodParams):
    k: int | None = Field(None, ge=1, le=100, description="passages retrieved per follow-up (None: retrieval.k)")
    max_follow_ups: int = Field(5, ge=0, le=20, description="follow-up questions answered at most")
    step_tokens: int = Field(64, ge=4, le=512, description="new tokens per self-ask step")
    answer_tokens: int | None = Field(
        None, ge=1, description="new tokens of an intermediate answer (None: generation.max_new_tokens)"
    )
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    retrieve_question: bool = Field(
        False,
        description="retrieve k passages for the question itself into {reference} before the first step "
        "(FlashRAG's single-hop Self-Ask); False: the paper's, retrieval for follow-ups only",
    )
    template: PromptTemplate | None = Field(
        None,
        description="self-ask prompt head, continued by the transcript; "
        "fields {question} {reference} (the latest follow-up's passages); "
        "None: our own",
    )
    answer_template: PromptTemplate | None = Field(
        None,
        description="prompt answering a follow-up from its "
        "passages; fields {question} {reference}; None: short-answer RAG",
    )

    @field_validator("template", "answer_template")
    @classmethod
    def _fields(cls, v: PromptTemplate | None) -> PromptTemplate | None:
        check_template(v, {"question", "reference"})
        return v


def read_step(text: str) -> tuple[str, str | None, str | None]:
    """(kept text, follow-up, final answer) of one output: up to and with the first follow-up line, or the
    final answer ("" when empty after its marker), whichever comes first; (text, None, None) for neither."""
    follow, final = FOLLOW_UP.search(text), FINAL.search(text)
    if follow and follow.group(1).strip() and (final is None or follow.start() < final.start()):
        return text[: follow.end()].rstrip() + "\n", follow.group(1).strip(), None
    if final:
        return text, None, marked_answer(text[final.start() :], marker=FINAL) or ""
    return text, None, None


def _generate(prompt: Any, chat: bool, spec: SamplingSpec, stage: str) -> Generator[Request, Any, str | None]:
    """The output's text; None where `spec` asks to fit the window and the prompt does not (window.py)."""
    out = (yield Generate([prompt], sampling=spec, chat=chat, stage=stage))[0]
    return None if full(out) else out.text


def answer_follow_up(
    follow: str, p: SelfAskParams, reader: PromptTemplate, follow_ups: list[dict[str, str]], used: dict[str, Hit]
) -> Generator[Request, Any, list[Hit] | None]:
    """Retrieve for the follow-up, answer it from its passages; recorded in `follow_ups` and `used`. None where
    the answering prompt does not fit the window."""
    hits = (
        yield Retrieve(
            [follow], k=p.k, retriever=p.retriever, step=f"follow-up-{len(follow_ups) + 1}", path="follow-up"
        )
    )[0]
    used.update((h.id, h) for h in hits if h.id not in used)
    said = yield from _generate(
        reader.render(hits, question=follow),
        reader.chat,
        SamplingSpec(max_tokens=p.answer_tokens, fit=True),
        "intermediate-answer",
    )
    if said is None:
        return None
    follow_ups.append({"question": follow, "answer": extract_answer(said) or "unknown"})
    return list(hits)


@register_method(
    "self-ask",
    params=SelfAskParams,
    paper=PAPER,
    description="self-ask: the model writes follow-up questions, each answered from retrieval",
)
def self_ask(q: Question, p: SelfAskParams) -> Generator[Request, Any, Answer]:
    tpl, reader = p.template or DEFAULT_TEMPLATE, p.answer_template or DEFAULT_ANSWER_TEMPLATE
    transcript = ""
    hits: list[Hit] = []
    follow_ups: list[dict[str, str]] = []
    used: dict[str, Hit] = {}
    step_spec = SamplingSpec(max_tokens=p.step_tokens, stop=STOPS)
    answer, stopped = None, ""
    if p.retrieve_question:
        hits = list((yield Retrieve([q.question], k=p.k, retriever=p.retriever, step="question", path="question"))[0])
        used.update((h.id, h) for h in hits)
    first = True
    while not stopped:
        prompt = tpl.render(hits, suffix=transcript, question=q.question)
        text = yield from _generate(prompt, tpl.chat, step_spec if first else fitting(step_spec), "self-ask")
        first = False
        if text is None:  # the next step does not fit the window: stop as after the last follow-up
            stopped = STOPPED
            break
        kept, follow, final = read_step(text)
        if final is not None or follow is None:  # the answer, an empty one, or neither: the model's text stays
            transcript += kept
            answer, stopped = final or None, "answer" if final else "empty answer" if final == "" else "unparsed"
        elif len(follow_ups) >= p.max_follow_ups:
            stopped = "max_follow_ups"
        else:
            found = yield from answer_follow_up(follow, p, reader, follow_ups, used)
            if found is None:  # its answering prompt does not fit: stop before this follow-up
                stopped = STOPPED
                break
            hits = found
            transcript += f"{kept}Intermediate answer: {follow_ups[-1]['answer']}\n"
    forced = answer is None
    if forced:  # continue from the marker (already written when the model left it empty)
        if stopped != "empty answer":
            transcript = transcript.rstrip() + "\n" + FORCE
        prompt = tpl.render(hits, suffix=transcript, question=q.question)
        spec = SamplingSpec(max_tokens=32, stop=("\n",), fit=True)
        said = yield from _generate(prompt, tpl.chat, spec, "self-ask")
        # a full window: what the chain has, its last intermediate answer ("" without one)
        last = follow_ups[-1]["answer"] if follow_ups else ""
        answer = extract_answer(said) if said is not None else "" if last == "unknown" else last
        if said is None:
            stopped = STOPPED
    extra = {"follow_ups": follow_ups, "stopped": stopped, "answer_forced": forced}
    return Answer(
        answer or "",
        transcript.strip(),
        used_docs=list(used.values()),
        retrieval_triggered=bool(follow_ups),
        extra=extra,
    )
