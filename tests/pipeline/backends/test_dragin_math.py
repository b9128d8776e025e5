"""DRAGIN's equations (Su et al., 2024, Sec. 3) on hand-made distributions and attention matrices."""

import math

import numpy as np
import pytest

from pipeline.backends.dragin_math import (
    Candidate,
    candidates_for,
    entropy,
    first_above,
    max_later_attention,
    qfs_query,
    rind,
    semantic_mask,
    sentence_spans,
    truncate,
    word_spans,
)
from pipeline.methods.dragin import complete, cot_prompt, table9

# "the Nile flows" as four tokens: "the", " Nile", " flo", "ws"
TEXT = "the Nile flows"
OFFSETS = [(0, 3), (3, 8), (8, 12), (12, 14)]
# last-layer attention, row j = what token j attends to (causal: row sums to 1, zero above the diagonal)
ATTN = np.array([[1.0, 0.0, 0.0, 0.0], [0.6, 0.4, 0.0, 0.0], [0.2, 0.5, 0.3, 0.0], [0.1, 0.2, 0.3, 0.4]])


def test_entropy_eq1_exact_over_the_vocabulary():
    # uniform over 4 tokens: ln 4; (1/2, 1/4, 1/4): 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2
    h = entropy(np.log(np.array([[0.25, 0.25, 0.25, 0.25], [0.5, 0.25, 0.25, 1e-300]])))
    assert h[0] == pytest.approx(math.log(4))
    assert h[1] == pytest.approx(1.5 * math.log(2), rel=1e-9)
    # softmax is shift-invariant; a peaked distribution has near-zero entropy
    assert entropy(np.array([[1000.0, 0.0, 0.0]]))[0] == pytest.approx(0.0, abs=1e-12)
    assert entropy(np.array([[5.0, 5.0]]))[0] == pytest.approx(math.log(2))


def test_max_later_attention_eq3_reads_columns_below_the_token():
    a = max_later_attention(ATTN, np.arange(4), 4)
    assert a.tolist() == [0.6, 0.5, 0.3, 0.0]  # token 3 has no later token
    # only the sequence's own tokens count (rows past `length` are padding)
    assert max_later_attention(ATTN, np.array([0, 1]), 2).tolist() == [0.6, 0.0]


def test_stop_words_and_punctuation_are_masked_eq4():
    assert semantic_mask(TEXT, OFFSETS).tolist() == [0.0, 1.0, 1.0, 1.0]  # "the" is a spaCy stop word
    text = "It was in Paris."
    offs = [(0, 2), (2, 6), (6, 9), (9, 15), (15, 16)]
    assert semantic_mask(text, offs).tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]  # "." has no word


def test_rind_eq5_triggers_at_the_first_token_above_theta():
    h = np.array([1.0, 2.0, 0.5, 3.0])
    scores = rind(h, max_later_attention(ATTN, np.arange(4), 4), semantic_mask(TEXT, OFFSETS))
    # "the": stop word -> 0; "Nile": 2.0 * 0.5 = 1.0; "flo": 0.5 * 0.3 = 0.15; "ws": nothing follows -> 0
    assert scores == pytest.approx([0.0, 1.0, 0.15, 0.0])
    assert first_above(scores, 0.9) == 1
    assert first_above(scores, 0.1) == 1
    assert first_above(scores, 1.0) is None  # strictly above the threshold
    # without the mask the high-entropy stop word would have triggered first
    assert first_above(rind(h * [3, 1, 1, 1], [0.6, 0.5, 0.3, 0], [1, 1, 1, 1]), 0.9) == 0


def test_truncation_eq6_cuts_before_the_tokens_word():
    assert truncate(TEXT, OFFSETS, 1) == "the"
    assert truncate(TEXT, OFFSETS, 3) == "the Nile"  # "ws" is inside "flows": the whole word goes
    assert truncate(TEXT, OFFSETS, 0) == ""


