"""A question's KV blocks held between its model calls (`answer.kv_pin_s`), so its next call finds its prefix cached.

vLLM frees a finished request's blocks into its prefix cache, where the least recently freed is reused first. A
multi-round program's next call comes back only after its search (or, for FLARE, after a whole other call that
regenerates a sentence with documents), and meanwhile the other questions' prefills reclaim those blocks: a concurrent
table computed 0.7-2% more prompt tokens than its runs one after another (docs/benchmarks.md, issue 62). Continuum
(Li et al. 2025, "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with KV Cache Time-to-Live") keeps
a program's KV in place across its tool call for a time to live; this does the same with vLLM's own block pool.

`PinningScheduler` is vLLM's scheduler (`scheduler_cls`, its extension point; vLLM itself is not changed) that holds
one more reference on the full blocks of each finished request whose id names its program (`request_id`: the
streaming generator names it under program scheduling). A program keeps the blocks of its last `KEEP` calls (FLARE's
next look-ahead extends the prompt before its detour, not the detour) until it ends: the engine says so with an
abort of `end_id(program)`, which no request bears. A pin whose end never comes ends after `kv_pin_s` seconds without
a call of its program in vLLM (a call waiting in vLLM's queue, behind the questions ranked before it, stops the
clock: a late-admitted question may wait there longer than the time to live). When the pool's free blocks would not
cover a reserve and what the next waiting prompt does not find cached, pins give way, the last-ranked program's
first (the program's number is its admission order, its priority: so the questions served first keep theirs, as
vLLM's priority scheduling preempts the last-ranked request first). Given back, a pin's blocks go where vLLM puts a
finished request's: cached, and reused least recently freed first.
`Pins` is the bookkeeping, free of vLLM, so that its rules are tested alone.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, cast

log = logging.getLogger(__name__)

ADDITIONAL_CONFIG_KEY = "dynrag_kv_pin_s"  # vLLM's additional_config carries the time to live to its engine process
SCHEDULER = "pipeline.backends.kv_pins.PinningScheduler"
KEEP = 2  # calls whose blocks a program keeps: its last and the one before (FLARE's detour)
RESERVE = 0.05  # share of the pool kept free of pins, besides what the next waiting prompt needs
_PROGRAM = re.compile(r"@(\d+)(?:-|$)")  # "<n>@<program>", to which vLLM's AsyncLLM appends "-<random>"
_END = "end"  # end_id's head: "end@<program>"


def pin_seconds(cfg) -> float:
    """How long a streaming generator holds a program's blocks under `cfg` (0: it does not): answer.kv_pin_s, under
    program scheduling only, where each call carries its program (its question's admission order)."""
    return cfg.answer.kv_pin_s if cfg.answer.scheduling == "program" else 0.0


def request_id(n: int, program: int | None) -> str:
    """The id of a streamed request: its number, and the program it belongs to where pins are on."""
    return f"{n}" if program is None else f"{n}@{program}"


def end_id(program: int) -> str:
    """What the engine aborts when `program` ends: its pins are given back."""
    return f"{_END}@{program}"


def program_of(request_id: str) -> int | None:
    found = _PROGRAM.search(request_id)
    return int(found.group(1)) if found else None


@dataclass
class _Pin:
    program: int
    blocks: list[Any]
    until: float


@dataclass
class Pins:
    """Pins by program, oldest first. Each method returns the blocks of the pins it ends, to give back to the pool."""

    ttl_s: float
    keep: int = KEEP
    _pins: deque[_Pin] = field(default_factory=deque)
    _calls: Counter[int] = field(default_factory=Counter)  # programs' calls in vLLM: their pins' clocks stand still

    @property
    def held(self) -> int:
        """Blocks held, a block counted once per pin that holds it."""
        return sum(len(p.blocks) for p in self._pins)

    def started(self, program: int) -> None:
        self._calls[program] += 1

    def finished(self, program: int, now: float) -> None:
        """A call of `program` left vLLM (after `hold`): its pins' clocks start again, from now."""
        self._calls[program] -= 1
        if self._calls[program] <= 0:
            del self._calls[program]
            for pin in self._pins:
                if pin.program == program:
                    pin.until = now + self.ttl_s

    def hold(self, program: int, blocks: list[Any], now: float) -> list[Any]:
        if not blocks or self.ttl_s <= 0:
            return list(blocks)  # not held: given straight back
        mine = [p for p in self._pins if p.program == program]
        released = self._drop(mine[: max(0, len(mine) + 1 - self.keep)])
        self._pins.append(_Pin(program, list(blocks), now + self.ttl_s))
        return released

    def end(self, program: int) -> list[Any]:
        return self._drop([p for p in self._pins if p.program == program])

    def expire(self, now: float) -> list[Any]:
        return self._drop([p for p in self._pins if p.until <= now and p.program not in self._calls])

    def last_ranked(self) -> list[Any]:
        """End the pins of the program ranked last (the highest number): the pool is short."""
        last = max((p.program for p in self._pins), default=None)
        return [] if last is None else self.end(last)

    def __len__(self) -> int:
        return len(self._pins)

    def _drop(self, pins: list[_Pin]) -> list[Any]:
        released: list[Any] = []
        for pin in pins:
            self._pins.remove(pin)
            released += pin.blocks
        return released


def _pinning(base: type) -> type:
    class Pinning(base):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            ttl_s = float((self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY, 0.0))
            missing = _missing(self)
            if missing and ttl_s > 0:  # another vLLM than the one this was written against (0.32): no pins, no risk
                log.warning("answer.kv_pin_s: this vLLM's scheduler lacks %s; KV blocks are not pinned", missing)
                ttl_s = 0.0
            self.pins = Pins(ttl_s)
            self._reserve = 0 if missing else math.ceil(RESERVE * self.kv_cache_manager.block_pool.num_gpu_blocks)

        def _free_request_blocks(self, request) -> None:
            program = program_of(request.request_id)
            if program is not None and self.pins.ttl_s > 0:
                groups = self.kv_cache_manager.get_blocks(request.request_id).blocks
                full = [b for g in groups for b in g if b.block_hash is not None and not b.is_null]
                self.kv_cache_manager.block_pool.touch(full)  # one more reference: freeing the request leaves them
                now = time.monotonic()
                self._give_back(self.pins.hold(program, full, now))
                self.pins.finished(program, now)
            super()._free_request_blocks(request)

        def add_request(self, request) -> None:
            program = program_of(request.request_id)
            if program is not None and self.pins.ttl_s > 0 and request.request_id not in self.requests:
                self.pins.started(program)
            super().add_request(request)

        def finish_requests(self, request_ids, finished_status):
            ids = [request_ids] if isinstance(request_ids, str) else request_ids
            if ids is not None:
                ends = [r for r in ids if r.startswith(_END)]
                ids = [r for r in ids if not r.startswith(_END)]
                for end in ends:
                    self._give_back(self.pins.end(cast(int, program_of(end))))
            return super().finish_requests(ids, finished_status)

        def schedule(self, *args, **kwargs):
            if len(self.pins):
                self._give_back(self.pins.expire(time.monotonic()))
                pool = self.kv_cache_manager.block_pool
                need = self._reserve + (self._uncached(self.waiting.peek_request()) if self.waiting else 0)
                while len(self.pins) and pool.get_num_free_blocks() < need:
                    self._give_back(self.pins.last_ranked())
            return super().schedule(*args, **kwargs)

        def _uncached(self, request) -> int:
            """Blocks `request`'s prompt needs beyond its head found in the prefix cache."""
            pool = self.kv_cache_manager.block_pool
            hit = 0
            for h in request.block_hashes:
                if pool.get_cached_block(h, [0]) is None:
                    break
                hit += 1
            return max(0, math.ceil(request.num_tokens / self.block_size) - hit)

        def _give_back(self, blocks: list[Any]) -> None:
            if blocks:  # tail first, as vLLM frees a request's blocks: its head stays cached longest
                self.kv_cache_manager.block_pool.free_blocks(reversed(blocks))

    Pinning.__name__ = Pinning.__qualname__ = f"Pinning{base.__name__}"
    return Pinning


def _missing(scheduler) -> str:
    """What of vLLM's scheduler the pins use that `scheduler` lacks ("" where nothing)."""
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    needs = {
        "kv_cache_manager.block_pool": pool is not None,
        "kv_cache_manager.get_blocks": hasattr(getattr(scheduler, "kv_cache_manager", None), "get_blocks"),
        "BlockPool.touch/free_blocks/get_cached_block/get_num_free_blocks/num_gpu_blocks": all(
            hasattr(pool, a)
            for a in ("touch", "free_blocks", "get_cached_block", "get_num_free_blocks", "num_gpu_blocks")
        ),
        "waiting.peek_request": hasattr(getattr(scheduler, "waiting", None), "peek_request"),
        "Scheduler._free_request_blocks": callable(
            getattr(super(type(scheduler), scheduler), "_free_request_blocks", None)
        ),
    }
    return ", ".join(name for name, ok in needs.items() if not ok)


class PinningScheduler:
    """vLLM's scheduler with pins: its async scheduler where the engine schedules asynchronously (vLLM's default
    where it can), else its synchronous one. Constructed by vLLM's engine core from `scheduler_cls`."""

    def __new__(cls, *args, vllm_config, **kwargs):
        from platform_shims.compat import vllm_scheduler

        base = vllm_scheduler(bool(vllm_config.scheduler_config.async_scheduling))
        if base is None:  # another vLLM than the locked one (0.32), whose scheduler classes moved
            raise RuntimeError("this vLLM's scheduler classes moved: set answer.kv_pin_s=0 to run without KV pins")
        return _pinning(base)(*args, vllm_config=vllm_config, **kwargs)
