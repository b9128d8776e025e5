"""The forward pass behind DRAGIN's RIND and QFS, computing only what they read (Su et al., 2024, Sec. 3):
the final hidden states that produced each generated token (for the exact Eq. 1 entropy) and the last
layer's attention rows of the generated tokens over every key (Eqs. 2-3, QFS). Torch and transformers only.

Two modes over one model copy, loaded with `attn_implementation=IMPLEMENTATION` (registered here):

- `incremental`: every layer but the last runs PyTorch's SDPA (no weights materialised); the last layer
  runs the model's own eager attention and hands back its weights (mean over heads). The keys and values
  of a shared prompt prefix (DRAGIN's few-shot exemplars are every prompt's first few hundred tokens; a
  question's next round shares them too) are computed once and kept (`PrefixKV`), so a pass costs its
  suffix only. Causal attention makes the prefix's keys and values independent of what follows, so the
  result equals a full forward up to float summation order.
- `full`: every layer eager over the whole sequence, no cache: the pass as the official implementation
  and dynrag before it ran it (the reference of `dynrag bench dragin --reference`).

Models whose layers are not all full attention (sliding windows, chunked attention) take the full mode's
sequence (no prefix reuse) with SDPA below the last layer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

IMPLEMENTATION = "dynrag_rind"
MIN_PREFIX = 16  # shorter shared prefixes are not worth a separate forward


def register() -> None:
    """Registers the attention function and its (SDPA-style boolean) mask under IMPLEMENTATION."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _additive(mask: torch.Tensor | None, q_len: int, kv_len: int, dtype, device) -> torch.Tensor:
    """An eager (additive) mask from SDPA's boolean one (True: attend); None means causal, the queries
    being the last q_len of kv_len positions."""
    if mask is None:
        q = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        mask = (torch.arange(kv_len, device=device)[None, :] <= q)[None, None]
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)


