"""FlashRAG, the peer of `dynrag bench flashrag`, in its own virtual environment (never a dynrag dependency).

`pip install flashrag-dev==0.1.2` fails here (its `bm25s[full]` extra builds `pytrec_eval`, which downloads
from GitHub), so the wheel is installed with `--no-deps` beside the packages it really imports. The venv
lives under `<cache_dir>/bench/flashrag-venv` and is made once; a stamp holds the requirement list.
Standard library only: `python -m jobs.bench.flashrag_env CACHE_DIR` prepares it without dynrag's stack.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

FLASHRAG = "flashrag-dev==0.1.2"
# What flashrag 0.1.2 imports on the standard-RAG path (and a little around it); torch is the CPU build
# (a local wheel here, found through PIP_FIND_LINKS); transformers as in dynrag's lock (the same tokenizer
# and model code on both sides; 4.x cannot read the tokenizer of a model folder that 5.x saved).
REQUIREMENTS = [
    "torch==2.13.0+cpu",
    "transformers==5.19.0",
    "accelerate",
    "peft",
    "sentence-transformers==6.2.0",
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
]
NEVER = ("torchvision", "torchaudio", "torchcodec", "triton")  # CUDA builds; torchvision breaks transformers


def venv_dir(cache_dir: str | os.PathLike) -> Path:
    return Path(cache_dir) / "bench" / "flashrag-venv"


def python_of(cache_dir: str | os.PathLike) -> Path:
    return venv_dir(cache_dir) / "bin" / "python"


def _stamp() -> str:
    return hashlib.sha256("\n".join([FLASHRAG, *REQUIREMENTS]).encode()).hexdigest()[:16]


def ensure_flashrag(cache_dir: str | os.PathLike, log=print) -> Path:
    """The FlashRAG venv's python, creating and filling the venv on first use (a few minutes)."""
    root = venv_dir(cache_dir)
    stamp = root / ".dynrag-flashrag"
    py = python_of(cache_dir)
    if stamp.is_file() and stamp.read_text().strip() == _stamp() and py.is_file():
        return py
    log(f"installing FlashRAG ({FLASHRAG}) into {root} (once; a few minutes)")
    if not py.is_file():
        venv.EnvBuilder(with_pip=True).create(root)
    env = dict(os.environ)
    if Path("/opt/wheels").is_dir():
        env.setdefault("PIP_FIND_LINKS", "/opt/wheels")  # the local CPU torch wheel
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "-q"]
    subprocess.run(pip + REQUIREMENTS, check=True, env=env)
    subprocess.run(pip + ["--no-deps", FLASHRAG], check=True, env=env)
    probe = "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m)))" % (NEVER,)
    bad = subprocess.run([str(py), "-c", probe], check=True, capture_output=True, text=True).stdout.strip()
    if bad:
        raise RuntimeError(f"{bad} got installed into {root} (CUDA builds that break transformers); remove {root}")
    stamp.write_text(_stamp() + "\n")
    return py


if __name__ == "__main__":
    print(ensure_flashrag(sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache" / "dynrag"))
