"""DRAGIN's RIND and query as its authors' code computes them (oneal2000/DRAGIN src/generate.py,
AttnWeightRAG; pipeline/backends/authors_attention.py, pipeline/methods/dragin_authors.py): the per-word
attention and entropy of generate_attn against the formula computed apart on a tiny random model, the
modifier and keep_real_words on hand-made numbers worked by hand, and the loop on scripted backends."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from engine_fixtures import tiny_model_path
from fakes import MemoryRetriever

from pipeline.backends import Backends
from pipeline.backends import authors_attention as aa
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Completion, Question, SamplingSpec
from pipeline.methods import dragin_authors as authors
from pipeline.methods.registry import get_method


# -- generate_attn on a tiny model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pipeline.backends.attention import AttentionPass
    from pipeline.backends.hf_gen import HfGenerator

    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.backend = "transformers"
    hf = HfGenerator(cfg)
    return hf, AttentionPass(cfg, Backends(cfg, generator=hf))


def eager_last_layer(path: str, ids: list[int]) -> np.ndarray:
    """The code's `model(ids, output_attentions=True).attentions[-1][0]`, an eager model of its own."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids]), output_attentions=True).attentions[-1][0].numpy()


def by_hand_words(tokens: list[str], ids: list[int], space: str, per_token: np.ndarray) -> tuple[list, list]:
    words, values = [], []
    for i, (t, tid) in enumerate(zip(tokens, ids)):
        if i == 0 or t.startswith(space) or tid == 13:
            words.append(t.replace(space, ""))
            values.append(float(per_token[i]))
        else:
            words[-1] += t.replace(space, "")
            values[-1] += float(per_token[i])
    return words, values


@pytest.mark.parametrize("space", ["llama", "Ġ"])
def test_word_attention_is_the_max_over_later_rows_averaged_over_heads_summed_per_word(tiny, space, monkeypatch):
    hf, backend = tiny
    tok = hf.tokenizer
    if space != "llama":  # a model of another type: words start at the tokenizer's token for " "
        monkeypatch.setattr(type(backend), "space_token", property(lambda self: "Ġ"))
    assert backend.space_token == ("▁" if space == "llama" else "Ġ")  # the tiny model is of type llama
    ids = tok("Berlin is the capital of Germany")["input_ids"] + [13] + tok(" Rome is")["input_ids"]
    (r,) = backend.authors_rind([{"ids": ids, "ended": True}])
    ids = ids + [tok.eos_token_id]  # an output the model ended: the code's ids hold the end token
    a = eager_last_layer(str(hf.model.name_or_path), ids)  # [heads, q, k]
    per_token = a.max(axis=1).mean(axis=0)
    words, values = by_hand_words(tok.convert_ids_to_tokens(ids), ids, backend.space_token, per_token)
    assert r["words"] == words and r["attns"] == pytest.approx(values, abs=1e-5)
    assert len(words) == (2 if space == "llama" else 9)  # llama: "▁" starts no byte-level token; id 13 does


def test_a_query_is_cut_to_its_last_tokens_on_the_left_as_their_bm25(tiny):
    """retriever.BM25.retrieve's truncation: the last n tokens, no special tokens, decoded."""
    _, attention = tiny
    tok = attention.tokenizer
    text = "Titanic was directed by James Cameron in 1997"
    ids = tok.encode(text, add_special_tokens=False)
    (whole, tail) = attention.last_tokens([(text, len(ids) + 5), (text, 3)])
    assert whole == tok.decode(ids, skip_special_tokens=True)
    assert tail == tok.decode(ids[-3:], skip_special_tokens=True) and text.endswith(tail.strip())
    assert tail != whole


