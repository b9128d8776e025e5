"""The demo's questions: packaged questions that the packaged corpus can answer.

Rule (`RULE`): the first N questions of a packaged DPR set, in file order, that name an article of the packaged
Wikipedia corpus (its title, without a trailing "(qualifier)", occurs as whole words in the question) whose
lead section (title and text) holds a gold alias as whole words; question, titles, sections and aliases are
normalised as the EM metric normalises them (lower case, no punctuation, no a/an/the). The rule reads only
the corpus and the questions, not the retriever. The selection is written once as JSONL under the cache.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.engine.requests import Question

RULE = (
    "the first N questions (file order) that name an article of the packaged Wikipedia corpus (its title "
    "occurs in the question) whose lead section holds a gold alias; all normalised as for EM"
)
VERSION = 2  # part of the cached file's name: bump when the rule changes
_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")


def sections_by_title(sections: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Normalised title without its "(qualifier)" -> the normalised `title text` of its sections, padded
    with spaces so that ` alias ` finds whole words."""
    from pipeline.text.metrics import normalize_answer

    out: dict[str, list[str]] = {}
    for title, text in sections:
        key = normalize_answer(_QUALIFIER.sub("", title))
        if key:
            out.setdefault(key, []).append(f" {normalize_answer(f'{title} {text}')} ")
    return out


def answerable(questions: Iterable[Question], sections: dict[str, list[str]], n: int) -> Iterator[Question]:
    """The first `n` of `questions` (order kept) that name a title of `sections` (see sections_by_title)
    whose section holds a normalised gold alias."""
    from pipeline.text.metrics import normalize_answer

    longest = max((len(t.split()) for t in sections), default=0)
    found = 0
    for q in questions:
        if found >= n:
            return
        words = normalize_answer(q.question).split()
        named = {
            " ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, min(len(words), i + longest) + 1)
        }
        texts = [s for title in named & sections.keys() for s in sections[title]]
        aliases = [f" {a} " for a in map(normalize_answer, q.answers) if a]
        if not q.error and any(a in s for a in aliases for s in texts):
            found += 1
            yield q


def check_count(n: int) -> None:
    from pipeline.errors import DynragError

    if n < 1:
        raise DynragError(f"the demo needs at least one question (got {n})")


def demo_questions(name: str, n: int, cache_dir: str | os.PathLike) -> Path:
    """JSONL {id, question, answer} of the first `n` answerable questions of packaged set `name` (RULE),
    made once under `<cache_dir>/embedded` (a few seconds); ids are `<name>-<line in the packaged file>`."""
    from pipeline.assets.embedded import dpr_questions, wikipedia_lead_sections
    from pipeline.io.datasets import MADE, load_questions

    check_count(n)
    source = dpr_questions(name, cache_dir)
    target = source.parent / f"demo-{name}-{n}-v{VERSION}.jsonl"
    if target.exists():
        return target
    records = json.loads(wikipedia_lead_sections(cache_dir).read_text(encoding="utf-8")).values()
    sections = sections_by_title((r.get("title") or "", r.get("extract") or "") for r in records)
    chosen = list(answerable(load_questions(str(source), fmt="dpr-topics"), sections, n))
    tmp = target.with_name(target.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        for q in chosen:
            qid = f"{name}-{q.id.removeprefix(MADE + 'line-')}"
            f.write(json.dumps({"id": qid, "question": q.question, "answer": q.answers}) + "\n")
    tmp.replace(target)
    return target
