"""The methods `dynrag bench flashrag --method NAME` compares: each dynrag method beside the FlashRAG 0.1.2
pipeline class that implements the same paper (search-r1 and search-o1: classes of FlashRAG's GitHub main,
0.3.0dev, installed with --flashrag-source), and how dynrag's parameters are set from what FlashRAG's
installed package says (its templates and its pipeline's defaults, dumped at run time by
`probe.py`: the project carries no copy of FlashRAG's prompts).

Both sides get the bench's k and max new tokens; where FlashRAG's class has a step budget (iterations,
thresholds), dynrag's method gets the same budget. `differs` says where the two sides cannot ask the same
prompts, or run the same steps, and why (None: FlashRAG's prompts on both sides, same step budget).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Dumped = dict[str, Any]  # {"templates": {name: PromptTemplate fields}, "defaults": {param: value}}


@dataclass(frozen=True)
class BenchMethod:
    name: str  # dynrag's method
    pipeline: str  # FlashRAG's pipeline class (flashrag.pipeline)
    params: Callable[[Dumped, int, int], dict[str, Any]]  # (dumped, k, max_new_tokens) -> dynrag params
    flashrag_kwargs: Callable[[int], dict[str, Any]] = lambda max_new: {}  # max_new_tokens -> class kwargs
    differs: str | None = None
    needs_source: bool = False  # FlashRAG's GitHub main has the class, PyPI's 0.1.2 does not
    flashrag_no_answer: str | None = None  # FlashRAG's prediction where its budget ran out; dynrag's is ""


def _flare(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    return {
        "k": k,
        "max_tokens": max(8, max_new),
        "prob_threshold": d["defaults"]["threshold"],
        "max_retrievals": d["defaults"]["max_iter_num"],
        "template": d["templates"]["prompt"],
        "keep_docs": False,
    }


def _ircot(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    return {
        "k": k,
        "max_steps": d["defaults"]["max_iter"],
        "sentence_tokens": max(4, max_new),
        "template": d["templates"]["prompt"],
    }


def _self_ask(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    # FlashRAG's max_iter counts generate calls, which alternate follow-up / intermediate answer
    return {
        "k": k,
        "max_follow_ups": (d["defaults"]["max_iter"] + 1) // 2,
        "step_tokens": max(4, max_new),
        "answer_tokens": max_new,
        "retrieve_question": bool(d["defaults"].get("single_hop", False)),
        "template": d["templates"]["head"],
        "answer_template": d["templates"]["standard"],
    }


def _iter_retgen(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    return {
        "k": k,
        "iterations": d["defaults"]["iter_num"],
        "max_tokens": max_new,
        "template": d["templates"]["prompt"],
    }


def _sure(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    steps = ("candidates", "summary", "validity", "rank")
    return {
        "k": k,
        "candidates": 2,
        "summary_tokens": max(8, max_new),
        "both_orders": True,
        "constrained": False,
        "templates": {s: d["templates"][s] for s in steps},
    }


def _reasoning(tags: Any, fields: dict[str, str]) -> Callable[[Dumped, int, int], dict[str, Any]]:
    """dynrag's search-r1 / search-o1 parameters against a FlashRAG ReasoningPipeline (its GitHub main): its
    instruction template (with `fields` renamed to dynrag's) whose `doc` formats the passages as its block of
    documents does, its turn budget (max_retrieval_num generate calls, as many searches), turns of max new
    tokens, and turns read as it reads them (`strict`). Its tags, stop strings and the lines around its block of
    documents must be dynrag's: else a MethodError says what differs, before any side runs."""
    from pipeline.methods.registry import MethodError

    def params(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
        defaults, result = d["defaults"], d["templates"]["result"]
        theirs = {
            "query": (defaults["begin_of_query_token"], defaults["end_of_query_token"]),
            "result": (defaults["begin_of_documents_token"], defaults["end_of_documents_token"]),
            "block": (result["head"], result["tail"]),
            **(
                {"answer": (defaults["begin_of_answer_token"], defaults["end_of_answer_token"])}
                if tags.stop_at_answer
                else {}
            ),
        }
        ours = {
            "answer": tags.answer,
            "query": tags.query,
            "result": tags.result,
            "block": (f"\n\n{tags.result[0]}\n", f"\n{tags.result[1]}\n\n"),
        }
        stops = {tags.query[1]} | ({tags.answer[1]} if tags.stop_at_answer else set())
        if not stops <= set(result["stop"]):
            raise MethodError(f"FlashRAG's stop strings {result['stop']} lack dynrag's {sorted(stops)}")
        for what in theirs:
            if tuple(theirs[what]) != ours[what]:
                raise MethodError(f"FlashRAG's {what} tags {theirs[what]!r} are not dynrag's {ours[what]!r}")
        template = dict(d["templates"]["prompt"])
        for theirs_name, ours_name in fields.items():
            template = {**template, **{f: template[f].replace(theirs_name, ours_name) for f in ("system", "user")}}
        budget = defaults["max_retrieval_num"]
        return {
            "k": k,
            "max_turns": budget,
            "max_searches": budget,
            "turn_tokens": max(4, max_new),
            "strict": True,
            "template": template,
        }

    return params


def _search_r1(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    from pipeline.methods.search_r1 import TAGS

    return _reasoning(TAGS, {})(d, k, max_new)


def _search_o1(d: Dumped, k: int, max_new: int) -> dict[str, Any]:
    from pipeline.methods.search_o1 import TAGS

    return {**_reasoning(TAGS, {"{MAX_SEARCH_LIMIT}": "{max_searches}"})(d, k, max_new), "refine_tokens": max_new}


METHODS: dict[str, BenchMethod] = {
    m.name: m
    for m in [
        BenchMethod("sr-rag", "SequentialPipeline", lambda d, k, max_new: {}),
        BenchMethod(
            "flare",
            "FLAREPipeline",
            _flare,
            lambda max_new: {"max_generation_length": max_new, "look_ahead_steps": max_new},
            differs="same prompt (FlashRAG's FLARE template, the answer so far starting the model's turn), "
            "threshold and budget (max_iter_num retrievals, max new tokens in all), and a retrieval serves "
            "the one sentence regenerated with it (keep_docs=false); dynrag accepts every confident "
            "sentence of one look-ahead and stops when the model ends its answer, FlashRAG looks ahead "
            "once per sentence for max_iter_num rounds even after the answer has ended; dynrag's query "
            "drops the low-probability words, FlashRAG's keeps the tokens above the threshold",
        ),
        BenchMethod(
            "ircot",
            "IRCOTPipeline",
            _ircot,
            differs="same prompt text (FlashRAG's IRCoT template) and step budget (max_iter); dynrag keeps the "
            "first sentence of each thought (the paper) where FlashRAG keeps the whole output, keeps the "
            "paragraphs in the order found where FlashRAG sorts them by score, and without an answer "
            "continues once from 'So the answer is:' (one more LLM call)",
        ),
        BenchMethod(
            "self-ask",
            "SelfAskPipeline",
            _self_ask,
            differs="same head prompt (FlashRAG's own, read from its pipeline, with its 'No.' written for the "
            "model) and, as FlashRAG's single_hop, the question's passages in it (retrieve_question); a "
            "follow-up the model still asks is answered by a separate RAG call on dynrag's side "
            "(FlashRAG's standard template), by the model itself over the follow-up's passages on "
            "FlashRAG's",
        ),
        BenchMethod(
            "iter-retgen",
            "IterativePipeline",
            _iter_retgen,
            differs="same prompts (FlashRAG's standard template) and iterations; dynrag's prediction is the "
            "answer extracted from the last generation, FlashRAG's the last generation itself",
        ),
        BenchMethod(
            "sure",
            "SuRePipeline",
            _sure,
            differs="same four prompts (FlashRAG's SuRe templates) and two candidates, no constrained "
            "decoding; dynrag asks validity and ranking for 4 new tokens, FlashRAG for max new tokens, "
            "and dynrag averages each pair's two orders where FlashRAG sums one score per order",
        ),
        BenchMethod(
            "search-r1",
            "SearchR1Pipeline",
            _search_r1,
            differs="same prompt (FlashRAG's Search-R1 instruction, its block of documents), tags, stop strings, "
            "turn budget (max_retrieval_num generate calls) and turns read as FlashRAG reads them (strict=true); "
            "dynrag's stop strings are </search> and </answer> (FlashRAG's also lists variants with spaces and "
            "newlines after them, which a generation reaches only through the bare tag, and end-of-text "
            "strings the end token covers); an empty query gets an empty block without a search on dynrag's "
            "side; where the budget runs out FlashRAG predicts 'No valid answer found', dynrag '' (counted "
            "alike); FlashRAG waits for every active rollout each round, dynrag's engine has no rounds",
            needs_source=True,
            flashrag_no_answer="No valid answer found",
        ),
        BenchMethod(
            "search-o1",
            "SimpleDeepSearcherPipeline",
            _search_o1,
            differs="FlashRAG has no Search-o1 pipeline; its closest, SimpleDeepSearcherPipeline (GitHub main), "
            "asks Search-o1's instruction with its search-query and search-result markers, a \\boxed{} answer "
            "and a search budget (max_retrieval_num), but puts the documents themselves into the chain: it has "
            "no Reason-in-Documents step, which dynrag's search-o1 runs (one more LLM call per search, "
            "refine_tokens = max new tokens) with its own prompt; same instruction (its MAX_SEARCH_LIMIT is "
            "dynrag's max_searches), turn budget and strict reading of turns; FlashRAG truncates a block of "
            "documents to 3,000 tokens",
            needs_source=True,
            flashrag_no_answer="No valid answer found",
        ),
    ]
}


def bench_method(name: str) -> BenchMethod:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r} for bench flashrag; known: {', '.join(METHODS)}")
    return METHODS[name]


def dynrag_params(name: str, dumped: Dumped | None, k: int, max_new_tokens: int) -> dict[str, Any]:
    """dynrag's method parameters for the bench, validated by the method (templates become PromptTemplates)."""
    from pipeline.methods.registry import get_method

    values = bench_method(name).params(dumped or {}, k, max_new_tokens)
    get_method(name).params(values)  # refuses a template field the method does not fill, before any side runs
    return values
