"""A run's summary as sums that add up batch by batch, so that the end of a run costs its new rows, not the output.

    tally = Tally.of_table(rows)              # a batch's rows (its writer), or every row of an output (a recount)
    total.add(Tally.from_json(report["tally"]))
    total.summary()                           # rows, errors, the metrics' means, calls, tokens, times, latency

Every figure of the summary is a sum and a count (a mean), a ratio of two sums, a set, or a quantile of
`latency_s`, read off a histogram of 40 log-spaced bins a decade (a quantile within 3% of the exact one;
the same from a recount and from the batches, so both give the same summary). An error row's message is counted
(the first 16 messages), so a row removed later (a "system" error answered again, commit.py) is taken back out;
the summary's examples are the 3 most frequent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipeline.engine.core import STAGES

MEANS = (  # columns whose mean over answered rows the summary gives
    "em",
    "f1",
    "acc",
    "precision",
    "recall",
    "support_recall",
    "support_recall_retrieved",
    "docs_in_prompt",
    "passages_in_prompt",
    "llm_calls",
    "retrieval_calls",
    "classifier_calls",
    "retrieval_triggered",
    "prompt_tokens",
    "completion_tokens",
    "tokens",  # prompt_tokens + completion_tokens
    "latency_s",
    *(f"time_{s}_s" for s in (*STAGES, "total")),
)
RATIOS = {"retrieval_cache_hit_rate": ("retrieval_cache_hits", "retrieval_calls"),
          "prefix_cache_hit_rate": ("cached_prompt_tokens", "prompt_tokens")}  # fmt: skip
BINS_PER_DECADE = 40
LOW_S = 1e-4  # latencies below fall in the first bin, as above 1e5 s in the last
N_BINS = BINS_PER_DECADE * 9
ERROR_EXAMPLES = 16  # messages kept (the summary shows the first 3 still present)


@dataclass
class Tally:
    rows: int = 0
    errors: int = 0
    sums: dict[str, float] = field(default_factory=dict)  # over answered rows, non-null values
    counts: dict[str, int] = field(default_factory=dict)
    window_full: int = 0
    latency_bins: dict[int, int] = field(default_factory=dict)
    error_messages: dict[str, int] = field(default_factory=dict)  # the first ERROR_EXAMPLES messages, in order
    methods: set[str] = field(default_factory=set)
    datasets: set[str] = field(default_factory=set)

    @classmethod
    def of_table(cls, table: pa.Table) -> Tally:
        """The sums of `table`'s rows (one row a question; older parts without newer columns: those as null)."""
        import polars as pl

        df = pl.from_arrow(table)
        assert isinstance(df, pl.DataFrame)
        t = cls(rows=df.height, methods=set(df["method"].drop_nulls()), datasets=set(df["dataset"].drop_nulls()))
        bad = df.filter(pl.col("error").is_not_null())
        t.errors = bad.height
        for msg in bad["error"].to_list():
            t._note_error(msg, 1)
        ok = df.filter(pl.col("error").is_null())
        if "prompt_tokens" in ok.columns and "completion_tokens" in ok.columns:
            ok = ok.with_columns(tokens=pl.col("prompt_tokens") + pl.col("completion_tokens"))
        for col in {*MEANS, *(c for pair in RATIOS.values() for c in pair)}:
            if col in ok.columns:
                values = ok[col].cast(pl.Float64)
                values = values.fill_null(0.0) if col in _RATIO_COLUMNS else values.drop_nulls()
                t.sums[col], t.counts[col] = float(values.sum()), values.len()
        if "window_full" in ok.columns:
            t.window_full = int(ok["window_full"].fill_null(False).sum())
        if "latency_s" in ok.columns:
            bins = ok["latency_s"].drop_nulls().to_numpy()
            for b in _bin_of(bins):
                t.latency_bins[int(b)] = t.latency_bins.get(int(b), 0) + 1
        return t

    def add(self, other: Tally) -> Tally:
        self.rows += other.rows
        self.errors += other.errors
        for col, v in other.sums.items():
            self.sums[col] = self.sums.get(col, 0.0) + v
            self.counts[col] = self.counts.get(col, 0) + other.counts[col]
        self.window_full += other.window_full
        for b, n in other.latency_bins.items():
            self.latency_bins[b] = self.latency_bins.get(b, 0) + n
        for msg, n in other.error_messages.items():
            self._note_error(msg, n)
        self.methods |= other.methods
        self.datasets |= other.datasets
        return self

    def remove_error_rows(self, messages: list[str]) -> None:
        """Take out error rows removed from the output (each question's older "system" error, answered again)."""
        self.rows -= len(messages)
        self.errors -= len(messages)
        for msg in messages:
            if msg in self.error_messages:
                self.error_messages[msg] -= 1
                if not self.error_messages[msg]:
                    del self.error_messages[msg]

    def _note_error(self, msg: str, n: int) -> None:
        if msg in self.error_messages or len(self.error_messages) < ERROR_EXAMPLES:
            self.error_messages[msg] = self.error_messages.get(msg, 0) + n

    # -- as JSON (a batch's report, the output's saved tally) ----------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in ("rows", "errors", "sums", "counts", "window_full", "error_messages")},
            "latency_bins": {str(b): n for b, n in self.latency_bins.items()},
            "methods": sorted(self.methods),
            "datasets": sorted(self.datasets),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Tally:
        return cls(
            **{k: d[k] for k in ("rows", "errors", "window_full")},
            sums=dict(d["sums"]),
            counts=dict(d["counts"]),
            latency_bins={int(b): n for b, n in d["latency_bins"].items()},
            error_messages=dict(d["error_messages"]),
            methods=set(d["methods"]),
            datasets=set(d["datasets"]),
        )

    # -- the summary ---------------------------------------------------------------------------------------
    def mean(self, col: str) -> float | None:
        n = self.counts.get(col, 0)
        return round(self.sums[col] / n, 4) if n else None

    def ratio(self, name: str) -> float | None:
        part, whole = RATIOS[name]
        if part not in self.counts or not self.sums.get(whole):
            return None
        return round(self.sums[part] / self.sums[whole], 4)

    def latency_quantile(self, q: float) -> float | None:
        """The `q` quantile of latency_s, linearly interpolated between the two ranks around it (as polars' "linear"
        quantile), each rank's value the geometric middle of its bin."""
        total = sum(self.latency_bins.values())
        if not total:
            return None
        rank = q * (total - 1)
        low, high = self._ranked(math.floor(rank)), self._ranked(math.ceil(rank))
        return round(low + (rank - math.floor(rank)) * (high - low), 4)

    def _ranked(self, k: int) -> float:
        seen = 0
        for b in sorted(self.latency_bins):
            seen += self.latency_bins[b]
            if seen > k:
                return LOW_S * 10 ** ((b + 0.5) / BINS_PER_DECADE)
        raise AssertionError("unreachable")

    def summary(self) -> dict[str, Any]:
        """The summary's figures (output.summarize's keys, less those of the run and the files)."""
        answered = self.rows - self.errors
        examples = [m for m, _ in sorted(self.error_messages.items(), key=lambda kv: (-kv[1], kv[0]))][:3]
        return {
            "rows": self.rows,
            "answered": answered,
            "errors": self.errors,
            "error_examples": examples,
            "methods": sorted(self.methods),
            "datasets": sorted(self.datasets),
            **{k: self.mean(k) for k in ("em", "f1", "acc", "precision", "recall", "support_recall")},
            "support_recall_retrieved": self.mean("support_recall_retrieved"),
            **{f"{k}_per_question": self.mean(k) for k in ("docs_in_prompt", "passages_in_prompt", "llm_calls")},
            "retrieval_calls_per_question": self.mean("retrieval_calls"),
            "retrieval_cache_hit_rate": self.ratio("retrieval_cache_hit_rate"),
            "classifier_calls_per_question": self.mean("classifier_calls"),
            "retrieval_triggered_rate": self.mean("retrieval_triggered"),
            "prompt_tokens_per_question": self.mean("prompt_tokens"),
            "prefix_cache_hit_rate": self.ratio("prefix_cache_hit_rate"),  # vLLM's; 0 for others
            "completion_tokens_per_question": self.mean("completion_tokens"),
            "time_per_question_s": {s: self.mean(f"time_{s}_s") for s in (*STAGES, "total")},
            "latency_s": {
                "mean": self.mean("latency_s"),
                "p50": self.latency_quantile(0.5),
                "p95": self.latency_quantile(0.95),
            },  # fmt: skip
            "window_full": self.window_full,  # answered rows a full context window shortened or ended
            "tokens_per_question": self.mean("tokens"),
        }


_RATIO_COLUMNS = {c for pair in RATIOS.values() for c in pair} - set(MEANS)  # summed with nulls as 0


def _bin_of(seconds):
    import numpy as np

    clipped = np.clip(seconds, LOW_S, LOW_S * 10**9 * 0.999999)
    return np.floor(np.log10(clipped / LOW_S) * BINS_PER_DECADE).astype(int)
