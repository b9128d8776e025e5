"""Shared fixtures: the benchmark data kit (../shared/data, or $DYNRAG_DATA) and the model cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.config import default_cache_dir, default_data_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real benchmark files; tests that need them skip where the folder is absent."""
    d = Path(default_data_dir())
    if not d.is_dir():
        pytest.skip(f"benchmark data kit not found at {d} (set DYNRAG_DATA to its folder)")
    return d


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The shared model/package cache (prepared models are reused across tests and runs)."""
    return Path(default_cache_dir())
