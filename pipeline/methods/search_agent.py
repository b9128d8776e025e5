"""The rollout shared by the reasoning search methods (Search-R1, Search-o1): the model reasons in one growing
turn; when it writes a search query it is stopped at the query's closing tag, the query's top-k passages are
retrieved and appended between result tags, and the model goes on from there, until it writes an answer.

One rollout turn is one Generate call (stopped at the closing query tag, or the closing answer tag where the
answer has one). The output is read as text, not as tokens, so a tag split across tokens reads the same; a
backend that returns text past a stop string (a stop split across tokens it did not catch) is cut at the first
closing tag here. Of an output, whichever tag opens last decides (generation stops at the first close):

- a query: `<search> q` (the stop string itself is not returned, so a closed and an unclosed query read alike:
  a query cut by the token limit, a missing `</search>`, is still searched). An empty query retrieves nothing:
  an empty result block is appended and the turn counts, no search does.
- an answer: the text after the answer tag up to its close (or the end); `extract_answer` cleans it.
- neither (malformed): Search-R1's own rollout code appends a correction note and lets the model try again;
  so does this, as a turn.
- Past `max_searches` a query gets the note that the search budget is spent (Search-o1's limit message) in
  its result block. Past `max_turns`, or an empty answer: the forced answer (below).

Fallback (documented, `answer_forced` in the row): the answer tag is appended to the rollout and the model
writes the answer (32 tokens, up to the closing tag or a newline); "" when it is empty too.

A full context window (`generation.max_model_len`; pipeline/methods/window.py): every turn after the first, and
every Reason-in-Documents call, runs only where its prompt leaves room for its max_tokens (`turn_tokens`,
`refine_tokens`). Where it does not, the rollout ends as at its turn budget (`stopped: window`): the forced
answer, from the rollout as it is, or where that does not fit either, from the rollout the last prompt that ran
held (that prompt left a turn's room; "" if even that does not fit). A Reason-in-Documents call that does not
fit ends the rollout before its result block. Neither authors' code checks the window: Search-R1's keeps the
last `max_prompt_length` tokens of the rollout (search_r1/llm_agent/generation.py `_update_rolling_state`), so
the instruction and the question go first, which dynrag does not copy; Search-o1's (scripts/run_search_o1.py)
runs to its turn limit (MAX_TURN), the model's window being far longer than its rollouts. A first turn that does
not fit is the question's error (PromptTooLong).

`strict=true` reads each turn as FlashRAG's `ReasoningPipeline.run` does (its GitHub main,
flashrag/pipeline/reasoning_pipeline.py), so `dynrag bench flashrag --method search-r1` runs the same protocol on
both sides: an answer is an output that stopped at the answer's closing tag (search-r1; search-o1: any output
holding the answer tag), the text after the first answer tag; a query is an output that stopped at the query's
closing tag, the text after the first query tag (an empty one gets an empty result block); any other output ends the rollout
with the output itself as the prediction (no correction note, no second try); the output is stripped and ends
with its closing tag in the rollout; the turn budget ends the rollout with no answer (no forced answer call).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from indexing import Hit
from pipeline.engine.requests import Answer, Generate, Question, Request, Retrieve, SamplingSpec
from pipeline.methods.prompts import extract_answer, format_docs
from pipeline.methods.registry import MethodParams
from pipeline.methods.templates import PromptTemplate, check_template
from pipeline.methods.window import STOPPED, fitting, full

NO_QUERY = "No search query was given."
LIMIT = "The maximum search limit is exceeded. You are not allowed to search."
FORCED_TOKENS = 32


@dataclass(frozen=True)
class Tags:
    query: tuple[str, str]
    result: tuple[str, str]
    answer: tuple[str, str]
    stop_at_answer: bool  # the answer's closing tag is a stop string (Search-R1); else the turn runs to its end
    invalid: str  # appended after an output with neither a query nor an answer


class SearchAgentParams(MethodParams):
    k: int | None = Field(None, ge=1, le=100, description="passages retrieved per search (None: retrieval.k)")
    max_turns: int = Field(8, ge=1, le=50, description="rollout turns (Generate calls) at most")
    max_searches: int = Field(5, ge=0, le=50, description="searches at most (FlashRAG's max_retrieval_num: 5)")
    turn_tokens: int = Field(512, ge=4, le=8192, description="new tokens per turn")
    retriever: str | None = Field(None, description="bm25 | dense (None: retrieval.retriever)")
    template: PromptTemplate | None = Field(
        None,
        description="instruction prompt; fields {question} {max_searches}; its `doc` formats each passage of a "
        "result block; None: search-r1 the paper's Table 1, search-o1 ours after the paper",
    )
    strict: bool = Field(
        False,
        description="read turns as FlashRAG's ReasoningPipeline does: only a closed query searches, any other "
        "output is the prediction, no forced answer (pipeline/methods/search_agent.py)",
    )

    @field_validator("template")
    @classmethod
    def _fields(cls, v: PromptTemplate | None) -> PromptTemplate | None:
        check_template(v, {"question", "max_searches"})
        return v


def read_turn(text: str, tags: Tags) -> tuple[str, str | None, str | None]:
    """(kept text, query, answer) of one output: the text up to the first closing tag, then whichever of the
    query and answer tags opens last in it; query and answer None where that tag is absent."""
    opened = text.find(tags.answer[0])
    answer_end = text.find(tags.answer[1], opened + len(tags.answer[0])) if opened >= 0 else -1
    closes = [i for i in (text.find(tags.query[1]), answer_end) if i >= 0]
    kept = text[: min(closes)] if closes else text
    q_at, a_at = kept.rfind(tags.query[0]), kept.rfind(tags.answer[0])
    if q_at < 0 and a_at < 0:
        return kept, None, None
    if q_at > a_at:
        return kept, kept[q_at + len(tags.query[0]) :].strip(), None
    return kept, None, kept[a_at + len(tags.answer[0]) :].strip()


def read_strict(text: str, stop_reason: str, tags: Tags) -> tuple[str | None, str | None]:
    """(query, answer) of one output read as FlashRAG's ReasoningPipeline reads it (`strict`): the answer where
    the output stopped at the answer's closing tag (or, without that stop string, holds the answer tag), else
    the query where it stopped at the query's closing tag; both None: the output is the prediction."""
    opened = text.find(tags.answer[0])
    if stop_reason == tags.answer[1] if tags.stop_at_answer else opened >= 0:
        if opened < 0:
            return None, ""
        said = text[opened + len(tags.answer[0]) :]
        return None, (said if tags.stop_at_answer else said.split(tags.answer[1])[0]).strip()
    if stop_reason == tags.query[1] and tags.query[0] in text:
        return text[text.find(tags.query[0]) + len(tags.query[0]) :].strip(), None
    return None, None


