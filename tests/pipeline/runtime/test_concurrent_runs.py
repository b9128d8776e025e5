"""An experiment's runs answered together through one engine (run_methods, answer.runs=concurrent) write the
same rows per run as one after another and as each alone; they resume per run; the retrieval cache serves
repeated queries across runs and rounds with the same hits, and each row counts its hits."""

from __future__ import annotations

import json
import re

import pytest
from engine_fixtures import PASSAGES, BatchGenerator
from fakes import MemoryRetriever
from on_disk import assert_each_question_once

from jobs.bench.rig.simulated import SimGenerator
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.search_cache import SearchCache
from pipeline.evaluation.experiment import MethodRun, run_methods
from pipeline.io.output import read_rows

RUNS = [
    MethodRun("sr-rag", "sr-rag", {"k": 2}),
    MethodRun("iter-retgen", "iter-retgen", {"k": 2}),
    MethodRun("flare", "flare", {}),
    MethodRun("self-ask", "self-ask", {}),
    MethodRun("ircot", "ircot", {}),
    MethodRun("sure", "sure", {}),
]
# what differs between orders by design: timing, the run id, and which queries the cache already held
VARIES = ("run_id", "latency_s", "finished_at", "retrieval_cache_hits")


class CountingBatches(BatchGenerator):
    """The simulated generator behind a batch-only interface, recording each call's prompts."""

    def __init__(self):
        super().__init__()
        self.calls: list[int] = []

    def generate(self, prompts, samplings, chats):
        self.calls.append(len(prompts))
        return super().generate(prompts, samplings, chats)


class CountingRetriever(MemoryRetriever):
    """MemoryRetriever that also counts the queries it searched."""

    def search(self, queries, k, retriever="bm25"):
        self.searched = getattr(self, "searched", 0) + len(queries)
        return super().search(queries, k, retriever)


def questions(path, n: int = 6):
    qs = [
        {"id": f"q{i}", "question": f"Who directed the film Jaws number {i}?", "answers": ["Steven Spielberg"]}
        if i % 2
        else {"id": f"q{i}", "question": f"What is the capital of France {i}?", "answers": ["Paris"]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(q) + "\n" for q in qs))
    return path


def answer(
    tmp_path, out, *, runs=RUNS, order="concurrent", cache=100_000, generator=SimGenerator, limit=None, admit="runs"
):
    cfg = DynragConfig()
    cfg.answer.runs, cfg.answer.retrieval_cache, cfg.answer.progress = order, cache, False
    cfg.answer.admission_order = admit
    cfg.dataset.format = "generic"
    retriever = CountingRetriever(PASSAGES)
    gen = generator()
    backends = Backends(cfg, generator=gen, retriever=retriever)
    try:
        summaries = run_methods(
            str(questions(tmp_path / "q.jsonl")), None, runs, cfg, out, limit=limit, backends=backends
        )
    finally:
        backends.close()
    return summaries, retriever, gen


def rows(out, label) -> dict[str, dict]:
    got = {}
    for r in read_rows(str(out / label)).to_pylist():
        for key in [k for k in r if k.startswith("time_")] + list(VARIES):
            r.pop(key)
        for d in r["retrieved"]:
            d.pop("at_s")
        got[r["question_id"]] = r
    return got


def test_concurrent_runs_write_the_rows_of_sequential_runs_and_of_each_run_alone(tmp_path):
    together, _, gen = answer(tmp_path, tmp_path / "together", generator=CountingBatches)
    in_turn, _, _ = answer(tmp_path, tmp_path / "in-turn", order="sequential")
    assert [s["label"] for s in together] == [r.label for r in RUNS]
    assert all(s["new_rows"] == 6 and s["errors"] == 0 for s in together + in_turn)
    for r in RUNS:
        alone, _, _ = answer(tmp_path, tmp_path / f"alone-{r.label}", runs=[r])
        assert rows(tmp_path / "together", r.label) == rows(tmp_path / "in-turn", r.label)
        assert rows(tmp_path / "together", r.label) == rows(tmp_path / f"alone-{r.label}", r.label)
    # one engine served them: a generate call held more prompts than one run's 6 questions ever make at once
    assert max(gen.calls) > 6


class QuestionOrder(CountingBatches):
    """Records, per generate call, the number of the question each prompt asks."""

    def __init__(self):
        super().__init__()
        self.asked: list[list[int]] = []

    def generate(self, prompts, samplings, chats):
        self.asked.append([int(re.findall(r"(?:number|France) (\d+)\?", str(p))[-1]) for p in prompts])
        return super().generate(prompts, samplings, chats)


