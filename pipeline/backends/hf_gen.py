"""Generation with transformers: the fallback backend, and the one that can return attention
weights (DRAGIN's RIND/QFS need them; vLLM never returns them). Batched with left padding.

The text is read from the ids as vLLM's detokenizer reads them (pipeline/backends/detok.py); stop strings
cut it, and the ids end, as vLLM's do, with the one that completes the stop string. Per-token logprobs
come from the generation scores, and so do per-step entropies (SamplingSpec.entropy, DRAGIN's code's).
`SamplingSpec.json_schema` is decoded under its grammar (pipeline/backends/constrained.py: xgrammar's logits
mask, as vLLM's structured outputs); `choice` and `regex` are not applied here (methods parse what comes).
`self.model` / `self.tokenizer` are public so that DRAGIN's attention pass reuses them: the model runs
SDPA attention through the pass's registered implementation (pipeline/backends/rind_pass.py), eager
where a pass asks for weights.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import cast

from pipeline.assets.models import resolve_model
from pipeline.backends.chat import cut_at_stop, encode, window_check
from pipeline.backends.detok import clip, detokenize
from pipeline.config import FORWARD_BATCH, DynragConfig, resolve_dtype
from pipeline.engine.requests import Completion, SamplingSpec, TokenLogprob

log = logging.getLogger(__name__)


class HfGenerator:
    def __init__(self, cfg: DynragConfig, model_path: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from pipeline.backends import rind_pass
        from platform_shims.device import own_cuda

        rind_pass.register()
        g = self.cfg = cfg.generation
        path = model_path or resolve_model(g.model, cfg.paths.cache_dir)
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=g.trust_remote_code)
        cuda = own_cuda()
        self.device = "cuda" if cuda else "cpu"
        dtype = getattr(torch, resolve_dtype(g.dtype, cuda))
        self.model = (
            AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=rind_pass.IMPLEMENTATION, trust_remote_code=g.trust_remote_code
            )
            .to(self.device)
            .eval()
        )
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        )
        self._grammars = None  # constrained.JsonGrammars, made at the first json_schema request
        log.info("transformers model %s ready in %.1f s", path, time.perf_counter() - t0)

    def generate(self, prompts, samplings, chats) -> list[Completion | Exception]:
        results: list[Completion | Exception | None] = [None] * len(prompts)
        encoded = []
        for i, (p, chat) in enumerate(zip(prompts, chats)):
            try:
                ids = encode(self.tokenizer, p, chat)
                full = window_check(len(ids), samplings[i], self.cfg.max_model_len, self.cfg.max_new_tokens)
                if full is not None:
                    results[i] = full
                    continue
                encoded.append((i, ids))
            except Exception as err:
                results[i] = err
        # group by sampling spec (one generate call per spec and batch of generation.batch_size), the engine's
        # priority aside: it orders a group's prompts into batches (lower first)
        groups: dict[SamplingSpec, list[tuple[int, list[int]]]] = {}
        for i, ids in sorted(encoded, key=lambda e: samplings[e[0]].priority):
            groups.setdefault(replace(samplings[i], priority=0), []).append((i, ids))
        bs = self.cfg.batch_size or FORWARD_BATCH
        for spec, items in groups.items():
            for start in range(0, len(items), bs):
                chunk = items[start : start + bs]
                for (i, _), c in zip(chunk, self._generate_batch([ids for _, ids in chunk], spec)):
                    results[i] = c
        return cast(list[Completion | Exception], results)  # every slot filled

    def _generate_batch(self, batch: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        import torch

        g = self.cfg
        width = max(len(x) for x in batch)
        input_ids = torch.tensor([[self.pad_id] * (width - len(x)) + x for x in batch], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=self.device)
        temperature = g.temperature if spec.temperature is None else spec.temperature
        max_new = min(spec.max_tokens or g.max_new_tokens, g.max_model_len - width)
        kwargs = dict(
            max_new_tokens=max(1, max_new),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=bool(spec.logprobs) or spec.entropy,
        )
        if spec.json_schema is not None:
            kwargs["logits_processor"] = [self.grammars().processor(spec.json_schema, len(batch))]
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=g.top_p if spec.top_p is None else spec.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
        seqs = out.sequences[:, width:]
        eos = self.tokenizer.eos_token_id
        completions = []
        for row, (ids, gen) in enumerate(zip(batch, seqs.tolist())):
            finish = "length"
            if eos is not None and eos in gen:
                gen = gen[: gen.index(eos)]
                finish = "stop"
            while gen and gen[-1] == self.pad_id:
                gen = gen[:-1]
            full, spans = detokenize(self.tokenizer, gen, ids)
            text, stopped = cut_at_stop(full, spec.stop)
            stop_reason = ""
            if stopped:  # as vLLM: the ids end with the one that completes the stop string
                stop_reason = next(s for s in spec.stop if s and full.startswith(s, len(text)))
                stop_end = len(text) + len(stop_reason)
                gen = gen[: next((k + 1 for k, (_, e) in enumerate(spans) if e >= stop_end), len(gen))]
                spans = clip(spans[: len(gen)], len(text))
            lps = None
            if spec.logprobs:  # with special_text, the end token's step too, as the text then holds it
                lps = []
                for step, tid in enumerate(
                    gen + ([eos] if spec.special_text and finish == "stop" and not stopped else [])
                ):
                    logp = torch.log_softmax(out.scores[step][row].float(), -1)
                    top = torch.topk(logp, spec.logprobs)
                    lps.append(
                        TokenLogprob(
                            self.tokenizer.decode([tid]),
                            float(logp[tid]),
                            {self.tokenizer.decode([int(t)]): float(v) for v, t in zip(top.values, top.indices)},
                        )
                    )
            entropies = None
            if spec.entropy:  # the end-of-sequence token's step too, where the model ended
                steps = len(gen) + (finish == "stop" and not stopped)
                entropies = [step_entropy(out.scores[step][row]) for step in range(steps)]
            if spec.special_text and not stopped:
                text = self.tokenizer.decode(gen + ([eos] if finish == "stop" else []))
            completions.append(
                Completion(
                    text,
                    len(ids),
                    len(gen),
                    "stop" if stopped else finish,
                    lps,
                    gen,
                    prompt_token_ids=list(ids),
                    token_spans=spans if spec.token_spans else None,
                    stop_reason=stop_reason,
                    entropies=entropies,
                )
            )
        return completions

    def grammars(self):
        """The tokenizer's compiled JSON-schema grammars; their end tokens are those generate stops at."""
        if self._grammars is None:
            from pipeline.backends.constrained import JsonGrammars

            ends = self.model.generation_config.eos_token_id
            ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
            if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ends:
                ends.append(self.tokenizer.eos_token_id)
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._grammars = JsonGrammars(self.tokenizer, vocab, ends)
        return self._grammars


def step_entropy(scores) -> float:
    """-sum p log(p + 1e-10) of softmax(scores) in float32, as DRAGIN's generate_attn computes it."""
    import torch

    p = torch.softmax(scores.float(), dim=-1)
    return float(-(p * torch.log(p + 1e-10)).sum())