@dataclass
class Rollout:
    """One question's reasoning so far, and what the row records about it."""

    q: Question
    p: SearchAgentParams
    tags: Tags
    template: PromptTemplate
    text: str = ""
    turns: int = 0
    queries: list[str] = field(default_factory=list)
    used: dict[str, Hit] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    think_tokens: int = 0
    answer_tokens: int = 0
    stop_reason: str = ""  # of the last output
    full: bool = False  # the last prompt did not fit the window (not run)
    last_fit: str = ""  # the rollout as the last turn that ran saw it

    def prompt(self) -> Any:
        return self.template.render(continuation=self.text, question=self.q.question, max_searches=self.p.max_searches)

    def generate(self, spec: SamplingSpec, stage: str) -> Generator[Request, Any, tuple[str, int]]:
        """The model continues the rollout: (text, completion tokens). Every turn after the first must fit the
        window with its max_tokens (pipeline/methods/window.py): `self.full` is set where it does not."""
        if self.turns:
            spec = fitting(spec)
        text = self.text
        said = yield from self.call(self.prompt(), self.template.chat, spec, stage)
        if not self.full:
            self.last_fit = text
        return said

    def call(self, prompt: Any, chat: bool, spec: SamplingSpec, stage: str) -> Generator[Request, Any, tuple[str, int]]:
        out = (yield Generate([prompt], sampling=spec, chat=chat, stage=stage))[0]
        self.stop_reason = out.stop_reason
        self.full = full(out)
        return out.text, out.completion_tokens

    def search(self, query: str) -> Generator[Request, Any, list[Hit]]:
        step = f"search-{len(self.queries) + 1}"
        hits = list((yield Retrieve([query], k=self.p.k, retriever=self.p.retriever, step=step, path="search"))[0])
        self.queries.append(query)
        self.used.update((h.id, h) for h in hits if h.id not in self.used)
        return hits

    def append_result(self, body: str, verbatim: bool = False) -> None:
        """The result block; `verbatim`: the body as formatted (passages in the template's `doc` format, whose
        line ends it keeps), else stripped."""
        self.text += f"\n\n{self.tags.result[0]}\n{body if verbatim else body.strip()}\n{self.tags.result[1]}\n\n"


