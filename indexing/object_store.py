"""Object storage through fsspec (s3://, gs://, az://, memory://): what remote.py (index versions on a store)
and shard_storage.py (a build's shards) both use: telling a URI from a local path, and moving checked files."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from indexing.manifest import check_file


def is_remote(path: str | os.PathLike) -> bool:
    """True for an fsspec URI whose scheme is not the local file system (s3://, gs://, az://, memory://)."""
    text = str(path)
    if "://" not in text:
        return False
    return text.split("://", 1)[0].lower() not in ("file", "local")


def store(uri: str) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    return fs, root.rstrip("/")


def pull_files(fs: Any, wanted: Sequence[tuple[str, Path, dict | None]]) -> int:
    """Download the files `(remote path, local path, {sha256, bytes} or None)` not yet cached, in one
    batched `fs.get` (concurrent on object stores), each under a temporary name, checked, then renamed
    into place. Returns how many were pulled."""
    todo = [
        (r, loc, want, loc.with_name(f".{loc.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp"))
        for r, loc, want in wanted
        if not loc.is_file()
    ]
    try:
        for _, loc, _, _ in todo:
            loc.parent.mkdir(parents=True, exist_ok=True)
        if todo:
            fs.get([r for r, *_ in todo], [str(tmp) for *_, tmp in todo])
        for r, _loc, want, tmp in todo:
            if want is not None:
                check_file(tmp, want, name=r)
        for _, loc, _, tmp in todo:
            os.replace(tmp, loc)  # a concurrent worker's identical copy may land first: same bytes
    finally:
        for *_, tmp in todo:
            tmp.unlink(missing_ok=True)
    return len(todo)


def upload_dir(fs: Any, local_dir: Path, remote_dir: str, last: str) -> None:
    """Upload every file under `local_dir`, the file named `last` after all others."""
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    for p in sorted(files, key=lambda p: p.name == last):
        fs.put_file(str(p), f"{remote_dir}/{p.relative_to(local_dir).as_posix()}")
