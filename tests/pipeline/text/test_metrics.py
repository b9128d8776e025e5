"""Worked examples for the answer metrics (SQuAD normalisation) and gold-document recall."""

import pytest

from indexing.corpus.passages import paragraph_id
from pipeline.text.metrics import (
    accuracy,
    answer_metrics,
    exact_match,
    f1_precision_recall,
    normalize_answer,
    support_recall,
)


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


def test_support_recall_by_paragraph_where_titles_are_shared():
    """MuSiQue gives different paragraphs one title: two gold paragraphs titled "Paris", one retrieved (cut in
    two passages) and a third non-gold "Paris" paragraph retrieved. By title both golds would look found (1.0)."""
    gold_a, gold_b, other = (
        paragraph_id("Paris", t)
        for t in ("Paris is the capital.", "Paris, Texas is a city.", "Paris Hilton is a person.")
    )
    retrieved = [(f"{gold_a}#0", "Paris"), (f"{gold_a}#1", "Paris"), (other, "Paris"), ("p0", "Lyon")]
    assert support_recall(retrieved, ["Paris", "Paris"], [gold_a, gold_b]) == 0.5
    assert support_recall(retrieved, ["Paris", "Lyon"], [gold_a, ""]) == 1.0  # a title-only gold matches by title
    assert support_recall(retrieved, [], []) is None
    assert support_recall([], ["Paris"], [gold_a]) == 0.0


def test_supporting_paragraphs_from_a_question_file_carry_their_ids(tmp_path):
    import json

    from pipeline.io.datasets import load_questions

    rec = {
        "id": "q1",
        "question": "Which Paris?",
        "answer": "x",
        "answer_aliases": [],
        "question_decomposition": [],
        "paragraphs": [
            {"idx": 0, "title": "Paris", "paragraph_text": "Paris is the capital.", "is_supporting": True},
            {"idx": 1, "title": "Paris", "paragraph_text": "Paris, Texas is a city.", "is_supporting": True},
            {"idx": 2, "title": "Lyon", "paragraph_text": "Lyon is a city.", "is_supporting": False},
        ],
    }
    f = tmp_path / "musique.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    q = next(load_questions(str(f)))
    assert q.supporting_titles == ["Paris", "Paris"]
    assert q.supporting_ids == [
        paragraph_id("Paris", "Paris is the capital."),
        paragraph_id("Paris", "Paris, Texas is a city."),
    ]


def test_a_row_counts_documents_by_source_and_passages_apart():
    """Two passages cut from one paragraph are one document in the prompt (the papers count documents), two
    passages in all; gold recall finds the paragraph through either."""
    from indexing.search.hits import Hit
    from pipeline.engine.core import Outcome, Trace
    from pipeline.engine.requests import Answer, Question
    from pipeline.io.output import make_row

    gold = paragraph_id("Paris", "Paris is the capital.")
    used = [
        Hit(f"{gold}#0", "Paris", "Paris is", 1.0),
        Hit(f"{gold}#1", "Paris", "the capital.", 0.9),
        Hit("p0", "Lyon", "Lyon is a city.", 0.5),
    ]
    q = Question("q", "Which Paris?", ["x"], supporting_titles=["Paris"], supporting_ids=[gold])
    trace = Trace(retrieve_rounds=1)
    row = make_row(
        Outcome(q, Answer("x", used_docs=used), trace), run_id="r", method="m", params_json="{}", chash="h", model="m"
    )
    assert (row["docs_in_prompt"], row["passages_in_prompt"], row["support_recall"]) == (2, 3, 1.0)