def test_a_leading_end_token_divides_the_attention_by_the_rest():
    heads = torch.tensor([[[0.5, 0.2, 0.1], [0.1, 0.6, 0.3], [0.0, 0.0, 0.2]]])  # one head: max per column
    tokens = ["</s>", "▁a", "b"]
    ranges = aa.word_ranges(tokens, [2, 5, 6], "▁", after_eos=True)
    assert ranges == [(0, 0), (1, 2)]  # "▁a" starts a word (and would after "</s>" anyway)
    # max per key: 0.5, 0.6, 0.3; divided by 0.6 + 0.3
    assert aa.word_attention(heads, tokens, ranges) == pytest.approx([0.5 / 0.9, 1.0])
    assert aa.word_ranges(["x", "</s>", "y", "z"], [1, 2, 3, 4], "▁", after_eos=True) == [(0, 1), (2, 3)]


def test_special_text_is_the_decode_of_the_generated_ids_special_tokens_kept(tiny):
    """DRAGIN's code reads `tokenizer.decode(generated)`: special tokens in the middle (a chat model's
    <|im_start|>) and the end token kept; without special_text they are left out, as dynrag reads outputs."""
    hf, _ = tiny
    tok = hf.tokenizer
    prompt = "Question: who wrote the novel?\nAnswer:"
    kept, plain = (
        hf.generate([prompt], [SamplingSpec(max_tokens=12, temperature=0.0, special_text=s)], [False])[0]
        for s in (True, False)
    )
    ended = [tok.eos_token_id] if kept.finish_reason == "stop" else []
    assert kept.token_ids == plain.token_ids
    assert kept.text == tok.decode(kept.token_ids + ended)  # byte for byte, a partial character's "\ufffd" too
    assert kept.text != plain.text


def test_with_special_text_an_ended_output_s_logprobs_hold_the_end_token_as_its_text_does(tiny):
    """DRAGIN's TokenRAG walks `tokenizer.decode(t)` of every generated id, the end token's too, with its logprob
    (FLARE's sentence mean includes it). The tiny model's first greedy token stands in for its end token."""
    hf, _ = tiny
    prompt = "Question: who wrote the novel?\nAnswer:"
    spec = SamplingSpec(max_tokens=4, temperature=0.0, logprobs=1)
    first = hf.generate([prompt], [spec], [False])[0]
    eos = hf.tokenizer.eos_token_id
    hf.tokenizer.eos_token_id = first.token_ids[0]
    try:
        kept, plain = (
            hf.generate([prompt], [SamplingSpec(max_tokens=4, temperature=0.0, logprobs=1, special_text=s)], [False])[0]
            for s in (True, False)
        )
    finally:
        hf.tokenizer.eos_token_id = eos
    assert kept.finish_reason == "stop" and kept.token_ids == plain.token_ids == []
    assert plain.logprobs == [] and len(kept.logprobs) == 1
    assert kept.logprobs[0].token == kept.text and kept.logprobs[0].logprob == pytest.approx(first.logprobs[0].logprob)


def test_entropy_per_step_is_the_codes_over_the_scores_the_generator_chose_from(tiny):
    from scipy.special import softmax

    hf, _ = tiny
    prompt = "Question: who wrote the novel?\nAnswer:"
    spec = SamplingSpec(max_tokens=6, temperature=0.0, entropy=True)
    (out,) = hf.generate([prompt], [spec], [False])
    ids = torch.tensor([out.prompt_token_ids])
    g = hf.model.generate(
        input_ids=ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True, output_scores=True
    )
    scores = np.stack([s[0].numpy() for s in g.scores])
    p = softmax(scores, axis=-1)
    expected = -np.sum(p * np.log(p + 1e-10), axis=-1)  # generate_attn's entropies
    assert out.entropies == pytest.approx(expected[: len(out.entropies)].tolist(), rel=1e-5)
    assert len(out.entropies) == len(out.token_ids) + (out.finish_reason == "stop")
    assert aa.word_means([1.0, 2.0, 4.0], [(0, 1), (2, 2)]) == [1.5, 4.0]


