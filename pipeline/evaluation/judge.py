"""An LLM judge of a run's answers: does the prediction give one of the gold answers, in any wording?

EM and Acc miss correct free-form answers ("The answer is: 10."); the judge reads them. It sees the
question, the gold answers and the prediction only (no passages, no method), in this prompt (`PROMPT`):

    Question: {question}
    Correct answers: {golds}            # joined with " | "
    Proposed answer: {prediction}
    Is the proposed answer correct, i.e. does it state one of the correct answers (any wording)?
    Reply with one word: yes or no.

Its reply's first word decides: "yes" is right (1), "no" is wrong (0); anything else (or a failed
generation) is unjudged and counts in neither. All prompts of a run go to the generator in one batched
`generate` call (vLLM batches them; greedy, 8 new tokens). Verdicts are cached per run and judge model in
`<run>/judge/<model>.parquet`, keyed by question id and prediction, so a rerun asks only about rows it has
not judged (a changed prediction is judged again).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline.engine.requests import Completion, SamplingSpec
from pipeline.evaluation.runs import Run
from pipeline.io.output import read_rows

PROMPT = (
    "Question: {question}\n"
    "Correct answers: {golds}\n"
    "Proposed answer: {prediction}\n"
    "Is the proposed answer correct, i.e. does it state one of the correct answers (any wording)?\n"
    "Reply with one word: yes or no."
)
SAMPLING = SamplingSpec(max_tokens=8, temperature=0.0)
CACHE_COLUMNS = ("question_id", "prediction", "output", "verdict")


def prompt(question: str, golds: list[str], prediction: str) -> str:
    return PROMPT.format(question=question.strip(), golds=" | ".join(golds), prediction=prediction.strip())


def verdict(output: str) -> float | None:
    """1.0 for a reply starting "yes", 0.0 for "no", None otherwise (unjudged)."""
    words = re.findall(r"[a-z]+", output.lower())
    return {"yes": 1.0, "no": 0.0}.get(words[0]) if words else None


def model_slug(model: str) -> str:
    """The cache file's name for a judge model: a path's folder name, or the model name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model.rstrip("/")).name) or "judge"


def cache_path(run_dir: str, model: str) -> str:
    return f"{run_dir.rstrip('/')}/judge/{model_slug(model)}.parquet"


def read_cache(path: str) -> dict[tuple[str, str], tuple[str, float | None]]:
    import fsspec
    import polars as pl

    fs, p = fsspec.core.url_to_fs(path)
    if not fs.exists(p):
        return {}
    with fs.open(p, "rb") as fh:
        df = pl.read_parquet(fh)
    return {(q, pred): (out, v) for q, pred, out, v in df.select(CACHE_COLUMNS).iter_rows()}


def write_cache(path: str, cache: dict[tuple[str, str], tuple[str, float | None]]) -> None:
    import fsspec
    import polars as pl

    rows = [{"question_id": q, "prediction": p, "output": o, "verdict": v} for (q, p), (o, v) in cache.items()]
    df = pl.DataFrame(
        rows, schema={"question_id": pl.Utf8, "prediction": pl.Utf8, "output": pl.Utf8, "verdict": pl.Float64}
    )
    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(p, "wb") as fh:
        df.write_parquet(fh)


