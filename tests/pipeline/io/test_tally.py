"""A run's summary folded batch by batch (pipeline/io/tally.py, commit.py) equals a recount of its rows, and a
resumed run reads no column of the parts it found beyond the key columns (it reads its own batches to merge
them, merge.py)."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from eval_fixtures import fake_row

from pipeline.config import DynragConfig
from pipeline.io import output
from pipeline.io.commit import _KEY, TALLY_FILE
from pipeline.io.output import SCHEMA, summarize
from pipeline.io.tally import Tally
from pipeline.runtime.answer import run_answer

RUN_FIELDS = {"run_id", "out", "dataset", "method", "method_params", "config_hash", "model", "runtime"}
RUN_FIELDS |= {"skipped_already_answered", "backend_batch_calls", "wall_time_s", "new_rows", "questions_per_s"}
RUN_FIELDS |= {"wall_s_per_question", "duplicate_ids"}


def _rows(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        row = fake_row(i, dataset="d", method="m", params={}, f1=rnd.choice([0.0, 0.5, 1.0]), total_s=rnd.random())
        row.update(latency_s=rnd.lognormvariate(0, 1.5), retrieval_cache_hits=rnd.randint(0, 1), window_full=i % 7 == 0)
        if i % 5 == 0:
            row.update(error=f"GenerationError: boom {i % 3}", error_kind="system")
        rows.append(row)
    return rows


def test_the_sums_of_batches_are_the_sums_of_their_rows():
    rows = _rows(300, 0)
    whole = Tally.of_table(pa.Table.from_pylist(rows, schema=SCHEMA))
    folded = Tally()
    for i in range(0, 300, 64):
        folded.add(
            Tally.from_json(
                json.loads(json.dumps(Tally.of_table(pa.Table.from_pylist(rows[i : i + 64], schema=SCHEMA)).to_json()))
            )
        )
    assert folded.summary() == whole.summary()
    assert whole.summary()["errors"] == 60 and whole.summary()["window_full"] == 34
    # the mean over answered rows only; the latency's quantiles within 3% of the exact ones
    ok = [r for r in rows if r["error"] is None]
    assert whole.summary()["f1"] == pytest.approx(sum(r["f1"] for r in ok) / len(ok), abs=1e-4)
    exact = sorted(r["latency_s"] for r in ok)
    for q in (0.5, 0.95):
        rank = q * (len(ok) - 1)  # polars' linear quantile
        i, f = int(rank), rank - int(rank)
        want = exact[i] + f * (exact[min(i + 1, len(ok) - 1)] - exact[i])
        assert whole.latency_quantile(q) == pytest.approx(want, rel=0.03)
    # error rows answered again and removed: as if they had never been there
    errors = [r for r in rows if r["error"] is not None][:20]
    folded.remove_error_rows([r["error"] for r in errors])
    rest = [r for r in rows if r not in errors]
    assert folded.summary() == Tally.of_table(pa.Table.from_pylist(rest, schema=SCHEMA)).summary()


def _questions(path, n: int) -> str:
    lines = [json.dumps({"id": f"q{i}", "question": f"question {i}?", "answers": ["a"]}) for i in range(n)]
    lines[3] = "{not json"  # an error row (the question's own)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _cfg() -> DynragConfig:
    cfg = DynragConfig()
    cfg.generation.backend, cfg.answer.progress, cfg.answer.batch_questions = "none", False, 4
    return cfg


def _figures(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in RUN_FIELDS}


def test_a_runs_summary_is_folded_as_its_batches_commit_and_equals_a_recount(tmp_path, monkeypatch):
    dataset, out = _questions(tmp_path / "q.jsonl", 30), str(tmp_path / "run")
    first = run_answer(dataset, out, method="no-retrieval", limit=10, cfg=_cfg())
    assert _figures(first) == _figures(summarize(out)) and first["rows"] == 10 and first["errors"] == 1
    assert json.loads((tmp_path / "run" / TALLY_FILE).read_text())["tally"]["rows"] == 10

    reads: list[tuple[str, tuple | None]] = []
    read_part = output._read_part

    def recorded(fs, path, columns):
        reads.append((path, tuple(columns) if columns is not None else None))
        return read_part(fs, path, columns)

    before = set(output.part_files(out))
    monkeypatch.setattr(output, "_read_part", recorded)
    second = run_answer(dataset, out, method="no-retrieval", limit=22, cfg=_cfg())
    assert (second["new_rows"], second["skipped_already_answered"], second["rows"]) == (12, 10, 22)
    old = [(path, cols) for path, cols in reads if path in before]
    assert old and all(set(cols or SCHEMA.names) <= set(_KEY) for _, cols in old), old  # key columns only
    monkeypatch.undo()
    assert _figures(second) == _figures(summarize(out))

    # a run killed before its close leaves no tally: the next one counts the rows again, the same figures
    (tmp_path / "run" / TALLY_FILE).unlink()
    third = run_answer(dataset, out, method="no-retrieval", cfg=_cfg())
    assert third["rows"] == 30 and _figures(third) == _figures(summarize(out))
    # a tally naming a part that is gone (removed by hand) is not trusted
    saved = json.loads((tmp_path / "run" / TALLY_FILE).read_text())
    gone = tmp_path / "run" / "parts" / saved["parts"][0]
    gone.unlink()
    again = run_answer(dataset, out, method="no-retrieval", limit=0, cfg=_cfg())
    assert again["rows"] == summarize(out)["rows"] < 30 and _figures(again) == _figures(summarize(out))
