"""eval-dragin's table: runs with error rows (figures None) still print, labels come from the runs' params."""

from jobs.eval.dragin import comparison, retrieval_note, table


def _row(method, k, retrievals, em=0.5, errors=0):
    return {
        "dataset": "hotpotqa",
        "method": method,
        "k": k,
        "questions": 4,
        "errors": errors,
        "em": em,
        "f1": em,
        "retrievals": retrievals,
        "llm_calls": 1.0,
        "gen_tokens": 10.0,
        "triggers": None,
        "forced": None,
        "entropy": None,
        "s_per_q": 0.1,
    }


def test_error_rows_do_not_crash_the_table_or_the_comparison():
    # every dragin row failed: no figures (the old job compared None < float here and printed nothing)
    rows = [_row("sr-rag", 5, 1.0), _row("fs-rag", 3, 2.5), _row("dragin", 3, None, em=None, errors=4)]
    text = table(rows)
    assert "| DRAGIN | - | - | - |" in text and "| SR-RAG | 0.500 |" in text
    assert comparison(rows) == []  # nothing to compare for dragin
    rows[2] = _row("dragin", 3, 1.5)
    assert comparison(rows) == ["hotpotqa: DRAGIN retrieves less than FS-RAG (1.50 vs 2.50 per question)"]


def test_retrieval_note_names_each_runs_own_k():
    rows = [_row("no-retrieval", None, 0.0), _row("sr-rag", 5, 1.0), _row("dragin", 3, 1.5)]
    assert retrieval_note(rows) == "top-k per method: SR-RAG 5, DRAGIN 3"


def test_run_k_comes_from_the_summary_params_without_rereading_the_rows():
    from jobs.eval.dragin import run_k
    from pipeline.config import load_config
    from pipeline.methods.registry import get_method

    cfg = load_config(None, ["retrieval.k=7"])
    # the summary's method_params is the params' model_dump (run_answer): k None means retrieval.k
    dragin = {"method_params": get_method("dragin").params({}).model_dump(mode="json")}
    assert dragin["method_params"]["k"] == 3 and run_k(dragin, cfg) == 3  # Table 8's 3
    assert run_k({"method_params": {"k": None}}, cfg) == 7
    assert run_k({"method_params": get_method("no-retrieval").params({}).model_dump(mode="json")}, cfg) is None
    assert run_k({}, cfg) is None