def test_the_real_words_query_on_the_model_picks_by_the_hit_words_attention(tiny, monkeypatch):
    hf, backend = tiny
    text = "Who wrote the novel? Berlin is the capital of Germany"
    item = {"text": text, "n_curr": 1, "hits": [1], "real_words": ["Berlin", "capital", "Germany"], "top_k": 3}
    assert backend.authors_qfs([item]) == [""]  # llama's "▁" starts no byte-level token: one word, the hit one
    monkeypatch.setattr(type(backend), "space_token", property(lambda self: "Ġ"))
    assert backend.authors_qfs([item]) == ["Berlin capital"]  # "Germany" is the hit word
    # top 1: the one "Germany"'s tokens attend more, each token's row before it over the words before it
    ids = hf.tokenizer(text)["input_ids"]
    tokens = hf.tokenizer.convert_ids_to_tokens(ids)
    mean = eager_last_layer(str(hf.model.name_or_path), ids).mean(axis=0)
    starts = [i for i, t in enumerate(tokens) if i == 0 or t.startswith("Ġ")]
    g0 = starts[-1]  # "Germany" runs from g0 to the end
    att = sum(mean[t - 1, :g0] / mean[t - 1, :g0].sum() for t in range(g0, len(ids))) / (len(ids) - g0)
    ends = [*starts[1:], len(ids)]
    per_word = {tokens[a:b][-1].lstrip("Ġ"): float(att[a:b].sum()) for a, b in zip(starts, ends)}
    assert tokens[starts[4] : ends[4]] == ["Ġ", "Berlin"]  # a word of two tokens: their attention summed
    best = max(["Berlin", "capital"], key=per_word.__getitem__)
    assert backend.authors_qfs([{**item, "top_k": 1}]) == [best]


# -- the modifier ------------------------------------------------------------------------------------------
WORDS = ["Rome", "is", "in", "Italy.", "Zorblat", "directed", "it."]
SENTS = ["Rome is in Italy.", "Zorblat directed it."]


def test_modifier_finds_the_first_sentence_above_the_threshold_and_keeps_its_real_hit_words():
    attns = [1, 1, 1, 1, 2, 1, 1]
    weights = [0.1] * 4 + [1.0, 0.5, 1.5]
    # sentence 1: 1/4 * 0.1 * 4 = 0.1 each; sentence 2: 2/4 * 1.0 * 3 = 1.5, 1/4 * 0.5 * 3 = 0.375,
    # 1/4 * 1.5 * 3 = 1.125: "Zorblat" and "it." pass 0.8
    hit = authors.attn_modifier(WORDS, attns, weights, 0.8, SENTS, None)
    assert hit == ("Rome is in Italy.", ["Zorblat", "directed", "it."], [1, 0, 1])
    # with the real-word check, "it." holds none of the sentence's real words
    pos = {"Zorblat directed it.": {"Zorblat", "directed"}}
    hit = authors.attn_modifier(WORDS, attns, weights, 0.8, SENTS, pos.__getitem__)
    assert hit == ("Rome is in Italy.", ["Zorblat", "directed", "it."], [1, 0, 0])
    # the values are relative to the sentence: doubling every attention changes nothing
    assert authors.attn_modifier(WORDS, [2 * a for a in attns], weights, 0.8, SENTS, None)[2] == [1, 0, 1]
    assert authors.attn_modifier(WORDS, attns, weights, 1.6, SENTS, None) is None


def test_modifier_in_the_first_sentence_and_a_sentence_its_words_never_join_to():
    attns, weights = [1] * 7, [0.1] * 7
    weights[1] = 1.0  # "is": 1/4 * 1.0 * 4 = 1.0 > 0.8
    hit = authors.attn_modifier(WORDS, attns, weights, 0.8, SENTS, None)
    assert hit == ("", ["Rome", "is", "in", "Italy."], [0, 1, 0, 0])
    # a sentence the words never join to has no words (the code's tr stays tl); the last takes them all
    odd = ["Rome is  in Italy.", "Zorblat directed it."]
    hit = authors.attn_modifier(WORDS, attns, weights, 0.8, odd, None)
    assert hit == ("Rome is  in Italy.", WORDS, [0, 1, 0, 0, 0, 0, 0])  # 1/7 * 1.0 * 7 = 1.0


