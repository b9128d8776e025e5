"""The PAIRS evaluation job's run list and table (no model needed)."""

from __future__ import annotations

import pytest

from jobs.eval.pairs import GROUPS, pick, run_params, table
from pipeline.errors import DynragError


def test_run_list_and_shared_params():
    assert pick("main")[:2] == ["no-retrieval", "sr-rag"] and "dpr-ais-rerank" in pick("main")
    assert pick("w/o DPR (q only),pairs") == ["w/o DPR (q only)", "pairs"]
    assert set(GROUPS["ablation"]) <= set(GROUPS["all"])
    with pytest.raises(DynragError):
        pick("nope")
    shared = {"prompt_style": "short", "n": 4}
    assert run_params("sr-rag", shared) == ("sr-rag", {"k": 3, "retriever": "dense"})  # no such params there
    assert run_params("hyde", shared) == ("hyde", {"prompt_style": "short"})
    assert run_params("w/o DPR (p only)", shared) == ("dpr-ais", {"prompt_style": "short", "n": 4, "paths": "pseudo"})


def test_table_row():
    s = {
        "answered": 10,
        "em": 0.25,
        "f1": 0.5,
        "retrieval_triggered_rate": 0.7,
        "llm_calls_per_question": 3.3,
        "retrieval_calls_per_question": 1.4,
        "support_recall": None,
        "docs_in_prompt_per_question": 2.1,
        "time_per_question_s": {"total": 1.234},
    }
    row = table([("pairs", s)]).splitlines()[-1]
    assert row == "| pairs | 10 | 25.0 | 50.0 | 70.0% | 3.30 | 1.40 | - | 2.10 | 1.23 |"
