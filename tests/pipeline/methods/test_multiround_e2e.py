"""End to end: IRCoT, Self-Ask, ITER-RETGEN, SuRe, Search-R1 and Search-o1 answer HotpotQA dev questions over their own paragraphs
(BM25) on the tiny random-weight model through one vLLM engine shared by the module; every row is checked
against its own record of steps, calls, tokens and stage times."""

from __future__ import annotations

import json

import polars as pl
import pytest
from engine_fixtures import HOTPOT, build_hotpot_index

from pipeline.backends import Backends
from pipeline.runtime.answer import run_answer

N = 6  # questions per method
INDEXED = 15  # the fixture kit's HotpotQA dev questions, whose paragraphs make the index

METHODS = {  # short outputs and few steps: the random model never writes an answer marker on its own
    "ircot": {"k": 2, "max_steps": 2, "sentence_tokens": 8},
    "self-ask": {"k": 2, "max_follow_ups": 1, "step_tokens": 8, "answer_tokens": 4},
    "iter-retgen": {"k": 2, "iterations": 2, "max_tokens": 8},
    "sure": {"k": 3, "summary_tokens": 8},
    "search-r1": {"k": 2, "max_turns": 2, "turn_tokens": 8},
    "search-o1": {"k": 2, "max_turns": 2, "turn_tokens": 8, "refine_tokens": 4},
    "adaptive-rag": {"k": 2, "max_steps": 2},  # and the classifier trained below
}


@pytest.fixture(scope="module")
def hotpot_index(data_dir, tmp_path_factory):
    return build_hotpot_index(data_dir, tmp_path_factory, INDEXED)


@pytest.fixture(scope="module")
def complexity_clf(data_dir, tmp_path_factory) -> str:
    from pipeline.classifier.complexity import train_complexity
    from pipeline.config import DynragConfig

    cfg, out = DynragConfig(), tmp_path_factory.mktemp("clf") / "complexity"
    cfg.paths.data_dir = str(data_dir)
    train_complexity(cfg, out, per_dataset=20)
    return str(out)


@pytest.fixture(scope="module")
def answered(data_dir, hotpot_index, tiny_cfg, tiny_vllm, complexity_clf, tmp_path_factory):
    """Every method's rows and summary, from the session's vLLM engine."""
    out = {}
    backends = Backends(tiny_cfg, str(hotpot_index), generator=tiny_vllm)
    for method, params in METHODS.items():
        params = {**params, "classifier": complexity_clf} if method == "adaptive-rag" else params
        cfg = tiny_cfg.model_copy(deep=True)
        cfg.method.name, cfg.method.params = method, params
        folder = tmp_path_factory.mktemp(method)
        summary = run_answer(
            str(data_dir / HOTPOT),
            str(folder),
            index=str(hotpot_index),
            method=method,
            limit=N,
            cfg=cfg,
            backends=backends,
        )
        out[method] = (summary, pl.read_parquet(f"{folder}/parts/*.parquet"))
    return out


def _common(summary, df, method):
    assert summary["rows"] == N and summary["errors"] == 0, summary
    assert df.height == N and df["error"].null_count() == N and set(df["method"]) == {method}
    for r in df.iter_rows(named=True):
        assert r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 and r["time_generation_s"] > 0
        assert r["time_total_s"] >= r["time_generation_s"] + r["time_retrieval_s"] - 1e-9
        assert len(r["generations"]) == r["llm_calls"]
        rounds = sorted({d["round"] for d in r["retrieved"]})
        assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) <= r["retrieval_calls"]
        if r["retrieval_calls"] > r["retrieval_cache_hits"]:  # a query the retrieval cache held costs no search
            assert r["time_retrieval_s"] > 0
        yield r, json.loads(r["extra"])