# Turns the query's passages into the result block's text (Search-o1: the Reason-in-Documents call); sets the
# rollout's `full` where its own call did not fit the window.
Refine = Callable[[Rollout, str, list[Hit]], Generator[Request, Any, str]]


def plain_docs(r: Rollout, query: str, hits: list[Hit]) -> Generator[Request, Any, str]:
    """Search-R1: the passages themselves, as "Doc i (Title: t) text" lines (a given template: in its `doc`
    format, kept verbatim)."""
    return r.template.reference(hits) if r.p.template is not None else format_docs(hits)
    yield  # a generator that asks for nothing


def _strict_turn(r: Rollout, out: str, tokens: int) -> tuple[str | None, str | None, str]:
    """One turn read `strict`ly: (query, answer, why the rollout stops: "" while it goes on)."""
    query, said = read_strict(out, r.stop_reason, r.tags)
    r.text += (out + r.stop_reason).strip()  # FlashRAG's prompt + output.strip(), its stop string included
    if said is not None:
        r.answer_tokens += tokens
        return None, said, "answer"
    r.think_tokens += tokens
    if query is None:
        return None, out.strip(), "no action"
    return query, None, ""


def rollout(
    q: Question, p: SearchAgentParams, tags: Tags, template: PromptTemplate, refine: Refine, extra: dict
) -> Generator[Request, Any, Answer]:
    """Run the rollout to its answer; `extra` gets the row's record (refine may add to it)."""
    r = Rollout(q, p, tags, template, extra=extra)
    stops = (tags.query[1],) + ((tags.answer[1],) if tags.stop_at_answer else ())
    spec = SamplingSpec(max_tokens=p.turn_tokens, stop=stops)
    answer, stopped = None, "max_turns"
    while r.turns < p.max_turns:
        out, tokens = yield from r.generate(spec, "reason")
        if r.full:  # the next turn does not fit the window: the rollout ends as at its turn budget
            stopped = STOPPED
            break
        r.turns += 1
        if p.strict:
            query, answer, why = _strict_turn(r, out, tokens)
            if why:
                stopped = why
                break
            assert query is not None
            if not query:  # nothing to search: an empty block, as FlashRAG's search of no token finds nothing
                r.append_result("")
            elif len(r.queries) >= p.max_searches:
                r.append_result(LIMIT)
            else:
                hits = yield from r.search(query)
                body = yield from refine(r, query, hits)
                if r.full:
                    stopped = STOPPED
                    break
                r.append_result(body, verbatim=refine is plain_docs and bool(hits))
            continue
        kept, query, said = read_turn(out, tags)
        r.text += kept
        if said is not None:
            r.answer_tokens += tokens
            answer = extract_answer(said) or None
            stopped = "answer" if answer else "empty answer"
            break
        r.think_tokens += tokens
        if query is None:
            r.text += f"\n{tags.invalid}\n"
            continue
        r.text = r.text.rstrip() + f" {tags.query[1]}"
        if not query:
            r.append_result(NO_QUERY)
        elif len(r.queries) >= p.max_searches:
            r.append_result(LIMIT)
        else:
            hits = yield from r.search(query)
            body = yield from refine(r, query, hits)
            if r.full:  # Search-o1's Reason-in-Documents call does not fit: the rollout ends without this result
                stopped = STOPPED
                break
            r.append_result(body, verbatim=refine is plain_docs and bool(hits))
    forced = answer is None and not p.strict
    if forced:  # the answer tag (already written where the answer was empty) and a short answer after it
        if stopped != "empty answer":
            r.text = r.text.rstrip() + f"\n{tags.answer[0]}"
        forced_spec = SamplingSpec(max_tokens=FORCED_TOKENS, stop=(tags.answer[1], "\n"))
        said, tokens = yield from r.generate(forced_spec, "answer")
        if r.full:  # from the rollout as the last prompt that ran saw it (that prompt left a turn's room)
            r.text = r.last_fit.rstrip() + f"\n{tags.answer[0]}"
            said, tokens = yield from r.generate(forced_spec, "answer")
            said = "" if r.full else said
        r.answer_tokens += tokens
        answer = extract_answer(said)
    r.extra.update(
        turns=r.turns,
        searches=len(r.queries),
        queries=r.queries,
        think_tokens=r.think_tokens,
        answer_tokens=r.answer_tokens,
        stopped=stopped,
        answer_forced=forced,
    )
    return Answer(
        answer or "",
        r.text.strip(),
        used_docs=list(r.used.values()),
        retrieval_triggered=bool(r.queries),
        extra=r.extra,
    )