class HeadWeights(list):
    """`module._dynrag_eager` asking for the weights of every head, in the model's dtype ([batch, heads, q, k])."""


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA, except where a pass asked for weights (`module._dynrag_eager`: a list to append the mean
    over heads to, a HeadWeights for every head's, or True for eager without keeping them): there the
    model's own eager attention."""
    want = getattr(module, "_dynrag_eager", None)
    if want is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    eager = sys.modules[type(module).__module__].eager_attention_forward
    if attention_mask is None or attention_mask.dtype == torch.bool:
        attention_mask = _additive(attention_mask, query.shape[2], key.shape[2], query.dtype, query.device)
    out, weights = eager(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    if isinstance(want, HeadWeights):
        want.append(weights)
    elif isinstance(want, list):
        want.append(weights.float().mean(dim=1))
    return out, None


@dataclass
class PrefixKV:
    """The keys and values of the token ids `ids`, per layer ([1, kv heads, len, head dim] each)."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    def cut(self, n: int) -> PrefixKV:
        return PrefixKV(self.ids[:n], [(k[:, :, :n], v[:, :, :n]) for k, v in self.layers])


@lru_cache(maxsize=1)
def _prefix_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PrefixLayer(DynamicLayer):
        """One layer's prefix keys and values, read by a forward and never grown: the forward's own keys and
        values join them for that layer's attention only (the pass keeps no cache of its suffix)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            self.keys, self.values, self.is_initialized = keys, values, True
            self.dtype, self.device = keys.dtype, keys.device

        def update(self, key_states, value_states, *args, **kwargs):
            b = key_states.shape[0]
            return (
                torch.cat([self.keys.expand(b, -1, -1, -1), key_states], dim=-2),
                torch.cat([self.values.expand(b, -1, -1, -1), value_states], dim=-2),
            )

    return PrefixLayer


def prefix_cache(prefix: PrefixKV):
    """A transformers cache that serves `prefix` to every row of a forward's batch without copying it."""
    from transformers.cache_utils import Cache

    layer = _prefix_layer_class()
    return Cache(layers=[layer(k, v) for k, v in prefix.layers])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def full_attention_only(model) -> bool:
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    return types is None or all(t == "full_attention" for t in types)


class RindPass:
    """Runs passes for one model; keeps the last shared prefix's keys and values between calls."""

    def __init__(self, model, pad_id: int):
        if model.config._attn_implementation != IMPLEMENTATION:
            raise ValueError(f"the RIND pass needs a model loaded with attn_implementation={IMPLEMENTATION!r}")
        self.model, self.pad_id = model, pad_id
        self.decoder = model.get_decoder()
        self.layers = list(self.decoder.layers)
        self.device = next(model.parameters()).device
        self.reuse = full_attention_only(model)
        self.prefix: PrefixKV | None = None
        self.tokens_computed = 0  # positions run through the model (prefixes included), for benchmarks

    def shared_prefix(self, seqs: list[list[int]], starts: list[int]) -> PrefixKV | None:
        """The prefix to reuse for these sequences (each `seqs[r][:starts[r]]` is prompt; the last prompt
        position must stay in the pass, as it produces the first generated token): the kept one, cut to
        what every sequence shares, or a new one computed from what this call's sequences share."""
        if not self.reuse or not seqs:
            return None
        room = min(starts) - 1
        if self.prefix is not None:
            n = min([room, *(common_prefix(self.prefix.ids, s) for s in seqs)])
            if n >= MIN_PREFIX:
                self.prefix = self.prefix.cut(n) if n < len(self.prefix.ids) else self.prefix
                return self.prefix
        first = seqs[0][: max(room, 0)]
        n = min([len(first), *(common_prefix(first, s) for s in seqs[1:])])
        if n < MIN_PREFIX:
            return None
        self.prefix = self._compute_prefix(first[:n])
        return self.prefix

    def _compute_prefix(self, ids: list[int]) -> PrefixKV:
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.no_grad():
            self.decoder(input_ids=torch.tensor([ids], device=self.device), past_key_values=cache, use_cache=True)
        self.tokens_computed += len(ids)
        return PrefixKV(list(ids), [(layer.keys, layer.values) for layer in cache.layers])

    def run(
        self, seqs: list[list[int]], starts: list[int], prefix: PrefixKV | None = None, full: bool = False
    ) -> list[tuple[Any, Any]]:
        """For each sequence, (final hidden states at positions starts-1 .. len-2 [n_gen, hidden], the last
        layer's attention rows of positions starts .. len-1 over keys 0 .. len-1 [n_gen, len], mean over
        heads), the sequences right-padded into one forward after `prefix` (which each must start with;
        `shared_prefix`), every layer eager when `full`."""
        m = len(prefix.ids) if prefix else 0
        width = max(len(s) for s in seqs) - m
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), m + width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s) - m] = torch.tensor(s[m:])
            mask[r, : len(s)] = 1
        cache = prefix_cache(prefix) if prefix else None
        weights: list[torch.Tensor] = []
        eager = self.layers if full else self.layers[-1:]
        for layer in eager:
            layer.self_attn._dynrag_eager = True
        self.layers[-1].self_attn._dynrag_eager = weights
        try:
            with torch.no_grad():
                hidden = self.decoder(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    past_key_values=cache,
                    use_cache=cache is not None,
                ).last_hidden_state
        finally:
            for layer in eager:
                layer.self_attn._dynrag_eager = None
        self.tokens_computed += int(mask.sum()) - m * len(seqs)
        out = []
        for r, (s, start) in enumerate(zip(seqs, starts)):
            out.append((hidden[r, start - 1 - m : len(s) - 1 - m], weights[0][r, start - m : len(s) - m, : len(s)]))
        return out

    def last_layer_heads(self, ids: list[int]) -> torch.Tensor:
        """A forward as `model(ids, output_attentions=True)` runs it in eager attention (DRAGIN's code): `ids`
        alone, one sequence, no cache, every layer eager; the last layer's weights [heads, len, len] in the
        model's dtype."""
        weights = HeadWeights()
        for layer in self.layers:
            layer.self_attn._dynrag_eager = True
        self.layers[-1].self_attn._dynrag_eager = weights
        try:
            with torch.no_grad():
                self.decoder(input_ids=torch.tensor([ids], device=self.device), use_cache=False)
        finally:
            for layer in self.layers:
                layer.self_attn._dynrag_eager = None
        self.tokens_computed += len(ids)
        return weights[0][0]
