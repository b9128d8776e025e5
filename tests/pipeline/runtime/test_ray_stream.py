"""Ray mode streams: the dataset is read through Ray Data on a worker (dynrag's own loader, so bad lines are
the same error rows), the engine actors write the parts, and the driver only sums their reports. The
rows, `--limit` and resume equal the in-process run's; a resumed run on s3:// counts every row, and the
replicas get the index version the driver read."""

from __future__ import annotations

import json

import polars as pl
import pytest
from engine_fixtures import HOTPOT, build_hotpot_index, tiny_model_path
from on_disk import assert_each_question_once, rows_on_disk

from pipeline.config import DynragConfig
from pipeline.errors import DynragError
from pipeline.io import datasets, output
from pipeline.io.output import PartWriter, batch_report, part_files
from pipeline.io.part_store import attempt_key
from pipeline.runtime.answer import run_answer
from platform_shims.raytools import init_ray, shutdown_ray

pytestmark = [pytest.mark.own_process, pytest.mark.cluster]  # starts Ray in-process (scripts/run_tests.py)

COLUMNS = ["question_id", "prediction", "error", "error_kind", "retrieval_calls"]


def _dataset(data_dir, path):
    """Six questions with a bad line (line 3), a blank line and a repeated id (the last line)."""
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:6]
    path.write_text("\n".join([*lines[:2], "{not json", "", *lines[2:], lines[0]]) + "\n", encoding="utf-8")
    return path


def _rows(out) -> list[dict]:
    return pl.read_parquet(f"{out}/parts/*.parquet").select(COLUMNS).sort("question_id").to_dicts()


def test_question_source_reads_like_in_process(data_dir, tmp_path):
    """The read task's rows (no Ray needed): the first `limit` questions of the file less the answered ids,
    error rows included, with every skip counted once."""
    from pipeline.runtime.ray_questions import QuestionSource

    path = _dataset(data_dir, tmp_path / "q.jsonl")
    cfg = DynragConfig()
    every = list(datasets.load_questions(str(path), cfg))
    assert [q.id for q in every][2] == "dynrag:line-3" and every[-1].id.startswith("dynrag:dup2-")
    done = {every[0].id, every[3].id, every[5].id}  # the last one lies past a limit of 5

    def read(limit, batch):
        rows = [r for t in QuestionSource(str(path), cfg, done, limit, batch).read_blocks() for r in t.to_pylist()]
        assert all(len(r["qs"]) <= batch for r in rows)  # a row is a batch
        assert all(len(r["qs"]) == batch for r in rows[:-1])  # every batch full but the last
        return [json.loads(q)["id"] for r in rows for q in r["qs"]], sum(r["skipped"] for r in rows)

    for batch in (1, 2, 50):
        assert read(5, batch) == ([every[i].id for i in (1, 2, 4)], 2)
        assert read(None, batch) == ([every[i].id for i in (1, 2, 4, 6, 7)], 3)
    assert read(1, 2) == ([], 1)  # only a skip: a row with no question carries it


def test_part_writer_stages_one_object_per_attempt_and_the_header_first(tmp_path):
    from eval_fixtures import fake_row

    out = str(tmp_path / "run")
    rows = [fake_row(i, dataset="d", method="m", params={}, f1=1.0, total_s=1.0) for i in range(3)]
    writer = PartWriter(out, "run1", {"run.json": "{}"})
    assert writer.write([]) is None and not (tmp_path / "run").exists()  # nothing to write: no header either
    first = writer.write(rows)
    assert (tmp_path / "run" / "run.json").read_text() == "{}"
    again = PartWriter(out, "run1").write(list(reversed(rows)))  # the same batch, written again (a retry)
    assert again != first and attempt_key(again) == attempt_key(first)  # a new object, the batch's key
    assert "/_attempts/" in first and part_files(out) == []  # staged for the driver to commit, read by no one
    other = PartWriter(out, "run2").write(rows)  # another run's attempt of the same ids: its own key
    assert attempt_key(other) != attempt_key(first)
    report = batch_report(rows, 2, {"generate": 1})
    assert report.pop("tally")["rows"] == 3  # the batch's share of the summary (pipeline/io/tally.py)
    assert report == {"rows": 3, "errors": 0, "skipped": 2, "calls": {"generate": 1}}