def judge_run(run: Run, model: str, generator: Any) -> dict[str, Any]:
    """Judge the run's error-free rows that have gold answers (asking `generator` only about uncached ones);
    returns the judge's figures: judge_acc over judged rows, counts, agreement with EM and Acc."""
    rows = [
        r
        for r in read_rows(
            run.path, ["question_id", "question", "gold_answers", "prediction", "error", "em", "acc"]
        ).to_pylist()
        if r["error"] is None and r["em"] is not None
    ]
    path = cache_path(run.path, model)
    cache = read_cache(path)
    todo = [r for r in rows if (r["question_id"], r["prediction"] or "") not in cache]
    if todo:
        outs = generator.generate(
            [prompt(r["question"], list(r["gold_answers"]), r["prediction"] or "") for r in todo],
            [SAMPLING] * len(todo),
            [True] * len(todo),
        )
        for r, out in zip(todo, outs):
            text = out.text if isinstance(out, Completion) else f"(failed: {out})"
            cache[(r["question_id"], r["prediction"] or "")] = (
                text,
                verdict(text) if isinstance(out, Completion) else None,
            )
        write_cache(path, cache)
    judged = [(cache[(r["question_id"], r["prediction"] or "")][1], r) for r in rows]
    scored = [(v, r) for v, r in judged if v is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "judge_model": model,
        "judge_acc": mean([v for v, _ in scored]),
        "judged": len(scored),
        "unjudged": len(rows) - len(scored),
        "asked": len(todo),
        "judge_agree_em": mean([float(v == r["em"]) for v, r in scored]),
        "judge_agree_acc": mean([float(v == r["acc"]) for v, r in scored]),
        "judge_right_em_wrong": sum(v == 1.0 and r["em"] == 0.0 for v, r in scored),
        "cache": path,
    }


def markdown(results: list[tuple[Run, dict[str, Any]]]) -> str:
    """Per dataset: the judge's accuracy beside EM and Acc, and how often it agrees with each."""
    from pipeline.evaluation.table import cell

    if not results:
        return ""
    blocks = []
    for ds in dict.fromkeys(run.dataset for run, _ in results):
        lines = [
            f"### {ds}: judged by {results[0][1]['judge_model']}",
            "",
            "| run | EM | Acc | judge Acc | judged | unjudged | agrees with EM | agrees with Acc | right by judge, EM 0 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for run, j in ((r, j) for r, j in results if r.dataset == ds):
            lines.append(
                f"| {run.label} | {cell(run.summary['em'], '%')} | {cell(run.summary['acc'], '%')} | "
                f"{cell(j['judge_acc'], '%')} | {j['judged']} | {j['unjudged']} | {cell(j['judge_agree_em'], '%')} | "
                f"{cell(j['judge_agree_acc'], '%')} | {j['judge_right_em_wrong']} |"
            )
        blocks.append("\n".join(lines))
    return (
        "\n\n".join(blocks)
        + "\n\nJudge Acc over judged rows; unjudged: a reply neither yes nor no (pipeline/evaluation/judge.py has the prompt).\n"
    )


def judge_config(run: Run, model: str, overrides: list[str] | tuple[str, ...] = ()):
    """The judge's configuration: the run's saved generation settings (its backend) with `model`; a run
    that generated nothing (backend none) is judged on vLLM."""
    from pipeline.config import config_from_data
    from pipeline.evaluation.runs import resolved_config

    gen = dict(resolved_config(run.path).get("generation", {}))
    gen["model"] = model
    if gen.get("backend") in (None, "none"):
        gen["backend"] = "vllm"
    gen.pop("streaming", None)  # one batched generate call, not the streaming generator
    return config_from_data({"generation": gen}, overrides)


class LazyGenerator:
    """Builds the judge's generator on the first `generate`: a rerun whose verdicts are all cached loads no model."""

    def __init__(self, cfg):
        self.cfg, self.generator = cfg, None

    def generate(self, prompts, samplings, chats):
        from pipeline.backends import make_generator

        if self.generator is None:
            self.generator = make_generator(self.cfg)
        return self.generator.generate(prompts, samplings, chats)

    def close(self) -> None:
        if self.generator is not None:
            self.generator.close()


def judge_runs(
    runs: list[Run], model: str, overrides: list[str] | tuple[str, ...] = (), generator: Any = None
) -> list[tuple[Run, dict[str, Any]]]:
    """Judge every run that has answers with one judge engine (`generator`, else one built from the first such
    run's settings); runs without answers (generation.backend=none) are left out."""
    runs = [r for r in runs if r.summary.get("f1") is not None]
    if not runs:
        return []
    own = generator is None
    gen = LazyGenerator(judge_config(runs[0], model, overrides)) if own else generator
    try:
        return [(run, judge_run(run, model, gen)) for run in runs]
    finally:
        if own:
            gen.close()
