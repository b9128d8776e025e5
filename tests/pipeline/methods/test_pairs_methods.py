"""PAIRS methods and the expansion/rerank baselines through the real engine, with fake backends whose
vectors and rankings are set by hand, so the selected documents can be worked out on paper."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fakes import RecordingGenerator

from indexing.search.hits import Hit
from indexing.shards.embed import embed_input
from pipeline.backends import Backends
from pipeline.config import DynragConfig
from pipeline.engine.core import Engine
from pipeline.engine.requests import Question
from pipeline.io.output import make_row
from pipeline.methods.pairs import tagged_answer
from pipeline.methods.registry import MethodError, get_method

Q = "Where was the author of Book X born?"
PSEUDO = "Book X was written by Ann, who was born in Paris."


def _unit(deg: float, up: float = 0.0) -> np.ndarray:
    """A unit vector at azimuth `deg` in the q-p plane, lifted `up` degrees out of it."""
    r, u = math.radians(deg), math.radians(up)
    return np.array([math.cos(u) * math.cos(r), math.cos(u) * math.sin(r), math.sin(u)], dtype=np.float32)


# q at 0°, p at 60° in a plane; documents (azimuth, elevation). Angles to q and p (θ1, θ2), by hand:
# a (10, 30): s1 = cos30 cos10 = .8529, s2 = cos30 cos50 = .5567 -> 31.46°, 56.17°, sum 87.6°
# b (40, 0): 40°, 20°, sum 60°;  d (30, 20): s1 = s2 = cos20 cos30 = .8138 -> 35.53° each, sum 71.1°
# c (80, 0): 80°, 20°, sum 100°; e (100, 0): 100°, 40°, sum 140°; f (-30, 0): 30°, 90°, sum 120°
DOCS = {"a": (10, 30), "b": (40, 0), "c": (80, 0), "d": (30, 20), "e": (100, 0), "f": (-30, 0)}
HITS = {i: Hit(i, f"T{i}", f"text {i}", 0.0) for i in DOCS}


class FakeRetriever:
    """Query path: a, b, f, c, e; pseudo-context path: c, d, a, e, b (a, c, e, b found by both)."""

    def __init__(self):
        self.queries: list[str] = []

    def search(self, queries, k, retriever):
        self.queries.extend(queries)
        out = []
        for q in queries:
            ids = ["c", "d", "a", "e", "b"] if q == PSEUDO else ["a", "b", "f", "c", "e", "d"]
            out.append([HITS[i] for i in ids[:k]])
        return out


class FakeEmbedder:
    def __init__(self):
        self.vecs = {
            Q: _unit(0),
            PSEUDO: _unit(60),
            **{embed_input(h.title, h.text): _unit(*DOCS[i]) for i, h in HITS.items()},
        }

    def embed(self, texts, model=None):
        return np.stack([self.vecs[t] for t in texts])


class FakeScorer:
    """K(d, q) and K(d, p): fixed by hand per (query kind, document)."""

    K = {
        ("q", "a"): 0.1,
        ("q", "b"): 0.9,
        ("q", "c"): 0.5,
        ("q", "d"): 0.2,
        ("q", "e"): 0.3,
        ("q", "f"): 0.8,
        ("p", "a"): 0.1,
        ("p", "b"): 0.1,
        ("p", "c"): 0.6,
        ("p", "d"): 0.9,
        ("p", "e"): 0.0,
        ("p", "f"): 0.0,
    }

    def __init__(self):
        self.names: list[str] = []

    def score(self, items, classifier):
        self.names.append(classifier)
        return [self.K[("q" if query == Q else "p", doc.split(":")[0][1:])] for query, doc in items]


def _reply(direct: str, from_pseudo: str, final: str = "<answer>Paris</answer>"):
    def reply(prompt):
        text = str(prompt)
        if "write a detailed passage" in text or "write a passage" in text.lower() or "rationale" in text:
            return PSEUDO
        if "based on the Context" in text:
            return from_pseudo if f"Context: {PSEUDO}" in text else final
        return direct

    return reply


def _run(method: str, params: dict | None = None, reply=None):
    gen = RecordingGenerator(reply or _reply("<answer>London</answer>", "<answer>Paris</answer>"))
    ret, emb, sc = FakeRetriever(), FakeEmbedder(), FakeScorer()
    backends = Backends(DynragConfig(), generator=gen, retriever=ret, embedder=emb, scorer=sc)
    spec = get_method(method)
    (o,) = Engine(backends).run(
        [Question("1", Q, ["Paris"], supporting_titles=["Ta", "Tc"])], spec.program, spec.params(params)
    )
    assert o.error is None, o.error
    row = make_row(o, run_id="r", method=method, params_json="{}", chash="h", model="fake")
    return o, row, ret, sc


def test_tagged_answer():
    assert tagged_answer("<answer>Beijing</answer> because") == "Beijing"
    assert tagged_answer("It is <answer>Paris") == "Paris"  # the close tag was the stop string
    assert tagged_answer("Paris\nmore") == "Paris"
    assert tagged_answer("<answer></answer>London") == "London"


def test_pairs_agreement_skips_retrieval_with_three_llm_calls():
    o, row, ret, _ = _run("pairs", reply=_reply("<answer>The Paris</answer>", "<answer>paris.</answer>"))
    assert o.answer.prediction == "The Paris" and o.answer.retrieval_triggered is False
    assert row["retrieval_calls"] == 0 and row["llm_calls"] == 3 and row["retrieval_triggered"] is False
    assert row["embedding_calls"] == 0 and not row["retrieved"] and ret.queries == []
    assert json.loads(row["extra"])["gate"]["a2"] == "paris"  # one extraction rule: a final period dropped
    assert row["support_recall"] is None  # no documents were selected


def test_pairs_disagreement_runs_dpr_ais():
    o, row, ret, _ = _run("pairs")
    assert o.answer.retrieval_triggered is True and row["retrieval_triggered"] is True
    assert row["llm_calls"] == 4 and row["retrieval_calls"] == 2
    assert ret.queries == [Q, PSEUDO]
    # AIS, Eq. 4: s = cos(θ1 + θ2), smallest sums b 60°, d 71.1°, a 87.6°
    assert [h.id for h in o.answer.used_docs] == ["b", "d", "a"]
    assert o.answer.prediction == "Paris"
    assert row["support_recall"] == pytest.approx(0.5)  # Ta of {Ta, Tc}


def test_pairs_echoed_question_in_both_answers_retrieves():
    echo = "<answer>Where was the author of Book X born</answer>"
    o, row, ret, _ = _run("pairs", reply=_reply(echo, echo))
    gate = json.loads(row["extra"])["gate"]
    assert gate["echo"] is True and gate["a1"] == gate["a2"]  # they agree, but only on the question itself
    assert o.answer.retrieval_triggered is True and row["retrieval_calls"] > 0 and o.answer.prediction == "Paris"


def test_pairs_exclude_numeric_retrieves_even_when_answers_agree():
    reply = _reply("<answer>1905</answer>", "<answer>1905</answer>")
    o, row, _, _ = _run("pairs", reply=reply)
    assert row["retrieval_triggered"] is False and row["llm_calls"] == 3
    o, row, _, _ = _run("pairs", {"exclude_numeric": True}, reply=reply)
    assert row["retrieval_triggered"] is True and row["llm_calls"] == 4


def test_dpr_ais_merges_dedups_and_selects_by_eq4():
    o, row, ret, _ = _run("dpr-ais", {"n": 3})
    # top 3 by q: a, b, f; by p: c, d, a  ->  5 unique candidates
    extra = json.loads(row["extra"])
    assert extra["candidates"] == 5 and extra["from_both_paths"] == 1
    # θ1 + θ2 of the candidates: b 60°, d 71.1°, a 87.6°, c 100°, f 120°
    assert [h.id for h in o.answer.used_docs] == ["b", "d", "a"]
    assert extra["scores"] == pytest.approx([math.cos(math.radians(t)) for t in (87.65, 60, 120, 100, 71.06)], abs=5e-4)
    assert row["llm_calls"] == 2 and row["retrieval_calls"] == 2 and row["embedding_calls"] == 2 + 5
    kept = [d["id"] for d in row["retrieved"] if d["kept"]]
    assert sorted(kept) == ["a", "a", "b", "d"]  # a was retrieved by both paths
    assert {d["path"] for d in row["retrieved"]} == {"query", "pseudo-context"}


def test_dpr_ais_dynamic_uses_eq8_alpha():
    o, row, _, _ = _run("dpr-ais-dynamic", {"n": 3})
    alpha = json.loads(row["extra"])["alpha"]
    assert alpha == pytest.approx(0.058 * math.radians(60) + 0.455, abs=1e-4)
    # α = .058·(π/3) + .455 = .5157; α·θ1 + (1 − α)·θ2: b 30.3°, d 35.5°, a 43.4°, c 51.0°, f 59.0°
    assert [h.id for h in o.answer.used_docs] == ["b", "d", "a"]
    assert json.loads(row["extra"])["scores"][0] == pytest.approx(
        math.cos(math.radians(0.5157 * 31.46 + 0.4843 * 56.17)), abs=2e-4
    )


def test_dpr_ais_rerank_sums_both_reranker_scores():
    o, row, _, sc = _run("dpr-ais-rerank", {"n": 3, "reranker": "my-reranker"})
    # K(d,q) + K(d,p): a .2, b 1.0, f .8, c 1.1, d 1.1 -> c, d (candidate order), b
    assert [h.id for h in o.answer.used_docs] == ["c", "d", "b"]
    assert sc.names == ["my-reranker"] and row["classifier_calls"] == 10 and row["embedding_calls"] == 0


def test_ablations_single_path_and_fixed_ratio():
    o, row, ret, _ = _run("dpr-ais", {"n": 3, "paths": "query"})
    assert ret.queries == [Q] and row["retrieval_calls"] == 1
    assert json.loads(row["extra"])["candidates"] == 6  # 2n from the one path
    o, row, ret, _ = _run("dpr-ais", {"n": 3, "paths": "pseudo"})
    assert ret.queries == [PSEUDO]
    o, _, _, _ = _run("dpr-ais", {"n": 3, "selection": "fixed-2q1p"})
    assert [h.id for h in o.answer.used_docs] == ["a", "b", "c"]
    o, _, _, _ = _run("dpr-ais", {"n": 3, "selection": "fixed-1q2p"})
    assert [h.id for h in o.answer.used_docs] == ["a", "c", "d"]
    with pytest.raises(MethodError):
        get_method("dpr-ais").params({"selection": "fixed-2q1p", "paths": "query"})


def test_expansion_baselines_retrieve_with_their_signal():
    _, row, ret, _ = _run("hyde")
    assert ret.queries == [PSEUDO] and row["llm_calls"] == 2
    _, _, ret, _ = _run("q2d")
    assert ret.queries == [f"{Q}\n{PSEUDO}"]
    _, _, ret, _ = _run("cot", {"retriever": "bm25", "query_repeats": 2})
    assert ret.queries == [f"{Q} {Q}\n{PSEUDO}"]


def test_rerank_baseline_reorders_the_query_list():
    o, row, ret, _ = _run("rerank", {"depth": 6, "k": 2})
    # K(d, q): b .9, f .8, c .5 ... -> b, f
    assert [h.id for h in o.answer.used_docs] == ["b", "f"] and row["classifier_calls"] == 6
    assert row["llm_calls"] == 1 and ret.queries == [Q]


def test_short_prompt_style_uses_the_project_prompts():
    seen = []

    def reply(prompt):
        seen.append(prompt)
        return PSEUDO if "write a detailed passage" in str(prompt) else "Answer: Paris"

    o, row, _, _ = _run("pairs", {"prompt_style": "short"}, reply=reply)
    assert o.answer.prediction == "Paris" and row["retrieval_triggered"] is False
    direct, pseudo, with_pseudo = seen
    assert isinstance(direct, list) and "Only give me the answer" in direct[0]["content"]
    assert isinstance(pseudo, str)  # Fig. 9 (a) in both styles
    assert PSEUDO in with_pseudo[1]["content"] and "based on the given documents" in with_pseudo[0]["content"]