def test_an_actor_refuses_an_output_folder_it_cannot_see(tmp_path):
    from pipeline.io.output_lock import check_shared, output_lock

    out = str(tmp_path / "run")
    with pytest.raises(DynragError, match="must be shared by every node"):
        check_shared(out)
    with output_lock(out):
        check_shared(out)  # the driver holds the lock: its file is visible here
    check_shared("s3://bucket/run")


@pytest.fixture(scope="module")
def ray_cluster(s3_server):
    """One local Ray for the file's runs (run_answer leaves a Ray it did not start running): a start and a
    shutdown per test cost ~5 s each. Ray's workers take the environment of when it starts: the session's S3
    server's AWS_* are set while it starts (the s3 test's `s3` sets them in this process for that test only)."""
    with pytest.MonkeyPatch.context() as m:
        for k, v in s3_server.env.items():
            m.setenv(k, v)
        init_ray(None, 4)
    yield
    shutdown_ray()


def _tiny_job(data_dir, tmp_path_factory, tmp_path) -> tuple[str, str, DynragConfig]:
    """(index, dataset, configuration) of a small job with the tiny transformers model (BM25: the index's vectors,
    made by the test encoder, are not searched)."""
    index = str(build_hotpot_index(data_dir, tmp_path_factory, 20, encoder="hash"))
    dataset = str(_dataset(data_dir, tmp_path / "questions.jsonl"))
    cfg = DynragConfig()
    cfg.generation.model = str(tiny_model_path(tmp_path_factory))
    cfg.generation.backend = "transformers"
    cfg.embedding.model = "hash"
    cfg.generation.max_new_tokens = 8
    cfg.answer.progress = False
    cfg.answer.batch_questions = 2
    cfg.retrieval.k = 2  # the tiny tokenizer spends ~4 tokens a word: five passages overran 2,048 tokens (fixture kit)
    return index, dataset, cfg


def test_ray_streams_the_file_and_the_actors_write_the_in_process_rows(
    data_dir, tmp_path_factory, tmp_path, monkeypatch, ray_cluster
):
    index, dataset, cfg = _tiny_job(data_dir, tmp_path_factory, tmp_path)
    local, remote = str(tmp_path / "local"), str(tmp_path / "ray")

    def both(limit):
        mine = run_answer(dataset, local, index=index, method="sr-rag", limit=limit, cfg=cfg)
        ray_cfg = cfg.model_copy(deep=True)
        ray_cfg.runtime.mode, ray_cfg.ray.actors, ray_cfg.ray.actor_num_cpus = "ray", 2, 0.5
        with monkeypatch.context() as m:  # this process reads one record (the fail-fast check) and writes no part
            reads = datasets._records

            def first_record_only(source, f):
                for n, rec in enumerate(reads(source, f)):
                    assert n == 0, "the driver read past the first record"
                    yield rec

            m.setattr(datasets, "_records", first_record_only)
            m.setattr(output, "write_part", lambda *a, **k: pytest.fail("the driver wrote a part"))
            before = set(part_files(remote))
            theirs = run_answer(dataset, remote, index=index, method="sr-rag", limit=limit, cfg=ray_cfg)
        new = set(part_files(remote)) - before  # written by the actors, one per batch, keyed by the run
        assert new and all(p.rsplit("/", 1)[1].startswith(f"part-{theirs['run_id']}-") for p in new)
        return mine, theirs

    mine, theirs = both(4)  # the first 4 questions of the file: 2, the bad line's error row, 1
    assert _rows(remote) == _rows(local)
    assert [r["question_id"] for r in _rows(remote)].count("dynrag:line-3") == 1 and len(_rows(remote)) == 4
    assert (theirs["new_rows"], theirs["errors"], theirs["skipped_already_answered"]) == (4, 1, 0)
    assert set(theirs["backend_batch_calls"]) == set(mine["backend_batch_calls"]) != set()  # summed over the actors
    assert json.loads((tmp_path / "ray" / "run.json").read_text())["config_hash"] == theirs["config_hash"]

    mine, theirs = both(None)  # resume: only the rest is answered, the repeated id as an error row
    rows = _rows(remote)
    assert rows == _rows(local) and len(rows) == 8 and sum(r["error"] is not None for r in rows) == 2
    counts = [(s["new_rows"], s["skipped_already_answered"]) for s in (theirs, mine)]
    assert counts == [(4, 4), (4, 4)]
    assert pl.read_parquet(f"{remote}/parts/*.parquet").height == 8  # no row written twice


