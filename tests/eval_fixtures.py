"""Synthetic finished runs for the evaluation tests: rows with the real schema, written as real part files."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import DynragConfig
from pipeline.engine.core import STAGES
from pipeline.io.output import SCHEMA, write_part


def fake_row(i: int, *, dataset: str, method: str, params: dict, f1: float, total_s: float, **over) -> dict:
    row = dict.fromkeys(SCHEMA.names)
    row.update(
        run_id="r1",
        dataset=dataset,
        question_id=f"q{i}",
        question=f"question {i}?",
        gold_answers=["x"],
        gold_supporting_titles=["A", "B"],
        method=method,
        method_params=json.dumps(params),
        prediction="x" if f1 == 1 else "y",
        raw_output="",
        generations=[],
        retrieved=[],
        docs_in_prompt=3,
        llm_calls=1,
        retrieval_calls=1,
        classifier_calls=0,
        embedding_calls=0,
        retrieval_triggered=True,
        prompt_tokens=100,
        completion_tokens=5,
        em=f1,
        f1=f1,
        acc=f1,
        precision=f1,
        recall=f1,
        support_recall=0.5,
        **{f"time_{s}_s": 0.0 for s in STAGES},
    )
    # in a batch a question's wall time exceeds its cost share: latency_s = 3 x time_total_s here
    row.update(time_retrieval_s=total_s / 2, time_generation_s=total_s / 2, time_total_s=total_s, latency_s=3 * total_s)
    row.update(over)
    return row


def fake_run(
    folder: Path, *, dataset: str, method: str, params: dict, f1s: list[float], times: list[float], **over
) -> Path:
    """One run folder with a row per (f1, time) pair."""
    rows = [
        fake_row(i, dataset=dataset, method=method, params=params, f1=f, total_s=t, **over)
        for i, (f, t) in enumerate(zip(f1s, times))
    ]
    write_part(str(folder), rows)
    return folder


def drrag_like_runs(root: Path) -> list[Path]:
    """Two datasets; bm25 and cfs at k = 3, 4, 6 (recall growing with k) and one no-retrieval run each."""
    out = []
    for ds in ("hotpotqa", "musique"):
        for m, base in (("bm25", 0.3), ("cfs", 0.5)):
            for k in (3, 4, 6):
                out.append(
                    fake_run(
                        root / ds / f"{m}-k{k}",
                        dataset=ds,
                        method=m,
                        params={"k": k},
                        f1s=[1.0, 0.0],
                        times=[0.1 * k, 0.2 * k],
                        support_recall=base + 0.05 * k,
                        docs_in_prompt=k,
                    )
                )
        out.append(
            fake_run(
                root / ds / "no-retrieval",
                dataset=ds,
                method="no-retrieval",
                params={},
                f1s=[0.0, 0.0],
                times=[0.05, 0.05],
                retrieval_calls=0,
                retrieval_triggered=False,
                support_recall=None,
                docs_in_prompt=0,
            )
        )
    return out


def no_model_cfg() -> DynragConfig:
    """A run's configuration with the model's cost taken out (generation.backend=none), in batches of 2."""
    cfg = DynragConfig()
    cfg.generation.backend = "none"
    cfg.answer.progress = False
    cfg.answer.batch_questions = 2
    return cfg


def part_row(qid: str, finished_at: float, error: str | None = None) -> dict:
    """A row as a staged part holds it: its key columns, a prediction naming it, and a few required fields."""
    row = {"question_id": qid, "finished_at": finished_at, "error": error, "prediction": f"p-{qid}-{finished_at}"}
    return row | {"retrieval_triggered": False, "method": "m", "dataset": "d"}
