"""Search-o1 (Li et al., 2025, "Search-o1: Agentic Search-Enhanced Large Reasoning Models", arXiv
2501.05366), Sec. 3 (agentic search, the Reason-in-Documents module) and its QA instruction.

The model reasons freely and searches by writing <|begin_search_query|> query <|end_search_query|> (generation
stops there). The query's top-k documents do not enter the chain as they are: Reason-in-Documents, one extra
LLM call per search, reads the previous reasoning, the query and the documents and writes the information that
helps (after "Final Information"; "No helpful information found." when none does). That text goes between
<|begin_search_result|> and <|end_search_result|> and the model goes on. The answer is \\boxed{answer}, written
in a turn that runs to its end (no stop string). The instructions are ours, after the paper's (its Appendix
prompts); the rollout, its search budget and its fallbacks: `pipeline.methods.search_agent`.

Fallback of Reason-in-Documents (documented): an output without the "Final Information" marker is taken whole;
an empty one becomes "No helpful information found.".
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

from pydantic import Field, field_validator

from indexing import Hit
from pipeline.engine.requests import Answer, Question, Request, SamplingSpec
from pipeline.methods.registry import register_method
from pipeline.methods.search_agent import Rollout, SearchAgentParams, Tags, rollout
from pipeline.methods.templates import PromptTemplate, check_template

PAPER = "Search-o1 (Li et al., 2025, arXiv 2501.05366), Sec. 3"

TAGS = Tags(
    query=("<|begin_search_query|>", "<|end_search_query|>"),
    result=("<|begin_search_result|>", "<|end_search_result|>"),
    answer=("\\boxed{", "}"),
    stop_at_answer=False,
    invalid="To search I write <|begin_search_query|> query <|end_search_query|>; to answer, \\boxed{answer}.",
)
NOTHING = "No helpful information found."
FINAL_INFO = re.compile(r"\**\s*final\s+information\s*\**\s*:?", re.IGNORECASE)

DEFAULT_TEMPLATE = PromptTemplate(
    system="You are a reasoning assistant who can search to answer the user's question accurately. To search, "
    "write <|begin_search_query|> your query <|end_search_query|>. The system then searches, reads the documents "
    "found and gives you what helps, as <|begin_search_result|> ... <|end_search_result|>. You may search again "
    "when you need to, at most {max_searches} times. Once you know enough, go on reasoning to the answer.",
    user="Answer the question below. Think step by step, and give your final answer as \\boxed{{answer}}, a short "
    "answer without explanation.\n\nQuestion: {question}\n",
)
DEFAULT_REFINE_TEMPLATE = PromptTemplate(
    user="Read the documents found for the current search query and extract the information that helps answer "
    "it, so that the reasoning can continue.\n\nPrevious reasoning steps:\n{reasoning}\n\nCurrent search query:\n"
    '{query}\n\nDocuments:\n{reference}\n\nIf the documents help, write "Final Information" followed by the '
    'helpful information, concisely. If none helps, write "Final Information" followed by "No helpful '
    'information found."',
)


class SearchO1Params(SearchAgentParams):
    refine_tokens: int = Field(256, ge=4, le=8192, description="new tokens of a Reason-in-Documents call")
    refine_template: PromptTemplate | None = Field(
        None, description="Reason-in-Documents prompt; fields {reasoning} {query} {reference}; None: ours"
    )

    @field_validator("refine_template")
    @classmethod
    def _refine_fields(cls, v: PromptTemplate | None) -> PromptTemplate | None:
        check_template(v, {"reasoning", "query", "reference"}, "refine_template")
        return v


def final_information(text: str) -> str:
    """The text after the last "Final Information" marker, else all of it; NOTHING when empty."""
    found = list(FINAL_INFO.finditer(text))
    return (text[found[-1].end() :] if found else text).strip() or NOTHING


def reason_in_documents(r: Rollout, query: str, hits: list[Hit]) -> Generator[Request, Any, str]:
    """The extra call that condenses the documents (counted as `refine_tokens` in the row)."""
    p = r.p
    assert isinstance(p, SearchO1Params)
    if not hits:
        return NOTHING
    tpl = p.refine_template or DEFAULT_REFINE_TEMPLATE
    prompt = tpl.render(hits, reasoning=r.text.strip() or "(none)", query=query)
    spec = SamplingSpec(max_tokens=p.refine_tokens, fit=True)  # the rollout ends where it does not fit (search_agent)
    out, tokens = yield from r.call(prompt, tpl.chat, spec, "reason-in-documents")
    r.extra["refine_tokens"] = r.extra.get("refine_tokens", 0) + tokens
    return final_information(out)


@register_method(
    "search-o1",
    params=SearchO1Params,
    paper=PAPER,
    description="reason with search queries; Reason-in-Documents condenses each search's documents (1 extra call)",
)
def search_o1(q: Question, p: SearchO1Params) -> Generator[Request, Any, Answer]:
    return (yield from rollout(q, p, TAGS, p.template or DEFAULT_TEMPLATE, reason_in_documents, {"refine_tokens": 0}))
