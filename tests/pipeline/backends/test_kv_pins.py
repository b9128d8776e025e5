"""A question's KV blocks held between its calls (pipeline/backends/kv_pins.py): the pins' rules alone, then a real
vLLM engine (tiny random model, a pool of 64 blocks) where a held prefix survives other prompts that would have
reclaimed it, and an ended program's does not; and the continuous engine telling the generator each program's end."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

from pipeline.backends import Backends
from pipeline.backends.kv_pins import ADDITIONAL_CONFIG_KEY, SCHEDULER, Pins, program_of, request_id
from pipeline.backends.vllm_gen import llm_kwargs
from pipeline.config import DynragConfig
from pipeline.engine.continuous import ContinuousEngine
from pipeline.engine.core import Engine
from pipeline.engine.requests import Answer, Completion, Generate, Question, SamplingSpec
from pipeline.engine.streaming import resolved


def test_a_request_id_names_its_program_also_with_vllms_suffix():
    assert program_of(request_id(12, 7)) == 7
    assert program_of(request_id(12, 7) + "-1a2b3c4d") == 7  # AsyncLLM makes ids unique with a suffix
    assert program_of(request_id(12, None)) is None and program_of("12-1a2b3c4d") is None
    assert program_of(request_id(3, 0)) == 0


def test_a_program_keeps_its_last_two_calls_blocks_until_it_ends():
    pins = Pins(ttl_s=10)
    assert pins.hold(1, ["a1", "a2"], now=0) == []
    assert pins.hold(2, ["b1"], now=0) == []
    assert pins.hold(1, ["c1"], now=1) == []  # its detour: the prompt before it is still held
    assert pins.hold(1, ["d1"], now=2) == ["a1", "a2"]  # a third call: the oldest of its own goes, not program 2's
    assert len(pins) == 3 and pins.held == 3
    assert pins.end(1) == ["c1", "d1"] and pins.end(1) == [] and pins.held == 1


def test_pins_end_after_their_time_to_live_and_the_last_ranked_program_gives_way_first():
    pins = Pins(ttl_s=5)
    pins.hold(1, ["a", "b"], now=0)
    pins.hold(2, ["c"], now=2)
    assert pins.expire(now=4.9) == []
    assert pins.expire(now=5.0) == ["a", "b"]
    pins.hold(9, ["d", "e"], now=6)
    pins.hold(4, ["f"], now=7)
    assert pins.last_ranked() == ["d", "e"]  # admitted last: served last, so its blocks go first
    assert pins.last_ranked() == ["f"] and pins.last_ranked() == ["c"] and pins.last_ranked() == []
    assert pins.held == 0
    assert Pins(ttl_s=0).hold(1, ["x"], now=0) == ["x"]  # off: nothing held


def test_a_pins_clock_stands_still_while_its_program_has_a_call_in_vllm():
    pins = Pins(ttl_s=5)
    pins.started(1)
    pins.hold(1, ["a"], now=0)
    pins.finished(1, now=0)
    pins.started(1)  # its next call waits in vLLM's queue, behind questions ranked before it
    assert pins.expire(now=60) == []
    pins.hold(1, ["b"], now=61)
    pins.finished(1, now=61)  # the clocks of both its pins start again
    assert pins.expire(now=65.9) == [] and pins.expire(now=66) == ["a", "b"]


def test_a_vllm_without_what_the_pins_use_schedules_without_pins(caplog):
    """Another vLLM than 0.32 (a cluster's wheel): its scheduler lacking the block pool's calls runs unpinned."""
    from types import SimpleNamespace

    from pipeline.backends.kv_pins import ADDITIONAL_CONFIG_KEY, _pinning

    class OtherScheduler:
        def __init__(self):
            self.vllm_config = SimpleNamespace(additional_config={ADDITIONAL_CONFIG_KEY: 60.0})
            self.kv_cache_manager = SimpleNamespace(get_blocks=None)  # no block pool
            self.waiting = []

        def _free_request_blocks(self, request):
            pass

        def schedule(self):
            return "scheduled"

    sched = _pinning(OtherScheduler)()
    assert sched.pins.ttl_s == 0 and "kv_cache_manager.block_pool" in caplog.text
    assert sched.schedule() == "scheduled"


@pytest.fixture(scope="module")
def pinning_gen(tiny_cfg):
    """A streaming vLLM engine with program scheduling and 60 s pins over a pool of 64 blocks of 32 tokens."""
    from pipeline.backends import make_generator

    cfg = tiny_cfg.model_copy(deep=True)
    cfg.generation.max_model_len = 1024
    cfg.generation.streaming = True
    cfg.generation.engine_kwargs.num_gpu_blocks_override = 64
    cfg.answer.scheduling = "program"
    cfg.answer.kv_pin_s = 60.0
    gen = make_generator(cfg)
    yield gen
    gen.close()


def test_a_held_prefix_survives_prompts_that_reclaim_the_pool_and_an_ended_programs_does_not(pinning_gen):
    gen = pinning_gen
    assert gen.llm.vllm_config.scheduler_config.scheduler_cls == SCHEDULER
    assert gen.kv_capacity() == 64 * 32

    def ask(prompt: str, program: int):
        return gen.submit(prompt, SamplingSpec(max_tokens=2, priority=program), False).result(120)[0]

    def flood(first: int):  # 15 one-call questions admitted later, 3 running at once: about 150 blocks in all
        def one(i):
            gen.submit(
                f"Unrelated {i}: " + " ".join(f"w{i}x{j}" for j in range(70)), SamplingSpec(2, priority=i), False
            ).result(120)
            gen.program_ended(i)

        for i in range(first, first + 15):
            one(i)

    def question(n: int) -> str:
        return f"Question {n}. " + " ".join(f"fact{n} number {j} holds." for j in range(40))

    held = ask(question(1), program=1)  # its blocks held: the question goes on
    full = held.prompt_tokens // 32 * 32
    assert full >= 10 * 32
    flood(100)
    again = ask(question(1) + " Then what?", program=1)
    assert again.cached_prompt_tokens >= full  # its prefix was held through the flood

    gen.program_ended(1)
    time.sleep(0.5)  # the end is sent without waiting
    flood(200)
    late = ask(question(1) + " Then who?", program=3)
    assert late.cached_prompt_tokens < full // 2  # given back at its end, then reclaimed by the flood


class EndRecorder:
    """A streaming generator recording each program's calls and ends, in order."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []

    def submit(self, prompt, sampling, chat) -> Future:
        self.events.append(("call", sampling.priority))
        return resolved(Completion("x", prompt_tokens=3, completion_tokens=1, finish_reason="stop"))

    def generate(self, prompts, samplings, chats):  # the lockstep engine's batches
        return [self.submit(p, s, c).result()[0] for p, s, c in zip(prompts, samplings, chats)]

    def program_ended(self, program: int) -> None:
        self.events.append(("end", program))


@pytest.mark.parametrize("scheduling", ["fcfs", "program"])
@pytest.mark.parametrize("engine", [ContinuousEngine, Engine])
def test_the_engine_tells_the_generator_each_programs_end_after_its_last_call(scheduling, engine):
    def two_rounds(q: Question, params):
        yield Generate([f"{q.id} round 1"], SamplingSpec(max_tokens=2))
        yield Generate([f"{q.id} round 2"], SamplingSpec(max_tokens=2))
        return Answer("done")

    gen = EndRecorder()
    backends = Backends(DynragConfig(), generator=gen)
    eng = (
        engine(backends, batch_wait_s=0.001, scheduling=scheduling)
        if engine is ContinuousEngine
        else engine(backends, scheduling=scheduling)
    )
    try:
        eng.run([Question(str(i), f"q{i}") for i in range(4)], two_rounds, None)
    finally:
        eng.close()
    ends = [p for kind, p in gen.events if kind == "end"]
    if scheduling == "fcfs":  # calls carry no program: there is nothing to end
        assert ends == []
        return
    assert sorted(ends) == [0, 1, 2, 3]
    for program in range(4):
        mine = [kind for kind, p in gen.events if p == program]
        assert mine == ["call", "call", "end"]


def test_vllm_gets_the_pinning_scheduler_only_with_pins():
    g = DynragConfig().generation
    assert "scheduler_cls" not in llm_kwargs(g, "m", gpu=False, by_priority=True)
    kwargs = llm_kwargs(g, "m", gpu=False, by_priority=True, pin_s=30.0)
    assert kwargs["scheduler_cls"] == SCHEDULER
    assert kwargs["additional_config"] == {ADDITIONAL_CONFIG_KEY: 30.0}


def test_a_ray_replicas_hosted_generator_passes_a_programs_end_to_its_host():
    import asyncio
    from types import SimpleNamespace

    from pipeline.runtime.ray_host import GeneratorHost, HostedStreamingGenerator

    sent: list[int] = []
    host = SimpleNamespace(program_ended=SimpleNamespace(remote=sent.append))
    HostedStreamingGenerator(host, {"streams": True}).program_ended(7)
    assert sent == [7]
    gen = EndRecorder()
    asyncio.run(GeneratorHost.program_ended(SimpleNamespace(gen=gen), 7))  # the host's side: to its generator
    assert gen.events == [("end", 7)]


def test_the_latency_models_cache_holds_a_programs_blocks_until_it_ends_and_sheds_the_last_ranked_first():
    """Blocks of 2 tokens, a cache of 8: program 1's finished sequence (3 blocks) survives two later sequences of 5
    blocks of other tokens only where it is pinned; when the cache is short, the last-ranked program's pin gives
    way first; an ended program's blocks are cached and free again."""
    from jobs.bench.rig.kv_model import PrefixCache

    def run(cache, ids, program):
        held, hit = cache.admit(ids, 0)
        cache.release(held, ids, program)
        return hit

    first = [1, 2, 3, 4, 5, 6]
    for pins, kept in [(False, 0), (True, 4)]:  # (the last prompt token is always computed: 4 of 6 at most)
        cache = PrefixCache(8, block=2, pins=pins)
        run(cache, first, 1)
        run(cache, list(range(100, 110)), 2)
        run(cache, list(range(200, 210)), 3)  # evicts the least recently freed: program 1's, unless pinned
        assert run(cache, first, 1) == kept

    cache = PrefixCache(8, block=2, pins=True)
    run(cache, first, 1)
    run(cache, [7, 8, 9, 10], 9)  # admitted last
    run(cache, list(range(100, 104)), 3)
    assert run(cache, first, 1) == 4 and len(cache.pins) == 4  # program 1's last two calls, 9's, 3's
    assert cache.admit(list(range(300, 306)), 0) is not None  # 3 blocks where 1 is left: program 9's pin gives way
    assert sorted({p.program for p in cache.pins._pins}) == [1, 3]
    cache.end(1)
    assert len(cache.pins) == 1 and all(k in cache.free for k in cache.keys(first))


def test_the_latency_models_pins_take_programs_ends_while_its_scheduler_releases_sequences():
    """A program's end comes from the engine's thread while the model's scheduler thread finishes sequences: both
    change the same pins (`dynrag bench experiment --simulate-gpu --kv-tokens 100000` once failed with "deque
    mutated during iteration"). Programs end over and over while sequences finish, with the interpreter switching
    threads as often as it can; every call completes."""
    import sys
    import threading

    from jobs.bench.rig.simulated import SimGenerator

    gen = SimGenerator(kv_tokens=200_000, pins=True)
    words = " ".join(f"w{i}" for i in range(100))
    stop, errors = threading.Event(), []

    def end_programs():
        try:
            while not stop.is_set():
                for program in range(0, 600, 7):
                    gen.program_ended(program)
        except Exception as e:  # the scheduler's thread changed the pins under this one
            errors.append(e)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    ends = threading.Thread(target=end_programs)
    ends.start()
    try:
        futures = [
            gen.submit(f"{program} {call} {words}", SamplingSpec(max_tokens=2, priority=program), chat=False)
            for call in range(2)
            for program in range(600)
        ]
        done = [f.result(timeout=120) for f in futures]
    finally:
        stop.set()
        ends.join(timeout=60)
        sys.setswitchinterval(switch)
    assert len(done) == 1_200 and errors == []
