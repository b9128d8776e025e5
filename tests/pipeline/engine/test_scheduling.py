"""answer.scheduling=program (issue 62): each model call ranked by its question's admission order, in the engine's
batches and in the generator's queue; and the latency model's KV cache (jobs/bench/rig/kv_model.py), checked on worked
examples. vLLM's own priority scheduling runs in test_vllm_streaming."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from jobs.bench.rig.kv_model import PrefixCache
from jobs.bench.rig.simulated import SimGenerator
from pipeline.backends import Backends
from pipeline.backends.vllm_gen import llm_kwargs
from pipeline.config import DynragConfig
from pipeline.engine.admission import FIRST_FOOTPRINT, KvBudget, call_size
from pipeline.engine.continuous import ContinuousEngine, make_engine
from pipeline.engine.core import Engine
from pipeline.engine.requests import Answer, Completion, Generate, Question, SamplingSpec
from pipeline.engine.streaming import resolved

QUESTIONS = [Question(str(i), f"question {i}") for i in range(5)]


def two_rounds(q: Question, params):
    first = (yield Generate([f"{q.id} round 1"], SamplingSpec(max_tokens=2)))[0]
    second = (yield Generate([f"{q.id} round 2 after {first.text}"], SamplingSpec(max_tokens=2)))[0]
    return Answer(second.text)


def completion(prompt: str) -> Completion:
    return Completion(f"<{prompt.split()[0]}>", prompt_tokens=3, completion_tokens=1, finish_reason="stop")


class Recorder:
    """A generator recording each prompt with its priority: `calls` (batch `generate`) or `submitted` (streaming)."""

    def __init__(self):
        self.calls: list[list[tuple[str, int]]] = []
        self.submitted: list[tuple[str, int]] = []

    def generate(self, prompts, samplings, chats):
        self.calls.append([(p, s.priority) for p, s in zip(prompts, samplings)])
        return [completion(p) for p in prompts]


class StreamRecorder(Recorder):
    def submit(self, prompt, sampling, chat) -> Future:
        self.submitted.append((prompt, sampling.priority))
        return resolved(completion(prompt))


@pytest.mark.parametrize("scheduling", ["fcfs", "program"])
def test_each_prompt_carries_its_questions_admission_order_under_program_scheduling(scheduling):
    gen = StreamRecorder()
    eng = ContinuousEngine(Backends(DynragConfig(), generator=gen), batch_wait_s=0.001, scheduling=scheduling)
    try:
        out = eng.run(QUESTIONS, two_rounds, None)
    finally:
        eng.close()
    assert [o.answer.prediction for o in out] == [f"<{q.id}>" for q in QUESTIONS]
    assert len(gen.submitted) == 10
    for prompt, priority in gen.submitted:
        assert priority == (int(prompt.split()[0]) if scheduling == "program" else 0)


@pytest.mark.parametrize("scheduling, second", [("fcfs", ["2", "3"]), ("program", ["0", "1"])])
def test_a_batch_takes_the_earliest_admitted_questions_next_round_first(scheduling, second):
    """Batches of 2 prompts: while the first batch (questions 0 and 1) runs, questions 2-4 wait; the next batch is
    2 and 3 first come first served, or the next rounds of 0 and 1 by program."""
    gen = Recorder()
    eng = ContinuousEngine(
        Backends(DynragConfig(), generator=gen), batch_wait_s=0.001, caps={"generate": 2}, scheduling=scheduling
    )
    try:
        out = eng.run(QUESTIONS, two_rounds, None)
    finally:
        eng.close()
    assert [o.answer.prediction for o in out] == [f"<{q.id}>" for q in QUESTIONS]
    assert [p.split()[0] for p, _ in gen.calls[0]] == ["0", "1"]
    assert [p.split()[0] for p, _ in gen.calls[1]] == second
    assert sorted(p for call in gen.calls for p, _ in call) == sorted(
        [f"{q.id} round 1" for q in QUESTIONS] + [f"{q.id} round 2 after <{q.id}>" for q in QUESTIONS]
    )


def test_kv_budget_worked_example():
    """Capacity 4,000 tokens, filled to 3,600. Until a question has finished, one not counted yet counts
    FIRST_FOOTPRINT (1,024) tokens; then the mean of the finished questions' largest footprints; a finished
    question's tokens are free again."""
    kv = KvBudget(4000)
    assert kv.room == 3600 and kv.estimate() == FIRST_FOOTPRINT == 1024
    assert kv.admits(2) and not kv.admits(3)  # 3 x 1,024 fit in 3,600; 4 do not
    kv.record(0, 1200)
    kv.record(1, 1200)
    assert kv.admits(2)  # 1,200 + 1,200 held, and 1,024 for the new one: 3,424
    assert not kv.admits(3)  # one live question not yet generated counts 1,024 more
    kv.record(0, 2000)  # question 0's next round: its latest call is what it holds
    assert kv.held == {0: 2000, 1: 1200} and not kv.admits(2)
    kv.record(0, 900)  # a smaller last call: it holds 900, but it came to hold 2,000
    kv.release(0)
    assert kv.estimate() == 2000 and kv.admits(1) and not kv.admits(2)  # 1,200 + 2,000; + 2,000 more: 5,200
    unbounded = KvBudget(None)
    assert unbounded.admits(10_000)
    assert KvBudget(1).admits(0)  # one question always runs


