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

Work units (`plan_units`, what a build reads and shards one at a time, and a cluster build's tasks): a
file is one `Unit`, except an uncompressed line-oriented (JSONL, TSV) or Parquet file larger than
`index.unit_bytes`, which is cut at the nominal offsets 0, U, 2U, ... (U = unit_bytes; fixed multiples,
so appending to a file moves no boundary). A line-oriented unit [a, b) is resolved when read to whole
lines: from the first *anchor* line starting at or after byte a (byte 0 for the first unit) to the first
anchor line starting at or after b, an anchor being a line whose bytes hash to 0 modulo `anchor_every`
(a few dozen lines apart; `anchor_spacing`). Lines are cut at b"\n" only, which is never part of a
multi-byte UTF-8 character; units cover every line once (a last line without a newline included), and
a unit may be empty. Anchors make the boundaries depend on content near the nominal offset, so an edit
shifting the bytes of a file by d moves a later boundary only if an anchor lies within d bytes before
its offset. A TSV unit after the first reads the file's header line for its columns (a quoted field
spanning lines must not straddle a boundary: set index.unit_bytes=0 for such files); a generic JSONL
unit decides whether the file has ids by the file's first record, as a whole-file read does. A
Parquet unit [a, b) holds the row groups whose data start in it. Errors in a unit that starts past
byte 0 name `file:byte N` (where the line starts) instead of `file:line`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from indexing.errors import IndexingError

log = logging.getLogger(__name__)

COMPRESSED = (".gz", ".bz2", ".zst")  # opened with fsspec's compression="infer": read whole, never split
FORMATS = ("dpr-tsv", "flashrag-jsonl", "jsonl", "parquet", "hotpotqa", "2wiki", "musique", "wiki-lead-sections")
DEFAULT_FIELDS = {"id": "id", "title": "title", "text": "text"}
DIGEST_BLOCK = 1 << 22  # bytes read at a time by unit_digest


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


@dataclass(frozen=True)
class Unit:
    """A work unit: the whole file at `path` (start 0, end None), or its nominal byte range [start, end)
    (end None: to the end of the file), resolved to whole lines or row groups when read (module doc)."""

    path: str
    start: int = 0
    end: int | None = None
    anchor_every: int = 1

    def __str__(self) -> str:
        whole = self.start == 0 and self.end is None
        return self.path if whole else f"{self.path}[{self.start}:{'' if self.end is None else self.end}]"


def anchor_spacing(unit_bytes: int) -> int:
    """Lines between anchors on average: 64 for units of 256 MiB and more (tens of KiB of typical
    lines), fewer for small units so that each still has anchors (1: every line is one)."""
    return max(1, min(64, unit_bytes >> 22))


class _Bad(Exception):
    """A malformed record; turned into a CorpusError or a skip by `read_corpus`."""


def _open(path: str, mode: str = "rt") -> Any:
    import fsspec

    try:
        if "b" in mode:
            return fsspec.open(path, mode, compression="infer").open()
        return fsspec.open(path, mode, compression="infer", encoding="utf-8").open()
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


def _anchor_at(f: Any, offset: int, every: int) -> int:
    """The start of the first anchor line (module doc) that begins at or after byte `offset` > 0 of the
    binary file `f`, or the end of the file if none does."""
    f.seek(offset - 1)
    pos = offset - 1 + len(f.readline())  # past the line holding byte offset-1: the next line starts here
    while True:
        line = f.readline()
        if not line or zlib.crc32(line.rstrip(b"\n")) % every == 0:
            return pos
        pos += len(line)


def _line_span(f: Any, unit: Unit) -> tuple[int, int | None]:
    """The bytes [start, end) a line-oriented unit resolves to in the binary file `f` (end None: to the end)."""
    if not unit.start and unit.end is None:
        return 0, None
    start = _anchor_at(f, unit.start, unit.anchor_every) if unit.start else 0
    return start, None if unit.end is None else _anchor_at(f, unit.end, unit.anchor_every)


