"""The methods `dynrag bench flashrag --method NAME` compares: each dynrag method beside the FlashRAG 0.1.2
pipeline class that implements the same paper, and how dynrag's parameters are set from what FlashRAG's
installed package says (its templates and its pipeline's defaults, dumped at run time by
`flashrag_probe.py`: the project carries no copy of FlashRAG's prompts).

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
