"""Generation with vLLM's async engine (`AsyncLLM`): each prompt is submitted as it comes and delivered
when its sequence finishes, so there are no call boundaries (a streaming generator,
pipeline/engine/streaming.py). The continuous engine submits every Generate request at once and vLLM's
scheduler keeps its batch full; `generate` (the lockstep engine) submits a batch and waits for all.
Settings, tokenization and outputs are `VllmGenerator`'s; the engine's asyncio loop runs in a thread.
A prompt's future is its asyncio task's (`run_coroutine_threadsafe`): a task cancelled at shutdown
cancels its future, which resolves its waiters, and a prompt submitted after `close` fails at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from concurrent.futures import Future
from typing import Any

from pipeline.backends.kv_pins import end_id, request_id
from pipeline.backends.vllm_gen import SHUTDOWN_TIMEOUT_S, VllmGenerator, as_engine_dead
from pipeline.engine.requests import Completion, SamplingSpec
from pipeline.engine.streaming import InFlight, StreamingGenerator, resolved
from pipeline.errors import BackendError
from platform_shims.compat import abort_in_engine


class VllmStreamingGenerator(StreamingGenerator, VllmGenerator):
    pins_programs = True

    def _engine(self, kwargs: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs

        from platform_shims.compat import async_vllm_engine

        self.flight, self._ids = InFlight(), itertools.count()
        self._submitting = threading.Lock()  # a submit schedules its prompt, or sees the engine closed
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="dynrag-vllm-async", daemon=True).start()

        async def start():  # AsyncLLM starts its output handler on the running loop
            return async_vllm_engine(AsyncEngineArgs(**kwargs))

        # a start that hangs (vLLM, NCCL) ends the job at ray.replica_wait_s, as a Ray replica's start does. No name
        # for the future: one in this frame kept the engine alive to the interpreter's exit (its __del__ then fails)
        try:
            return asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=self.start_s)
        except concurrent.futures.TimeoutError:
            raise BackendError(
                f"the streaming vLLM engine did not start within {self.start_s:g} s (ray.replica_wait_s)"
            ) from None

    def submit(self, prompt, sampling, chat) -> Future:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        (ids,) = self.encode_all([prompt], [chat], [sampling])
        if not isinstance(ids, list):  # its error, or the window's empty completion
            return resolved(ids)
        params = self.sampling_params(sampling, len(ids))
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per sequence, when it finishes
        with self._submitting:
            if self.llm is None:
                fut: Future = Future()
                fut.set_exception(BackendError("the vLLM engine is closed: no more prompts can be submitted"))
                return fut
            # the future is the task's: cancelled with it (at shutdown), and cancelling it cancels the task
            key = request_id(next(self._ids), sampling.priority if self.pin_s > 0 else None)  # its program, for pins
            run = self._run(self.llm, key, TokensPrompt(prompt_token_ids=ids), params, sampling)
            return asyncio.run_coroutine_threadsafe(run, self._loop)

    def program_ended(self, program: int) -> None:
        """Give back `program`'s pinned blocks (kv_pins.py): an abort of a request id no request bears, which the
        pinning scheduler reads as the program's end. Sent without waiting; lost at close, with the engine."""
        if self.pin_s <= 0:
            return
        with self._submitting:
            if self.llm is not None:
                asyncio.run_coroutine_threadsafe(abort_in_engine(self.llm, [end_id(program)]), self._loop)

    async def _run(
        self, llm, key: str, prompt, params, spec: SamplingSpec | None = None
    ) -> tuple[Completion | Exception, float]:
        self.flight.start(key)
        result: Completion | Exception
        try:
            ranked = {"priority": spec.priority} if spec is not None and self.by_priority else {}
            async for out in llm.generate(prompt, params, key, **ranked):
                final = out
            result = self._completion(final, spec or SamplingSpec())
        except Exception as err:  # this prompt's error, its question's; a dead engine's, the run's
            result = as_engine_dead(err)
        finally:  # also when cancelled: the sequence leaves the flight either way
            cost_s = self.flight.finish(key)
        return result, cost_s

    def _shutdown(self, llm) -> None:
        from platform_shims.compat import stop_output_handler

        async def finish_tasks():  # the client's socket tasks, cancelled by shutdown: let them end before the loop
            await asyncio.sleep(0)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with self._submitting:  # `close` set self.llm to None: every later submit fails at once, and every
            pass  # earlier one has scheduled its task, which finish_tasks cancels if vLLM did not end it
        try:
            asyncio.run_coroutine_threadsafe(stop_output_handler(llm), self._loop).result(timeout=SHUTDOWN_TIMEOUT_S)
            llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
            asyncio.run_coroutine_threadsafe(finish_tasks(), self._loop).result(timeout=SHUTDOWN_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