def test_concurrent_runs_are_admitted_question_by_question_with_admission_order_questions(tmp_path, caplog):
    """Every run's first question, then every run's second: a question's runs are in flight together, whatever
    order the runs' threads put their questions in (first in, first out admitted one run's six before the next's)."""
    with caplog.at_level("INFO", logger="pipeline.engine.continuous"):
        _, _, gen = answer(tmp_path, tmp_path / "together", generator=QuestionOrder, admit="questions")
    assert "sources came within" not in caplog.text  # every run's questions came and were known: no wait ran out
    assert all(asked == sorted(asked) for asked in gen.asked)  # each call's prompts by their question's turn
    assert max(map(len, gen.asked)) > 6  # a call held several runs' prompts (first in, first out: run by run)


def test_concurrent_runs_resume_each_run_on_its_own(tmp_path):
    out = tmp_path / "exp"
    answer(tmp_path, out, runs=RUNS[:1], limit=3)  # one run answered its first 3 questions before
    first = answer(tmp_path, out, runs=RUNS[:3], limit=3)[0]
    assert [(s["new_rows"], s["skipped_already_answered"]) for s in first] == [(0, 3), (3, 0), (3, 0)]
    second = answer(tmp_path, out, runs=RUNS[:3], limit=5)[0]
    assert [(s["new_rows"], s["skipped_already_answered"]) for s in second] == [(2, 3)] * 3
    assert all(len(rows(out, r.label)) == 5 for r in RUNS[:3])
    assert all(s["new_rows"] == 0 for s in answer(tmp_path, out, runs=RUNS[:3], limit=5)[0])


@pytest.mark.parametrize("order", ["concurrent", "sequential"])
def test_the_retrieval_cache_gives_the_same_hits_and_rows_count_them(tmp_path, order):
    cached, ret, _ = answer(tmp_path, tmp_path / "cached", order=order)
    plain, ret0, _ = answer(tmp_path, tmp_path / "plain", order=order, cache=0)
    for r in RUNS:
        assert rows(tmp_path / "cached", r.label) == rows(tmp_path / "plain", r.label)
    hits = {
        r.label: [x["retrieval_cache_hits"] for x in read_rows(str(tmp_path / "cached" / r.label)).to_pylist()]
        for r in RUNS
    }
    calls = sum(x["retrieval_calls"] for r in RUNS for x in read_rows(str(tmp_path / "plain" / r.label)).to_pylist())
    assert ret0.searched == calls  # no cache: every query searched
    assert ret.searched == calls - sum(map(sum, hits.values()))  # each hit is a search saved
    assert sum(map(sum, hits.values())) > 0
    assert all(s["retrieval_cache_hit_rate"] in (0.0, None) for s in plain)  # None: a run that never retrieved
    if order == "sequential":  # iter-retgen's first query is the question sr-rag searched before it
        assert cached[1]["retrieval_cache_hit_rate"] >= 1 / 3


def test_a_second_run_of_the_same_queries_is_served_by_the_cache(tmp_path):
    twice = [MethodRun("a", "sr-rag", {"k": 2}), MethodRun("b", "sr-rag", {"k": 1})]
    summaries, ret, _ = answer(tmp_path, tmp_path / "out", runs=twice, order="sequential")
    assert ret.searched == 6  # the second run (k=1 <= 2) searched nothing
    assert [s["retrieval_cache_hit_rate"] for s in summaries] == [0.0, 1.0]
    assert [len(r["retrieved"]) for r in rows(tmp_path / "out", "b").values()] == [1] * 6


def test_search_cache_keys_and_prefixes():
    cache = SearchCache(2)
    cache.put(("idx", 1, "s"), "bm25", "q", 3, ["a", "b", "c"])
    assert cache.get(("idx", 1, "s"), "bm25", "q", 2) == ["a", "b"]  # a smaller k: the first hits
    assert cache.get(("idx", 1, "s"), "bm25", "q", 4) is None  # a larger k was never searched
    assert cache.get(("idx", 2, "s"), "bm25", "q", 1) is None  # another index version
    assert cache.get(("idx", 1, "s"), "dense", "q", 1) is None  # another retriever
    assert cache.get(("idx", 1, "t"), "bm25", "q", 1) is None  # other search settings
    cache.put(("idx", 1, "s"), "bm25", "q2", 1, ["x"])
    cache.put(("idx", 1, "s"), "bm25", "q3", 1, ["y"])  # beyond 2 entries: the least recently used goes
    assert cache.get(("idx", 1, "s"), "bm25", "q", 1) is None and len(cache) == 2