def test_ray_reads_questions_from_and_writes_rows_to_s3(s3, ray_cluster, data_dir, tmp_path):
    """fsspec URIs on the workers: the read task opens the dataset on S3 and the actors write their parts
    there (the S3 settings reach them through the environment of the local Ray)."""
    fs, bucket = s3
    fs.pipe(f"{bucket}/q.jsonl", _dataset(data_dir, tmp_path / "q.jsonl").read_bytes())
    cfg = DynragConfig()
    cfg.generation.backend = "none"
    cfg.answer.progress = False
    cfg.answer.batch_questions = 3
    dataset, remote = f"s3://{bucket}/q.jsonl", f"s3://{bucket}/run"
    mine = run_answer(dataset, str(tmp_path / "local"), method="no-retrieval", limit=6, cfg=cfg)
    cfg.runtime.mode = "ray"
    theirs = run_answer(dataset, remote, method="no-retrieval", limit=6, cfg=cfg)
    assert (theirs["rows"], theirs["errors"]) == (mine["rows"], mine["errors"]) == (6, 1)
    key = ["question_id", "prediction", "error"]
    rows = [output.read_rows(out, key).sort_by("question_id") for out in (remote, str(tmp_path / "local"))]
    assert rows[0] == rows[1]
    assert all(p.rsplit("/", 1)[1].startswith(f"part-{theirs['run_id']}-") for p in part_files(remote))
    assert fs.exists(f"{bucket}/run/run.json")


def test_question_source_serves_several_runs_from_one_read(data_dir, tmp_path):
    """An experiment's runs over one file: one read, each question once for each run that has not answered it,
    each run's skips counted on its own rows."""
    from pipeline.runtime.ray_questions import QuestionSource

    path = _dataset(data_dir, tmp_path / "q.jsonl")
    cfg = DynragConfig()
    every = [q.id for q in datasets.load_questions(str(path), cfg)]
    dones = [{every[0]}, {every[1], every[4]}]
    rows = [r for t in QuestionSource(str(path), cfg, dones, 5, 2).read_blocks() for r in t.to_pylist()]
    for run, done in enumerate(dones):
        mine = [r for r in rows if r["run"] == run]
        assert [json.loads(q)["id"] for r in mine for q in r["qs"]] == [q for q in every[:5] if q not in done]
        assert sum(r["skipped"] for r in mine) == len(done)


def test_an_experiment_on_ray_answers_its_runs_at_once_as_in_process(data_dir, tmp_path_factory, tmp_path, ray_cluster):
    """Two methods through one set of engine actors (one Ray job, their batches side by side): the same rows per
    run as in-process, each run's parts in its own folder, each question once on disk, the runs overlapping."""
    from pipeline.evaluation.experiment import MethodRun, run_methods

    index, dataset, cfg = _tiny_job(data_dir, tmp_path_factory, tmp_path)
    runs = [MethodRun("sr-rag", "sr-rag", {"k": 2}), MethodRun("no-retrieval", "no-retrieval", {})]
    local = run_methods(dataset, index, runs, cfg, tmp_path / "local")
    ray_cfg = cfg.model_copy(deep=True)
    ray_cfg.runtime.mode, ray_cfg.ray.actors, ray_cfg.ray.actor_num_cpus = "ray", 1, 0.5
    theirs = run_methods(dataset, index, runs, ray_cfg, tmp_path / "ray")
    assert [s["runtime"] for s in theirs] == ["ray", "ray"] and [s["rows"] for s in theirs] == [8, 8]
    spans = []
    for r, mine, their in zip(runs, local, theirs):
        assert _rows(tmp_path / "ray" / r.label) == _rows(tmp_path / "local" / r.label), r.label
        assert (their["errors"], their["new_rows"]) == (mine["errors"], mine["new_rows"])
        assert_each_question_once(tmp_path / "ray" / r.label, 8, errors=2)
        rows = pl.read_parquet(f"{tmp_path / 'ray' / r.label}/parts/*.parquet")  # a question's span: latency_s
        spans.append(((rows["finished_at"] - rows["latency_s"]).min(), rows["finished_at"].max()))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # in flight at once, not one after the other


