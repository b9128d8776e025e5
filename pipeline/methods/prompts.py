"""Prompt templates in the papers' style: the model is asked for a short answer the metrics can read.

The wording follows the "standard RAG" / "direct" prompts used by FlashRAG, DR-RAG and PAIRS:
documents listed as `Doc i (Title: t) text`, then the question, then "Answer:".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from indexing import Hit

SHORT = "Only give me the answer and do not output any other words."

DIRECT_SYSTEM = f"Answer the question below. {SHORT}"
RAG_SYSTEM = f"Answer the question based on the given documents. {SHORT}"


def format_docs(hits: Sequence[Hit]) -> str:
    return "\n".join(f"Doc {i} (Title: {h.title}) {h.text}" for i, h in enumerate(hits, 1))


def direct_prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": DIRECT_SYSTEM}, {"role": "user", "content": f"Question: {question}\nAnswer:"}]


def rag_prompt(question: str, hits: Sequence[Hit]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": RAG_SYSTEM},
        {
            "role": "user",
            "content": f"The following are given documents.\n\n{format_docs(hits)}\n\n"
            f"Answer the question: {question}\nAnswer:",
        },
    ]


# "So the answer is X", "The answer to this question is: X", "Final answer: X", "Answer: X"
ANSWER_MARKER = re.compile(
    r"(?:\bso\s+)?\b(?:the\s+)?(?:final\s+|short\s+)?answer(?:\s+to\s+(?:this|the)\s+question)?"
    r"\s*(?:\bis\b\s*:?|:)[ \t]*",
    re.IGNORECASE,
)
# DRAGIN's Appendix B marker: its few-shot exemplars end with "So the answer is X." The general marker would
# also match reasoning such as "the answer is not in the question".
SO_THE_ANSWER_IS = re.compile(r"\bso\s+the\s+answer\s+is\b\s*:?[ \t]*", re.IGNORECASE)


def _clean(line: str) -> str:
    return line.strip().strip('"').strip().rstrip(".").strip().strip('"').strip()


def marked_answer(text: str, marker: re.Pattern[str] = ANSWER_MARKER) -> str | None:
    """The rest of the line after the first answer marker ("so the answer is", "the answer to this question
    is:", "answer:"; or only `marker`'s matches) with something after it (a model that goes on writing
    "Question: ... Answer: ..." makes later markers); "" when no marker has anything after it, None when there
    is no marker."""
    found = marker.finditer(text)
    first = next(found, None)
    if first is None:
        return None
    rests = (text[m.end() :].split("\n", 1)[0] for m in (first, *found))
    return next((_clean(r) for r in rests if _clean(r)), "")


def extract_answer(text: str) -> str:
    """The one rule every method's prediction follows: the answer after an answer marker (`marked_answer`),
    else the first non-empty line without a leading marker; surrounding quotes and a final period removed."""
    stripped = (line.strip() for line in text.strip().splitlines())
    lines = (line[m.end() :] if (m := ANSWER_MARKER.match(line)) else line for line in stripped)
    return marked_answer(text) or next((_clean(x) for x in lines if _clean(x)), "")
