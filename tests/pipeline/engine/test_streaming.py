"""Streaming generators' futures (pipeline/engine/streaming.py): a prompt whose future fails or is
cancelled resolves every waiter with that error as its result; the simulated generator skips a cancelled
prompt; vLLM's per-prompt coroutine leaves the flight even when cancelled (no vLLM started)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError, Future, wait
from types import SimpleNamespace

import pytest
from fakes import CancellingGenerator

from jobs.bench.rig.simulated import SimGenerator
from pipeline.engine.requests import Completion, SamplingSpec
from pipeline.engine.streaming import InFlight, generate_all


def _bounded(fn, timeout: float = 10):
    """fn()'s value, from a thread given `timeout` s: a waiter that never resolves fails the test, not hangs."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert out, f"still waiting after {timeout} s"
    return out[0]


def test_generate_all_returns_a_cancelled_prompt_as_its_error():
    gen = CancellingGenerator()
    prompts = ["first", "please cancel me", "third"]
    outs = _bounded(lambda: gen.generate(prompts, [SamplingSpec(max_tokens=4)] * 3, [True] * 3))
    assert isinstance(outs[1], CancelledError)
    assert [o.text for o in (outs[0], outs[2])] == [
        SimGenerator._one(p, SamplingSpec(max_tokens=4)).text for p in ("first", "third")
    ]


def test_generate_all_returns_a_failed_future_as_its_prompts_error():
    def submit(prompt, sampling, chat) -> Future:
        fut: Future = Future()
        if prompt == "bad":  # e.g. submitted after the generator closed
            fut.set_exception(ValueError("closed"))
        else:
            fut.set_result((Completion(prompt.upper()), 0.5))
        return fut

    outs = _bounded(lambda: generate_all(submit, ["a", "bad", "c"], [None] * 3, [True] * 3))
    assert outs[0].text == "A" and isinstance(outs[1], ValueError) and outs[2].text == "C"


def test_the_simulated_generator_skips_a_prompt_cancelled_while_it_waited():
    gen = SimGenerator(max_seqs=1)
    spec = SamplingSpec(max_tokens=4)
    with gen._cv:  # the scheduler cannot admit anything until both are submitted and one is cancelled
        first, second = gen.submit("a", spec, True), gen.submit("b", spec, True)
        assert second.cancel()
    third = gen.submit("c", spec, True)  # served after the cancelled one: the scheduler goes on
    assert not wait([first, third], 10).not_done
    assert [f.result()[0].text for f in (first, third)] == [
        SimGenerator._one(p, SamplingSpec(max_tokens=4)).text for p in "ac"
    ]
    assert second.cancelled() and len(gen.flight) == 0


class FakeAsyncLLM:
    """`generate` as AsyncLLM's: an async iterator of outputs; `hold` blocks it until cancelled."""

    def __init__(self, hold: bool = False, fail: bool = False):
        self.hold, self.fail, self.started = hold, fail, threading.Event()

    async def generate(self, prompt, params, key):
        self.started.set()
        if self.hold:
            await asyncio.sleep(3600)
        if self.fail:
            raise RuntimeError("engine error for this prompt")
        out = SimpleNamespace(text="ok", logprobs=None, token_ids=[5, 6], finish_reason="stop", stop_reason=None)
        yield SimpleNamespace(outputs=[out], prompt_token_ids=[1, 2, 3])


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_a_cancelled_vllm_request_resolves_its_future_and_leaves_the_flight(loop):
    from pipeline.backends.vllm_stream import VllmStreamingGenerator

    gen = VllmStreamingGenerator.__new__(VllmStreamingGenerator)  # no engine: `_run` is given its llm
    gen.flight = InFlight()
    held = FakeAsyncLLM(hold=True)
    llms = {"done": FakeAsyncLLM(), "failed": FakeAsyncLLM(fail=True), "held": held}
    runs = {name: asyncio.run_coroutine_threadsafe(gen._run(llm, name, "p", None), loop) for name, llm in llms.items()}
    assert held.started.wait(10)

    async def cancel_all():  # what the generator's shutdown does to the tasks still running
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(10)
    assert not wait(runs.values(), 10).not_done
    (done, cost_s), (failed, _) = runs["done"].result(), runs["failed"].result()
    assert (done.text, done.prompt_tokens, done.completion_tokens, done.finish_reason) == ("ok", 3, 2, "stop")
    assert cost_s >= 0 and isinstance(failed, RuntimeError)  # a prompt's error is its value
    assert runs["held"].cancelled()
    assert len(gen.flight) == 0  # the cancelled sequence left the flight too
