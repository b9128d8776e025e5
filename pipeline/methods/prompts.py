"""Prompt templates in the papers' style: the model is asked for a short answer the metrics can read.

The wording follows the "standard RAG" / "direct" prompts used by FlashRAG, DR-RAG and PAIRS:
documents listed as `Doc i (Title: t) text`, then the question, then "Answer:".
"""

from __future__ import annotations

import re
from typing import Sequence

from indexing.hits import Hit

SHORT = "Only give me the answer and do not output any other words."

DIRECT_SYSTEM = f"Answer the question below. {SHORT}"
RAG_SYSTEM = f"Answer the question based on the given documents. {SHORT}"


def format_docs(hits: Sequence[Hit]) -> str:
    return "\n".join(f"Doc {i} (Title: {h.title}) {h.text}" for i, h in enumerate(hits, 1))


def direct_prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": DIRECT_SYSTEM},
            {"role": "user", "content": f"Question: {question}\nAnswer:"}]


def rag_prompt(question: str, hits: Sequence[Hit]) -> list[dict[str, str]]:
    return [{"role": "system", "content": RAG_SYSTEM},
            {"role": "user", "content": f"The following are given documents.\n\n{format_docs(hits)}\n\n"
                                        f"Answer the question: {question}\nAnswer:"}]


_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:\-]?\s*", re.IGNORECASE)


def short_answer(text: str) -> str:
    """The first non-empty line, without an "Answer:" prefix or surrounding quotes."""
    for line in text.strip().splitlines():
        line = _PREFIX.sub("", line.strip()).strip().strip('"').strip()
        if line:
            return line
    return ""
