"""The latency model's KV cache: vLLM's automatic prefix caching in blocks, over a cache of limited size.

What it assumes (vLLM v1's KV-cache manager, simplified):
- The cache holds `capacity` blocks of `block` tokens. A sequence is admitted only when every block it will need
  (its prompt and its whole output) fits beside those already held: no preemption, and a sequence that cannot fit
  waits at the head of the queue (as vLLM's scheduler stops at a request it cannot allocate).
- A full block is keyed by every token up to its end, so a block is reused only by a sequence whose tokens agree
  with it from the first token on. The leading keyed blocks a new prompt finds (held by a running sequence, or
  cached and free) are its prefix-cache hit; the prompt's last token is always computed (as vLLM does).
- When a sequence finishes, its full blocks (prompt and output) stay cached but free. A free block is evicted,
  least recently freed first and a sequence's last block before its first (vLLM frees in reverse), when a new
  allocation needs its space.
- With `pins` (answer.kv_pin_s, pipeline/backends/kv_pins.py), a finished sequence of a program stays held for it
  (its last two) until the program ends; when a sequence does not fit, the last-ranked program's pins give way
  first. The pins' time to live is not modelled (every program's end is told), nor vLLM's reserve.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pipeline.backends.kv_pins import Pins


@dataclass
class Held:
    """What one admitted sequence holds: its keyed blocks (shared) and its private ones (the rest)."""

    keys: list[int] = field(default_factory=list)
    private: int = 0


class PrefixCache:
    def __init__(self, capacity: int, block: int = 32, pins: bool = False):
        if capacity < 1 or block < 1:
            raise ValueError(f"a KV cache needs at least one block of one token (capacity {capacity}, block {block})")
        self.capacity, self.block = capacity, block
        self.refs: dict[int, int] = {}  # keyed blocks held by running sequences -> how many hold each
        self.free: OrderedDict[int, None] = OrderedDict()  # keyed blocks cached and free, evicted first to last
        self.private = 0  # blocks held and not keyed (a partial block, or one whose key another holds)
        self.evicted = 0  # blocks evicted so far
        self.pins = Pins(ttl_s=float("inf")) if pins else None  # keys held for their program between its calls

    def keys(self, ids: list[int]) -> list[int]:
        """One key per full block of `ids`: a hash of every token up to the block's end."""
        out, h = [], 0
        for end in range(self.block, len(ids) + 1, self.block):
            h = hash((h, tuple(ids[end - self.block : end])))
            out.append(h)
        return out

    def used(self) -> int:
        return len(self.refs) + len(self.free) + self.private

    def admit(self, prompt: list[int], max_new: int, force: bool = False) -> tuple[Held, int] | None:
        """Allocate a sequence of `prompt` and up to `max_new` generated tokens: what it holds and how many prompt
        tokens the cache served; None when its blocks do not fit now (`force`: admit anyway, the cache over its
        size, so that a sequence larger than the whole cache still runs when nothing else does). The prompt's full
        blocks are keyed at once, so a sequence admitted after it (in the same step too) finds them."""
        keys = self.keys(prompt)
        hits = 0
        while hits < (len(prompt) - 1) // self.block and (keys[hits] in self.refs or keys[hits] in self.free):
            hits += 1  # (at most the blocks before the last prompt token: that one is always computed)
        need = -(-(len(prompt) + max_new) // self.block) - hits  # blocks to allocate

        def room() -> int:  # the unused blocks and the free ones it does not reuse (those are evicted, oldest first)
            return self.capacity - len(self.refs) - self.private - sum(1 for k in keys[:hits] if k in self.free)

        while need > room() and self.pins is not None and len(self.pins):
            self._unref(self.pins.last_ranked())  # the pool is short: the last-ranked program's pins give way
        if need > room() and not force:
            return None
        fresh = list(dict.fromkeys(k for k in keys[hits:] if k not in self.refs and k not in self.free))
        for k in keys[:hits]:  # the hits are held again (out of the free list)
            self.free.pop(k, None)
            self.refs[k] = self.refs.get(k, 0) + 1
        while self.used() + need > self.capacity and self.free:
            self.free.popitem(last=False)
            self.evicted += 1
        for k in fresh:
            self.refs[k] = 1
        held = Held(keys[:hits] + fresh, need - len(fresh))
        self.private += held.private
        return held, hits * self.block

    def release(self, held: Held, ids: list[int], program: int | None = None) -> None:
        """A sequence finished with token `ids` (prompt and output): its full blocks stay cached, free; held for
        `program` where pins are on."""
        self.private -= held.private
        for k in held.keys:
            self.refs[k] -= 1
            if not self.refs[k]:
                del self.refs[k]
        mine = set(held.keys)
        output = [k for k in self.keys(ids) if k not in mine and k not in self.refs and k not in self.free]
        for k in [*held.keys, *output[: held.private]][::-1]:  # freed last to first: a tail goes before its head
            if k not in self.refs:
                self.free[k] = None
                self.free.move_to_end(k)
        while self.used() > self.capacity and self.free:
            self.free.popitem(last=False)
            self.evicted += 1
        if program is not None and self.pins is not None:
            pinned = [k for k in dict.fromkeys(self.keys(ids)) if k in self.refs or k in self.free]
            for k in pinned:  # one more reference each, as vLLM's pool touches them
                self.free.pop(k, None)
                self.refs[k] = self.refs.get(k, 0) + 1
            self._unref(self.pins.hold(program, pinned, 0.0))

    def end(self, program: int) -> None:
        """`program` makes no more calls: its pins are given back."""
        if self.pins is not None:
            self._unref(self.pins.end(program))

    def _unref(self, keys: list[int]) -> None:
        for k in reversed(keys):  # a tail before its head, as vLLM frees
            self.refs[k] -= 1
            if not self.refs[k]:
                del self.refs[k]
                self.free[k] = None
