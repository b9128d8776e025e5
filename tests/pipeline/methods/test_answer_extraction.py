"""One answer-extraction rule for every method (pipeline/methods/prompts.py), on the phrasings small models
produce: a marker sentence, a chat-style preamble, a continued "Question: ... Answer:" block, quotes."""

import pytest

from pipeline.methods.dragin import complete
from pipeline.methods.prompts import SO_THE_ANSWER_IS, extract_answer, marked_answer


@pytest.mark.parametrize(
    "text, answer",
    [
        ("The answer to this question is: X", "X"),  # was "to this question is: X"
        (" Jaws is by Steven Spielberg. So the answer is Steven Spielberg.", "Steven Spielberg"),
        ("Doc 1 says so.\nAnswer: Paris.", "Paris"),
        ("The answer is: 1960\nmore", "1960"),
        ('Final answer: "Berlin"', "Berlin"),
        ("Answer: Paris\nQuestion: Who founded Lyon?\nAnswer: Plancus", "Paris"),  # the model went on: first answer
        ("Answer:\n\nRome", "Rome"),
        ('""\n  Answer:\nRome', "Rome"),  # an indented bare marker line: was "r:" (marker found on the stripped line)
        ("Berlin", "Berlin"),
        ('  \n"Oslo"\nmore text', "Oslo"),
        ("He answered the call.", "He answered the call"),  # "answered" is no marker
        ("", ""),
    ],
)
def test_every_method_extracts_the_same_way(text, answer):
    assert extract_answer(text) == answer


def test_marker_presence_drives_dragin_forcing_and_completion():
    assert marked_answer("no answer here") is None  # DRAGIN then forces "So the answer is"
    assert marked_answer("x. So the answer is") == ""
    assert complete("x. So the answer is Paris.") and not complete("x. So the answer is")
    assert not complete("So the answer is J. K.")  # "J. K." is no finished sentence (spaCy tokens)


def test_dragin_reads_only_so_the_answer_is():
    """Appendix B: the multi-round methods read the answer after "So the answer is"; the general marker would
    take "the answer is not in the question." mid-reasoning as a finished answer sentence."""
    reasoning = "The answer is not in the question. Jaws was directed by Steven Spielberg."
    assert not complete(reasoning)
    assert marked_answer(reasoning, marker=SO_THE_ANSWER_IS) is None  # DRAGIN then forces "So the answer is"
    assert marked_answer(reasoning) == "not in the question. Jaws was directed by Steven Spielberg"  # general rule
    done = reasoning + " So the answer is Steven Spielberg."
    assert complete(done)
    assert marked_answer(done, marker=SO_THE_ANSWER_IS) == "Steven Spielberg"
    # same first-marker-with-content and cleaning rule as the general marker
    assert marked_answer('x. So the answer is "".\nQ: y? So the answer is "Oslo".', marker=SO_THE_ANSWER_IS) == "Oslo"
    assert (
        marked_answer("So the answer is Paris.\nQuestion: z? So the answer is Lyon.", marker=SO_THE_ANSWER_IS)
        == "Paris"
    )
    assert marked_answer("x. So the answer is", marker=SO_THE_ANSWER_IS) == ""
