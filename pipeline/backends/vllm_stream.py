"""Generation with vLLM's async engine (`AsyncLLM`): each prompt is submitted as it comes and delivered
when its sequence finishes, so there are no call boundaries (a streaming generator,
pipeline/backends/streaming.py). The continuous engine submits every Generate request at once and vLLM's
scheduler keeps its batch full; `generate` (the lockstep engine) submits a batch and waits for all.
Settings, tokenization and outputs are `VllmGenerator`'s; the engine's asyncio loop runs in a thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

from pipeline.backends.streaming import InFlight, StreamingGenerator
from pipeline.backends.vllm_gen import SHUTDOWN_TIMEOUT_S, VllmGenerator
from pipeline.engine.requests import Completion


class VllmStreamingGenerator(StreamingGenerator, VllmGenerator):
    def _engine(self, kwargs: dict[str, Any]):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.flight, self._ids = InFlight(), itertools.count()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="dynrag-vllm-async", daemon=True).start()

        async def start():  # AsyncLLM starts its output handler on the running loop
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        return asyncio.run_coroutine_threadsafe(start(), self._loop).result()

    def submit(self, prompt, sampling, chat, done) -> None:
        from vllm.sampling_params import RequestOutputKind

        (ids,) = self.encode_all([prompt], [chat])
        if isinstance(ids, Exception):
            done(ids, 0.0)
            return
        params = self.sampling_params(sampling, len(ids))
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per sequence, when it finishes
        key = str(next(self._ids))
        self.flight.start(key)
        asyncio.run_coroutine_threadsafe(self._run(key, ids, params, sampling.token_spans, done), self._loop)

    async def _run(self, key: str, ids: list[int], params, spans: bool, done) -> None:
        from vllm.inputs import TokensPrompt

        result: Completion | Exception
        try:
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=ids), params, key):
                final = out
            result = self._completion(final, spans)
        except Exception as err:  # this prompt's error, its question's
            result = err
        done(result, self.flight.finish(key))

    def _shutdown(self, llm) -> None:
        async def stop_output_handler():  # before the engine core goes: it would log the dead engine as an error
            handler = getattr(llm, "output_handler", None)
            if handler is not None:
                handler.cancel()
                await asyncio.gather(handler, return_exceptions=True)

        async def finish_tasks():  # the client's socket tasks, cancelled by shutdown: let them end before the loop
            await asyncio.sleep(0)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(stop_output_handler(), self._loop).result(timeout=SHUTDOWN_TIMEOUT_S)
            llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
            asyncio.run_coroutine_threadsafe(finish_tasks(), self._loop).result(timeout=SHUTDOWN_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
