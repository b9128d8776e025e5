"""Bad input across the CLI (`jobs.cli.main`, in this process): row-level problems become error rows
while the other questions are answered and the summary counts them; whole-input problems are one
`dynrag: error: ...` line and exit code 2. Ids cannot move output files, and a corrupt or truncated
index file is named at open."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest
from fault_tools import damage_faiss_header, one_error_line

from jobs.cli import main

pytestmark = pytest.mark.faults

NONE = ["--set", "generation.backend=none"]


def cli(capsys, *args):
    rc = main(["--log-level", "ERROR", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def refused(capsys, message: str, *args: str) -> None:
    """The CLI exits 2 with one `dynrag: error:` line holding `message`."""
    rc, _, err = cli(capsys, *args)
    assert rc == 2 and message in one_error_line(err)


GOOD = [{"id": f"q{i}", "question": f"who wrote book {i}?", "answer": ["someone"]} for i in range(5)]
BAD = [
    b'{"id": "bad-json", "question": "unterminated',  # malformed JSON
    b'{"id": "latin1", "question": "caf\xe9 au lait?"}',  # not UTF-8
    b'{"id": "no-question", "answer": ["x"]}',  # missing field
    b'{"id": "typed", "question": 42, "answer": ["x"]}',  # wrong-typed field
    b'{"id": "empty", "question": "   ", "answer": ["x"]}',  # empty question
    b'{"id": "long", "question": "' + b"why " * 1000 + b'?"}',  # over-long question
    b'{"id": "q0", "question": "the same id again?"}',  # duplicate id
    b"not json and no tab",  # neither JSON nor TSV
    b'["a", "list"]',  # not an object
]
ESCAPING = [
    {"id": "../../escaped", "question": "where do I go?", "answer": ["x"]},
    {"id": "/abs/path", "question": "and I?", "answer": ["x"]},
    {"id": "a/b\\c", "question": "and me?", "answer": ["x"]},
]


def test_bad_rows_become_error_rows_and_the_rest_is_answered(capsys, tmp_path):
    data = tmp_path / "in" / "questions.jsonl"
    data.parent.mkdir()
    lines = [json.dumps(g).encode() for g in GOOD] + BAD + [json.dumps(e).encode() for e in ESCAPING]
    data.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "in" / "out"
    rc, stdout, err = cli(
        capsys, "answer", "--dataset", str(data), "--method", "no-retrieval", "--out", str(out), "--no-progress", *NONE
    )
    assert rc == 0, err
    n_ok = len(GOOD) + len(ESCAPING)
    assert f"rows {n_ok + len(BAD)} (answered {n_ok}, errors {len(BAD)}" in stdout
    rows = pl.read_parquet(f"{out}/parts/*.parquet")
    errors = dict(rows.filter(pl.col("error").is_not_null()).select("question_id", "error").iter_rows())
    assert len(errors) == len(BAD)
    text = " | ".join(errors.values())
    for expected in (
        "not valid JSON",
        "not valid UTF-8",
        "no question text",
        "is a int, not text",
        "over dataset.max_question_chars",
        "duplicate question id 'q0'",
        "neither JSON nor",
    ):
        assert expected in text, expected
    assert set(rows["question_id"]) >= {e["id"] for e in ESCAPING}
    # ids never name files: everything written is under out, with generated names
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert all(w == "in/questions.jsonl" or w.startswith("in/out/") for w in written), written
    assert all(p.name.startswith("part-") for p in (out / "parts").iterdir())
    assert json.loads((out / "summary.json").read_text())["errors"] == len(BAD)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "dataset file not found"),
        (b"", "holds no questions"),
        (b'[{"question": "a?", "answer": "b"}, {"question": ', "not valid JSON"),
        (b'[{"question": "caf\xe9?", "answer": "b"}]', "not UTF-8"),
        (b'{"foo": 1}\n', "cannot detect the dataset format"),
    ],
)
def test_unreadable_datasets_are_one_line_errors(capsys, tmp_path, content, message):
    data = tmp_path / "questions.jsonl"
    if content is not None:
        data.write_bytes(content)
    refused(
        capsys,
        message,
        "answer",
        "--dataset",
        str(data),
        "--method",
        "no-retrieval",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        *NONE,
    )


def test_an_unreachable_dataset_with_an_empty_error_message_is_one_line(capsys, monkeypatch, tmp_path):
    import fsspec

    def unreachable(*args, **kw):
        raise OSError()  # no message at all

    monkeypatch.setattr(fsspec, "open", unreachable)
    refused(
        capsys,
        "cannot read memory://questions.jsonl (OSError: );",
        "answer",
        "--dataset",
        "memory://questions.jsonl",
        "--method",
        "no-retrieval",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        *NONE,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "retrieval.k=0"], "invalid configuration: retrieval.k"),
        (["--set", "generation.max_new_tokens=lots"], "invalid configuration: generation.max_new_tokens"),
        (["--set", "generation.nonsense=1"], "generation.nonsense: unknown field"),
        (["--set", "novalue"], "not of the form section.key=value"),
        (["--method", "no-such-method"], "no-such-method"),
        (["--set", "generation.backend=transformers", "--set", "generation.model=/no/such/model"], "/no/such/model"),
        (["--method", "sr-rag", "--index", "/no/such/index"], "/no/such/index"),
    ],
)
def test_bad_configuration_model_or_index_is_one_line_error(capsys, data_dir, tmp_path, args, message):
    refused(
        capsys,
        message,
        "answer",
        "--dataset",
        str(data_dir / "nq_open/dev_3610.jsonl"),
        "--limit",
        "3",
        "--method",
        "no-retrieval",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        *NONE,
        *args,
    )
    assert not (tmp_path / "out").exists()  # a refused job leaves nothing behind


def test_a_job_that_fails_before_its_first_row_leaves_nothing(capsys, data_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    rc, _, err = cli(
        capsys,
        "answer",
        "--dataset",
        str(data_dir / "nq_open/dev_3610.jsonl"),
        "--limit",
        "3",
        "--method",
        "no-retrieval",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        "--set",
        "generation.backend=transformers",
        "--set",
        f"generation.model={model}",
    )
    assert rc == 2 and "dynrag: error: cannot load the generation model" in err  # after transformers' own warning
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "no passages"),
        (b'{"id": "1", "title": "t", "text": "fine words"}\n{"id": "2", "title": "t", "text": \n', ":2"),
        (b'{"id": "1", "title": "t", "text": "caf\xe9"}\n', "UTF-8"),
        (b'{"id": "1", "title": "t", "text": {"a": 5}}\n', "field 'text' is dict, not text"),
    ],
)
def test_bad_corpora_are_one_line_errors(capsys, tmp_path, content, message):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(content)
    refused(capsys, message, "index", "build", str(corpus), "--index", str(tmp_path / "idx"), "--format", "jsonl")
    assert not (tmp_path / "idx").exists()  # a failed build leaves no lock, no empty staging/ or shards/


def test_a_failed_refresh_leaves_the_index_as_it_was(capsys, small_index, tmp_path):
    """A refresh over a corpus with a bad line fails in one line; the published index keeps its files, and
    neither the lock nor the staging folder's contents are left behind (nor by a build that succeeded)."""
    before = sorted(p.relative_to(small_index) for p in small_index.rglob("*"))
    assert ".build.lock" not in {p.name for p in before}
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "1", "title": "t", "text": "fine words"}\n{broken\n', encoding="utf-8")
    refused(capsys, ":2", "index", "build", str(corpus), "--index", str(small_index), "--format", "jsonl")
    assert sorted(p.relative_to(small_index) for p in small_index.rglob("*")) == before


@pytest.fixture(scope="module")
def small_index(data_dir, tmp_path_factory):
    lines = (data_dir / "wikipedia/psgs_w100_sample_1000.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    d = tmp_path_factory.mktemp("small")
    (d / "corpus.jsonl").write_text("\n".join(lines + ["{broken"]) + "\n", encoding="utf-8")
    assert (
        main(
            [
                "--log-level",
                "ERROR",
                "index",
                "build",
                str(d / "corpus.jsonl"),
                "--index",
                str(d / "idx"),
                "--skip-bad-lines",
                "--set",
                "index.shard_size=20",
            ]
        )
        == 0
    )
    return d / "idx"


def test_skipped_corpus_lines_are_counted(small_index):
    assert (
        json.loads(next((small_index / "versions").glob("v*/manifest.json")).read_text())["build"]["bad_lines_skipped"]
        == 1
    )


@pytest.mark.parametrize(
    "name, damage",
    [("faiss.index", "truncate"), ("passages.arrow", "flip"), ("vectors.npy", "flip"), ("lucene", "truncate")],
)
def test_corrupt_or_truncated_index_file_is_named(capsys, small_index, tmp_path, name, damage):
    """A truncated file is named at open (sizes are checked); a changed byte by `dynrag index verify`."""
    idx = tmp_path / "idx"
    shutil.copytree(small_index, idx)
    if name == "lucene":  # a file of the version's merged BM25 index
        target = max(
            (p for p in next((idx / "versions").glob("v*")).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
        )
    else:
        target = next((idx / "shards").glob(f"*/{name}"))
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    check = ("search", "--index", str(idx), "anything") if damage == "truncate" else ("verify", "--index", str(idx))
    rc, _, err = cli(capsys, "index", *check)
    line = one_error_line(err)
    assert rc == 2 and str(target) in line and "corrupt" in line


def test_a_rerun_with_another_configuration_is_refused(capsys, data_dir, tmp_path):
    out = tmp_path / "out"
    args = [
        "answer",
        "--dataset",
        str(data_dir / "nq_open/dev_3610.jsonl"),
        "--limit",
        "3",
        "--method",
        "no-retrieval",
        "--out",
        str(out),
        "--no-progress",
        *NONE,
    ]
    assert cli(capsys, *args)[0] == 0
    saved = (out / "config.resolved.yaml").read_text()
    refused(capsys, "holds rows of another configuration (retrieval.k: 5 -> 10)", *args, "--set", "retrieval.k=10")
    assert (out / "config.resolved.yaml").read_text() == saved
    rc, stdout, _ = cli(capsys, *args, "--set", "answer.batch_questions=2")  # not part of the configuration
    assert rc == 0 and "resumed past 3" in stdout


def test_a_corrupt_index_is_refused_before_anything_is_written(capsys, small_index, tmp_path):
    idx, out = tmp_path / "idx", tmp_path / "out"
    shutil.copytree(small_index, idx)
    damage_faiss_header(idx)  # same size: index.verify=size passes it
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps(GOOD[0]) + "\n")
    refused(
        capsys,
        f"cannot use the index {idx}",
        "answer",
        "--dataset",
        str(data),
        "--method",
        "sr-rag",
        "--index",
        str(idx),
        "--out",
        str(out),
        "--set",
        "retrieval.retriever=dense",
        *NONE,
    )
    assert not out.exists()


def test_error_rows_not_of_the_question_are_retried_by_a_rerun(small_index, tmp_path):
    from pipeline.backends import Backends
    from pipeline.backends.retrieval import IndexRetriever
    from pipeline.config import load_config
    from pipeline.io.output import read_rows
    from pipeline.runtime.answer import run_answer

    data, out = tmp_path / "q.jsonl", str(tmp_path / "out")
    data.write_bytes(b"\n".join([json.dumps(g).encode() for g in GOOD] + [BAD[0]]) + b"\n")
    cfg = load_config(overrides=["generation.backend=none"])

    class Unreachable:
        def search(self, *args):
            raise ConnectionError("the index server does not answer")

    def answer(retriever):
        return run_answer(
            str(data),
            out,
            method="sr-rag",
            cfg=cfg,
            progress=False,
            backends=Backends(cfg, str(small_index), retriever=retriever),
        )

    first = answer(Unreachable())
    assert (first["rows"], first["errors"]) == (6, 6)
    assert sorted(read_rows(out)["error_kind"].to_pylist()) == ["input"] + ["system"] * 5
    second = answer(IndexRetriever(str(small_index), cfg))
    assert (second["skipped_already_answered"], second["new_rows"]) == (1, 5)
    assert (second["rows"], second["errors"]) == (6, 1)  # one row per question; only the bad line's error stays
    assert read_rows(out)["error_kind"].to_pylist().count("input") == 1