class BoundedRecorder(StreamRecorder):
    """A streaming generator with a KV cache of `capacity` tokens, each call leaving 500 (400 prompt, 100 output), of
    which `cached` prompt tokens it finds in the prefix cache."""

    def __init__(self, capacity, cached: int = 0):
        super().__init__()
        self.capacity, self.cached = capacity, cached

    def kv_capacity(self):
        return self.capacity

    def submit(self, prompt, sampling, chat) -> Future:
        done = Completion(
            f"<{prompt.split()[0]}>",
            prompt_tokens=400,
            completion_tokens=100,
            finish_reason="stop",
            cached_prompt_tokens=self.cached,
        )
        return resolved(done)


class LiveCounter:
    """`program` (default `two_rounds`), counting the programs started and not yet returned: `at_start` has that
    count as each starts."""

    def __init__(self, program=None):
        self.live, self.at_start, self.program = 0, [], program or two_rounds

    def __call__(self, q: Question, params):
        self.live += 1
        self.at_start.append(self.live)
        try:
            return (yield from self.program(q, params))
        finally:
            self.live -= 1


def run_bounded(
    program: LiveCounter, n: int, capacity: int | None = 4600, scheduling: str = "program", cfg=None, cached: int = 0
) -> list:
    """`n` questions through a continuous engine over a BoundedRecorder of `capacity` KV tokens (`cached`: the
    prompt tokens each call finds in the prefix cache)."""
    gen = BoundedRecorder(capacity, cached)
    backends = Backends(cfg or DynragConfig(), generator=gen)
    eng = ContinuousEngine(backends, batch_wait_s=0.001, scheduling=scheduling)
    try:
        return eng.run([Question(str(i), f"question {i}") for i in range(n)], program, None)
    finally:
        eng.close()


@pytest.mark.parametrize("scheduling, capacity", [("program", 4600), ("fcfs", 4600), ("program", None)])
def test_admission_is_held_while_the_live_questions_fill_the_kv_cache(scheduling, capacity):
    """Room for 4,140 tokens: under program scheduling the first 4 start (1,024 tokens each assumed), then, each
    question holding 500 after its first round, at most 8 are in flight; under fcfs, or with no capacity
    known, all 40 at once."""
    program = LiveCounter()
    out = run_bounded(program, 40, capacity, scheduling)
    assert [o.answer.prediction for o in out] == [f"<{i}>" for i in range(40)]  # everyone answered, in any case
    counts = program.at_start
    assert len(counts) == 40 and program.live == 0
    if scheduling == "program" and capacity:
        assert counts[:4] == [1, 2, 3, 4]
        assert max(counts[4:]) == 8
    else:
        assert max(counts) == 40


