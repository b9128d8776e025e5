"""DRAGIN and its baselines on the engine: many questions' generations, attention passes and searches are
batched into one backend call per round; the real attention backend does one padded forward pass for
many items and its entropy / attention equal an unpadded single-sequence forward."""

from __future__ import annotations

import numpy as np
import pytest
from dragin_fakes import BYTE_GUESS, FIRST, PASSAGES, VllmLike, attention_item
from engine_fixtures import captured_ids, tiny_model_path
from fakes import PIECE, FakeAttention, MemoryRetriever

from jobs.bench.rig.simulated import tokenized
from pipeline.backends import Backends
from pipeline.backends.dragin_math import word_spans
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Completion, Question, TokenLogprob
from pipeline.methods.registry import get_method

GUESS = " The film was made by Zorblat Unknown. So the answer is Unknown."  # without documents
INFORMED = " The film was made by Steven Spielberg. So the answer is Steven Spielberg."  # with documents


class ScriptedGenerator:
    """Continues a fixed reasoning (INFORMED with documents in the prompt, GUESS without) from where the
    prompt's answer ends; "Zorblat" has a low probability. Records the number of prompts per call."""

    def __init__(self):
        self.calls: list[int] = []
        self.outs: list[Completion] = []

    def generate(self, prompts, samplings, chats):
        self.calls.append(len(prompts))
        out = []
        for prompt, spec in zip(prompts, samplings):
            target = INFORMED if "Context:" in prompt else GUESS
            so_far = prompt.rsplit("\nAnswer:", 1)[1]
            text = target[len(so_far) :] if so_far and target.startswith(so_far) else target
            if so_far.endswith("So the answer is"):
                text = " Unknown."
            pieces = PIECE.findall(text)
            finish = "length" if len(pieces) > spec.max_tokens else "stop"
            pieces = pieces[: spec.max_tokens]
            text = "".join(pieces)
            lps = (
                [TokenLogprob(p, float(np.log(0.1 if "Zorblat" in p else 0.9))) for p in pieces]
                if spec.logprobs
                else None
            )
            out.append(
                Completion(
                    text,
                    prompt_tokens=len(prompt.split()),
                    completion_tokens=len(pieces),
                    finish_reason=finish,
                    logprobs=lps,
                    **tokenized(prompt, pieces, spec.token_spans),
                )
            )
        self.outs += out
        return out


# the batching counted here is the methods': the retrieval cache would fold repeated queries
NO_CACHE = DynragConfig.model_validate({"answer": {"retrieval_cache": 0}})


def run(method: str, n: int = 12, params=None):
    qs = [
        Question(str(i), f"Who directed the film Jaws number {i}?", answers=["Steven Spielberg"], dataset="hotpotqa")
        for i in range(n)
    ]
    gen, ret, att = ScriptedGenerator(), MemoryRetriever(PASSAGES), FakeAttention()
    engine = Engine(Backends(NO_CACHE, generator=gen, retriever=ret, named={"attention": att}))
    spec = get_method(method)
    return engine.run(qs, spec.program, spec.params(params or {})), gen, ret, att, engine


def test_dragin_batches_generation_attention_and_retrieval_across_questions():
    out, gen, ret, att, engine = run("dragin")
    assert all(o.error is None for o in out), out[0].error
    # round 1: 12 generations, 12 attention items, 12 queries; round 2 (with documents): 12 + 12
    assert gen.calls == [12, 12]
    assert att.calls == [12, 12]
    assert ret.calls == [12]
    assert engine.batch_calls["attention.stats"] == 2
    # the attention pass got each completion's own prompt and output ids
    got = [(it["prompt_ids"], it["generated_ids"]) for it in att.items]
    assert got == [(o.prompt_token_ids, o.token_ids) for o in gen.outs] and all(g for _, g in got)
    a = out[0].answer
    assert a.prediction == "Steven Spielberg"
    assert a.extra["retrievals"] == 1 and a.extra["hallucination_points"] == 1 and a.extra["entropy"] == "exact"
    assert a.extra["generated_tokens"] == len(PIECE.findall(GUESS)) + len(PIECE.findall(INFORMED)) - 5
    # QFS: the question's content words (attended most), then earlier output words, in text order
    assert a.extra["queries"][0] == "directed film Jaws number 0 film"
    assert "The film was made by Steven Spielberg." in a.raw_output
    assert out[0].trace.backend_calls == {"attention.stats": 2}
    # the trigger: RIND fired at " Zorblat", the 6th answer token (index 5), where the output was truncated
    assert a.extra["retrieval_at_tokens"] == [5] and PIECE.findall(GUESS)[5] == " Zorblat"
    tr = out[0].trace  # the attention pass is its own stage; each retrieved document records when it came
    assert tr.time["attention"] > 0 and all(d["at_s"] > 0 for d in tr.retrieved)


