"""DRAGIN's attention pass computing only what RIND and QFS read (pipeline/backends/rind_pass.py): SDPA
below the last layer and the shared prompt prefix's keys and values kept across calls give the same
entropy, probabilities, a_max and QFS attention as one full eager forward per sequence (fp32, 1e-4); the
RIND bound from top log-probabilities never skips a pass that would trigger."""

from __future__ import annotations

import numpy as np
import pytest
from dragin_fakes import PASSAGES, VllmLike, attention_item
from engine_fixtures import captured_ids, tiny_model_path
from fakes import MemoryRetriever

from pipeline.backends.dragin_math import (
    cannot_trigger,
    entropy,
    entropy_upper_bound,
    first_above,
    max_later_attention,
    rind,
    rind_upper_bound,
    semantic_mask,
    sentence_relative,
)
from pipeline.config import DynragConfig

EXEMPLARS = "Question: Who wrote Dracula?\nAnswer: Bram Stoker wrote it. So the answer is Bram Stoker.\n\n" * 2


def item(tok, docs: str, question: str, generated: str, so_far: str = "") -> dict:
    """An attention item for a DRAGIN-shaped prompt (exemplars, documents, the question, the answer so far)."""
    head = EXEMPLARS + (f"Context:\n{docs}\n\n" if docs else "") + "Question: "
    p = f"{head}{question}\nAnswer:{so_far}"
    return attention_item(tok, p, generated, [(len(head), len(head) + len(question))])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(tiny_model_path(tmp_path_factory))


