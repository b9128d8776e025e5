"""Helpers shared by the engine tests: the tiny model (built once per session), a small index over the
context paragraphs of the first HotpotQA dev questions, and the continuous engine's passages and batch-only
generator."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from tiny_model import build_tiny_model

from jobs.bench.rig.simulated import SimGenerator
from pipeline.io.output import SCHEMA, part_files
from pipeline.text.metrics import answer_metrics

HOTPOT = "hotpotqa/dev_400.jsonl"
PASSAGES = [
    ("p1", "Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg."),
    ("p2", "Paris", "Paris is the capital of France."),
    ("p3", "Rome", "Rome is the capital of Italy."),
    ("p4", "Steven Spielberg", "Steven Spielberg is an American film director born in Cincinnati."),
    ("p5", "Berlin", "Berlin is the capital of Germany."),
]


class BatchGenerator:
    """The simulated generator behind a batch-only interface (no `submit`): the continuous engine's generate lane."""

    def __init__(self):
        self.sim = SimGenerator()

    def generate(self, prompts, samplings, chats):
        return self.sim.generate(prompts, samplings, chats)


def tiny_model_path(tmp_path_factory) -> Path:
    folder = tmp_path_factory.getbasetemp() / "tiny-model"
    if not (folder / "model.safetensors").exists():
        build_tiny_model(folder)
    return folder


def captured_ids(backend) -> list[list[int]]:
    """Records the unpadded id rows of every pass of an AttentionPass (`pipeline/backends/attention.py`) as
    its model ran them: a kept prefix's ids (from its key/value cache) then the forward's own ids."""
    rows: list[list[int]] = []

    def hook(_module, _args, kwargs):
        if "attention_mask" not in kwargs:  # a prefix's keys and values being computed
            return
        cache = kwargs.get("past_key_values")
        m = cache.get_seq_length() if cache is not None else 0
        prefix = backend.passes.prefix.ids[:m] if m else []
        assert len(prefix) == m
        for ids, mask in zip(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist()):
            assert all(mask[:m])
            rows.append(prefix + [t for t, k in zip(ids, mask[m:]) if k])

    backend.model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)
    return rows


def at_least(data_dir: Path, rel: str, n: int, out_dir: Path) -> Path:
    """A JSONL question file of the kit with at least n records: the kit's own where it has them, else (the
    fixture kit) its records repeated up to n lines in out_dir, each repeat's id suffixed "-r<k>" so that
    every line is a distinct question (files without ids get theirs from line numbers). For job tests
    (resume, faults) that need many rows, not many different questions."""
    src = data_dir / rel
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(lines) >= n:
        return src
    rows = []
    for i in range(n):
        rec, k = json.loads(lines[i % len(lines)]), i // len(lines)
        for key in ("question_id", "_id", "id", "qid"):
            if k and key in rec:
                rec[key] = f"{rec[key]}-r{k}"
        rows.append(json.dumps(rec, ensure_ascii=False))
    out = out_dir / rel  # the kit's relative path: a dataset named after its folder keeps its name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out


def hotpot_subset(data_dir: Path, out: Path, n: int = 20) -> Path:
    """The first n dev questions (as many as data_dir has) as a corpus file in a temp folder."""
    lines = (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:n]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def build_hotpot_index(data_dir: Path, tmp_path_factory, n: int = 20, encoder: str | None = None) -> Path:
    """The first `n` HotpotQA records' paragraphs as an index, built once per test process; `encoder`: its
    `embedding.model` (default the configuration's; the job that searches it must use the same)."""
    from indexing import build_index
    from pipeline.config import DynragConfig

    root = tmp_path_factory.getbasetemp() / f"hotpot-index-{n}{'-' + encoder if encoder else ''}"
    if not (root / "done").exists():
        corpus = hotpot_subset(data_dir, tmp_path_factory.mktemp("corpus") / "hotpot_dev_subset.jsonl", n)
        cfg = DynragConfig()
        if encoder:
            cfg.embedding.model = encoder
        build_index([str(corpus)], root, cfg.index_settings(), fmt="hotpotqa")
        (root / "done").write_text("ok")
    return root


def supporting_titles_raw(data_dir: Path, n: int) -> list[set[str]]:
    """Gold supporting titles read straight from the file, independently of the dataset loader."""
    out = []
    for line in (data_dir / HOTPOT).read_text(encoding="utf-8").splitlines()[:n]:
        rec = json.loads(line)
        out.append({c["title"] for c in rec["contexts"] if c["is_supporting"]})
    return out


def check_rows(out, method: str, data_dir: Path, retrieves: bool, n: int = 15):
    """The rows of an end-to-end run of `n` HotpotQA questions (HOTPOT) with `method`: one per question, each
    scored as answer_metrics scores it, its calls, times and retrieved documents; gold-document recall against
    the raw file's is_supporting flags. Returns them."""
    files = part_files(str(out))
    assert files
    assert pq.read_schema(files[0]).equals(SCHEMA, check_metadata=False)
    df = pl.read_parquet(f"{out}/parts/*.parquet")
    assert df.height == n and df["question_id"].n_unique() == n
    assert df["error"].null_count() == n
    assert set(df["method"]) == {method}
    gold_raw = supporting_titles_raw(data_dir, n)
    for row in df.sort("question_id").iter_rows(named=True):
        m = answer_metrics(row["prediction"], row["gold_answers"])
        assert (row["em"], row["f1"], row["acc"]) == (m["em"], m["f1"], m["acc"])
        assert row["llm_calls"] == 1 and row["completion_tokens"] > 0 and row["prompt_tokens"] > 0
        assert row["time_generation_s"] > 0 and row["time_total_s"] >= row["time_generation_s"]
        assert row["retrieval_triggered"] is retrieves
        if retrieves:
            assert row["retrieval_calls"] == 1 and row["time_retrieval_s"] > 0
            assert len(row["retrieved"]) == 5 and row["docs_in_prompt"] == 5
            assert all(d["kept"] and d["step"] == "retrieve" for d in row["retrieved"])
        else:
            assert row["retrieval_calls"] == 0 and row["retrieved"] == [] and row["support_recall"] is None
    # gold-document recall against the raw file's is_supporting flags, in dataset order
    rows = {r["question_id"]: r for r in df.iter_rows(named=True)}
    order = [json.loads(line)["question_id"] for line in (data_dir / HOTPOT).read_text().splitlines()[:n]]
    for qid, gold in zip(order, gold_raw):
        r = rows[qid]
        assert set(r["gold_supporting_titles"]) == gold
        if retrieves:
            titles = {d["title"] for d in r["retrieved"]}
            assert r["support_recall"] == pytest.approx(len(gold & titles) / len(gold))
    return df