def test_flare_truncates_before_the_low_probability_sentence_and_masks_it():
    out, gen, ret, att, _ = run("flare")
    assert gen.calls == [12, 12] and ret.calls == [12] and att.calls == []
    a = out[3].answer
    assert a.prediction == "Steven Spielberg" and a.extra["retrievals"] == 1
    assert a.extra["queries"] == ["The film was made by Unknown"]
    assert a.extra["retrieval_at_tokens"] == [0]  # the low-probability sentence was the first: nothing kept


def test_fixed_rule_baselines_retrieve_per_window_and_per_sentence():
    out, gen, ret, _, _ = run("fs-rag")
    # question first, then after each of the two sentences but the last: 2 retrieval rounds of 12
    assert ret.calls == [12, 12] and gen.calls == [12, 12]
    assert out[0].answer.extra["queries"] == [
        "Who directed the film Jaws number 0?",
        "The film was made by Steven Spielberg.",
    ]
    out, gen, ret, _, _ = run("fl-rag", params={"window": 4})
    assert ret.calls[0] == 12 and all(c == 12 for c in gen.calls) and len(gen.calls) == len(ret.calls)
    assert out[0].answer.extra["queries"][1] == "The film was made"


def test_dragin_without_retrieval_budget_never_calls_attention():
    out, gen, ret, att, _ = run("dragin", params={"max_retrievals": 0})
    assert att.calls == [] and ret.calls == []
    assert out[0].answer.prediction == "Unknown" and out[0].answer.retrieval_triggered is False


def test_attention_backend_one_padded_pass_equals_single_forwards(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.backends.attention import AttentionPass
    from pipeline.backends.dragin_math import entropy

    path = tiny_model_path(tmp_path_factory)
    backend = AttentionPass(DynragConfig(), None, model_path=str(path))
    tok = AutoTokenizer.from_pretrained(path)
    prompt = "Question: who wrote the novel?\nAnswer:"
    items = [
        attention_item(tok, prompt, " the author of the book" + " was born in London" * (i % 3), [(10, 30)])
        for i in range(9)
    ]
    res = backend.stats(items)
    assert backend.forward_batches == [6, 3]  # sorted by length; the longest three would pad over a quarter
    backend.mode = "full"
    full = backend.stats(items)
    assert backend.forward_batches[2:] == [9]  # the reference pass: one padded forward for all nine

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    for it, r, f in zip(items[:3], res[:3], full[:3]):
        assert f["entropy"] == pytest.approx(r["entropy"], abs=1e-5) and np.allclose(f["amax"], r["amax"], atol=1e-6)
        p_ids, g_ids = it["prompt_ids"], it["generated_ids"]
        with torch.no_grad():
            o = model(torch.tensor([p_ids + g_ids]), output_attentions=True)
        n, L = len(p_ids), len(p_ids) + len(g_ids)
        logits = o.logits[0, n - 1 : L - 1].numpy()
        assert r["entropy"] == pytest.approx(entropy(logits), rel=1e-4, abs=1e-5)
        a = o.attentions[-1][0].mean(0).numpy()
        assert r["amax"] == pytest.approx([a[i + 1 :, i].max() if i + 1 < L else 0.0 for i in range(n, L)], abs=1e-5)
        probs = torch.softmax(o.logits[0, n - 1 : L - 1], -1)[torch.arange(L - n), torch.tensor(g_ids)].numpy()
        assert r["prob"] == pytest.approx(probs, rel=1e-4)
        # QFS candidates: the question's tokens (the context span) then every generated token
        words = [w for w in r["cand_words"] if w]
        assert words[:5] == ["who", "wrote", "the", "novel", "the"] or words[0] == "who"
        assert r["cand_attn"].shape == (L - n, len(r["cand_words"]))
        assert np.allclose(np.triu(r["cand_attn"][:, -(L - n) :]), 0)  # nothing at or after the token itself
        assert len(r["offsets"]) == L - n and word_spans(it["generated"], r["offsets"])[0] is not None


def test_attention_model_is_loaded_on_the_device_and_dtype_placement_resolves(tmp_path_factory, monkeypatch):
    import torch

    from pipeline.backends import attention
    from pipeline.config import GenerationConfig

    path = str(tiny_model_path(tmp_path_factory))
    cpu = attention.AttentionPass(DynragConfig(), None, model_path=path)
    item = attention_item(
        cpu.tokenizer, "Question: who wrote the novel?\nAnswer:", " the author of the book", [(10, 30)]
    )
    assert (cpu.device.type, cpu.model.dtype) == ("cpu", torch.float32)  # no GPU: fp32 on the CPU, as before

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert attention.placement(GenerationConfig(), True) == ("cuda:1", "bfloat16")
    assert attention.placement(GenerationConfig(dtype="float16"), True) == ("cuda:1", "float16")
    assert attention.placement(GenerationConfig(attention_dtype="bfloat16"), False) == ("cpu", "bfloat16")
    assert attention.placement(GenerationConfig(attention_dtype="float32"), True) == ("cuda:1", "float32")
    # a machine that reports a GPU takes the GPU path: its dtype, with the device swapped for the CPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_path = attention.placement
    monkeypatch.setattr(attention, "placement", lambda g, cuda: ("cpu", gpu_path(g, cuda)[1]))
    half = attention.AttentionPass(DynragConfig(), None, model_path=path)
    assert half.model.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in half.model.parameters())
    (r16,), (r32,) = half.stats([item]), cpu.stats([item])
    assert r16["offsets"] == r32["offsets"] and r16["entropy"].dtype == r32["entropy"].dtype
    assert r16["entropy"] == pytest.approx(r32["entropy"], rel=0.05)