def reference_stats(path, it) -> dict:
    """One full eager forward over the sequence, every layer's weights returned (the official pass)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    p_ids, g_ids = it["prompt_ids"], it["generated_ids"]
    with torch.no_grad():
        o = model(torch.tensor([p_ids + g_ids]), output_attentions=True)
    n, length = len(p_ids), len(p_ids) + len(g_ids)
    logits = o.logits[0, n - 1 : length - 1].numpy()
    a = o.attentions[-1][0].mean(0).numpy()
    probs = torch.softmax(o.logits[0, n - 1 : length - 1], -1)[torch.arange(length - n), torch.tensor(g_ids)]
    return {
        "entropy": entropy(logits),
        "prob": probs.numpy(),
        "amax": max_later_attention(a, np.arange(n, length), length),
        "rows": a[n:length],
    }


def check_equal(path, items, results) -> None:
    for it, r in zip(items, results):
        ref = reference_stats(path, it)
        assert r["entropy"] == pytest.approx(ref["entropy"], abs=1e-4)
        assert r["prob"] == pytest.approx(ref["prob"], abs=1e-4)
        assert r["amax"] == pytest.approx(ref["amax"], abs=1e-4)
        n = len(it["prompt_ids"])
        # QFS's attention: the generated rows over the generated candidates before them
        assert r["cand_attn"].shape[0] == len(it["generated_ids"])
        gen_cols = ref["rows"][:, n:]
        assert np.allclose(r["cand_attn"][:, -gen_cols.shape[1] :], np.tril(gen_cols, -1), atol=1e-4)


def test_incremental_pass_equals_the_full_eager_forward_across_calls_and_a_changed_prompt(model_path):
    from pipeline.backends.attention import AttentionPass

    backend = AttentionPass(DynragConfig(), None, model_path=model_path)
    tok = backend.tokenizer
    scored = captured_ids(backend)
    questions = ["who wrote the novel?", "where was Tosca first staged?", "is Paris in France?"]
    first = [
        item(tok, "", q, " The author of the book was born in London" + " yes" * i) for i, q in enumerate(questions)
    ]
    full_tokens = sum(len(it["prompt_ids"]) + len(it["generated_ids"]) for it in first)
    check_equal(model_path, first, backend.stats(first))
    kept = backend.passes.prefix
    assert kept is not None and len(kept.ids) >= 40  # the exemplars' keys and values, kept
    assert first[0]["prompt_ids"][: len(kept.ids)] == kept.ids
    assert backend.tokens_computed < 0.6 * full_tokens  # the shared prefix ran once
    assert sorted(scored) == sorted(it["prompt_ids"] + it["generated_ids"] for it in first)

    # the next round: a retrieval changed the prompt after the exemplars; the kept prefix is cut, not recomputed
    second = [
        item(tok, f"[1] Doc {i}: a passage about item {i} and its author.", q, " was born in Dublin", " The author")
        for i, q in enumerate(questions)
    ]
    before = backend.tokens_computed
    check_equal(model_path, second, backend.stats(second))
    assert backend.passes.prefix.ids == kept.ids[: len(backend.passes.prefix.ids)]
    assert backend.tokens_computed - before == sum(
        len(it["prompt_ids"]) + len(it["generated_ids"]) - len(backend.passes.prefix.ids) for it in second
    )

    # a prompt sharing nothing with the kept prefix: computed whole, still exact
    other = [attention_item(tok, "Berlin is the capital of Germany and its largest city by far.", " It is", [])]
    check_equal(model_path, other, backend.stats(other))

    # the full mode (the reference) agrees too, and runs every token
    backend.mode = "full"
    before = backend.tokens_computed
    check_equal(model_path, second, backend.stats(second))
    assert backend.tokens_computed - before == sum(len(it["prompt_ids"]) + len(it["generated_ids"]) for it in second)


def test_skip_bound_skips_only_what_cannot_trigger_and_says_so(model_path):
    """A confident generator's bound clears theta (skipped); a diffuse one's does not (the pass runs)."""
    from pipeline.backends.attention import AttentionPass

    backend = AttentionPass(DynragConfig(), None, model_path=model_path)
    tok = backend.tokenizer
    it = item(tok, "", "who wrote the novel?", " Bram Stoker wrote Dracula.")
    n = len(it["generated_ids"])
    confident = [[-1e-7] + [-25.0] * 19 for _ in range(n)]
    diffuse = [[np.log(0.05)] * 20 for _ in range(n)]
    bound = {"theta": 1.3, "attention_norm": "none"}
    sure, unsure = (
        dict(it, skip_bound={**bound, "top_logprobs": confident}),
        dict(it, skip_bound={**bound, "top_logprobs": diffuse}),
    )
    res = backend.stats([sure, unsure])
    assert res[0] == {"skipped": True, "offsets": res[1]["offsets"]} and "entropy" in res[1]
    assert backend.skipped == 1 and backend.forward_batches == [1]
    # a token list that does not match the generated ids is never trusted
    short = dict(it, skip_bound={**bound, "top_logprobs": confident[:-1]})
    assert "entropy" in backend.stats([short])[0]


class Confident(VllmLike):
    """VllmLike whose every token comes with 20 top log-probabilities, the chosen one all but certain."""

    def generate(self, prompts, samplings, chats):
        outs = super().generate(prompts, samplings, chats)
        for o in outs:
            for t in o.logprobs or []:
                t.top = {t.token: -1e-9, **{f"other{k}": -40.0 for k in range(19)}}
        return outs


@pytest.mark.parametrize("skip_bound", [True, False])
def test_dragin_skips_the_pass_where_the_generators_logprobs_bound_rind(model_path, skip_bound):
    from transformers import AutoTokenizer

    from pipeline.backends import Backends
    from pipeline.backends.attention import AttentionPass
    from pipeline.engine.core import Engine
    from pipeline.engine.requests import Question
    from pipeline.methods.registry import get_method

    att = AttentionPass(DynragConfig(), None, model_path=model_path)
    gen = Confident(AutoTokenizer.from_pretrained(model_path))
    engine = Engine(
        Backends(DynragConfig(), generator=gen, retriever=MemoryRetriever(PASSAGES), named={"attention": att})
    )
    spec = get_method("dragin")
    q = [Question("0", "Who directed the film Jaws?", dataset="hotpotqa")]
    (o,) = engine.run(q, spec.program, spec.params({"skip_bound": skip_bound, "theta": 1.3}))
    assert o.error is None, o.error
    assert all(t.top for t in gen.outs[0].logprobs) if skip_bound else gen.outs[0].logprobs is None
    if skip_bound:  # every chunk certain: no pass, no retrieval, and the row says why
        assert att.forward_batches == [] and att.skipped == 1 and o.answer.extra["attention_skipped"] == 1
        assert o.answer.extra["retrievals"] == 0
    else:
        assert att.forward_batches and att.skipped == 0 and o.answer.extra["attention_skipped"] == 0


def test_entropy_upper_bound_on_hand_computed_cases():
    # the whole distribution known: the bound is the entropy itself
    p = np.array([0.5, 0.25, 0.25])
    assert entropy_upper_bound(list(np.log(p)), 3) == pytest.approx(float(-(p * np.log(p)).sum()))
    # half the mass unknown over 10 other tokens: 0.5 log 2 + 0.5 log(10 / 0.5)
    assert entropy_upper_bound([np.log(0.5)], 11) == pytest.approx(0.5 * np.log(2) + 0.5 * np.log(20))


def test_rind_bound_never_skips_a_chunk_the_full_pass_would_trigger_on():
    """Property test over random logits, attention and texts: wherever the bound says the chunk cannot
    trigger, RIND on the exact entropy and attention does not trigger; and it does skip some chunks."""
    rng = np.random.default_rng(0)
    words = ["the", "Bram", "Stoker", "wrote", "Dracula", "in", "1897", ".", "and", "London", ",", "is"]
    skipped = 0
    for case in range(600):
        n = int(rng.integers(2, 14))
        picked = [words[k] for k in rng.integers(0, len(words), n)]
        text, offsets = "", []
        for w in picked:
            start = len(text) + (0 if w in ".," else 1)
            text += ("" if w in ".," else " ") + w
            offsets.append((start, len(text)))
        vocab = int(rng.integers(30, 300))
        sharp = rng.choice([0.5, 5.0, 30.0, 80.0])
        logits = rng.normal(size=(n, vocab)) * sharp
        logp = (
            logits
            - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
            - logits.max(1, keepdims=True)
        )
        k = int(rng.integers(1, 21))
        tops = [sorted(row, reverse=True)[:k] for row in logp]
        attn = np.tril(rng.dirichlet(np.ones(n) * rng.choice([0.05, 1.0]), size=n))
        attn = attn / attn.sum(1, keepdims=True)
        norm = "sentence" if case % 2 else "none"
        theta = float(rng.choice([0.1, 0.5, 1.3, 3.0]))
        amax = max_later_attention(attn, np.arange(n), n)
        amax = sentence_relative(amax, text, offsets) if norm == "sentence" else amax
        fires = first_above(rind(entropy(logits), amax, semantic_mask(text, offsets)), theta) is not None
        bounds = rind_upper_bound(np.array([entropy_upper_bound(t, vocab) for t in tops]), text, offsets, norm)
        if cannot_trigger(bounds, theta):
            skipped += 1
            assert not fires, (case, text)
    assert skipped > 50