def test_generation_streaming_auto_batches_only_where_every_method_makes_one_call(monkeypatch):
    import pipeline.backends.vllm_gen as vllm_gen
    import pipeline.backends.vllm_stream as vllm_stream
    from pipeline.backends import make_generator, streams
    from pipeline.methods.registry import all_methods, all_one_call

    one_call = {name for name, spec in all_methods().items() if spec.one_call}
    assert one_call == {"no-retrieval", "sr-rag", "bm25", "sm", "qdc", "cis", "cfs"}
    assert all_one_call(["sr-rag"]) and all_one_call(["sr-rag", "cfs"])
    assert not all_one_call(["sr-rag", "flare"]) and not all_one_call(["iter-retgen"])
    assert not all_one_call([])  # methods not known
    cfg = DynragConfig()
    assert cfg.generation.streaming == "auto"
    assert not streams(cfg, one_call=True) and streams(cfg, one_call=False)
    cfg.generation.streaming = True
    assert streams(cfg, one_call=True)
    cfg.generation.streaming = False
    assert not streams(cfg, one_call=False)

    monkeypatch.setattr(vllm_gen, "VllmGenerator", lambda cfg: "batched")
    monkeypatch.setattr(vllm_stream, "VllmStreamingGenerator", lambda cfg: "streaming")
    cfg = DynragConfig()
    cfg.generation.backend = "vllm"
    assert make_generator(cfg, one_call=True) == "batched"
    assert make_generator(cfg) == "streaming"
    assert Backends(cfg, one_call=all_one_call(["sr-rag", "bm25"])).generator == "batched"


def test_a_drained_concurrent_experiment_resumes_each_run_where_it_stopped(tmp_path, monkeypatch):
    import pipeline.engine.drain as drain_module
    from pipeline.runtime.signals import Interrupted

    drains: list = []

    class Kept(drain_module.Drain):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            drains.append(self)

    class DrainsMidway(CountingBatches):
        def generate(self, prompts, samplings, chats):
            if sum(self.calls) >= 12 and drains:  # a SIGTERM once some prompts are done: drain now
                drains[-1].request(0.0)
            return super().generate(prompts, samplings, chats)

    monkeypatch.setattr(drain_module, "Drain", Kept)
    out, runs = tmp_path / "exp", RUNS[:3]
    with pytest.raises(Interrupted):
        answer(tmp_path, out, runs=runs, generator=DrainsMidway)
    before = {r.label: len(rows(out, r.label)) if (out / r.label / "parts").is_dir() else 0 for r in runs}
    assert sum(before.values()) < 18  # stopped before every question had its row
    again = answer(tmp_path, out, runs=runs)[0]
    assert [s["new_rows"] + s["skipped_already_answered"] for s in again] == [6, 6, 6]
    assert [s["skipped_already_answered"] for s in again] == [before[r.label] for r in runs]
    assert all(s["rows"] == 6 for s in again)
    for r in runs:
        assert_each_question_once(out / r.label, 6)  # as pyarrow counts parts/


def test_bench_experiment_answers_the_runs_together_with_the_predictions_of_one_after_another():
    """`dynrag bench experiment --simulate-gpu` at a twentieth of the latency model's time: the same predictions
    per run in both modes, and the concurrent mode's engine held more sequences at once than one run ever has
    questions (impossible one run after another) in fewer decode steps."""
    from jobs.bench.experiment import METHODS, bench_experiment
    from jobs.bench.pipeline import DEFAULTS
    from jobs.bench.rig.simulated import PREFILL_PER_S, RUNNING_S, STEP_S
    from pipeline.config import load_config

    n = 6
    f = bench_experiment(load_config(None, DEFAULTS), list(METHODS), n, 0.05)
    conc, seq = f["modes"]["concurrent"], f["modes"]["sequential"]
    assert f["same_as_alone"] and f["same_as_alone_per_run"] == {m: f"{n}/{n}" for m in METHODS}
    assert f["questions"] == n * len(METHODS)
    assert all(p["rows"] == n and p["errors"] == 0 for w in (conc, seq) for p in w["per_run"].values())
    assert (conc["llm_calls"], conc["prompt_tokens"]) == (seq["llm_calls"], seq["prompt_tokens"])
    assert seq["max_running"] <= n < conc["max_running"]
    assert conc["decode_steps"] < seq["decode_steps"] and conc["mean_running"] > seq["mean_running"]
    assert f["ratio_vs_sequential"] == round(seq["seconds"] / conc["seconds"], 2)
    # the modelled seconds are the steps' costs, whatever the sleeps; no step serves two of a question's calls
    for w in (conc, seq):
        uncached = w["prompt_tokens"] - w["cached_prompt_tokens"]
        costs = STEP_S * w["decode_steps"] + RUNNING_S * w["completion_tokens"] + uncached / PREFILL_PER_S
        assert w["model_s"] == pytest.approx(costs, abs=0.01)
        assert 0 < w["longest_program_tokens"] <= w["decode_steps"]
    assert 1 < f["model_ratio_vs_sequential"] <= f["model_ratio_bound"]
    hits = f["retrieval_cache_hit_rate"]["sequential"]
    assert hits["sr-rag"] == 0.0 and hits["iter-retgen"] > 0  # its first query: the question sr-rag searched before