def test_attention_pass_scores_the_generators_ids_not_a_reencoding_of_the_texts(tmp_path_factory):
    """Ids a generator may emit that its tokenizer would not: a word spelled one byte-level character per
    token, and a random model's own greedy output after a prompt that ends mid-word. The pass scores those
    ids, and places them in the text by reading them back."""
    from pipeline.backends.attention import AttentionPass
    from pipeline.backends.hf_gen import HfGenerator
    from pipeline.engine.requests import SamplingSpec

    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.backend = "transformers"
    hf = HfGenerator(cfg)
    backend = AttentionPass(cfg, Backends(cfg, generator=hf))
    assert backend.model is hf.model
    tok = hf.tokenizer

    prompt = "Question: who wrote the novel?\nAnswer:"
    spelled = " the author"
    char_ids = tok.convert_tokens_to_ids(["Ġ" if c == " " else c for c in spelled])
    items = [attention_item(tok, prompt, spelled, [(10, 30)], generated_ids=char_ids)]
    spec = SamplingSpec(max_tokens=10, temperature=0.0, stop=("\n",))
    mid_word = ["Question: who wrote the nov", "Berlin is the capi", "Shirley Temple was an Amer"]
    for p, out in zip(mid_word, hf.generate(mid_word, [spec] * 3, [False] * 3)):
        assert out.prompt_token_ids == tok(p)["input_ids"] and out.text.strip()
        items.append(attention_item(tok, p, out.text, [(0, len(p))], generated_ids=out.token_ids))
    # encoding the texts apart (the old pass) gives other ids for the spelled word and some greedy outputs
    apart = [it["prompt_ids"] + tok(it["generated"], add_special_tokens=False)["input_ids"] for it in items]
    ran = [it["prompt_ids"] + it["generated_ids"] for it in items]
    assert apart[0] != ran[0] and sum(a != r for a, r in zip(apart, ran)) >= 2

    rows = captured_ids(backend)  # from here on: the generator's model shared, its generate not called
    res = backend.stats(items)
    assert sorted(rows) == sorted(ran)  # exactly the generator's ids went through the model
    for it, r in zip(items, res):
        n = len(it["generated_ids"])
        assert len(r["offsets"]) == n and r["entropy"].shape == r["prob"].shape == (n,)
        spans = list(dict.fromkeys(map(tuple, r["offsets"])))
        assert "".join(it["generated"][s:e] for s, e in spans) == it["generated"]
    # each character of the spelled word is one token, placed on its own character and mapped to its word
    assert [tuple(o) for o in res[0]["offsets"]] == [(i, i + 1) for i in range(len(spelled))]
    assert res[0]["cand_words"][-len(spelled) :] == [None, "the", "the", "the", None] + ["author"] * 6


