"""One answer-extraction rule for every method (pipeline/methods/prompts.py), on the phrasings small models
produce: a marker sentence, a chat-style preamble, a continued "Question: ... Answer:" block, quotes."""

import pytest

from pipeline.methods.dragin import complete
from pipeline.methods.prompts import extract_answer, marked_answer


@pytest.mark.parametrize("text, answer", [
    ("The answer to this question is: X", "X"),  # was "to this question is: X"
    (" Jaws is by Steven Spielberg. So the answer is Steven Spielberg.", "Steven Spielberg"),
    ("Doc 1 says so.\nAnswer: Paris.", "Paris"),
    ("The answer is: 1960\nmore", "1960"),
    ('Final answer: "Berlin"', "Berlin"),
    ("Answer: Paris\nQuestion: Who founded Lyon?\nAnswer: Plancus", "Paris"),  # the model went on: first answer
    ("Answer:\n\nRome", "Rome"),
    ("Berlin", "Berlin"),
    ("  \n\"Oslo\"\nmore text", "Oslo"),
    ("He answered the call.", "He answered the call"),  # "answered" is no marker
    ("", ""),
])
def test_every_method_extracts_the_same_way(text, answer):
    assert extract_answer(text) == answer


def test_marker_presence_drives_dragin_forcing_and_completion():
    assert marked_answer("no answer here") is None  # DRAGIN then forces "So the answer is"
    assert marked_answer("x. So the answer is") == ""
    assert complete("x. So the answer is Paris.") and not complete("x. So the answer is")
    assert not complete("So the answer is J. K.")  # "J. K." is no finished sentence (spaCy tokens)