def _unit_lines(unit: Unit) -> Iterator[tuple[str, bytes]]:
    """The raw lines of a unit, each with where it is: `file:line`, or `file:byte N` in a unit starting
    past byte 0 (its line numbers are unknown without reading what comes before)."""
    with _open(unit.path, "rb") as f:
        start, end = _line_span(f, unit)
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(f, 1):
            if end is not None and pos >= end:
                return
            yield (f"{unit.path}:{lineno}" if start == 0 else f"{unit.path}:byte {pos}"), raw
            pos += len(raw)


def _jsonl_items(unit: Unit) -> Iterator[tuple[str, Any]]:
    for where, raw in _unit_lines(unit):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield where, _Bad(f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
            continue
        if not line.strip():
            continue
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            yield where, _Bad(f"invalid JSON ({exc.msg} at column {exc.colno})")


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


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); corpus files must be UTF-8"
        ) from None


def _tsv_records(unit: Unit, stats: ReadStats, skip: bool) -> Iterator[Record]:
    csv.field_size_limit(1 << 26)  # long documents in user TSVs; the default caps a field at 128 KiB
    path = unit.path
    where = f"{path}:1"  # of the last line the csv reader took

    def text_lines() -> Iterator[str]:
        nonlocal where
        if unit.start:  # a later unit of the file: its header line names the columns
            with _open(path, "rb") as f:
                yield _utf8(f.readline(), where)
        for where, raw in _unit_lines(unit):
            yield _utf8(raw, where)

    reader = csv.reader(text_lines(), delimiter="\t", quoting=csv.QUOTE_MINIMAL)
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
            if not skip:
                raise CorpusError(f"{where}: {exc}") from None
            stats.skip(where, str(exc))
            continue
        if len(row) != len(cols) or not row[i_id].strip():
            reason = (
                f"expected {len(cols)} tab-separated fields, got {len(row)}" if len(row) != len(cols) else "empty id"
            )
            if not skip:
                raise CorpusError(f"{where}: {reason}")
            stats.skip(where, reason)
            continue
        yield Record(title=row[i_title], text=row[i_text], source_id=row[i_id].strip())