def test_ircot_rows(answered):
    summary, df = answered["ircot"]
    for r, ex in _common(summary, df, "ircot"):
        assert r["retrieval_calls"] == len(ex["queries"]) >= 1 and ex["steps"] == len(ex["cot"]) <= 2
        assert r["llm_calls"] == ex["steps"] + ex["answer_forced"] + (ex["stopped"] == "empty")
        assert {d["step"] for d in r["retrieved"]} <= {"step-0", "step-1"}
        assert r["passages_in_prompt"] == ex["paragraphs"] == len({d["id"] for d in r["retrieved"]})
        assert r["raw_output"] == " ".join(ex["cot"])


def test_self_ask_rows(answered):
    summary, df = answered["self-ask"]
    for r, ex in _common(summary, df, "self-ask"):
        follow = len(ex["follow_ups"])
        assert r["retrieval_calls"] == follow <= 1 and r["retrieval_triggered"] is (follow > 0)
        assert r["llm_calls"] == 1 + 2 * follow + ex["answer_forced"]


def test_iter_retgen_rows(answered):
    summary, df = answered["iter-retgen"]
    for r, ex in _common(summary, df, "iter-retgen"):
        assert r["llm_calls"] == r["retrieval_calls"] == 2 and ex["queries"][0] == r["question"]
        assert [g["stage"] for g in r["generations"]] == ["iter-1", "iter-2"]
        assert {d["step"] for d in r["retrieved"]} == {"iter-1", "iter-2"}
        last = {d["id"] for d in r["retrieved"] if d["round"] == 2}
        assert {d["id"] for d in r["retrieved"] if d["kept"]} == last and r["passages_in_prompt"] == len(last)
    assert summary["backend_batch_calls"]["generate"] == 2  # one batched generate per iteration for all N


def test_sure_rows(answered):
    summary, df = answered["sure"]
    for r, ex in _common(summary, df, "sure"):
        cands = ex["candidates"]
        # constrained decoding holds even a random model to "(a) .., (b) ..", "True/False", "Summary 1/2"
        assert ex["candidates_parsed"] and 1 <= len(cands) <= 2 and r["prediction"] in cands
        assert r["retrieval_calls"] == 1 and all(d["kept"] for d in r["retrieved"])
        if len(cands) == 2:
            assert r["llm_calls"] == 1 + 2 + 2 + 2 and set(ex["validity"]) <= {0, 1}
            assert sum(ex["ranking"]) == 1.0 and r["prediction"] == cands[ex["best"]]


@pytest.mark.parametrize("method", ["search-r1", "search-o1"])
def test_search_agent_rows(answered, method):
    summary, df = answered[method]
    for r, ex in _common(summary, df, method):
        assert 1 <= ex["turns"] <= 2 and r["retrieval_calls"] == ex["searches"] == len(ex["queries"])
        refines = [g for g in r["generations"] if g["stage"] == "reason-in-documents"]
        assert r["llm_calls"] == ex["turns"] + ex["answer_forced"] + len(refines)
        assert len(refines) == (ex["searches"] if method == "search-o1" else 0)
        assert ex["think_tokens"] + ex["answer_tokens"] + ex.get("refine_tokens", 0) == r["completion_tokens"]
        assert ex["stopped"] in {"answer", "empty answer", "max_turns"}


def test_adaptive_rag_rows(answered, whole_kit):
    summary, df = answered["adaptive-rag"]
    routes = []
    for r, ex in _common(summary, df, "adaptive-rag"):
        routes.append(ex["route"])
        assert 0.33 < ex["route_probability"] <= 1
        if ex["route"] == "B":
            assert r["retrieval_calls"] == 1 and r["llm_calls"] == 1
        elif ex["route"] == "C":  # IRCoT's own record follows the route
            assert r["retrieval_calls"] == len(ex["queries"]) >= 1 and ex["steps"] <= 2
        else:
            assert r["retrieval_calls"] == 0
    assert set(routes) <= {"A", "B", "C"}
    if whole_kit:  # trained on the whole kit, it sends HotpotQA (multi-hop) questions to C; the
        assert "C" in routes  # fixture kit's few questions need not teach it that
