"""PAIRS' selection math (Chen et al. 2025, "Parametric-Verified Adaptive Information Retrieval and
Selection for Efficient RAG", Methodology): dual-path merge, the AIS scores and the agreement gate.

On L2-normalised embeddings q = f(q), p = f(p), d = f(d):
    s1 = <d, q> = cos θ1,  s2 = <d, p> = cos θ2                                  (Eqs. 2, 3)
    AIS:      s(d) = cos(θ1 + θ2) = s1·s2 − sqrt(1 − s1²)·sqrt(1 − s2²)          (Eq. 4)
    dynamic:  s(d) = cos(α·θ1 + (1 − α)·θ2)                                       (Eq. 5)
              α = 0.058·θ0 + 0.455, θ0 = arccos <q, p> in radians                  (Eq. 8)
    rerank:   s(d) = K(d, q) + K(d, p)                                            (Eq. 7)
Eq. (4) is cos of the summed angles, so it is not monotone once θ1 + θ2 > π (both angles past 90°):
s1 = s2 = −1 scores 1, as the formula says. Retrieved candidates have θ1 or θ2 below 90° in practice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from indexing import Hit
from pipeline.text.metrics import normalize_answer

ALPHA_SLOPE, ALPHA_INTERCEPT = 0.058, 0.455  # Eq. (8), fitted on 5,000 HotpotQA train queries


def _cos(x) -> np.ndarray:
    """Cosines clipped to [-1, 1]: float error on normalised vectors must not give NaN angles."""
    return np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)


def ais_score(s1, s2) -> np.ndarray:
    """Eq. (4): cos(θ1 + θ2) from s1 = cos θ1 and s2 = cos θ2."""
    s1, s2 = _cos(s1), _cos(s2)
    return s1 * s2 - np.sqrt(1.0 - s1**2) * np.sqrt(1.0 - s2**2)


def dynamic_alpha(q_p_cos: float) -> float:
    """Eq. (8): α = 0.058·θ0 + 0.455 with θ0 = arccos <q, p>, kept in [0, 1] (Eq. 5's range)."""
    theta0 = float(np.arccos(_cos(q_p_cos)))
    return float(np.clip(ALPHA_SLOPE * theta0 + ALPHA_INTERCEPT, 0.0, 1.0))


def dynamic_score(s1, s2, alpha: float) -> np.ndarray:
    """Eq. (5): cos(α·θ1 + (1 − α)·θ2); α weights the query's angle (larger α: trust q more)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return np.cos(alpha * np.arccos(_cos(s1)) + (1.0 - alpha) * np.arccos(_cos(s2)))


def optimal_alpha(s1: float, s2: float) -> float:
    """Eq. (6): α = θ2 / (θ1 + θ2) for a relevant document (the regression target behind Eq. 8)."""
    t1, t2 = float(np.arccos(_cos(s1))), float(np.arccos(_cos(s2)))
    return 0.5 if t1 + t2 == 0 else t2 / (t1 + t2)


def rerank_score(k_dq, k_dp) -> np.ndarray:
    """Eq. (7): K(d, q) + K(d, p) from a reranker's scores."""
    return np.asarray(k_dq, dtype=np.float64) + np.asarray(k_dp, dtype=np.float64)


# -- dual-path retrieval and selection (Algorithm 1) ---------------------------------------------


def merge_paths(paths: dict[str, Sequence[Hit]]) -> tuple[list[Hit], list[list[str]]]:
    """Algorithm 1 line 4, D2n = Dq ∪ Dp: the union in order of first appearance (a document found by
    both paths appears once), and for each merged hit the names of the paths that found it."""
    merged: dict[str, Hit] = {}
    found_by: dict[str, list[str]] = {}
    for name, hits in paths.items():
        for h in hits:
            merged.setdefault(h.id, h)
            names = found_by.setdefault(h.id, [])
            if name not in names:
                names.append(name)
    return list(merged.values()), [found_by[i] for i in merged]


def top_k(hits: Sequence[Hit], scores: Sequence[float] | np.ndarray, k: int) -> list[Hit]:
    """Algorithm 1 line 9: the k hits of highest score (ties keep candidate order)."""
    order = sorted(range(len(hits)), key=lambda i: -float(scores[i]))
    return [hits[i] for i in order[:k]]


def fixed_ratio(q_hits: Sequence[Hit], p_hits: Sequence[Hit], n_q: int, n_p: int) -> list[Hit]:
    """PAIRS Table 3's "w/o AIS (w/ 2q+1p / 1q+2p)": the first n_q query hits, then the first n_p
    pseudo-context hits not already taken."""
    chosen = list(q_hits[:n_q])
    ids = {h.id for h in chosen}
    return chosen + [h for h in p_hits if h.id not in ids][:n_p]


# -- the parametric verification gate -----------------------------------------------------------

_DIGIT = re.compile(r"\d")
_NUMBER_WORDS = re.compile(
    r"\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"hundred|thousand|million|billion)\b",
    re.IGNORECASE,
)


def is_numeric(answer: str) -> bool:
    """PAIRS Table 5's heuristic: the answer contains a number (digits or a number word)."""
    return bool(_DIGIT.search(answer) or _NUMBER_WORDS.search(answer))


def is_echo(answer: str, question: str, share: float = 0.8) -> bool:
    """The answer repeats the question: it holds at least `share` of the question's distinct words (SQuAD
    normalisation; "Which is older, A or B?" answered "A" holds one word in five and is no echo)."""
    q, a = set(normalize_answer(question).split()), set(normalize_answer(answer).split())
    return bool(q) and len(q & a) >= share * len(q)


def answers_agree(a1: str, a2: str, *, question: str = "", exclude_numeric: bool = False) -> bool:
    """The gate: â1 and â2 agree when equal after SQuAD normalisation, not empty and not an echo of the
    question (a model that repeats the question in both answers knows nothing); with `exclude_numeric`, a
    numeric â1 never skips retrieval (Table 5, "Exclude num")."""
    n1, n2 = normalize_answer(a1), normalize_answer(a2)
    if not n1 or n1 != n2 or is_echo(a1, question):
        return False
    return not (exclude_numeric and is_numeric(a1))
