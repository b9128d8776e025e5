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

An item may carry `skip_bound`: {"theta", "attention_norm", "top_logprobs": one list of the generator's top
log-probabilities per generated token}. Where that bound proves no token's RIND score can exceed theta
(pipeline/backends/dragin_math.py, `rind_upper_bound`), the pass is skipped and the result is
{"skipped": True, "offsets": ...}; the bound needs the model's vocabulary size, which this backend knows.

The pass computes only what RIND and QFS read (pipeline/backends/rind_pass.py): SDPA below the last
layer, the last layer's weights for the generated rows, and the keys and values of the prompt prefix the
call's items share (the few-shot exemplars) computed once and kept across calls, so a pass costs the
item's suffix. `generation.attention_pass=full` runs every layer eager over the whole sequence (the
official implementation's pass; `dynrag bench dragin --reference`). Items are sorted by length and cut
into forward batches whose last-layer weights fit `generation.attention_batch_mib` and whose padding
stays within a quarter of its real positions.
DRAGIN's code computes RIND's attention and its real-words query otherwise; the authors' setting asks for
theirs (pipeline/backends/authors_attention.py), each a forward over exactly the tokens the code feeds,
every layer eager, no prefix reuse:

    Call("attention", "authors_rind", [{"ids": [int], "ended": bool}, ...])
        -> {"words": [str], "ranges": [(first, last)], "attns": [float]} per item: generate_attn's words of
        the generated ids (with the end-of-sequence id after them where `ended`, as the code's generate keeps
        it) and each word's attention from a forward over those ids alone
    Call("attention", "authors_qfs", [{"text": str, "n_curr": int, "hits": [0|1], "real_words": [str],
                                       "top_k": int}, ...])
        -> the query per item: keep_real_words over `text` (the question, the answer so far, the kept
        sentences and the current sentence's words) encoded as the tokenizer encodes it

With generation.backend=transformers the generator's model is reused, otherwise it is loaded here, where
`placement` says: on a GPU, the generator's device in half precision (bf16 unless the generator runs
fp16), in the same process as the generator (the Ray engine actor beside vLLM: one copy per GPU, so leave
it room with generation.engine_kwargs.gpu_memory_utilization); on a CPU fp32, the exact figures
(`generation.attention_dtype` sets another: bf16 matrix products ran 2.3x fp32's here, on AVX512-BF16,
but round entropies and weights: `dynrag bench dragin --reference` counts the decisions that change). vLLM's own copy of the weights lives in its engine process and cannot be shared.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from pipeline.backends import authors_attention as authors
from pipeline.backends import register_backend
from pipeline.backends.detok import clip, detokenize
from pipeline.backends.dragin_math import (
    cannot_trigger,
    entropy,
    entropy_upper_bound,
    max_later_attention,
    rind_upper_bound,
    word_spans,
)
from pipeline.errors import DynragError

log = logging.getLogger(__name__)


def placement(g, cuda: bool) -> tuple[str, str]:
    """(device, torch dtype name) of the attention model for generation settings `g`."""
    if not cuda:
        return "cpu", "float32" if g.attention_dtype == "auto" else g.attention_dtype
    import torch

    auto = "float16" if g.dtype == "float16" else "bfloat16"
    return f"cuda:{torch.cuda.current_device()}", auto if g.attention_dtype == "auto" else g.attention_dtype


PADDING = 0.25  # a forward batch's padded positions stay within this share of its real ones


