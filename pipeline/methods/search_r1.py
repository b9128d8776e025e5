"""Search-R1 (Jin et al., 2025, "Search-R1: Training LLMs to Reason and Leverage Search Engines with
Reinforcement Learning", arXiv 2503.09516), Sec. 3 and Table 1.

The model reasons inside <think> ... </think>, searches with <search> query </search> (generation stops there;
the query's top-k passages come back between <information> and </information> and the model goes on), and
answers inside <answer> ... </answer>. The instruction is the paper's Table 1 template. It runs with any
instruct model; Search-R1's RL-trained checkpoints (`generation.model`: a local path or hub name, their chat
template applied by the generator) are the ones it is meant for. The rollout, its budgets and its fallbacks:
`pipeline.methods.search_agent`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pipeline.engine.requests import Answer, Question, Request
from pipeline.methods.registry import register_method
from pipeline.methods.search_agent import SearchAgentParams, Tags, plain_docs, rollout
from pipeline.methods.templates import PromptTemplate

PAPER = "Search-R1 (Jin et al., 2025, arXiv 2503.09516), Sec. 3, Table 1"

TAGS = Tags(
    query=("<search>", "</search>"),
    result=("<information>", "</information>"),
    answer=("<answer>", "</answer>"),
    stop_at_answer=True,
    # the correction Search-R1's rollout appends after an output with neither action
    invalid="My previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.",
)

# The paper's Table 1 instruction.
DEFAULT_TEMPLATE = PromptTemplate(
    user="Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search>, and it will return the top searched results between <information> and "
    "</information>. You can search as many times as you want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer> without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Question: {question}\n"
)


@register_method(
    "search-r1",
    params=SearchAgentParams,
    paper=PAPER,
    description="reason in <think>, search with <search> (stop, retrieve, <information>), answer in <answer>",
)
def search_r1(q: Question, p: SearchAgentParams) -> Generator[Request, Any, Answer]:
    return (yield from rollout(q, p, TAGS, p.template or DEFAULT_TEMPLATE, plain_docs, {}))
