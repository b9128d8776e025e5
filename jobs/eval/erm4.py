"""`dynrag eval-erm4`: ERM4's Table 1 (configurations (i)-(iv), F1 and Hit
Rate, Sec. 4.3) and Table 2 (the Retrieval Trigger's tau against time and knowledge counts, Sec. 6).

    dynrag eval-erm4 --index idx/hotpotqa --limit 40 --first 30 --out runs/erm4 \
        [--tables 1,2] [--taus 0.2,0.4,0.6,0.8,1.0] [--set generation.model=qwen2.5-0.5b-instruct]

Table 1 answers the first `--limit` questions of `--dataset` with no-retrieval, rewrite-retrieve-read,
erm4-rewriter and erm4 (reservoir off). Table 2 follows Sec. 6: the first `--first` questions are answered
with erm4 (tau = 1.0: all knowledge external) and what the filter kept of it fills that run's own reservoir
(OUT/table2/first-set/erm4-reservoir.sqlite); then a second set of semantically similar questions (each
first-set question rephrased by a fixed template, chosen by its position: `paraphrase`) is answered once per
tau, each run reading that reservoir (reservoir_path, update_reservoir=false: every tau and every question
sees the same pairs, so the rows do not depend on run order or timing; theta = 3). Hit Rate is the `acc` metric (a gold
answer contained in the response, Sec. 4.2). Every tau runs under the same conditions: after one discarded
warm-up run, `--repeats` passes over the taus, every other one in reverse order; the saving is printed with
each pass's figure. Rows go under OUT/table1/<method> and OUT/table2/...; a rerun resumes (rows are kept by
question id), so delete OUT to measure times afresh.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from pipeline.errors import DynragError
from pipeline.evaluation.runs import extra_summary

log = logging.getLogger(__name__)

# parameters shared by the retrieving configurations: n = 3 per query (the paper's 10, Sec. 4.1, scaled to a
# 2048-token model context), Q capped at 3 queries, 9 knowledge instances in the prompt; the weak
# hypothesis for multi-hop questions (Sec. 3.2)
COMMON = {"k": 3, "max_knowledge": 9, "rewrite_tokens": 64}
PLUS = {**COMMON, "max_queries": 3}
TABLE1: list[tuple[str, str, dict[str, Any]]] = [
    ("(i) Direct", "no-retrieval", {}),
    ("(ii) Rewriter-Retriever-Reader", "rewrite-retrieve-read", COMMON),
    ("(iii) Rewriter+-Retriever-Reader", "erm4-rewriter", PLUS),
    ("(iv) Rewriter+-Retriever-Filter-Reader", "erm4", {**PLUS, "reservoir": False, "hypothesis": "weak"}),
]
TEMPLATES = (
    "Could you tell me: {q}",
    "I would like to know this. {q}",
    "{q} Please answer briefly.",
    "Here is my question: {q}",
)


def paraphrase(question: str, i: int) -> str:
    """A deterministic rephrasing that keeps every entity of the question (template i mod 4)."""
    return TEMPLATES[i % len(TEMPLATES)].format(q=question.strip())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval-erm4",
        help="ERM4 Tables 1 and 2 (configurations (i)-(iv); tau sweep)",
        description=__doc__.split("\n\n")[0],
    )
    add_args(p)
    p.set_defaults(func=run)


def add_args(p: argparse.ArgumentParser) -> None:
    from jobs.cli import add_config_args, add_job_options, add_sequential_arg

    add_job_options(
        p,
        dataset={"default": None, "help": "questions (default: paths.data_dir/hotpotqa/dev_400.jsonl)"},
        index={"help": "index over the dataset's corpus"},
    )
    p.add_argument("--out", default="runs/erm4", metavar="DIR")
    p.add_argument("--tables", default="1,2", help="which tables: 1, 2 or 1,2")
    add_job_options(p, limit={"default": 40, "help": "Table 1: first N questions"})
    p.add_argument("--first", type=int, default=30, help="Table 2: first-set questions (the second set has as many)")
    p.add_argument("--taus", default="0.2,0.4,0.6,0.8,1.0", help="Table 2: tau values")
    p.add_argument("--theta", type=int, default=3, help="Table 2: popularity threshold (3 in Sec. 6)")
    add_job_options(
        p,
        repeats={
            "default": 2,
            "help": "Table 2: passes over the taus after a discarded warm-up "
            "run, every other one in reverse order; the saving is printed with its spread (default 2)",
        },
    )
    add_sequential_arg(p)
    add_config_args(p)


def _row(label: str, out: Path, s: dict) -> dict:
    t = s["time_per_question_s"]
    e = extra_summary(
        str(out),
        [
            "external_knowledge",
            "memory_knowledge",
            "irrelevant_knowledge",
            "backoff",
            "filter_unparsed",
            "rewrite_parsed",
        ],
    )
    return {
        "config": label,
        "questions": s["answered"],
        "errors": s["errors"],
        "f1": s["f1"],
        "hit_rate": s["acc"],
        "time_s": t["total"],
        "retrieval_s": t["retrieval"],
        "wall_s": s.get("wall_s_per_question"),
        "llm_calls": s["llm_calls_per_question"],
        "external": e["external_knowledge"],
        "memory": e["memory_knowledge"],
        "irrelevant": e["irrelevant_knowledge"],
        "backoff": e["backoff"],
        "unparsed": e["filter_unparsed"],
        "rewrite_parsed": e["rewrite_parsed"],
        "out": str(out),
    }


def _fmt(v, pct=False, nd=2) -> str:
    return "-" if v is None else f"{100 * v:.{nd}f}" if pct else f"{v:.{nd}f}"


def table1(cfg, backends, dataset: str, index: str, limit: int, out: Path) -> list[dict]:
    from pipeline.evaluation.experiment import MethodRun, run_methods

    runs = [MethodRun(method, method, params) for _, method, params in TABLE1]
    summaries = run_methods(dataset, index, runs, cfg, out / "table1", limit=limit, backends=backends)
    return [_row(label, Path(s["out"]), s) for (label, _, _), s in zip(TABLE1, summaries)]


def render_table1(rows: list[dict]) -> str:
    lines = [
        "| Method | F1 | Hit Rate | LLM calls/q | external | irrelevant | back-off | unparsed NLI/q | rewrites parsed "
        "| s/q | questions |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {_fmt(r['f1'], True)} | {_fmt(r['hit_rate'], True)} | {_fmt(r['llm_calls'])} "
            f"| {_fmt(r['external'])} | {_fmt(r['irrelevant'])} | {_fmt(r['backoff'], True, 0)}% "
            f"| {_fmt(r['unparsed'])} | {_fmt(r['rewrite_parsed'], True, 0)}% | {_fmt(r['time_s'])} "
            f"| {r['questions']} |"
        )
    return "\n".join(lines)


def intervals1(rows: list[dict]) -> str:
    """Table 1's methods against (ii) Rewriter-Retriever-Reader (else the first row): F1 and hit-rate (Acc)
    differences with 95% intervals and p."""
    from pipeline.evaluation.comparison import against_baseline

    base = next((r for r in rows if r["config"].startswith("(ii)")), rows[0])["config"]
    return f"\nagainst {base}:\n\n" + against_baseline([(r["config"], r["out"]) for r in rows], base, ("f1", "acc"))


def second_set(cfg, dataset: str, first: int, dest: Path) -> Path:
    """The first `first` questions of `dataset`, each rephrased (ids suffixed '-para'), as a QA JSONL file."""
    from itertools import islice

    from pipeline.io.datasets import load_questions

    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w", encoding="utf-8") as f:
        for i, q in enumerate(islice(load_questions(dataset, cfg), first)):
            f.write(
                json.dumps({"id": f"{q.id}-para", "question": paraphrase(q.question, i), "answers": q.answers}) + "\n"
            )
    return dest


def tau_sweep(taus: list[float], repeats: int, run_one) -> dict[float, list[dict]]:
    """`run_one(tau, folder)` -> a row, for every tau, under the same conditions: one discarded warm-up run
    first (a fresh engine's first run is slower, whatever its tau: seen 2x here), then `repeats` passes,
    every other one in reverse order, so no tau always runs first. Returns tau -> its rows, one per pass."""
    run_one(taus[0], "warm-up")
    rows: dict[float, list[dict]] = {tau: [] for tau in taus}
    for r in range(repeats):
        for tau in taus if r % 2 == 0 else taus[::-1]:
            rows[tau].append(run_one(tau, f"repeat{r + 1}/second-set-tau{tau}"))
    return rows


def merge_repeats(tau: float, runs: list[dict]) -> dict:
    """One Table 2 row from a tau's passes: the first pass's figures, its time as the mean over the passes
    (`times` keeps each pass's, for the spread)."""
    times = [r["time_s"] for r in runs if r["time_s"] is not None]
    return {**runs[0], "tau": tau, "times": times, "time_s": sum(times) / len(times) if times else None}


def table2(
    cfg, backends, dataset: str, index: str, first: int, taus: list[float], theta: int, out: Path, repeats: int
) -> list[dict]:
    from pipeline.evaluation.experiment import MethodRun, run_methods
    from pipeline.methods.reservoir import Reservoir, run_reservoir_path

    params = {**PLUS, "hypothesis": "weak", "theta": theta}
    c = cfg.model_copy(deep=True)
    c.answer.batch_questions = max(c.answer.batch_questions, first)
    # the first set, into its run's own reservoir: tau = 1.0 with theta >= 2 never answers from memory (only
    # a title equal to the query reaches S = 1.0); lockstep, one batch: the pairs are added in question order,
    # so which passage a title keeps does not depend on timing
    first_cfg = c.model_copy(deep=True)
    first_cfg.answer.engine = "lockstep"
    first_run = MethodRun("first-set", "erm4", {**params, "tau": 1.0})
    s = run_methods(dataset, index, [first_run], first_cfg, out / "table2", limit=first, backends=backends)[0]
    base = run_reservoir_path(str(out / "table2" / "first-set"))
    store = Reservoir(base)
    log.info("first set: %d questions answered, reservoir holds %d title-content pairs", s["answered"], len(store))
    rows = [
        {
            "config": "first set (fills the reservoir)",
            **_row("", out / "table2" / "first-set", s),
            "reservoir": len(store),
        }
    ]
    similar = second_set(cfg, dataset, first, out / "table2" / "second-set.jsonl")

    def run_one(tau: float, folder: str) -> dict:  # each run reads the first set's reservoir, unchanged
        run_out = out / "table2" / folder
        run = MethodRun(folder, "erm4", {**params, "tau": tau, "reservoir_path": base, "update_reservoir": False})
        s = run_methods(str(similar), index, [run], c, out / "table2", backends=backends)[0]
        log.info("table 2 tau=%s (%s): %s s/q", tau, folder, s["time_per_question_s"]["total"])
        return _row(f"tau={tau}", run_out, s)

    rows += [merge_repeats(tau, runs) for tau, runs in tau_sweep(taus, repeats, run_one).items()]
    store.close()
    return rows


def render_table2(rows: list[dict]) -> str:
    lines = [
        "| tau | Time Cost (s/q) | spread (s/q) | retrieval (s/q) | wall (s/q) | LLM calls/q | External Knowledge "
        "| Memory Knowledge | Irrelevant Knowledge | Hit Rate (%) | F1 (%) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows[1:]:
        spread = f"{min(r['times']):.2f}-{max(r['times']):.2f}" if r.get("times") else "-"
        lines.append(
            f"| {r['tau']} | {_fmt(r['time_s'])} | {spread} | {_fmt(r['retrieval_s'], nd=4)} | {_fmt(r['wall_s'])} "
            f"| {_fmt(r['llm_calls'])} | {_fmt(r['external'])} | {_fmt(r['memory'])} | {_fmt(r['irrelevant'])} "
            f"| {_fmt(r['hit_rate'], True, 1)} | {_fmt(r['f1'], True, 1)} |"
        )
    first = rows[0]
    lines.append(
        f"\nFirst set: {first['questions']} questions, {first['reservoir']} title-content pairs cached, "
        f"{_fmt(first['time_s'])} s/q, hit rate {_fmt(first['hit_rate'], True, 1)}%."
    )
    ref = next((r for r in rows[1:] if r["tau"] == 1.0), None)
    timed = [r for r in rows[1:] if r["time_s"] is not None]
    if ref and ref["time_s"] and timed:
        best = min(timed, key=lambda r: r["time_s"])
        # the saving of each pass (best tau against tau = 1.0 in the same pass), then their mean and range
        pairs = list(zip(best.get("times") or [best["time_s"]], ref.get("times") or [ref["time_s"]]))
        savings = [1 - b / r for b, r in pairs if r]
        spread = (
            f" (passes: {', '.join(f'{100 * s:.1f}%' for s in savings)})"
            if len(savings) > 1
            else " (one pass: no spread; use --repeats 2 or more)"
        )
        lines.append(
            f"Fastest tau = {best['tau']}: {_fmt(best['time_s'])} s/q against {_fmt(ref['time_s'])} s/q at "
            f"tau = 1.0, a time saving of {100 * sum(savings) / len(savings):.1f}%{spread} (hit rate "
            f"{_fmt(best['hit_rate'], True, 1)}% vs {_fmt(ref['hit_rate'], True, 1)}%). Each tau ran after a "
            "discarded warm-up run, in alternating order."
        )
        if best is not ref and not best["memory"]:
            lines.append(
                f"At tau = {best['tau']} no query was answered from memory (memory knowledge 0): it did the work of "
                "tau = 1.0, so its time difference is noise, not a saving."
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.backends import Backends

    cfg = config_from_args(args)
    cfg.answer.progress = False
    dataset = args.dataset or str(Path(cfg.paths.data_dir) / "hotpotqa" / "dev_400.jsonl")
    if not Path(dataset).is_file():
        raise DynragError(f"{dataset} not found (paths.data_dir={cfg.paths.data_dir}; set DYNRAG_DATA)")
    tables = {t.strip() for t in args.tables.split(",") if t.strip()}
    if not tables or tables - {"1", "2"}:
        raise DynragError(f"--tables: 1, 2 or 1,2, not {args.tables!r}")
    try:
        taus = [float(t) for t in args.taus.split(",") if t.strip()]
    except ValueError:
        raise DynragError(f"--taus: numbers expected, got {args.taus!r}") from None
    if args.repeats < 1:
        raise DynragError(f"--repeats: at least 1, not {args.repeats}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backends = Backends(cfg, args.index)  # one generator, index and embedder for every run
    text = [f"dataset {dataset}, model {cfg.generation.model}, retriever {cfg.retrieval.retriever}, index {args.index}"]
    try:  # Table 2 first: the Section 6 study is the longer one
        if "2" in tables:
            rows = table2(cfg, backends, dataset, args.index, args.first, taus, args.theta, out, args.repeats)
            text2 = [
                f"\nERM4 Table 2 (first set {args.first} questions; second set {args.first} rephrased ones; "
                f"theta = {args.theta})",
                render_table2(rows),
            ]
            (out / "table2.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
            print("\n".join(text2), flush=True)
        if "1" in tables:
            rows = table1(cfg, backends, dataset, args.index, args.limit, out)
            text += [f"\nERM4 Table 1 (first {args.limit} questions)", render_table1(rows), intervals1(rows)]
            (out / "table1.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
        if "2" in tables:
            text += text2
    finally:
        backends.close()
    report = "\n".join(text)
    (out / "tables.md").write_text(report + "\n", encoding="utf-8")
    print(report)
    return 0