def test_a_question_with_a_call_out_counts_that_calls_estimated_size():
    """While a call is waiting or running, its question counts its prompts' characters / 4 and its max_tokens (the
    share of them returned calls wrote, once one has returned) where that is more than its last call left; the
    call's return replaces the estimate with what it left."""
    kv = KvBudget(4000)
    call = Generate(["x" * 2000, [{"role": "user", "content": "y" * 400}]], SamplingSpec(max_tokens=50))
    assert call_size(call) == (600, 2 * 50)
    kv.record(0, 500)
    kv.expect(0, call_size(call))  # no call has returned: all of its max_tokens
    assert kv.admits(2) and not kv.admits(3)  # 700 + 2 x 1,024 = 2,748; one more: 3,772
    kv.expect(1, (10, 0))  # a question whose small first call is out counts the estimate (1,024) still
    assert kv.admits(2) and not kv.admits(3)
    kv.expect(0, (100, 0))  # a smaller call out: the question counts what its last call left (500)
    assert kv.admits(3)  # 500 + 1,024 + 2 x 1,024 = 3,572
    kv.record(0, 650)  # the call returned: what it left
    assert kv.out == {1: 10} and kv.held == {0: 650}
    kv.wrote(50, 100)  # it wrote 50 of its 100
    kv.wrote(250, 200)  # one that wrote past its max_tokens counts them all
    kv.wrote(5, 0)  # one without a max_tokens teaches nothing
    assert kv.completion_share() == 250 / 300
    kv.expect(0, (1000, 600))
    assert kv.out[0] == 1000 + 500


def long_second_round(q: Question, params):
    first = (yield Generate([f"{q.id} round 1"]))[0].text
    return Answer((yield Generate([f"{q.id} round 2 " + "z" * 4000]))[0].text or first)


def test_admission_counts_a_question_by_the_call_it_has_out():
    """Room for 4,140 tokens. Each question's second prompt is about 1,000 tokens: counted at that size while it is
    out, and the finished questions' largest footprint estimating the next ones, at most 4 are in flight (counted
    by the 500 their first call left, 8 were)."""
    program = LiveCounter(long_second_round)
    out = run_bounded(program, 20)
    assert len(out) == 20 and program.live == 0 and max(program.at_start) == 4


def generous_rounds(q: Question, params):
    """Two rounds, each given max_tokens 1,000 (BoundedRecorder writes 100 of them)."""
    first = (yield Generate([f"{q.id} round 1"], SamplingSpec(max_tokens=1000)))[0].text
    return Answer((yield Generate([f"{q.id} round 2"], SamplingSpec(max_tokens=1000)))[0].text or first)


def test_a_call_out_counts_the_share_of_its_max_tokens_that_calls_wrote():
    """Room for 4,140 tokens; each call given 1,000 max_tokens writes 100. Counted whole, a call out is 1,000 and
    more tokens, and at most 4 questions are in flight (as the engine did before it counted that share); counted by
    the share calls wrote (0.1), each holds the 500 its first call left, and as finished questions' footprints bring
    the estimate down, 7 are (the first 4 were counted at 1,010 before a call returned: 8 would need more to end)."""
    program = LiveCounter(generous_rounds)
    out = run_bounded(program, 40)
    assert len(out) == 40 and program.live == 0 and max(program.at_start) >= 7


def default_rounds(q: Question, params):
    """Two rounds that leave max_tokens to the generator (None)."""
    first = (yield Generate([f"{q.id} round 1"]))[0].text
    return Answer((yield Generate([f"{q.id} round 2"]))[0].text or first)


