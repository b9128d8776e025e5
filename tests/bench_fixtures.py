"""`dynrag bench flashrag` with both sides scripted: FlashRAG's venv, the corpus, the templates dump and the
matrix product faked, and each side's process answered by `fake_sides`' `run_measured` (what the real sides print,
with the counts a test chooses), recording the order, commands and environments of the runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Script:
    """What the scripted sides do and what the bench asked of them."""

    errors: dict[str, int] = field(default_factory=dict)  # side -> error rows
    vllm_fails: str | None = None  # FlashRAG's vLLM generator fails with this message
    order: list[str] = field(default_factory=list)  # sides in the order run (a failed vLLM run included)
    commands: dict[str, list[str]] = field(default_factory=dict)
    envs: dict[str, dict] = field(default_factory=dict)
    frameworks: list[str] = field(default_factory=list)  # FlashRAG's framework at each of its runs
    driver_modes: list[tuple[str, ...]] = field(default_factory=list)  # the driver's untimed runs


def save_weights(folder, shapes: dict):
    """A model folder holding only zero weights of these shapes (what jobs/bench/rig/roofline.py reads)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(s) for k, s in shapes.items()}, str(folder / "model.safetensors"))
    return folder


def side_result(side: str, script: Script, framework: str, threads: int) -> dict[str, Any]:
    errors = script.errors.get(side, 0)
    return {
        "side": side,
        "framework": framework,
        "threads": threads,
        "questions": 2,
        "answered": 2 - errors,
        "errors": errors,
        "seconds": 4e-6,
        "startup_s": 3.0,
        "questions_per_s": (2 - errors) / (4e-6 if side == "dynrag" else 4e-5),
        "llm_calls": 5 if side == "dynrag" else 6,
        "retrievals": 3,
        "prompt_tokens": 200,
        "completion_tokens": 20,
        "prompt_tokens_per_question": 100.0,
        "completion_tokens_per_question": 10.0,
        "llm_calls_per_question": 2.5 if side == "dynrag" else 3.0,
        "retrievals_per_question": 1.5,
        "predictions": {"a": "x", "b": "y"},
        "doc_ids": {"a": ["1", "2"], "b": ["3", side]},
        **({"answers": {"a": "Paris", "b": "y"}} if side == "dynrag" else {}),
    }


def fake_sides(monkeypatch, tmp_path, dumped: dict | None = None, script: Script | None = None):
    """Returns (order, commands, model folder, script)."""
    import jobs.bench.flashrag.env
    import jobs.bench.flashrag.launch as launch
    import jobs.bench.flashrag.prepare as setup
    import jobs.bench.rig.roofline
    import pipeline.assets.models
    import pipeline.backends.embedding
    import pipeline.backends.hf_gen
    import pipeline.backends.vllm_gen  # noqa: F401  bound resolve_model before it is patched below, not after
    from jobs.bench.flashrag.driver import VLLM_FAILED
    from jobs.bench.rig.rss import Measured

    script = script or Script()

    def fake(cmd, env=None, **_):
        side = "flashrag" if str(launch.DRIVER) in cmd else "dynrag"
        script.order.append(side)
        script.commands[side], script.envs[side] = cmd, dict(env or {})
        framework = "vllm"
        if side == "flashrag":
            framework = json.loads((tmp_path / "flashrag.json").read_text())["framework"]
            script.frameworks.append(framework)
            if framework == "vllm" and script.vllm_fails:
                failed = json.dumps({"side": "flashrag", "vllm_failed": script.vllm_fails})
                return Measured(VLLM_FAILED, "progress\n" + failed + "\n", "", 10.0, 2**30)
        r = side_result(side, script, framework, int((env or {}).get("OMP_NUM_THREADS", 0)))
        return Measured(0, "progress\n" + json.dumps(r) + "\n", "", 10.0, 2**30)

    monkeypatch.setattr(jobs.bench.flashrag.env, "ensure_flashrag", lambda *a, **k: "/venv/bin/python")
    model = save_weights(tmp_path / "model", {"model.embed_tokens.weight": (50, 8), "model.layers.0.w.weight": (8, 8)})
    monkeypatch.setattr(pipeline.assets.models, "resolve_model", lambda *a: str(model))

    def prepare(cfg, ds, limit, warmup, work):  # a file of limit + 3 questions
        (work / "questions.jsonl").write_text(
            json.dumps({"id": "a", "answers": ["Paris"]}) + "\n" + json.dumps({"id": "b", "answers": ["z"]}) + "\n"
        )
        return {"questions": limit, "warmup_questions": min(warmup, 3), "passages": 5}

    monkeypatch.setattr(setup, "prepare", prepare)
    monkeypatch.setattr(launch, "dump_templates", lambda *a: dumped)
    monkeypatch.setattr(launch, "run_driver", lambda python, config, *mode: script.driver_modes.append(mode))
    monkeypatch.setattr(jobs.bench.rig.roofline, "matmul_gflops", lambda dtype: 1e-3)
    monkeypatch.setattr(launch, "run_measured", fake)
    return script.order, script.commands, model, script


def run_driver_with(site, config):
    """FlashRAG's driver, as the bench runs it, on `config` with the packages under `site` (fakes) first on its path."""
    import os
    import subprocess
    import sys

    from jobs.bench.flashrag.launch import flashrag_command

    return subprocess.run(
        flashrag_command(sys.executable, config),
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )
