"""Safety: nothing a user supplies is unpickled or evaluated, model repos' code never runs unless
generation.trust_remote_code is set, and ids cannot steer output paths (tests/faults/test_faults_inputs.py).

A static check walks the product's source (pipeline/, indexing/, jobs/) for the calls that execute
data; a dynamic one points the CLI at a model folder whose config asks for its own code and at one
whose weights are a pickle that runs a command: both are refused with one error line, and neither
ran anything."""

from __future__ import annotations

import ast
import json
import pickle
import shutil
from pathlib import Path

import pytest
from engine_fixtures import tiny_model_path

from jobs.cli import main
from pipeline.config import DynragConfig

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("pipeline", "indexing", "platform_shims", "jobs") for p in (ROOT / d).rglob("*.py"))
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"}


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_no_source_unpickles_or_evaluates():
    problems = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            problems += [f"{where}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] in UNSAFE_MODULES]
        for call, name in _calls(tree):
            line = f"{where}:{call.lineno}: {name}"
            if name in ("eval", "exec", "compile", "__import__"):
                problems.append(f"{line} evaluates code")
            elif name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
                problems.append(f"{line}: use yaml.safe_load")
            elif name == "torch.load" and not (
                isinstance(_kw(call, "weights_only"), ast.Constant) and _kw(call, "weights_only").value is True
            ):
                problems.append(f"{line} without weights_only=True")
            elif (
                name.endswith("load")
                and isinstance(_kw(call, "allow_pickle"), ast.Constant)
                and _kw(call, "allow_pickle").value
            ):
                problems.append(f"{line} with allow_pickle=True")
            remote = _kw(call, "trust_remote_code")
            if remote is not None and not (isinstance(remote, ast.Attribute) and remote.attr == "trust_remote_code"):
                problems.append(f"{line}: trust_remote_code must come from the configuration")
    assert not problems, "\n".join(problems)


def test_remote_code_is_off_unless_opted_in():
    assert DynragConfig().generation.trust_remote_code is False


def _answer(capsys, data_dir, model: Path, out: Path):
    rc = main(
        [
            "--log-level",
            "ERROR",
            "answer",
            "--dataset",
            str(data_dir / "nq_open/dev_3610.jsonl"),
            "--limit",
            "2",
            "--method",
            "no-retrieval",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "generation.backend=transformers",
            "--set",
            f"generation.model={model}",
        ]
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, [x for x in err.strip().splitlines() if x.startswith("dynrag: ")]


class _RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_model_code_and_pickled_weights_never_run(capsys, data_dir, tmp_path, tmp_path_factory):
    marker = tmp_path / "code-ran"
    custom = tmp_path / "custom-code-model"
    shutil.copytree(tiny_model_path(tmp_path_factory), custom)  # a working tokenizer; the model asks for code
    for weights in custom.glob("*.safetensors"):
        weights.unlink()
    (custom / "config.json").write_text(
        json.dumps(
            {
                **json.loads((custom / "config.json").read_text()),
                "model_type": "evil",
                "architectures": ["EvilModel"],
                "auto_map": {
                    "AutoConfig": "modeling_evil.EvilConfig",
                    "AutoModelForCausalLM": "modeling_evil.EvilModel",
                },
            }
        )
    )
    (custom / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    rc, lines = _answer(capsys, data_dir, custom, tmp_path / "out1")
    assert rc == 2 and len(lines) == 1 and "cannot load the generation model" in lines[0], lines
    assert "trust_remote_code" in lines[0]
    assert not marker.exists()

    pickled = tmp_path / "pickled-weights-model"
    pickled.mkdir()
    (pickled / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "num_key_value_heads": 2,
                "vocab_size": 64,
            }
        )
    )
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsACommand(marker)))
    rc, lines = _answer(capsys, data_dir, pickled, tmp_path / "out2")
    assert rc == 2 and len(lines) == 1 and "cannot load the generation model" in lines[0], lines
    assert not marker.exists()
    assert not (tmp_path / "out1" / "parts").exists() and not (tmp_path / "out2" / "parts").exists()