def test_word_spans_map_subword_tokens_to_words():
    assert word_spans(TEXT, OFFSETS) == [(0, 3), (4, 8), (9, 14), (9, 14)]
    assert word_spans("a, b", [(0, 1), (1, 2), (2, 4)]) == [(0, 1), None, (3, 4)]


def test_qfs_picks_top_n_tokens_and_keeps_text_order():
    text = "Who directed Jaws? Jaws was directed by Steven"
    offs = [(0, 3), (3, 12), (12, 17), (17, 18), (18, 23), (23, 27), (27, 36), (36, 39), (39, 46)]
    cands = candidates_for(text, offs)
    assert [c.word for c in cands] == ["Who", "directed", "Jaws", None, "Jaws", "was", "directed", "by", "Steven"]
    w = np.array([0.05, 0.20, 0.30, 0.90, 0.10, 0.80, 0.01, 0.70, 0.40])
    # stop words ("was", "by", "Who") and punctuation are skipped; top 3 = Jaws(0.30), Steven(0.40), directed(0.20)
    assert qfs_query(w, cands, 3) == "directed Jaws Steven"  # text order, not attention order
    assert qfs_query(w, cands, 1) == "Steven"
    # with stop words allowed, "was" (0.80) and "by" (0.70) come first and are placed in text order
    assert qfs_query(w, cands, 3, skip_stop_words=False) == "was by Steven"
    # two tokens of one word give the word once
    sub = [Candidate("Spielberg", 5), Candidate("Spielberg", 5), Candidate("Steven", 0)]
    assert qfs_query(np.array([0.9, 0.8, 0.1]), sub, 2) == "Spielberg"
    assert qfs_query(np.array([0.9, 0.8, 0.1]), sub, 3) == "Steven Spielberg"


def test_sentences_answers_and_prompts():
    assert sentence_spans(" A was born in 1950. B died. So the answer is x") == [(0, 20), (20, 28), (28, 47)]
    assert complete("x. So the answer is Paris.") and not complete("x. So the answer is")
    prompt, spans = cot_prompt("Who directed Jaws?", [], " It was", 50)
    assert prompt.endswith("Question: Who directed Jaws?\nAnswer: It was")
    assert [prompt[s:e] for s, e in spans] == ["Who directed Jaws?", " It was"]
    assert table9("2wikimultihopqa") == (64, 1.2, 40) and table9("hotpotqa") == (100, 1.3, 35)


def test_abbreviations_and_decimals_end_no_sentence():
    # the old regex ('.', '!' or '?' before a blank) also cut after "U.S." and "J. K."
    text = "The U.S. population grew 3.5 percent in 2010. It was the largest rise."
    assert sentence_spans(text) == [(0, 45), (45, 70)]
    assert sentence_spans("J. K. Rowling wrote it. Dr. Smith agreed!  ") == [(0, 23), (23, 41)]
    assert not complete("x. So the answer is J. K.") and not complete("x. So the answer is 3.5")
    assert complete("x. So the answer is 3.5 percent.")


def test_sentence_relative_attention_has_mean_one_per_sentence():
    from pipeline.backends.dragin_math import sentence_relative

    text = "Ann ran. Bo is up."  # not "A b. C d e.": spaCy reads a single letter and a period as an initial
    offs = [(0, 3), (3, 7), (7, 8), (8, 11), (11, 14), (14, 17), (17, 18)]  # "Ann"," ran","."," Bo"," is"," up","."
    rel = sentence_relative(np.array([0.2, 0.4, 0.0, 0.1, 0.1, 0.4, 0.0]), text, offs)
    # sentence 1 mean 0.2 -> 1, 2, 0; sentence 2 mean 0.15 -> 2/3, 2/3, 8/3, 0
    assert rel == pytest.approx([1.0, 2.0, 0.0, 2 / 3, 2 / 3, 8 / 3, 0.0])