@pytest.fixture(scope="module")
def run_bytes(tmp_path_factory):
    """Runs a method on one question over VllmLike."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path(tmp_path_factory))
    q = [Question("0", "Who directed the film Jaws?", answers=["Steven Spielberg"], dataset="hotpotqa")]

    def run_with(method):
        gen = VllmLike(tok)
        engine = Engine(Backends(DynragConfig(), generator=gen, retriever=MemoryRetriever(PASSAGES)))
        spec = get_method(method)
        (o,) = engine.run(q, spec.program, spec.params({}))
        assert o.error is None, o.error
        return o.answer, gen, lambda text: len(tok(text, add_special_tokens=False)["input_ids"])

    return run_with


def test_flare_places_byte_level_tokens_by_reading_their_ids(run_bytes):
    """vLLM's `decoded_token` of each byte of a multi-byte character is U+FFFD: laid end to end, those strings
    run past the characters, and a low-probability word after "東京" landed on the next word. The spans read
    from the ids put it on its own word."""
    a, gen, n_tokens = run_bytes("flare")
    assert len("".join(t.token for t in gen.outs[0].logprobs)) > len(BYTE_GUESS)  # a U+FFFD per byte
    assert a.extra["queries"] == ["The film was made by Unknown"]  # " Zorblat", not " Unknown", was masked
    assert a.extra["retrieval_at_tokens"] == [n_tokens(FIRST)]  # the first sentence kept, all its tokens counted
    assert a.prediction == "Steven Spielberg"
    assert a.raw_output.startswith(FIRST.strip() + " The film was made by Steven")


def test_fs_rag_counts_byte_level_tokens_by_reading_their_ids(run_bytes):
    a, _, n_tokens = run_bytes("fs-rag")
    second = " The film was made by Steven Spielberg."
    assert a.extra["queries"] == ["Who directed the film Jaws?", FIRST.strip(), second.strip()]
    assert a.extra["retrieval_at_tokens"] == [0, n_tokens(FIRST), n_tokens(FIRST) + n_tokens(second)]


class ChatSentenceGenerator:
    """Chat prompts: continues sentence by sentence from the answer the prompt's assistant turn holds, with
    FACT's sentences when the documents (system message) name Spielberg, else GUESSED's; "Zorblat" has a low
    probability. Records every prompt."""

    FACT = [" Steven Spielberg.", " He was born in 1946."]
    GUESSED = [" Zorblat directed Jaws.", " He was born in 1946."]

    def __init__(self):
        self.prompts: list = []

    def generate(self, prompts, samplings, chats):
        out = []
        for prompt, spec, chat in zip(prompts, samplings, chats):
            assert chat and isinstance(prompt, list)
            self.prompts.append(prompt)
            docs = "Spielberg" in prompt[0]["content"]
            so_far = prompt[-1]["content"] if prompt[-1]["role"] == "assistant" else ""
            done = so_far.count(".")
            pieces = PIECE.findall("".join((self.FACT if docs else self.GUESSED)[done:]))[: spec.max_tokens]
            lps = [TokenLogprob(p, float(np.log(0.1 if "Zorblat" in p else 0.9))) for p in pieces]
            text = "".join(pieces)
            out.append(
                Completion(
                    text, 10, len(pieces), "stop", logprobs=lps, **tokenized(prompt[-1]["content"], pieces, True)
                )
            )
        return out


@pytest.mark.parametrize("keep_docs", [True, False])
def test_flare_with_a_template_regenerates_one_sentence_per_retrieval_unless_docs_are_kept(keep_docs):

    gen = ChatSentenceGenerator()
    engine = Engine(Backends(DynragConfig(), generator=gen, retriever=MemoryRetriever(PASSAGES)))
    tpl = {"system": "Documents:\n{reference}", "user": "Question: {question}", "chat": True}
    spec = get_method("flare")
    qs = [Question("0", "Who directed the film Jaws?", answers=["Steven Spielberg"])]
    params = spec.params({"template": tpl, "keep_docs": keep_docs, "max_tokens": 32, "k": 1})
    a = engine.run(qs, spec.program, params)[0].answer
    # the sentence with "Zorblat" triggers one retrieval; its query drops the low-probability word
    assert a.extra["queries"] == ["directed Jaws"] and a.extra["retrievals"] == 1
    assert a.raw_output == "Steven Spielberg. He was born in 1946."
    assert a.prediction == "Steven Spielberg. He was born in 1946"  # the output itself: no answer marker
    assert not a.extra["answer_forced"]
    docs_in = ["Spielberg" in p[0]["content"] for p in gen.prompts]
    if keep_docs:  # the documents stay: the look-ahead with them is accepted whole
        assert docs_in == [False, True]
    else:  # only the regenerated sentence sees them; the model then goes on from it, without documents
        assert docs_in == [False, True, False]
        assert gen.prompts[-1][-1] == {"role": "assistant", "content": " Steven Spielberg."}


def test_flare_refuses_a_template_field_it_does_not_fill():
    from pipeline.methods.registry import MethodError

    with pytest.raises(MethodError, match="examples"):
        get_method("flare").params({"template": {"user": "{question} {examples}"}})