@pytest.mark.parametrize("max_new_tokens, most", [(3000, 1), (16, 8)])
def test_a_call_that_leaves_max_tokens_to_the_generator_counts_what_the_generator_gives_it(max_new_tokens, most):
    """Room for 4,140 tokens; calls with max_tokens None get generation.max_new_tokens. At 3,000 a call out counts
    3,000 tokens (no call with a max_tokens has returned to teach a share): after the first two (the second admitted
    on the 1,024-token prior) no question fits beside another; at 16, each holds the 500 its first call left: 8 in
    flight (counted as 0, it was 8 at 3,000 too)."""
    cfg = DynragConfig()
    cfg.generation.max_new_tokens = max_new_tokens
    program = LiveCounter(default_rounds)
    out = run_bounded(program, 24, cfg=cfg)
    assert len(out) == 24 and program.live == 0
    assert max(program.at_start[2:]) == most
    assert call_size(Generate(["x" * 40]), 64) == (10, 64) and call_size(Generate(["x" * 40])) == (10, 0)


def test_answer_kv_fill_sets_the_share_of_the_kv_cache_admission_fills():
    """kv_fill 0.45 of 4,600 tokens: room for 2,070, so 2 start (1,024 each assumed), then at most 4 (500 each)."""
    cfg = DynragConfig()
    cfg.answer.kv_fill = 0.45
    eng = make_engine(cfg, Backends(cfg, generator=BoundedRecorder(4600)))
    program = LiveCounter()
    try:
        out = eng.run([Question(str(i), f"question {i}") for i in range(12)], program, None)
    finally:
        eng.close()
    assert len(out) == 12 and program.at_start[:2] == [1, 2] and max(program.at_start) == 4
    with pytest.raises(ValueError, match="kv_fill"):
        DynragConfig.model_validate({"answer": {"kv_fill": 0}})


def test_make_engine_passes_the_configured_scheduling():
    cfg = DynragConfig()
    assert make_engine(cfg, None).by_program  # the default: it measured faster (docs/benchmarks.md, issue 62)
    cfg.answer.scheduling = "fcfs"
    assert not make_engine(cfg, None).by_program
    cfg.answer.scheduling = "program"
    cfg.answer.engine = "lockstep"
    assert isinstance(make_engine(cfg, None), Engine) and make_engine(cfg, None).by_program


def test_vllm_gets_priority_scheduling_only_under_program():
    g = DynragConfig().generation
    assert "scheduling_policy" not in llm_kwargs(g, "m", gpu=False)
    assert llm_kwargs(g, "m", gpu=True, by_priority=True)["scheduling_policy"] == "priority"


def test_host_kv_offload_reaches_a_gpu_engine_only(caplog):
    g = DynragConfig().generation
    assert "kv_offloading_size" not in llm_kwargs(g, "m", gpu=True)
    g.engine_kwargs.kv_offloading_size = 64.0
    assert llm_kwargs(g, "m", gpu=True)["kv_offloading_size"] == 64.0
    assert "kv_offloading_size" not in llm_kwargs(g, "m", gpu=False)
    assert "not used by a CPU engine" in caplog.text


def test_the_simulated_generator_admits_by_priority_then_arrival():
    gen = SimGenerator(max_seqs=1)  # one sequence at a time: the order they finish is the order admitted
    done: list[str] = []
    futures = []
    with gen._cv:  # every prompt queued before the scheduler thread looks (the condition's lock is reentrant)
        for prompt, priority in [("a", 3), ("b", 1), ("c", 3), ("d", 0), ("e", 1)]:
            futures.append(gen.submit(prompt, SamplingSpec(max_tokens=2, priority=priority), True))
            futures[-1].add_done_callback(lambda f, p=prompt: done.append(p))
    for fut in futures:
        fut.result(timeout=10)
    assert done == ["d", "b", "e", "a", "c"]


# ---- the latency model's KV cache ---------------------------------------------------------------------------


