"""Worked examples for the answer metrics (SQuAD normalisation) and gold-document recall."""

import pytest

from pipeline.evaluation.metrics import accuracy, answer_metrics, exact_match, f1_precision_recall, normalize_answer, support_recall


def test_normalisation_drops_case_punctuation_articles_and_spaces():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("  Chief of Protocol. ") == "chief of protocol"


def test_exact_match_takes_the_best_gold():
    assert exact_match("the Denver Broncos", ["Broncos", "Denver Broncos"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0


def test_f1_worked_example():
    # prediction tokens: [barack, obama, was, president]; gold: [barack, obama]
    # common 2 -> precision 2/4, recall 2/2, F1 = 2*0.5*1/(1.5) = 2/3
    f1, p, r = f1_precision_recall("Barack Obama was president", ["Barack Obama"])
    assert p == pytest.approx(0.5) and r == pytest.approx(1.0) and f1 == pytest.approx(2 / 3)
    # best over golds: "obama" alone gives P 1/4, R 1, F1 0.4 < 2/3
    f1b, _, _ = f1_precision_recall("Barack Obama was president", ["obama", "Barack Obama"])
    assert f1b == pytest.approx(2 / 3)


def test_f1_counts_repeated_tokens_once_each():
    # pred [new, york, new, york], gold [new, york]: common = min counts = 2; P 0.5 R 1 F1 2/3
    f1, p, r = f1_precision_recall("New York New York", ["New York"])
    assert (p, r) == (0.5, 1.0) and f1 == pytest.approx(2 / 3)


def test_yes_no_must_match_exactly():
    assert f1_precision_recall("yes it is", ["yes"])[0] == 0.0
    assert f1_precision_recall("yes", ["yes"])[0] == 1.0


def test_accuracy_is_gold_contained_as_whole_tokens():
    assert accuracy("It was Tequila, I think", ["tequila"]) == 1.0
    assert accuracy("Tequilas", ["tequila"]) == 0.0
    assert accuracy("anything", []) == 0.0


def test_answer_metrics_none_without_gold():
    assert answer_metrics("x", [])["em"] is None
    m = answer_metrics("Chief of Protocol", ["Chief of Protocol"])
    assert m == {"em": 1.0, "f1": 1.0, "acc": 1.0, "precision": 1.0, "recall": 1.0}


def test_support_recall():
    assert support_recall(["A", "B", "C"], ["A", "D"]) == 0.5
    assert support_recall(["A"], []) is None
    assert support_recall([], ["A"]) == 0.0
