"""PAIRS selection math (pipeline/methods/ais.py) on hand-computed vectors: Eqs. (4)-(8), merge, gate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from indexing.search.hits import Hit
from pipeline.methods.ais import (
    ais_score,
    answers_agree,
    dynamic_alpha,
    dynamic_score,
    fixed_ratio,
    is_echo,
    is_numeric,
    merge_paths,
    optimal_alpha,
    rerank_score,
    top_k,
)


def _unit(deg: float) -> np.ndarray:
    r = math.radians(deg)
    return np.array([math.cos(r), math.sin(r)])


def test_eq4_on_vectors_at_known_angles():
    # q at 0°, p at 90°, d at 30°: θ1 = 30°, θ2 = 60°, so s(d) = cos 90° = 0
    q, p, d = _unit(0), _unit(90), _unit(30)
    s1, s2 = float(d @ q), float(d @ p)
    assert s1 == pytest.approx(math.sqrt(3) / 2) and s2 == pytest.approx(0.5)
    assert float(ais_score(s1, s2)) == pytest.approx(0.0, abs=1e-12)
    # d at 45° with q at 0°, p at 30°: θ1 = 45°, θ2 = 15°, cos 60° = 0.5
    q, p, d = _unit(0), _unit(30), _unit(45)
    assert float(ais_score(d @ q, d @ p)) == pytest.approx(0.5)
    # by hand: s1 = s2 = 0.6 -> 0.36 - 0.8 * 0.8 = -0.28
    assert float(ais_score(0.6, 0.6)) == pytest.approx(-0.28)


def test_eq4_edge_cases_s_plus_minus_one():
    s2 = np.array([-1.0, -0.3, 0.0, 0.7, 1.0])
    # s1 = 1 (θ1 = 0): the score is s2 itself; s1 = -1 (θ1 = π): cos(π + θ2) = -s2
    assert np.allclose(ais_score(1.0, s2), s2)
    assert np.allclose(ais_score(-1.0, s2), -s2)
    assert float(ais_score(1.0, 1.0)) == pytest.approx(1.0)
    assert float(ais_score(1.0, -1.0)) == pytest.approx(-1.0)
    assert float(ais_score(-1.0, -1.0)) == pytest.approx(1.0)  # cos 2π: the formula wraps past π
    # float error just outside [-1, 1] is clipped, never NaN
    assert float(ais_score(1.0000001, 0.5)) == pytest.approx(0.5)
    assert not np.isnan(ais_score(-1.0000002, 0.2))


def test_eq4_rewards_joint_alignment_over_the_sum():
    # same s1 + s2 = 1.2, but the balanced document is closer to both q and p
    balanced, lopsided = float(ais_score(0.6, 0.6)), float(ais_score(1.0, 0.2))
    assert balanced == pytest.approx(-0.28) and lopsided == pytest.approx(0.2)
    assert lopsided > balanced  # θ1 + θ2: 0° + 78.5° < 53.1° + 53.1°


def test_eq5_and_eq8_dynamic_weighting():
    # θ0 = 0 (q = p): α = 0.455; θ0 = π/2: α = 0.058 π/2 + 0.455
    assert dynamic_alpha(1.0) == pytest.approx(0.455)
    assert dynamic_alpha(0.0) == pytest.approx(0.058 * math.pi / 2 + 0.455)
    assert dynamic_alpha(-1.0) == pytest.approx(0.058 * math.pi + 0.455)
    # θ1 = 60°, θ2 = 30°, α = 0.5: cos 45°
    assert float(dynamic_score(0.5, math.sqrt(3) / 2, 0.5)) == pytest.approx(math.sqrt(2) / 2)
    # α = 1 keeps only the query angle, α = 0 only the pseudo-context's
    assert float(dynamic_score(0.3, -0.9, 1.0)) == pytest.approx(0.3)
    assert float(dynamic_score(0.3, -0.9, 0.0)) == pytest.approx(-0.9)
    # s = ±1 edges: θ = 0 or π
    assert float(dynamic_score(1.0, 1.0, 0.455)) == pytest.approx(1.0)
    assert float(dynamic_score(-1.0, -1.0, 0.455)) == pytest.approx(-1.0)
    assert float(dynamic_score(1.0, -1.0, 0.5)) == pytest.approx(0.0, abs=1e-12)  # cos 90°
    with pytest.raises(ValueError):
        dynamic_score(0.5, 0.5, 1.5)


def test_eq6_optimal_alpha_and_eq7():
    assert optimal_alpha(math.cos(math.radians(20)), math.cos(math.radians(60))) == pytest.approx(0.75)
    assert optimal_alpha(1.0, 1.0) == 0.5
    assert np.allclose(rerank_score([0.9, 0.1], [0.2, 0.4]), [1.1, 0.5])


def _hits(*ids: str) -> list[Hit]:
    return [Hit(i, f"T{i}", f"text {i}", 0.0) for i in ids]


def test_dual_path_merge_dedups_and_keeps_first_order():
    merged, found = merge_paths({"query": _hits("a", "b", "c"), "pseudo-context": _hits("c", "d", "a", "e")})
    assert [h.id for h in merged] == ["a", "b", "c", "d", "e"]
    assert found == [
        ["query", "pseudo-context"],
        ["query"],
        ["query", "pseudo-context"],
        ["pseudo-context"],
        ["pseudo-context"],
    ]
    merged, _ = merge_paths({"query": _hits("x", "x")})
    assert [h.id for h in merged] == ["x"]


def test_top_k_and_fixed_ratio():
    hits = _hits("a", "b", "c", "d")
    assert [h.id for h in top_k(hits, [0.1, 0.9, 0.5, 0.9], 3)] == ["b", "d", "c"]
    q, p = _hits("a", "b", "c"), _hits("b", "d", "e")
    assert [h.id for h in fixed_ratio(q, p, 2, 1)] == ["a", "b", "d"]  # b is already held: next p hit
    assert [h.id for h in fixed_ratio(q, p, 1, 2)] == ["a", "b", "d"]


def test_agreement_gate():
    assert answers_agree("The Eiffel Tower.", "eiffel tower")
    assert not answers_agree("Paris", "Lyon")
    assert not answers_agree("", "")  # nothing to agree on
    assert not answers_agree("the", "a")  # both normalise to empty
    assert answers_agree("1905", "1905")
    assert not answers_agree("1905", "1905", exclude_numeric=True)
    assert not answers_agree("three", "Three", exclude_numeric=True)
    assert answers_agree("Am Rong", "am rong", exclude_numeric=True)
    assert is_numeric("born in 1972") and not is_numeric("someone")


def test_an_echo_of_the_question_is_no_agreement():
    q = "Who wrote the novel Dune?"
    assert answers_agree("Frank Herbert", "frank herbert", question=q)
    assert not answers_agree("Who wrote the novel Dune", "who wrote the novel dune?", question=q)  # both echo
    assert not answers_agree("the novel Dune, who wrote it", "The novel Dune, who wrote it.", question=q)
    assert is_echo("Dune novel, who wrote", q) and not is_echo("Dune", q)  # 4 of 4 words vs 1 of 4 ("the" dropped)
    assert answers_agree("Alice", "alice", question="Which is older, Alice or Bob?")  # a choice is no echo