def test_a_ray_jobs_blocks_grow_with_its_batches_not_its_questions(ray_cluster, tmp_path, caplog):
    """Ray Data schedules, accounts and keeps stats per block, on the driver: a block is a batch of questions. At
    a fixed batch size, N questions make N / batch blocks in the read and as many reports, for every N (one row a
    block made 20 and 60)."""
    import logging

    cfg = DynragConfig()
    cfg.generation.backend, cfg.answer.progress, cfg.answer.batch_questions = "none", False, 5
    cfg.runtime.mode = "ray"
    for n in (20, 60):
        path = tmp_path / f"q{n}.jsonl"
        path.write_text(
            "".join(json.dumps({"id": f"q{i}", "question": f"q {i}?", "answers": ["a"]}) + "\n" for i in range(n))
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pipeline.runtime.ray_runner"):
            summary = run_answer(str(path), str(tmp_path / f"out{n}"), method="no-retrieval", cfg=cfg)
        line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("ray data blocks: "))
        blocks = json.loads(line.removeprefix("ray data blocks: "))
        assert summary["rows"] == n and rows_on_disk(tmp_path / f"out{n}").num_rows == n
        assert sorted(blocks.values()) == [n // 5, n // 5], blocks  # the read's blocks and the engine actors'


def test_resumed_ray_run_on_s3_counts_every_row(s3, ray_cluster, data_dir):
    """The driver's ledger with Ray (issue 47, item 5): a resumed run on s3:// counts every row in its summary.
    The engine actors write the parts from their own processes, so the driver's s3fs listing of parts/, cached
    when the run started, never shows them: the summary must count the parts listed at start and those the
    actors report (`batch_report(..., part)`), not a listing."""
    fs, bucket = s3
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:8]
    fs.pipe(f"{bucket}/q.jsonl", ("\n".join(lines) + "\n").encode())
    cfg = DynragConfig()
    cfg.runtime.mode = "ray"
    cfg.generation.backend = "none"
    cfg.answer.progress = False
    cfg.answer.batch_questions = 2
    cfg.ray.batch_questions = 2
    dataset, out = f"s3://{bucket}/q.jsonl", f"s3://{bucket}/run"
    assert run_answer(dataset, out, method="no-retrieval", limit=4, cfg=cfg)["rows"] == 4
    second = run_answer(dataset, out, method="no-retrieval", limit=8, cfg=cfg)
    assert (second["skipped_already_answered"], second["new_rows"]) == (4, 4)
    assert second["rows"] == 8
    assert_each_question_once(out, 8)  # as pyarrow counts parts/


def test_a_ray_run_pins_the_index_version_for_every_replica(data_dir, tmp_path_factory, tmp_path, monkeypatch):
    """The driver reads the index's CURRENT once and hands `<index>@vN` to the replicas (and the pools), so a
    version published mid-run is not mixed in; the run's rows and summary are the runner's as usual."""
    from engine_fixtures import build_hotpot_index

    from pipeline.runtime import ray_runner

    index = build_hotpot_index(data_dir, tmp_path_factory, n=5, encoder="hash")  # which encoder is not the point
    seen: list = []

    def runner(dataset, out, cfg, index_dir, row_args, **kw):
        seen.append(index_dir)
        yield from ()

    monkeypatch.setattr(ray_runner, "answer_with_ray", runner)
    cfg = DynragConfig()
    cfg.runtime.mode, cfg.generation.backend, cfg.answer.progress = "ray", "none", False
    cfg.embedding.model = "hash"
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:2]
    (tmp_path / "q.jsonl").write_text("\n".join(lines) + "\n")
    run_answer(str(tmp_path / "q.jsonl"), str(tmp_path / "out"), index=str(index), method="sr-rag", cfg=cfg)
    assert seen == [f"{index}@v000001"]
