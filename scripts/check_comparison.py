"""Check `dynrag evaluate B --baseline A --json` against a recomputation from the two runs' Parquet rows that
shares no code with dynrag's: pyarrow reads the part files, the standard library pairs, resamples and flips.

    python scripts/check_comparison.py RUN_A RUN_B [--resamples 10000]

Prints, per compared metric, dynrag's and the recomputed delta, 95% interval and p, and exits 1 where an
interval end differs by more than 0.01 or p by more than 0.02 (the recomputation is itself a Monte Carlo
estimate with its own seed, so the two agree only within sampling error).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq


def scores(run: str, metric: str) -> dict[str, float | None]:
    """question id -> the metric of its last finished row (None for an error row or a missing score)."""
    latest: dict[str, tuple[str, float | None]] = {}
    for part in sorted(Path(run, "parts").glob("part-*.parquet")):
        t = pq.read_table(part, columns=["question_id", "finished_at", "error", metric]).to_pylist()
        for r in t:
            key = str(r["finished_at"])
            if r["question_id"] not in latest or key >= latest[r["question_id"]][0]:
                latest[r["question_id"]] = (key, None if r["error"] is not None else r[metric])
    return {q: v for q, (_, v) in latest.items()}


def recompute(a: dict, b: dict, resamples: int, rng: random.Random) -> tuple[int, float, float, float, float]:
    diffs = [b[q] - a[q] for q in a if q in b and a[q] is not None and b[q] is not None]
    n = len(diffs)
    delta = sum(diffs) / n
    boot = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))

    def pct(q: float) -> float:  # linear interpolation between order statistics, as numpy's default
        pos = q * (resamples - 1)
        lo = int(pos)
        return boot[lo] + (boot[min(lo + 1, resamples - 1)] - boot[lo]) * (pos - lo)

    observed = abs(sum(diffs)) - 1e-9
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed for _ in range(resamples))
    return n, delta, pct(0.025), pct(0.975), (hits + 1) / (resamples + 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--resamples", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "jobs.cli", "evaluate", args.run_b, "--baseline", args.run_a, "--json"]
        out = subprocess.run([*cmd, "--out", tmp], capture_output=True, text=True, check=True).stdout
    [row] = json.loads(out)
    ok = True
    rng = random.Random(12345)
    for m in row["metrics"]:
        n, delta, lo, hi, p = recompute(scores(args.run_a, m), scores(args.run_b, m), args.resamples, rng)
        ci = row[f"delta_{m}_ci95"]
        good = (
            n == row["n"]
            and abs(delta - row[f"delta_{m}"]) < 1e-9
            and abs(lo - ci[0]) <= 0.01
            and abs(hi - ci[1]) <= 0.01
            and abs(p - row[f"p_{m}"]) <= 0.02
        )
        ok &= good
        print(
            f"{m}: n {row['n']} / {n}; delta {row[f'delta_{m}']:.4f} / {delta:.4f}; "
            f"95% CI [{ci[0]:.4f}, {ci[1]:.4f}] / [{lo:.4f}, {hi:.4f}]; p {row[f'p_{m}']:.4f} / {p:.4f}: "
            + ("agree" if good else "DISAGREE")
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
