"""The `attention` backend: a transformers forward pass over the token ids the generator ran (prompt,
then output) that returns what DRAGIN's RIND and QFS need (Su et al., 2024, Sec. 3) — vLLM never returns
attention.

    Call("attention", "stats", [{"prompt": str, "prompt_ids": [int], "generated": str,
                                 "generated_ids": [int], "context": [(start, end), ...]}, ...])

The pass scores exactly `prompt_ids + generated_ids` (a Completion's `prompt_token_ids` and `token_ids`):
encoding the two texts apart would give other tokens (a merge across their boundary, a leading-space
marker). `prompt_ids` must be this tokenizer's encoding of `prompt` (the generator's, as the generator
encoded it), whose offset mapping places the prompt's tokens; the generated tokens are placed by reading
their ids as a detokenizer does (pipeline/backends/detok.py; `generated` is what they decode to, up to a
stop string). `context` are character spans of the prompt whose tokens QFS may pick (the question, the
answer so far); every generated token may be picked too. One result per item (a dict):

- `offsets`   (start, end) of each generated token in `generated`
- `entropy`   exact Eq. 1 entropy of the full next-token distribution that produced each token (nats)
- `prob`      that distribution's probability of the token itself
- `amax`      Eq. 3: max attention a later generated token pays it (last layer, mean over heads)
- `cand_words`, `cand_order`: each QFS candidate token's word (None: punctuation) and text position
- `cand_attn` [n_generated, n_candidates]: attention each generated token pays each candidate before it

All items of one call share forward passes: sorted by length, right-padded, cut into batches whose
last-layer attention fits `generation.attention_batch_mib`. The model runs with eager attention; a forward hook
keeps the last layer's weights only (output_attentions=True would hold every layer's L x L maps).
With generation.backend=transformers the generator's model is reused, otherwise it is loaded here, where
`placement` says: on a GPU, the generator's device in half precision (bf16 unless the generator runs
fp16), in the same process as the generator (the Ray engine actor beside vLLM: one copy per GPU, so leave
it room with generation.engine_kwargs.gpu_memory_utilization); on a CPU fp32, as half precision is slow
there. vLLM's own copy of the weights lives in its engine process and cannot be shared.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from pipeline.backends import register_backend
from pipeline.backends.detok import clip, detokenize
from pipeline.errors import DynragError
from pipeline.methods.dragin_math import entropy, max_later_attention, word_spans

log = logging.getLogger(__name__)


def placement(g, cuda: bool) -> tuple[str, str]:
    """(device, torch dtype name) of the attention model for generation settings `g`."""
    if not cuda:
        return "cpu", "float32"
    import torch

    return f"cuda:{torch.cuda.current_device()}", "float16" if g.dtype == "float16" else "bfloat16"


@register_backend("attention")
class AttentionPass:
    def __init__(self, cfg, backends=None, *, model_path: str | None = None, max_attention_bytes: float | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from pipeline.assets.models import resolve_model

        self.max_attention_bytes = max_attention_bytes or cfg.generation.attention_batch_mib * 2**20
        self.forward_batches: list[int] = []  # items per forward pass, for tests and benchmarks
        gen = backends.generator if backends is not None and cfg.generation.backend == "transformers" else None
        if gen is not None and hasattr(gen, "model"):
            self.model, self.tokenizer = gen.model, gen.tokenizer
        else:
            path = model_path or resolve_model(cfg.generation.model, cfg.paths.cache_dir)
            device, dtype = placement(cfg.generation, torch.cuda.is_available())
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.generation.trust_remote_code)
            self.model = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=getattr(torch, dtype),
                device_map=device,
                attn_implementation="eager",
                trust_remote_code=cfg.generation.trust_remote_code,
            ).eval()
        if self.model.config._attn_implementation != "eager":
            raise ValueError("the attention backend needs a model loaded with attn_implementation='eager'")
        self.device = next(self.model.parameters()).device
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        )
        self.heads = self.model.config.num_attention_heads

    # -- the operation -------------------------------------------------------------------------
    def stats(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        enc = [self._encode(it) for it in items]
        order = sorted(range(len(items)), key=lambda k: len(enc[k]["ids"]))
        results: list[Any] = [None] * len(items)
        batch: list[int] = []
        for k in order:
            width = len(enc[k]["ids"])
            if batch and (len(batch) + 1) * self.heads * width * width * 4 > self.max_attention_bytes:
                self._forward([enc[b] for b in batch], batch, results)
                batch = []
            batch.append(k)
        if batch:
            self._forward([enc[b] for b in batch], batch, results)
        return results

    # -- internals -------------------------------------------------------------------------------
    def _encode(self, item: dict[str, Any]) -> dict[str, Any]:
        prompt, generated = item["prompt"], item["generated"]
        p_ids, g_ids = [int(t) for t in item["prompt_ids"]], [int(t) for t in item["generated_ids"]]
        if generated and not g_ids:
            raise DynragError("no generated token ids: the attention pass scores the generator's Completion.token_ids")
        p = self.tokenizer(prompt, add_special_tokens=True, return_offsets_mapping=True)
        if list(p["input_ids"]) != p_ids:
            raise DynragError("the prompt ids are not the attention tokenizer's encoding of the prompt text")
        g_text, g_spans = detokenize(self.tokenizer, g_ids, p_ids)
        if not g_text.startswith(generated):
            raise DynragError(
                f"the generated ids decode to {g_text[:40]!r}, not to the generator's text {generated[:40]!r}"
            )
        gen_offsets = clip(g_spans, len(generated))
        shift = len(prompt)
        offsets = [tuple(o) for o in p["offset_mapping"]] + [(s + shift, e + shift) for s, e in gen_offsets]
        n_prompt = len(p_ids)
        full = prompt + generated
        spans = word_spans(full, offsets)
        context = [tuple(c) for c in item.get("context", [])]
        cand = [j for j in range(n_prompt) if any(offsets[j][0] < ce and cs < offsets[j][1] for cs, ce in context)]
        cand += list(range(n_prompt, len(offsets)))
        return {
            "ids": p_ids + g_ids,
            "n_prompt": n_prompt,
            "gen_offsets": gen_offsets,
            "cand": cand,
            "cand_words": [None if (sp := spans[j]) is None else full[sp[0] : sp[1]] for j in cand],
            "cand_order": [-1 if (sp := spans[j]) is None else sp[0] for j in cand],
        }

    def _forward(self, encs: list[dict], slots: list[int], results: list) -> None:
        import torch

        width = max(len(e["ids"]) for e in encs)
        ids = torch.full((len(encs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encs), width), dtype=torch.long)
        for r, e in enumerate(encs):
            ids[r, : len(e["ids"])] = torch.tensor(e["ids"])
            mask[r, : len(e["ids"])] = 1
        captured: dict[str, Any] = {}
        decoder = self.model.get_decoder()
        hook = decoder.layers[-1].self_attn.register_forward_hook(
            lambda _m, _inp, out: captured.__setitem__("w", out[1].float().mean(dim=1))
        )
        try:
            with torch.no_grad():
                hidden = decoder(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
                head = self.model.get_output_embeddings()
                for r, (e, slot) in enumerate(zip(encs, slots)):
                    results[slot] = self._item_stats(e, hidden[r], captured["w"][r], head)
        finally:
            hook.remove()
        self.forward_batches.append(len(encs))

    @staticmethod
    def _item_stats(e: dict, hidden, attn, head) -> dict[str, Any]:
        n_prompt, length = e["n_prompt"], len(e["ids"])
        gen = np.arange(n_prompt, length)
        if gen.size == 0:
            return {
                "offsets": [],
                "entropy": np.zeros(0),
                "prob": np.zeros(0),
                "amax": np.zeros(0),
                "cand_words": e["cand_words"],
                "cand_order": e["cand_order"],
                "cand_attn": np.zeros((0, len(e["cand"])), dtype=np.float32),
            }
        # the distribution that produced token i sits at position i - 1
        logits = head(hidden[gen - 1]).float().cpu().numpy()
        tok = np.asarray(e["ids"])[gen]
        z = logits - logits.max(axis=-1, keepdims=True)
        prob = np.exp(z[np.arange(len(gen)), tok]) / np.exp(z).sum(axis=-1)
        a = attn[:length, :length].cpu().numpy()
        cand = np.asarray(e["cand"])
        cand_attn = a[np.ix_(gen, cand)] * (cand[None, :] < gen[:, None])  # only tokens before i (Sec. 3.2)
        return {
            "offsets": e["gen_offsets"],
            "entropy": entropy(logits),
            "prob": prob,
            "amax": max_later_attention(a, gen, length),
            "cand_words": e["cand_words"],
            "cand_order": e["cand_order"],
            "cand_attn": cand_attn.astype(np.float32),
        }
