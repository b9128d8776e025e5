"""BM25's settings are configuration values: k1 and b at search time, the analyzer (stemmer, stop words) at
build time; `dynrag index info` shows them and a run's resolved config records what its search used."""

from __future__ import annotations

import json

import pytest
import yaml

from jobs.cli import main

DOCS = [
    ("a", "Runners", "The runners were running quickly."),
    ("b", "Park", "A run in the park."),
    ("c", "Lake", "Boats on a quiet lake."),
]
HASH = ["--set", "embedding.model=hash"]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    d = tmp_path_factory.mktemp("bm25")
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in DOCS))
    built = {}
    for name, sets in {
        "default": [],
        "plain": ["--set", "index.bm25_stemmer=none", "--set", "index.bm25_stopwords=false"],
    }.items():
        built[name] = d / name
        assert (
            main(["--log-level", "ERROR", "index", "build", str(corpus), "--index", str(built[name]), *HASH, *sets])
            == 0
        )
    return built


def search(root, query, *sets):
    from indexing import open_index
    from pipeline.config import load_config

    cfg = load_config(None, ["embedding.model=hash", *sets])
    with open_index(root, cfg.index_settings()) as index:
        return [h.id for h in index.search([query], 3, "bm25")[0]]


def test_the_analyzer_is_chosen_at_build_and_used_by_search(indexes):
    assert sorted(search(indexes["default"], "run")) == ["a", "b"]  # Porter: running, runners -> run(ner)
    assert search(indexes["plain"], "run") == ["b"]  # no stemming: only the word itself
    assert search(indexes["default"], "the") == []  # a stop word
    assert sorted(search(indexes["plain"], "the")) == ["a", "b"]  # kept
    # a search analyses queries as its index was built, whatever the configuration says
    assert search(indexes["plain"], "run", "index.bm25_stemmer=porter") == ["b"]


def test_index_info_shows_k1_b_and_the_analyzer(indexes, capsys):
    assert (
        main(
            [
                "index",
                "info",
                "--index",
                str(indexes["plain"]),
                "--json",
                "--set",
                "index.bm25_k1=1.2",
                "--set",
                "index.bm25_b=0.75",
            ]
        )
        == 0
    )
    shown = json.loads(capsys.readouterr().out)["bm25_search"]
    assert shown == {"k1": 1.2, "b": 0.75, "stemmer": "none", "stopwords": False}
    assert main(["index", "info", "--index", str(indexes["default"])]) == 0
    assert "k1 0.9, b 0.4" in (out := capsys.readouterr().out) and "stemmer porter, English stop words dropped" in out


def test_a_run_records_the_analyzer_its_index_was_built_with(indexes, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "who runs in the park?", "answer": ["b"]}) + "\n")
    out = tmp_path / "out"
    assert (
        main(
            [
                "--log-level",
                "ERROR",
                "answer",
                "--dataset",
                str(questions),
                "--index",
                str(indexes["plain"]),
                "--method",
                "sr-rag",
                "--out",
                str(out),
                "--no-progress",
                "--set",
                "generation.backend=none",
                *HASH,
            ]
        )
        == 0
    )
    index = yaml.safe_load((out / "config.resolved.yaml").read_text())["index"]
    assert (index["bm25_stemmer"], index["bm25_stopwords"], index["bm25_k1"], index["bm25_b"]) == (
        "none",
        False,
        0.9,
        0.4,
    )


def test_the_searcher_ranks_and_scores_as_pyserinis_lucene_searcher(data_dir, tmp_path):
    """sparse.LuceneShard drives Anserini's SimpleSearcher itself (importing pyserini.search.lucene loads torch):
    the same hits and scores as pyserini's LuceneSearcher over the same Lucene index, analyzer and k1, b."""
    from indexing.shards.sparse import DEFAULT_ANALYZER, LuceneShard, build_lucene

    lines = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").splitlines()[:300]
    docs = [(r["id"], r["contents"]) for r in map(json.loads, lines)]
    assert build_lucene(docs, tmp_path / "lucene", threads=1) == len(docs)
    # three queries from the sample's own text (so each finds something in the whole kit and the fixture kit alike)
    own = [" ".join(docs[i][1].split()[:4]) for i in (0, len(docs) // 2, len(docs) - 1)]
    queries = [*own, "American football player", "the", "zzzq"]
    shard = LuceneShard(tmp_path / "lucene", 1.2, 0.75, DEFAULT_ANALYZER)
    ours = shard.batch_search(queries, 5, 2)
    shard.close()

    from pyserini.analysis import get_lucene_analyzer
    from pyserini.search.lucene import LuceneSearcher

    theirs = LuceneSearcher(str(tmp_path / "lucene"))
    theirs.set_analyzer(get_lucene_analyzer(stemmer="porter", stopwords=True))
    theirs.set_bm25(1.2, 0.75)
    found = theirs.batch_search(queries, [str(i) for i in range(len(queries))], k=5, threads=2)
    theirs.close()
    assert ours == [[(h.docid, float(h.score)) for h in found.get(str(i), [])] for i in range(len(queries))]
    assert all(ours[: len(own)]) and ours[-1] == []
