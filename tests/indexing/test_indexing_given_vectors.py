"""`dynrag index build --vectors FILE`: vectors taken from a .npy or a FAISS Flat file instead of embedding.

The corpus is synthetic JSONL; row i of the vectors file is the hash encoder's vector of the word "probe<i>",
which no passage contains, so a dense search for "probe<i>" finds record i's passage only if that passage got
row i of the file (and not an embedding of its own text).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from indexing import build_index, open_index
from indexing.shards.embed import HashEncoder
from indexing.versions.manifest import read_manifest
from jobs.cli import main
from pipeline.config import load_config

LINES = 51
DUPLICATE, EMPTY, BAD = 10, 20, 30  # line 10 repeats record 3's id, line 20 has no text, line 30 is not JSON
LOCAL = ["--set", "runtime.mode=local", "--set", "index.shard_size=10"]


def config(**overrides):
    sets = {"runtime.mode": "local", "index.shard_size": 10, "embedding.model": "hash", **overrides}
    return load_config(overrides=[f"{k}={v}" for k, v in sets.items()]).index_settings()


def probes(n: int) -> np.ndarray:
    return HashEncoder().encode([f"probe{i}" for i in range(n)])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = np.random.default_rng(7)
    lines = []
    for i in range(LINES):
        text = " ".join(f"w{w}" for w in rng.integers(0, 400, 30))
        rec = {"id": f"r{i}", "title": f"Title {i}", "text": text}
        if i == DUPLICATE:
            rec["id"] = "r3"
        if i == EMPTY:
            rec["text"] = ""
        lines.append("{not json" if i == BAD else json.dumps(rec))
    path = tmp_path_factory.mktemp("given") / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def kept() -> list[int]:
    """The lines whose record becomes a passage."""
    return [i for i in range(LINES) if i not in (DUPLICATE, EMPTY, BAD)]


def write_vectors(path: Path, vecs: np.ndarray, kind: str) -> str:
    if kind == "faiss":
        import faiss

        index = faiss.IndexFlatIP(vecs.shape[1])
        index.add(np.ascontiguousarray(vecs, dtype=np.float32))
        faiss.write_index(index, str(path))
    else:
        np.save(path, vecs.astype(np.float16 if kind == "npy16" else np.float32))
    return str(path)


@pytest.fixture
def encoded(monkeypatch) -> list[list[str]]:
    """Every batch of texts the hash encoder is asked to encode."""
    calls: list[list[str]] = []
    real = HashEncoder.encode

    def spy(self, texts):
        calls.append(list(texts))
        return real(self, texts)

    monkeypatch.setattr(HashEncoder, "encode", spy)
    return calls


@pytest.mark.parametrize(
    "kind,factory", [("npy32", "Flat"), ("npy16", "Flat"), ("faiss", "Flat"), ("npy32", "IVF4,Flat")]
)
def test_row_i_is_record_i_and_nothing_is_embedded(corpus, tmp_path, encoded, kind, factory):
    scale = np.linspace(0.5, 3.0, LINES, dtype=np.float32)[:, None]  # not normalised: kept as given
    vectors = write_vectors(tmp_path / f"vectors.{'index' if kind == 'faiss' else 'npy'}", probes(LINES) * scale, kind)
    cfg = config(**{"index.faiss_factory": factory, "index.faiss_train_size": 40})
    encoded.clear()
    report = build_index([str(corpus)], tmp_path / "idx", cfg, vectors=vectors, on_bad_line="skip", fmt="jsonl")
    assert len(encoded) == 1 and len(encoded[0]) == 1  # the query model's dimension, no passage
    assert report["passages"] == len(kept()) and report["bad_lines_skipped"] == 1
    assert report["passages_embedded"] == 0 and report["vectors"]["taken"] == len(kept())
    m = read_manifest(tmp_path / "idx")
    assert m["settings"]["embedding"]["given"] and m["settings"]["embedding"]["model"] == "hash"
    assert m["shards"] and len(m["shards"]) > 2
    norms = np.concatenate(
        [np.linalg.norm(np.load(tmp_path / "idx/shards" / s["key"] / "vectors.npy"), axis=1) for s in m["shards"]]
    )
    assert np.allclose(np.sort(norms), np.sort(scale[kept(), 0]), rtol=1e-2)
    with open_index(tmp_path / "idx", cfg) as index:
        hits = index.search([f"probe{i}" for i in kept()], k=1, retriever="dense")
    assert [h[0].id for h in hits] == [f"r{i}" for i in kept()]


def test_rows_count_records_over_the_units_of_a_file(corpus, tmp_path):
    """The corpus read as four work units (index.unit_bytes): row i is still the file's record i."""
    vectors = write_vectors(tmp_path / "v.npy", probes(LINES), "npy32")
    cfg = config(**{"index.unit_bytes": corpus.stat().st_size // 4 + 1})
    report = build_index([str(corpus)], tmp_path / "idx", cfg, vectors=vectors, on_bad_line="skip", fmt="jsonl")
    assert report["units"] == 4 and report["vectors"]["taken"] == len(kept())
    with open_index(tmp_path / "idx", cfg) as index:
        hits = index.search([f"probe{i}" for i in kept()], k=1, retriever="dense")
    assert [h[0].id for h in hits] == [f"r{i}" for i in kept()]


def run_build(corpus: Path, idx: Path, *extra: str) -> int:
    return main(["index", "build", str(corpus), "--index", str(idx), "--skip-bad-lines", *LOCAL, *extra])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("dynrag: error:")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0]
    return errors[0]


def test_mismatches_are_one_error_line(corpus, tmp_path, capsys, encoded):
    model = ["--vectors-model", "hash"]
    idx = tmp_path / "idx"
    cases = [
        (probes(LINES + 1), [], f"has {LINES + 1} rows, the corpus has {LINES} records (1 of them bad lines skipped"),
        (probes(40), [], f"has 40 rows, the corpus has {LINES} records"),
        (probes(LINES)[:, :16], [], "has dimension 16, but the query model hash gives 384"),
        (probes(LINES), ["--set", "index.passage_words=10"], "corpus record 0 (id 'r0') has more than"),
    ]
    for vecs, extra, message in cases:
        path = write_vectors(tmp_path / "v.npy", vecs, "npy32")
        encoded.clear()
        assert run_build(corpus, idx, "--vectors", path, *model, *extra) == 2
        assert message in one_error_line(capsys), message
        assert not (idx / "CURRENT").exists()
        assert not any(len(c) > 1 for c in encoded)  # no passage was embedded

    assert run_build(corpus, idx, "--vectors", path) == 2  # the model must be named
    assert "--vectors-model MODEL" in one_error_line(capsys)

    import faiss

    ivf = faiss.index_factory(384, "IVF2,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(probes(LINES))
    ivf.add(probes(LINES))
    faiss.write_index(ivf, str(tmp_path / "ivf.index"))
    assert run_build(corpus, idx, "--vectors", str(tmp_path / "ivf.index"), *model) == 2
    assert "neither a .npy array nor a FAISS Flat index" in one_error_line(capsys)


def test_dimension_is_checked_before_reading_the_corpus(corpus, tmp_path, capsys):
    path = write_vectors(tmp_path / "v.npy", probes(LINES)[:, :16], "npy32")
    assert run_build(corpus, tmp_path / "idx", "--vectors", path, "--vectors-model", "hash") == 2
    assert "dimension 16" in one_error_line(capsys)
    assert not (tmp_path / "idx" / "staging").exists()


def test_rebuilds_reuse_shards_follow_changed_rows_and_never_mix(corpus, tmp_path, capsys):
    idx, vecs = tmp_path / "idx", probes(LINES)
    path = write_vectors(tmp_path / "v.npy", vecs, "npy32")
    args = ("--vectors", path, "--vectors-model", "hash")
    assert run_build(corpus, idx, *args) == 0
    first = read_manifest(idx)
    assert run_build(corpus, idx, *args) == 0 and "unchanged, still version 1" in capsys.readouterr().out

    vecs[25] = HashEncoder().encode(["changed25"])[0]  # one row changes: its shard alone is rebuilt
    write_vectors(tmp_path / "v.npy", vecs, "npy32")
    assert run_build(corpus, idx, *args) == 0
    second = read_manifest(idx)
    assert second["version"] == 2 and second["build"]["shards_built"] == 1
    assert len({s["key"] for s in first["shards"]} - {s["key"] for s in second["shards"]}) == 1
    cfg = config()
    with open_index(idx, cfg) as index:
        assert index.search(["changed25"], k=1, retriever="dense")[0][0].id == "r25"

    assert run_build(corpus, idx, *args, "--normalize-vectors") == 0  # another setting: every shard rebuilt
    third = read_manifest(idx)
    assert third["build"]["shards_reused"] == 0 and third["settings"]["embedding"]["normalize"]

    assert run_build(corpus, idx, "--set", "embedding.model=hash") == 2  # embedding would mix two sources
    assert "holds vectors given with --vectors (hash)" in one_error_line(capsys)
    assert read_manifest(idx)["version"] == 3