@register_backend("attention")
class AttentionPass:
    def __init__(self, cfg, backends=None, *, model_path: str | None = None, max_attention_bytes: float | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from pipeline.assets.models import resolve_model
        from pipeline.backends import rind_pass
        from platform_shims.device import own_cuda

        rind_pass.register()
        self.max_attention_bytes = max_attention_bytes or cfg.generation.attention_batch_mib * 2**20
        self.mode = cfg.generation.attention_pass  # "incremental" | "full"; the bench switches it
        self.forward_batches: list[int] = []  # items per forward pass, for tests and benchmarks
        self.skipped = 0  # items whose RIND bound made the pass needless
        gen = backends.generator if backends is not None and cfg.generation.backend == "transformers" else None
        if gen is not None and hasattr(gen, "model"):
            self.model, self.tokenizer = gen.model, gen.tokenizer
        else:
            path = model_path or resolve_model(cfg.generation.model, cfg.paths.cache_dir)
            device, dtype = placement(cfg.generation, own_cuda())
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.generation.trust_remote_code)
            self.model = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=getattr(torch, dtype),
                device_map=device,
                attn_implementation=rind_pass.IMPLEMENTATION,
                trust_remote_code=cfg.generation.trust_remote_code,
            ).eval()
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.passes = rind_pass.RindPass(self.model, pad_id)  # raises unless the model runs IMPLEMENTATION
        self.device = self.passes.device
        self.heads = self.model.config.num_attention_heads

    @property
    def tokens_computed(self) -> int:
        """Positions run through the model so far (shared prefixes once), for benchmarks."""
        return self.passes.tokens_computed

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Each text's length in the model's tokens, encoded as a prompt is (DRAGIN's code stops at a length)."""
        return [len(self.tokenizer.encode(t)) for t in texts]

    # -- DRAGIN's code's RIND attention and query (the authors' setting) -------------------------
    @property
    def space_token(self) -> str:
        """BasicGenerator's space token: "▁" for a model of type llama, else the tokenizer's token for " "."""
        return "▁" if self.model.config.model_type == "llama" else self.tokenizer.tokenize(" ")[0]

    def _words(self, ids: list[int], after_eos: bool) -> tuple[list[str], list[tuple[int, int]], list[str]]:
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        ranges = authors.word_ranges(tokens, ids, self.space_token, after_eos)
        return tokens, ranges, authors.word_texts(tokens, ranges, self.space_token)

    def authors_rind(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for it in items:
            ids = [int(t) for t in it["ids"]]
            if it.get("ended") and self.tokenizer.eos_token_id is not None:
                ids.append(self.tokenizer.eos_token_id)
            if not ids:
                out.append({"words": [], "ranges": [], "attns": []})
                continue
            tokens, ranges, words = self._words(ids, after_eos=True)
            heads = self.passes.last_layer_heads(ids)
            out.append({"words": words, "ranges": ranges, "attns": authors.word_attention(heads, tokens, ranges)})
        return out

    def authors_qfs(self, items: list[dict[str, Any]]) -> list[str]:
        out = []
        for it in items:
            ids = list(self.tokenizer.encode(it["text"]))
            _, ranges, words = self._words(ids, after_eos=False)
            mean = self.passes.last_layer_heads(ids).mean(dim=0)
            fwd = authors.forward_attention(mean, ranges, it["n_curr"], it["hits"])
            out.append(authors.real_words_query(words, fwd, it["n_curr"], it["hits"], it["real_words"], it["top_k"]))
        return out

    def last_tokens(self, items: list[tuple[str, int]]) -> list[str]:
        """Each (text, n): the text cut to its last n tokens and decoded, special tokens left out (DRAGIN's
        BM25 truncates a query so, on the left, before it searches)."""
        return [
            self.tokenizer.decode(self.tokenizer.encode(t, add_special_tokens=False)[-n:], skip_special_tokens=True)
            for t, n in items
        ]

    # -- the operation -------------------------------------------------------------------------
    def stats(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        enc = [self._encode(it) for it in items]
        seqs, starts = [e["ids"] for e in enc], [e["n_prompt"] for e in enc]
        full = self.mode == "full"
        results: list[Any] = [None] * len(items)
        for k, (it, e) in enumerate(zip(items, enc)):
            if "skip_bound" in it and not full and self._bound_holds(it["skip_bound"], it["generated"], e):
                results[k] = {"skipped": True, "offsets": e["gen_offsets"]}
                self.skipped += 1
        todo = [k for k in range(len(items)) if results[k] is None]
        if not todo:
            return results
        prefix = None if full else self.passes.shared_prefix([seqs[k] for k in todo], [starts[k] for k in todo])
        m = len(prefix.ids) if prefix else 0
        order = sorted(todo, key=lambda k: len(seqs[k]))
        batch: list[int] = []
        for k in order:
            width, rows = len(seqs[k]), len(seqs[k]) - m  # full: rows == width (m == 0)
            grown = (len(batch) + 1) * self.heads * rows * width * 4 > self.max_attention_bytes
            padded = (len(batch) + 1) * rows > (1 + PADDING) * (sum(len(seqs[b]) - m for b in batch) + rows)
            if batch and (grown or (padded and not full)):
                self._forward(enc, batch, prefix, results)
                batch = []
            batch.append(k)
        if batch:
            self._forward(enc, batch, prefix, results)
        return results

    def _bound_holds(self, bound: dict, generated: str, e: dict) -> bool:
        """The RIND bound of the generator's top log-probabilities (one list per generated token) stays below
        theta for every token of `generated` (dragin_math.rind_upper_bound): no pass needed."""
        tops = bound["top_logprobs"]
        if len(tops) != len(e["gen_offsets"]) or not all(tops):
            return False
        vocab = self.model.config.get_text_config(decoder=True).vocab_size
        h = np.array([entropy_upper_bound(t, vocab) for t in tops])
        s = rind_upper_bound(h, generated, [tuple(o) for o in e["gen_offsets"]], bound["attention_norm"])
        return cannot_trigger(s, bound["theta"])

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

    def _forward(self, enc: list[dict], batch: list[int], prefix, results: list) -> None:
        import torch

        outs = self.passes.run(
            [enc[k]["ids"] for k in batch], [enc[k]["n_prompt"] for k in batch], prefix, full=self.mode == "full"
        )
        head = self.model.get_output_embeddings()
        with torch.no_grad():
            for k, (hidden, rows) in zip(batch, outs):
                results[k] = self._item_stats(enc[k], hidden, rows, head)
        self.forward_batches.append(len(batch))

    @staticmethod
    def _item_stats(e: dict, hidden, rows, head) -> dict[str, Any]:
        """`hidden`: the final hidden states that produced the generated tokens; `rows`: the generated
        tokens' last-layer attention over every position before them."""
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
        logits = head(hidden).float().cpu().numpy()
        tok = np.asarray(e["ids"])[gen]
        z = logits - logits.max(axis=-1, keepdims=True)
        prob = np.exp(z[np.arange(len(gen)), tok]) / np.exp(z).sum(axis=-1)
        a = rows.cpu().numpy()
        cand = np.asarray(e["cand"])
        cand_attn = a[:, cand] * (cand[None, :] < gen[:, None])  # only tokens before i (Sec. 3.2)
        return {
            "offsets": e["gen_offsets"],
            "entropy": entropy(logits),
            "prob": prob,
            "amax": max_later_attention(a[:, gen], np.arange(len(gen)), len(gen)),
            "cand_words": e["cand_words"],
            "cand_order": e["cand_order"],
            "cand_attn": cand_attn.astype(np.float32),
        }
