"""Helpers shared by the engine tests: the tiny model (built once per session), a small index over the
context paragraphs of the first HotpotQA dev questions, and the continuous engine's passages and batch-only
generator."""

from __future__ import annotations

import json
from pathlib import Path

from tiny_model import build_tiny_model

from jobs.bench.rig.simulated import SimGenerator

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