def test_prefix_cache_worked_example():
    """Blocks of 2 tokens, 4 blocks in all."""
    kv = PrefixCache(capacity=4, block=2)
    a, got = kv.admit([1, 2, 3, 4, 5], max_new=1)  # 6 tokens: 3 blocks, nothing cached yet
    assert got == 0 and kv.used() == 3
    kv.release(a, [1, 2, 3, 4, 5, 9])  # its 3 full blocks stay cached, free: [5, 9] first to go, then [3, 4]
    assert kv.used() == 3 and len(kv.free) == 3
    d, got = kv.admit([6, 6, 6], max_new=1)  # needs 2 blocks, 1 unused: evicts the least recently freed, [5, 9]
    assert got == 0 and kv.evicted == 1
    kv.release(d, [6, 6, 6, 8])  # free, oldest first: [1, 2]'s successor [3, 4], [1, 2], then d's [6, 8], [6, 6]
    b, got = kv.admit([1, 2, 3, 4, 7], max_new=1)  # a's first 4 tokens are still cached: its tail went first
    assert got == 4 and kv.evicted == 2  # and its one new block evicted d's tail
    assert kv.admit([6, 6, 5], max_new=1) is None  # every block is held or reused: no room for one more
    kv.release(b, [1, 2, 3, 4, 7, 7])
    same_head, got = kv.admit([6, 6, 5], max_new=1)  # d's head is still cached
    assert got == 2
    assert kv.admit([8, 8, 8, 8, 8], max_new=1) is None  # 3 more blocks do not fit beside it
    kv.release(same_head, [6, 6, 5, 5])
    assert kv.used() <= kv.capacity and not kv.refs and not kv.private
    # the last prompt token is always computed, so a prompt of exactly its cached blocks hits one block less
    c, got = kv.admit([1, 2, 3, 4], max_new=1)
    assert got == 2


def test_prompts_admitted_together_share_their_blocks_at_once():
    """vLLM keys a prompt's full blocks when it is scheduled: a second prompt in the same step reuses them."""
    kv = PrefixCache(capacity=100, block=2)
    kv.admit([1, 2, 3, 4, 5], max_new=1)
    _, got = kv.admit([1, 2, 3, 4, 6], max_new=1)
    assert got == 4


def test_prefix_cache_admits_a_sequence_larger_than_the_cache_only_when_forced():
    kv = PrefixCache(capacity=2, block=4)
    assert kv.admit(list(range(20)), max_new=4) is None
    held, _ = kv.admit(list(range(20)), max_new=4, force=True)
    kv.release(held, list(range(24)))
    assert kv.used() <= 2  # what it left beyond the cache's size is evicted


def test_the_simulated_generator_serves_a_repeated_prefix_from_its_cache_and_evicts_when_small():
    words = " ".join(f"w{i}" for i in range(120))
    roomy = SimGenerator(kv_tokens=100_000)
    first, again = (roomy.generate([p], [SamplingSpec(max_tokens=4)], [False])[0] for p in (words, words + " more"))
    assert first.cached_prompt_tokens == 0
    assert again.cached_prompt_tokens >= first.prompt_tokens * 0.75  # every whole block of the earlier prompt
    tiny = SimGenerator(kv_tokens=200)  # room for about 6 blocks: the other prompt evicts the first one's
    tiny.generate([words], [SamplingSpec(max_tokens=4)], [False])
    tiny.generate([" ".join(f"x{i}" for i in range(120))], [SamplingSpec(max_tokens=4)], [False])
    assert tiny.generate([words + " more"], [SamplingSpec(max_tokens=4)], [False])[0].cached_prompt_tokens == 0
    assert tiny.kv is not None and tiny.kv.evicted > 0


def test_a_head_other_questions_hold_is_not_counted_as_each_questions_own():
    """Room for 4,140 tokens; each call leaves 500, 300 of them a head its first call found cached (a method's
    instruction and few-shot examples, held once by every question). Each question counts the 200 that are its own:
    20 questions in flight, where counting 500 each allowed 8
    (test_admission_is_held_while_the_live_questions_fill_the_kv_cache)."""
    program = LiveCounter()
    out = run_bounded(program, 60, cached=300)
    assert len(out) == 60 and program.live == 0
    assert max(program.at_start) == 20
