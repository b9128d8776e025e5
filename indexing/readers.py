"""Corpus readers: every supported format streamed as `Record`s, through fsspec.

Formats (`fmt`):

- `dpr-tsv`: DPR's psgs_w100.tsv, columns id, text, title, with a header line.
- `flashrag-jsonl`: one JSON object a line, `id` and `contents` = "\"Title\"\ntext" or "Title\ntext".
- `jsonl` / `parquet`: generic records; the id/title/text field names come from `fields`
  (default `{"id": "id", "title": "title", "text": "text"}`; an absent id field means
  content-derived ids; `"title": None` means no title).
- `hotpotqa`: the IRCoT processed JSONL (`contexts[]` = {title, paragraph_text}) or the official
  JSON list (`context` = [[title, [sentences]]]); also a corpus dict title -> sentences.
- `2wiki`: official JSONL or JSON list (`context` = [[title, [sentences]]]) or the corpus list
  [{title, text}].
- `musique`: official JSONL or JSON list (`paragraphs[]` = {title, paragraph_text}) or the corpus
  list [{title, text}].
- `wiki-lead-sections`: JSON dict title -> {title, extract, description, topic}.

`auto` picks the format from the extension and the first record. JSONL and TSV files stream line
by line; JSON files (dataset-sized lists and dicts) are parsed whole. Paragraphs of the multi-hop
datasets carry no source id: their passage ids are derived from (title, text) (see passages.py),
so a paragraph shared by several questions is one passage.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from indexing.errors import IndexingError

log = logging.getLogger(__name__)

FORMATS = ("dpr-tsv", "flashrag-jsonl", "jsonl", "parquet", "hotpotqa", "2wiki", "musique", "wiki-lead-sections")
DEFAULT_FIELDS = {"id": "id", "title": "title", "text": "text"}


class CorpusError(IndexingError, ValueError):
    """A corpus file is unreadable, malformed or of an unknown format; the message names file and line."""


@dataclass(frozen=True)
class Record:
    """One source document: `source_id` is None when the format has no ids (ids then come from content)."""

    title: str
    text: str
    source_id: str | None = None


@dataclass
class ReadStats:
    """Counts over one build; `skipped` lists `file:line: reason` of skipped bad lines (first 20)."""

    records: int = 0
    bad_lines: int = 0
    skipped: list[str] = field(default_factory=list)

    def skip(self, where: str, reason: str) -> None:
        self.bad_lines += 1
        if len(self.skipped) < 20:
            self.skipped.append(f"{where}: {reason}")
        log.warning("skipping bad record at %s: %s", where, reason)


class _Bad(Exception):
    """A malformed record; turned into a CorpusError or a skip by `read_corpus`."""


def _open(path: str, mode: str = "rt") -> Any:
    import fsspec

    try:
        if "b" in mode:
            return fsspec.open(path, mode, compression="infer").open()
        tsv = ".tsv" in path.rsplit("/", 1)[-1]
        return fsspec.open(path, mode, compression="infer", encoding="utf-8", newline="" if tsv else None).open()
    except FileNotFoundError:
        raise CorpusError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{path}: cannot open ({type(exc).__name__}: {exc})") from None


def _str(obj: dict, key: str, *, required: bool = True) -> str:
    if key not in obj or obj[key] is None:
        if required:
            raise _Bad(f"missing field {key!r}")
        return ""
    value = obj[key]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise _Bad(f"field {key!r} is {type(value).__name__}, not text")
    return value


def join_sentences(value: Any) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _Bad("paragraph sentences are not a list of strings")
    # HotpotQA keeps the leading space of each sentence; join without adding another.
    return "".join(value) if any(s.startswith(" ") for s in value[1:]) else " ".join(value)


# ---- record -> Records, one function per format (raise _Bad on malformed input) ----


def _flashrag(obj: Any, fields: dict) -> Iterator[Record]:
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    contents = _str(obj, "contents")
    head, sep, body = contents.partition("\n")
    if not sep:
        head, body = "", contents
    title = head.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    yield Record(title=title, text=body.strip(), source_id=_str(obj, "id"))


def _generic(obj: Any, fields: dict) -> Iterator[Record]:
    """Configurable fields. Whether a file has ids is decided by its first record: if that has the
    id field, every record must; if not, all ids are derived from content."""
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    id_key, title_key, text_key = fields.get("id"), fields.get("title"), fields.get("text") or "text"
    if "_has_ids" not in fields:
        fields["_has_ids"] = bool(id_key) and id_key in obj
    source_id = _str(obj, cast(str, id_key)) if fields["_has_ids"] else None  # _has_ids: id_key is set
    if source_id is not None and not source_id.strip():
        raise _Bad(f"empty {id_key!r}")
    title = _str(obj, title_key, required=False) if title_key else ""
    yield Record(title=title, text=_str(obj, text_key), source_id=source_id)


def _context_pairs(ctx: Any) -> Iterator[Record]:
    if not isinstance(ctx, list):
        raise _Bad("'context' is not a list")
    for pair in ctx:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise _Bad("a 'context' entry is not [title, sentences]")
        yield Record(title=pair[0], text=join_sentences(pair[1]))


def _title_text(obj: Any) -> Record:
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    if "text" in obj and isinstance(obj["text"], list):  # HotpotQA's corpus dict: title -> sentences
        return Record(title=_str(obj, "title"), text=join_sentences(obj["text"]))
    return Record(title=_str(obj, "title"), text=_str(obj, "text"))


def _multihop(obj: Any, fields: dict) -> Iterator[Record]:
    """One question of HotpotQA/2Wiki/MuSiQue (any of their layouts), or one corpus entry."""
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    if "contexts" in obj or "paragraphs" in obj:  # IRCoT-processed HotpotQA, MuSiQue
        paras = obj.get("contexts", obj.get("paragraphs"))
        if not isinstance(paras, list):
            raise _Bad("'contexts'/'paragraphs' is not a list")
        for p in paras:
            if not isinstance(p, dict):
                raise _Bad("a paragraph is not a JSON object")
            yield Record(title=_str(p, "title"), text=_str(p, "paragraph_text"))
    elif "context" in obj:  # official HotpotQA / 2Wiki
        yield from _context_pairs(obj["context"])
    elif "text" in obj:  # corpus list [{title, text}]
        yield _title_text(obj)
    else:
        raise _Bad("no 'contexts', 'paragraphs', 'context' or 'text' field")


def _lead_section(obj: Any, fields: dict) -> Iterator[Record]:
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    yield Record(title=_str(obj, "title"), text=_str(obj, "extract"))


CONVERTERS: dict[str, Callable[[Any, dict], Iterator[Record]]] = {
    "flashrag-jsonl": _flashrag,
    "jsonl": _generic,
    "parquet": _generic,
    "hotpotqa": _multihop,
    "2wiki": _multihop,
    "musique": _multihop,
    "wiki-lead-sections": _lead_section,
}


# ---- raw records of a file: (location, object) ----


def _jsonl_items(path: str) -> Iterator[tuple[str, Any]]:
    with _open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield f"{path}:{lineno}", _Bad(f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                yield f"{path}:{lineno}", _Bad(f"invalid JSON ({exc.msg} at column {exc.colno})")


def _json_items(path: str) -> Iterator[tuple[str, Any]]:
    with _open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    if isinstance(data, list):
        for i, obj in enumerate(data):
            yield f"{path}[{i}]", obj
    elif isinstance(data, dict):
        for key, obj in data.items():
            # a corpus dict title -> sentences (HotpotQA) or title -> record (lead sections)
            if isinstance(obj, dict):
                obj = {"title": key, **obj}
            else:
                obj = {"title": key, "text": obj}
            yield f"{path}[{key!r}]", obj
    else:
        raise CorpusError(f"{path}: top-level JSON is {type(data).__name__}, expected a list or an object")


def _tsv_records(path: str, stats: ReadStats, skip: bool) -> Iterator[Record]:
    csv.field_size_limit(1 << 26)  # long documents in user TSVs; the default caps a field at 128 KiB
    with _open(path) as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)
        header = next(reader, None)
        if header is None:
            return
        cols = [h.strip().lower() for h in header]
        if not {"id", "text", "title"} <= set(cols):
            raise CorpusError(f"{path}:1: DPR TSV header must name id, text and title (got {header!r})")
        i_id, i_text, i_title = cols.index("id"), cols.index("text"), cols.index("title")
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                where = f"{path}:{reader.line_num}"
                if not skip:
                    raise CorpusError(f"{where}: {exc}") from None
                stats.skip(where, str(exc))
                continue
            where = f"{path}:{reader.line_num}"
            if len(row) != len(cols) or not row[i_id].strip():
                reason = (
                    f"expected {len(cols)} tab-separated fields, got {len(row)}"
                    if len(row) != len(cols)
                    else "empty id"
                )
                if not skip:
                    raise CorpusError(f"{where}: {reason}")
                stats.skip(where, reason)
                continue
            yield Record(title=row[i_title], text=row[i_text], source_id=row[i_id].strip())


def _parquet_items(path: str) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    with _open(path, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
            row = 0
            for batch in pf.iter_batches(batch_size=8192):
                for obj in batch.to_pylist():
                    row += 1
                    yield f"{path}:row {row}", obj
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            if isinstance(exc, (CorpusError, _Bad)):
                raise
            raise CorpusError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


# ---- detection ----


def _first_line(path: str) -> str:
    with _open(path) as f:
        for line in f:
            if line.strip():
                return line
    return ""


def detect_format(path: str) -> str:
    """Pick a format from the extension and the first record; raise CorpusError when ambiguous."""
    name = path.rsplit("/", 1)[-1].lower()
    for ext in (".gz", ".bz2", ".zst"):
        name = name.removesuffix(ext)
    if name.endswith(".tsv"):
        return "dpr-tsv"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".jsonl"):
        line = _first_line(path)
        try:
            obj = json.loads(line) if line else {}
        except json.JSONDecodeError:
            raise CorpusError(f"{path}:1: invalid JSON; cannot detect the format (pass --format)") from None
        return _format_of(obj, path) or "jsonl"
    if name.endswith(".json"):
        with _open(path) as f:
            head = f.read(1 << 16)
        stripped = head.lstrip()
        if stripped.startswith("{"):
            # a dict keyed by title: lead sections ({title, extract, ...}) or HotpotQA's title -> sentences
            if '"extract"' in head:
                return "wiki-lead-sections"
            return "hotpotqa"
        if stripped.startswith("["):
            for key, fmt in (('"contexts"', "hotpotqa"), ('"paragraphs"', "musique"), ('"evidences"', "2wiki")):
                if key in head:
                    return fmt
            if '"context"' in head:
                return "hotpotqa"
            if '"text"' in head and '"title"' in head:
                return "2wiki"  # a corpus list [{title, text}] (2Wiki and MuSiQue share the layout)
    raise CorpusError(f"{path}: cannot detect the corpus format; pass one of: {', '.join(FORMATS)}")


def _format_of(obj: Any, path: str) -> str | None:
    if not isinstance(obj, dict):
        return None
    if "contents" in obj and "id" in obj and "text" not in obj:
        return "flashrag-jsonl"
    if "contexts" in obj:
        return "hotpotqa"
    if "paragraphs" in obj:
        return "musique"
    if "context" in obj:
        return "2wiki" if "evidences" in obj or "type" in obj and "level" not in obj else "hotpotqa"
    return None


# ---- public entry ----


def expand_sources(sources: list[str]) -> list[str]:
    """The corpus files of `sources`: each as given, or a glob (`*`, `?`, `[`) replaced by its matches, sorted."""
    import fsspec

    units = []
    for src in sources:
        if not any(c in src for c in "*?[") or ("://" not in src and os.path.exists(src)):
            units.append(src)
            continue
        fs, _ = fsspec.core.url_to_fs(src)
        matches = sorted(fs.glob(src))
        if not matches:
            raise CorpusError(f"no corpus file matches {src}")
        protocol = src.split("://", 1)[0] + "://" if "://" in src else ""
        units += [m if "://" in m or not protocol else protocol + m for m in matches]
    return units


def read_corpus(
    path: str,
    fmt: str = "auto",
    fields: dict | None = None,
    on_bad_line: str = "error",
    stats: ReadStats | None = None,
) -> Iterator[Record]:
    """Stream the records of one corpus file or URI.

    `on_bad_line="error"` raises CorpusError naming `file:line` at the first malformed record;
    `"skip"` skips it, counting it in `stats` (and logging it).
    """
    if on_bad_line not in ("error", "skip"):
        raise CorpusError(f"on_bad_line must be 'error' or 'skip', not {on_bad_line!r}")
    stats = stats if stats is not None else ReadStats()
    skip = on_bad_line == "skip"
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise CorpusError(f"unknown corpus format {fmt!r}; choose from: auto, {', '.join(FORMATS)}")
    fields = {**DEFAULT_FIELDS, **(fields or {})}
    log.info("reading %s as %s", path, fmt)
    try:
        yield from _records(path, fmt, fields, skip, stats)
    except UnicodeDecodeError as exc:  # TSV and JSON files are decoded as they are read
        raise CorpusError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start} of a block); corpus files must be UTF-8"
        ) from None


def _records(path: str, fmt: str, fields: dict, skip: bool, stats: ReadStats) -> Iterator[Record]:
    if fmt == "dpr-tsv":
        for rec in _tsv_records(path, stats, skip):
            stats.records += 1
            yield rec
        return
    if fmt == "parquet":
        items = _parquet_items(path)
    elif fmt == "flashrag-jsonl" or (fmt == "jsonl"):
        items = _jsonl_items(path)
    elif _looks_like_jsonl(path):
        items = _jsonl_items(path)
    else:
        items = _json_items(path)
    convert = CONVERTERS[fmt]
    for where, obj in items:
        try:
            if isinstance(obj, _Bad):
                raise obj
            recs = list(convert(obj, fields))
        except _Bad as bad:
            if not skip:
                raise CorpusError(f"{where}: {bad}") from None
            stats.skip(where, str(bad))
            continue
        stats.records += 1
        yield from recs


def _looks_like_jsonl(path: str) -> bool:
    name = path.lower()
    for ext in (".gz", ".bz2", ".zst"):
        name = name.removesuffix(ext)
    if name.endswith(".jsonl"):
        return True
    if name.endswith(".json"):
        return False
    line = _first_line(path).strip()
    return line.startswith("{") and line.endswith("}")
