"""Question sources: hub URIs through fsspec (a local stand-in for the hub here), a clear error where the hub
cannot be reached, FlashRAG's format, ids dynrag makes in a namespace of their own, and `dynrag data`."""

import json
import subprocess
import sys
import time

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from pipeline.io.datasets import DatasetError, load_questions

NQ = "hf://datasets/RUC-NLPIR/FlashRAG_datasets/nq/test.jsonl"


@pytest.fixture
def local_hub(tmp_path):
    """`hf://datasets/...` served from tmp_path: the real HfFileSystem is put back afterwards."""
    original = fsspec.get_filesystem_class("hf")

    class StandIn(LocalFileSystem):
        protocol = "hf"

        @classmethod
        def _strip_protocol(cls, path):
            return str(tmp_path / str(path).removeprefix("hf://"))

    fsspec.register_implementation("hf", StandIn, clobber=True)
    try:
        yield tmp_path
    finally:
        fsspec.register_implementation("hf", original, clobber=True)


def test_hub_uri_in_flashrag_format_reads_through_fsspec(local_hub):
    f = local_hub / "datasets/RUC-NLPIR/FlashRAG_datasets/nq/test.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text(
        "\n".join(
            json.dumps({"id": f"test_{i}", "question": f"q{i}?", "golden_answers": [f"a{i}", "b"], "metadata": {}})
            for i in range(3)
        )
        + "\n"
    )
    qs = list(load_questions(NQ))
    assert [(q.id, q.question, q.answers, q.dataset) for q in qs] == [
        (f"test_{i}", f"q{i}?", [f"a{i}", "b"], "nq") for i in range(3)
    ]


def test_unreachable_hub_fails_at_once_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = f"from pipeline.io.datasets import load_questions\nlist(load_questions({NQ!r}))"
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t < 30 and out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeline.io.datasets.DatasetError: cannot read hf://") and "local path" in last


def test_ids_dynrag_makes_cannot_collide_with_a_files_own(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"id": "line-2", "question": "real?", "answer": ["x"]}),
                "{broken",
                json.dumps({"question": "no id?", "answer": ["y"]}),
                json.dumps({"id": "dynrag:line-2", "question": "squatter?", "answer": ["z"]}),
            ]
        )
        + "\n"
    )
    qs = list(load_questions(str(f)))
    assert [q.id for q in qs] == ["line-2", "dynrag:line-2", "dynrag:line-3", "dynrag:line-4"]
    assert [q.error is None for q in qs] == [True, False, True, False]
    assert "keeps for the ids it makes" in qs[3].error


def test_missing_local_dataset_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        list(load_questions(str(tmp_path / "none.jsonl")))


def test_dynrag_data_lists_packaged_and_hub_sets():
    out = subprocess.run([sys.executable, "-m", "jobs.cli", "data"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "dpr:nq-test" in out.stdout and f"{NQ.rsplit('/', 1)[0]}/{{train,dev,test}}.jsonl" in out.stdout