def test_real_words_are_the_taggers_and_without_one_the_words_but_stop_words():
    assert authors.real_words("Who directed the film Titanic in 1997?", None) == {"directed", "film", "Titanic", "1997"}


# -- keep_real_words -------------------------------------------------------------------------------------
# 5 tokens, 4 words: w0 = t0, w1 = t1 t2, w2 = t3, w3 = t4
RANGES = [(0, 0), (1, 2), (3, 3), (4, 4)]
MEAN = torch.tensor(
    [
        [1.0, 0, 0, 0, 0],
        [0.6, 0.4, 0, 0, 0],
        [0.5, 0.25, 0.25, 0, 0],
        [0.1, 0.2, 0.3, 0.2, 0.2],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ]
)


def test_forward_attention_is_the_row_before_each_token_over_the_words_before_it():
    # w3's one token t4: row t3 over t0..t3 renormalised (0.8): 0.125, 0.25, 0.375, 0.25 -> per word
    assert aa.forward_attention(MEAN, RANGES, 2, [0, 1]) == pytest.approx([0.125, 0.625, 0.25, 0])
    # w2's token t3: row t2 over t0..t2 -> 0.5, 0.5 (w1's two tokens), 0; the mean of the two hit words
    assert aa.forward_attention(MEAN, RANGES, 2, [1, 1]) == pytest.approx([0.3125, 0.5625, 0.125, 0])
    # w1 (two tokens): t1's row t0 over t0 -> 1; t2's row t1 over t0 (not its own word's t1) -> 1; / 2
    assert aa.forward_attention(MEAN, RANGES, 3, [1, 0, 0]) == pytest.approx([1, 0, 0, 0])
    assert all(math.isnan(v) for v in aa.forward_attention(MEAN, RANGES, 2, [0, 0]))  # the code's 0 / 0


def test_query_keeps_the_top_real_words_not_hit_in_text_order():
    words = ["Who", "directed", "Titanic?", "Cameron"]
    fwd = [0.125, 0.625, 0.25, 0.0]
    real = ["directed", "Titanic", "Cameron"]  # "Titanic" matches "Titanic?" (a substring)
    assert aa.real_words_query(words, fwd, 2, [0, 1], real, 1) == "directed"
    assert aa.real_words_query(words, [0.1, 0.2, 0.9, 0], 2, [0, 1], real, 2) == "directed Titanic?"
    assert aa.real_words_query(words, fwd, 2, [0, 0], real, 35) == "directed Titanic? Cameron"  # none hit
    nan = [math.nan] * 4  # no hit word: every attention NaN, the first top_k in text order
    assert aa.real_words_query(words, nan, 2, [0, 0], real, 2) == "directed Titanic?"


# -- the loop --------------------------------------------------------------------------------------------
FEWSHOT = "Question: Where is Rome?\nAnswer: Rome is in Italy. So the answer is Italy.\n"
CASE = "Question: {question}\nAnswer:"
PASSAGES = [
    ("p1", "Titanic", "Titanic won Best Picture at the 1998 Academy Awards."),
    ("p2", "James Cameron", "James Cameron directed Titanic."),
]
UNSURE = {"Zorblat": 3.0}


class Words:
    """One id per whitespace word, shared by the scripted generator and attention."""

    def __init__(self):
        self.words: list[str] = []

    def id(self, w: str) -> int:
        if w not in self.words:
            self.words.append(w)
        return self.words.index(w)


class WordScript:
    """Replies in order, one token per word, entropy 0.1 a word but UNSURE's."""

    def __init__(self, replies: list[str], vocab: Words):
        self.replies, self.vocab, self.prompts, self.specs = list(replies), vocab, [], []

    def generate(self, prompts, samplings, chats):
        self.prompts += prompts
        self.specs += samplings
        outs = []
        for spec in samplings:
            text = self.replies.pop(0)
            ids = [self.vocab.id(w) for w in text.split()]
            ent = [UNSURE.get(w, 0.1) for w in text.split()] if spec.entropy else None
            outs.append(Completion(text, 1, len(ids), "length", None, ids, entropies=ent))
        return outs