def _parquet_items(unit: Unit) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    path = unit.path
    with _open(path, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
            groups, row = [], 0  # the unit's row groups; rows before them
            for g in range(pf.metadata.num_row_groups):
                meta = pf.metadata.row_group(g)
                at = meta.column(0).data_page_offset if meta.num_columns else 0
                if at < unit.start:
                    row += meta.num_rows
                elif unit.end is None or at < unit.end:
                    groups.append(g)
            for batch in pf.iter_batches(batch_size=8192, row_groups=groups) if groups else ():
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
    for ext in COMPRESSED:
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


def _split_kind(path: str, fmt: str) -> str | None:
    """How a file splits into byte-range units: "lines", "parquet", or None (read whole)."""
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(COMPRESSED):
        return None
    if fmt == "parquet" or (fmt == "auto" and name.endswith(".parquet")):
        return "parquet"
    if fmt in ("dpr-tsv", "flashrag-jsonl", "jsonl") or name.endswith((".jsonl", ".tsv")):
        return "lines"
    return None


def plan_units(sources: list[str], fmt: str = "auto", unit_bytes: int = 0) -> list[Unit]:
    """The work units of `sources` in corpus order (module doc); `unit_bytes` 0: one unit per file. Only
    file sizes are looked up: no corpus byte is read."""
    import fsspec

    units = []
    for path in expand_sources(sources):
        n = 1
        if unit_bytes and _split_kind(path, fmt):
            try:
                size = fsspec.core.url_to_fs(path)[0].size(path)
            except FileNotFoundError:
                raise CorpusError(f"{path}: file not found") from None
            except (OSError, ValueError) as exc:
                raise CorpusError(f"{path}: cannot open ({type(exc).__name__}: {exc})") from None
            n = max(1, -(-size // unit_bytes))
        every = anchor_spacing(unit_bytes)
        units += [Unit(path, i * unit_bytes, (i + 1) * unit_bytes if i + 1 < n else None, every) for i in range(n)]
    return units


def unit_digest(unit: Unit, fmt: str = "auto") -> str:
    """sha256 of every byte a unit's records come from, so that equal digests mean equal records: a line
    unit's resolved lines, and for one past byte 0 also the file's first line (a TSV's header, a generic
    JSONL's first record decide how its lines read); anything else, the whole file. The unit itself
    (path, nominal range) is part of it. About 1.5 GB/s of CPU here: a corpus's bytes cost a few seconds
    a GB, against about a minute a GB to read them into passages."""
    h = hashlib.sha256(str(unit).encode("utf-8"))
    with _open(unit.path, "rb") as f:
        start, end = 0, None
        if _split_kind(unit.path, fmt) == "lines":
            start, end = _line_span(f, unit)
            if start:
                f.seek(0)
                h.update(f.readline())
            f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            block = f.read(DIGEST_BLOCK if left is None else min(DIGEST_BLOCK, left))
            if not block:
                break
            h.update(block)
            left = None if left is None else left - len(block)
    return h.hexdigest()


def read_corpus(
    source: str | Unit,
    fmt: str = "auto",
    fields: dict | None = None,
    on_bad_line: str = "error",
    stats: ReadStats | None = None,
) -> Iterator[Record]:
    """Stream the records of one corpus file or URI, or of one work unit of it (`plan_units`).

    `on_bad_line="error"` raises CorpusError naming `file:line` at the first malformed record;
    `"skip"` skips it, counting it in `stats` (and logging it).
    """
    if on_bad_line not in ("error", "skip"):
        raise CorpusError(f"on_bad_line must be 'error' or 'skip', not {on_bad_line!r}")
    stats = stats if stats is not None else ReadStats()
    skip = on_bad_line == "skip"
    unit = source if isinstance(source, Unit) else Unit(source)
    fmt = detect_format(unit.path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise CorpusError(f"unknown corpus format {fmt!r}; choose from: auto, {', '.join(FORMATS)}")
    fields = {**DEFAULT_FIELDS, **(fields or {})}
    log.info("reading %s as %s", unit, fmt)
    try:
        yield from _records(unit, fmt, fields, skip, stats)
    except UnicodeDecodeError as exc:  # JSON files are decoded as they are read
        raise CorpusError(
            f"{unit.path}: not UTF-8 text ({exc.reason} at byte {exc.start} of a block); corpus files must be UTF-8"
        ) from None


def _records(unit: Unit, fmt: str, fields: dict, skip: bool, stats: ReadStats) -> Iterator[Record]:
    path = unit.path
    if fmt == "dpr-tsv":
        for rec in _tsv_records(unit, stats, skip):
            stats.records += 1
            yield rec
        return
    if fmt == "parquet":
        items = _parquet_items(unit)
    elif fmt in ("flashrag-jsonl", "jsonl") or _looks_like_jsonl(path):
        if fmt == "jsonl" and unit.start:
            _ids_as_in_first_record(path, fields)
        items = _jsonl_items(unit)
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


def _ids_as_in_first_record(path: str, fields: dict) -> None:
    """A later unit of a generic JSONL file has ids when the file's first record has one (as `_generic`
    decides for the whole file); a first record that is not a JSON object decides nothing."""
    try:
        obj = json.loads(_first_line(path) or "null")
    except json.JSONDecodeError:
        return
    if isinstance(obj, dict):
        fields["_has_ids"] = bool(fields.get("id")) and fields["id"] in obj


def _looks_like_jsonl(path: str) -> bool:
    name = path.lower()
    for ext in COMPRESSED:
        name = name.removesuffix(ext)
    if name.endswith(".jsonl"):
        return True
    if name.endswith(".json"):
        return False
    line = _first_line(path).strip()
    return line.startswith("{") and line.endswith("}")
