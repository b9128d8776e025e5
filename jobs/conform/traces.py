"""Two implementations' traces of one question, side by side (`dynrag conform`).

A trace is the question's events in order: `generate` (the prompt's hash and text, the output) and `retrieve`
(the query, the passage ids). A side's *decisions* are its retrievals: where each happened (the answer the method
had accepted by then, read from the next prompt as the text after its last "Answer:"), the query and the ids;
and, where a row has `kept` (ERM4's Knowledge Filter), the titles the filter kept.
Two sides make the same decisions when those lists are equal; the same prediction when the answers are equal
after SQuAD normalisation. The first divergence is the first event that differs: its kind, a call's prompt or
output, a retrieval's query or passages.
"""

from __future__ import annotations

import re
from typing import Any

from jobs.conform.record import prompt_sha  # noqa: F401  (a trace's hash, as both sides record it)
from pipeline.text.metrics import normalize_answer

ANSWER = "Answer:"


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def accepted_in(prompt: str) -> str:
    """The answer a prompt continues: the text after its last "Answer:" (the question's own)."""
    i = prompt.rfind(ANSWER)
    return _squash(prompt[i + len(ANSWER) :]) if i >= 0 else ""


def decisions(events: list[dict]) -> list[dict]:
    """Each retrieval: the answer accepted before it, the query, the passage ids."""
    out = []
    for i, ev in enumerate(events):
        if ev["kind"] != "retrieve":
            continue
        after = next((e["prompt"] for e in events[i + 1 :] if e["kind"] == "generate"), None)
        out.append(
            {
                "after": accepted_in(after) if after is not None else None,
                "query": _squash(ev["query"]),
                "ids": list(ev["ids"]),
            }
        )
    return out


def _key(ev: dict) -> tuple:
    if ev["kind"] == "generate":
        return ("generate", ev["prompt_sha"], ev["text"])
    return ("retrieve", _squash(ev["query"]), tuple(ev["ids"]))


def _show(ev: dict | None, tail: int = 400) -> dict | None:
    if ev is None:
        return None
    if ev["kind"] == "generate":
        return {
            "kind": "generate",
            "prompt_sha": ev["prompt_sha"],
            "prompt_tail": ev["prompt"][-tail:],
            "output": ev["text"],
        }
    return {"kind": "retrieve", "query": ev["query"], "ids": list(ev["ids"])}


def first_divergence(ref: list[dict], ours: list[dict]) -> dict | None:
    """The first event where the two traces differ (one side having ended counts), or None."""
    for i in range(max(len(ref), len(ours))):
        a = ref[i] if i < len(ref) else None
        b = ours[i] if i < len(ours) else None
        if a is None or b is None or _key(a) != _key(b):
            return {"event": i, "reference": _show(a), "dynrag": _show(b)}
    return None


def compare(ref: dict, ours: dict) -> dict[str, Any]:
    """One question: the reference's row (events, prediction or error) against dynrag's."""
    out: dict[str, Any] = {"id": ref.get("id", ours.get("id")), "question": ref.get("question")}
    if ref.get("error") or ours.get("error"):
        out.update(same_decisions=False, same_prediction=False)
        out["reference_error"], out["dynrag_error"] = ref.get("error"), ours.get("error")
        if ref.get("error") and ours.get("error"):  # both ended: after the same events?
            out["same_events_before_errors"] = first_divergence(ref["events"], ours["events"]) is None
        return out
    rd, od = decisions(ref["events"]), decisions(ours["events"])
    if "kept" in ref or "kept" in ours:  # what a knowledge filter kept is a decision too (ERM4)
        rd, od = rd + [{"kept": ref.get("kept")}], od + [{"kept": ours.get("kept")}]
    out["same_decisions"] = rd == od
    out["same_prediction"] = normalize_answer(ref["prediction"]) == normalize_answer(ours["prediction"])
    out["retrievals"] = {"reference": len(rd), "dynrag": len(od)}
    out["predictions"] = {"reference": ref["prediction"], "dynrag": ours["prediction"]}
    if not (out["same_decisions"] and out["same_prediction"]):
        out["first_divergence"] = first_divergence(ref["events"], ours["events"])
        out["decisions"] = {"reference": rd, "dynrag": od}
    return out


def summary(per_question: list[dict]) -> dict[str, Any]:
    return {
        "questions": len(per_question),
        "same_decisions": sum(bool(q["same_decisions"]) for q in per_question),
        "same_predictions": sum(bool(q["same_prediction"]) for q in per_question),
        "reference_errors": sum(bool(q.get("reference_error")) for q in per_question),
        "dynrag_errors": sum(bool(q.get("dynrag_error")) for q in per_question),
        "both_errors_after_the_same_events": sum(bool(q.get("same_events_before_errors")) for q in per_question),
        "differing": [q for q in per_question if not (q["same_decisions"] and q["same_prediction"])],
    }