class WordAttention:
    """authors_rind: a word per id, each attended alike; authors_qfs: records its item, asks "Titanic"."""

    def __init__(self, vocab: Words):
        self.vocab, self.asked = vocab, []

    def authors_rind(self, items):
        return [
            {
                "words": [self.vocab.words[i] for i in it["ids"]],
                "ranges": [(k, k) for k in range(len(it["ids"]))],
                "attns": [1.0] * len(it["ids"]),
            }
            for it in items
        ]

    def authors_qfs(self, items):
        self.asked += items
        return ["Titanic" for _ in items]

    def count_tokens(self, texts):
        return [len(t.split()) for t in texts]

    def last_tokens(self, items):
        return [" ".join(t.split()[-n:]) for t, n in items]


def test_the_loop_retrieves_at_the_unsure_sentence_with_the_real_words_query():
    replies = [
        "Titanic was made in 1997. Zorblat directed it. So the answer is Zorblat.",
        "James Cameron directed it. Titanic won awards.",
        "So the answer is James Cameron.",
    ]
    vocab = Words()
    script, att = WordScript(replies, vocab), WordAttention(vocab)
    retriever = MemoryRetriever(PASSAGES)
    backends = Backends(DynragConfig(), generator=script, retriever=retriever, named={"attention": att})
    spec = get_method("dragin")
    p = spec.params({"authors": {"fewshot": FEWSHOT, "case_template": CASE}, "theta": 0.8, "top_n": 35, "k": 1})
    out = Engine(backends).run([Question("q1", "Who directed Titanic?", dataset="hotpotqa")], spec.program, p)[0]
    assert out.error is None, out.error
    case = CASE.format(question="Who directed Titanic?")
    prompts = script.prompts
    assert prompts[0] == FEWSHOT + case and script.specs[0].entropy
    # "Zorblat": 1/3 * 3.0 * 3 = 3.0 > 0.8, the first sentence's words 0.1: its sentence is dropped; the query
    # is asked over the question, the answer so far ("" joined by blanks as the code joins it), the kept
    # sentence and the dropped sentence's words, with its hit flags
    (asked,) = att.asked
    assert asked["text"] == "Who directed Titanic?  Titanic was made in 1997. Zorblat directed it."
    assert (asked["n_curr"], asked["hits"], asked["top_k"]) == (3, [1, 0, 0], 35)
    assert {"Zorblat", "Titanic", "directed", "1997"} <= set(asked["real_words"]) and "Who" not in asked["real_words"]
    assert out.answer.extra["queries"] == ["Titanic"] and out.answer.extra["retrievals"] == 1
    assert prompts[1] == FEWSHOT + "Context:\n[1] " + PASSAGES[0][2] + "\nAnswer in the same format as before.\n" + (
        case + " Titanic was made in 1997."
    )
    assert not script.specs[1].entropy  # the continuation is the code's plain generate
    # only the first new sentence is kept; the next round has no passages and no sentence above theta
    assert prompts[2] == FEWSHOT + case + " Titanic was made in 1997. James Cameron directed it."
    assert len(prompts) == 3 and out.answer.prediction == "James Cameron"


def test_the_loop_needs_the_generators_entropies():
    vocab = Words()

    class NoEntropy(WordScript):
        def generate(self, prompts, samplings, chats):
            return [
                Completion(o.text, 1, o.completion_tokens, "length", None, o.token_ids)
                for o in super().generate(prompts, samplings, chats)
            ]

    script, att = NoEntropy(["Rome is in Italy."], vocab), WordAttention(vocab)
    backends = Backends(DynragConfig(), generator=script, retriever=MemoryRetriever(PASSAGES), named={"attention": att})
    spec = get_method("dragin")
    p = spec.params({"authors": {"fewshot": FEWSHOT, "case_template": CASE}})
    out = Engine(backends).run([Question("q1", "Where is Rome?", dataset="hotpotqa")], spec.program, p)[0]
    assert out.error is not None and "generation.backend=transformers" in str(out.error)
