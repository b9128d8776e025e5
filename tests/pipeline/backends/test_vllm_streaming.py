"""vLLM's async engine as a streaming generator (tiny random model): the same outputs as batched
`LLM.generate`, a short sequence delivered before a long one submitted earlier, engine_kwargs applied,
rows equal to the lockstep engine's through the continuous engine (the streaming engine with vLLM's priority
scheduling, answer.scheduling=program; the lockstep one first come, first served), and a prompt still running at close or
submitted after it resolves its future. One vLLM engine at a time."""

from __future__ import annotations

import asyncio
from concurrent.futures import wait

import pytest

from pipeline.backends import BackendError, Backends, make_generator
from pipeline.engine.continuous import ContinuousEngine
from pipeline.engine.core import Engine
from pipeline.engine.requests import Answer, Generate, Question, SamplingSpec

PROMPTS = [
    "Who wrote the novel?",
    "What is the capital of France?",
    "Shirley Temple was an American actress",
    "Berlin is the capital of Germany and Rome",
]
SPECS = [SamplingSpec(max_tokens=n, logprobs=lp) for n, lp in [(24, None), (2, 3), (12, None), (6, 2)]]
LABELS = ("entailment", "contradiction", "neutral")
PROMPTS.append("[NLI result]:")
SPECS.append(SamplingSpec(max_tokens=8, choice=LABELS))  # structured outputs through the async engine too


@pytest.fixture(scope="module")
def stream_cfg(tiny_cfg):
    """The session's tiny model settings (3 sequences at once) on the streaming generator."""
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.generation.max_model_len = 1024
    cfg.generation.streaming = True
    cfg.answer.scheduling = "program"  # vLLM's priority scheduling: the same outputs as first come, first served
    return cfg


def two_rounds(q: Question, params):
    first = (yield Generate([q.question], SamplingSpec(max_tokens=4 + len(q.question) % 9)))[0]
    second = (yield Generate([q.question + first.text], SamplingSpec(max_tokens=3)))[0]
    return Answer(second.text)


def test_streamed_vllm_matches_batched_vllm(stream_cfg, tiny_vllm):
    from pipeline.backends.vllm_stream import VllmStreamingGenerator

    gen = make_generator(stream_cfg)
    try:
        assert isinstance(gen, VllmStreamingGenerator)
        assert gen.llm.vllm_config.scheduler_config.max_num_seqs == 3  # engine_kwargs reach the async engine
        assert gen.llm.vllm_config.scheduler_config.policy == "priority"
        cache = gen.llm.vllm_config.cache_config  # what program scheduling's admission fills (engine/admission.py)
        assert Backends(stream_cfg, generator=gen).kv_capacity() == cache.num_gpu_blocks * cache.block_size > 0
        assert tiny_vllm.kv_capacity() == cache.num_gpu_blocks * cache.block_size  # the batched LLM: same settings
        streamed = gen.generate(PROMPTS, SPECS, [True] * len(PROMPTS))
        order = []

        def done_as(name):
            def done(fut):
                result, cost_s = fut.result()
                order.append((name, result.completion_tokens, cost_s > 0))

            return done

        futures = []
        for name, prompt, n in [("long", PROMPTS[0], 48), ("short", PROMPTS[1], 2)]:
            futures.append(gen.submit(prompt, SamplingSpec(max_tokens=n), True))
            futures[-1].add_done_callback(done_as(name))
        assert not wait(futures, 120).not_done
        qs = [Question(str(i), p) for i, p in enumerate(PROMPTS[:4] * 2)]
        eng = ContinuousEngine(Backends(stream_cfg, generator=gen), batch_wait_s=0.001, scheduling="program")
        try:
            continuous = eng.run(qs, two_rounds, None)
        finally:
            eng.close()
        lockstep = Engine(Backends(stream_cfg, generator=gen)).run(qs, two_rounds, None)
        at_close = gen.submit(PROMPTS[2], SamplingSpec(max_tokens=900), True)  # likely still running at close
    finally:
        gen.close()
    assert at_close.done() and len(gen.flight) == 0  # cancelled (or finished) with the engine: no waiter hangs
    late = gen.submit(PROMPTS[1], SamplingSpec(max_tokens=2), True)
    assert isinstance(late.exception(timeout=5), BackendError)  # after close: fails at once, never hangs
    assert not asyncio.all_tasks(gen._loop)  # no task left pending ("Task was destroyed but it is pending!" at exit)
    assert order[0][:2] == ("short", 2) and order[1][0] == "long" and order[1][1] > 2  # not in submission order
    assert all(shared for *_, shared in order)  # each got a share of the generator's time
    assert [o.answer.prediction for o in continuous] == [o.answer.prediction for o in lockstep]
    assert [o.trace.llm_calls for o in continuous] == [2] * len(qs)

    batched = tiny_vllm.generate(PROMPTS, SPECS, [True] * len(PROMPTS))  # the session's batched engine
    assert streamed[-1].text in LABELS
    for s, b in zip(streamed, batched):
        assert (s.text, s.token_ids, s.prompt_tokens, s.finish_reason) == (
            b.text,
            b.token_ids,
            b.prompt_tokens,
            b.finish_reason,
        )
        assert (s.logprobs is None) == (b.logprobs is None)
        if s.logprobs:
            assert [t.logprob for t in s.logprobs] == pytest.approx([t.logprob for t in b.logprobs], abs=1e-4)


def test_the_latency_models_prefix_cache_follows_vllms(tiny_vllm):
    """The same requests replayed through the latency model's KV cache (jobs/bench/rig/kv_model.py, vLLM's block size
    and block count) find the prefix-cache hits vLLM reported, within 10%: prompts sharing a head in one call,
    then each prompt extended by its output (a question's next round), then prompts sharing nothing."""
    from jobs.bench.rig.kv_model import PrefixCache

    cache_config = tiny_vllm.llm.llm_engine.vllm_config.cache_config
    kv = PrefixCache(cache_config.num_gpu_blocks, cache_config.block_size)
    head = "Zebrafish notes. " + " ".join(f"Entry {i}: the river {i} flows past the town {i * 7}." for i in range(14))
    spec = SamplingSpec(max_tokens=8)
    real = modelled = 0

    def call(prompts):
        nonlocal real, modelled
        outs = tiny_vllm.generate(prompts, [spec] * len(prompts), [False] * len(prompts))  # one wave: 3 at most
        held = []
        for o in outs:
            got = kv.admit(o.prompt_token_ids, o.completion_tokens)
            assert got is not None
            held.append(got[0])
            modelled += got[1]
        for h, o in zip(held, outs):
            kv.release(h, [*o.prompt_token_ids, *o.token_ids])
        real += sum(o.cached_prompt_tokens for o in outs)
        return outs

    first = [f"{head} Question {q}: which town?" for q in range(3)]
    outs = call(first)
    call([p + o.text + " Then:" for p, o in zip(first, outs)])
    call([f"Unrelated {q}: " + " ".join(f"word{q}x{i}" for i in range(60)) for q in range(3)])
    assert real > 0
    assert abs(modelled - real) <= 0.1 * real, (modelled, real)
