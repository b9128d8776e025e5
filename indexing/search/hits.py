"""What a retriever returns for one query: ranked passages with scores."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hit:
    id: str  # stable passage id
    title: str
    text: str
    score: float  # higher is better (BM25 score or inner product)
