"""A manifest read from storage is one this dynrag reads (`check_format`), and every path it names stays
inside its index root (issue 47, item 7).

A manifest is data from the index's storage: whoever can write the bucket writes it. Readers join its
shard keys, file names, `bm25.path`, `id_shards.path` and `faiss_template.path` onto the index root and
onto the local cache, and pull, read or delete there; so each must be a relative path with no `..`,
no `.`, no empty part, no backslash and no scheme, or the manifest is refused as a whole, before
anything is read or written.
"""

from __future__ import annotations

from typing import Any

from indexing.errors import IndexingError

FORMAT_VERSION = 2  # 2: passages.arrow + ids.npy (was passages.parquet)


def safe_relative(value: Any, what: str, where: str, *, single: bool = False) -> str:
    """`value` as a relative POSIX path inside the index root (one name when `single`), else IndexingError."""
    ok = isinstance(value, str) and value and "\\" not in value and "://" not in value and "\x00" not in value
    parts = value.split("/") if ok else []
    if not ok or value.startswith("/") or any(p in ("", ".", "..") for p in parts) or (single and len(parts) > 1):
        raise IndexingError(
            f"index {where}: {what} {value!r} is not a relative path inside the index "
            "(absolute paths, '..' and other escapes are refused)"
        )
    return value


def check_manifest_paths(manifest: dict, where: str) -> None:
    """Refuse a manifest that names a path outside its index root (see the module doc)."""
    if not isinstance(manifest.get("version"), int) or isinstance(manifest.get("version"), bool):
        raise IndexingError(f"index {where}: its manifest's version {manifest.get('version')!r} is not a number")
    for shard in manifest.get("shards") or []:
        key = safe_relative(shard.get("key"), "the manifest's shard key", where, single=True)
        for name in shard.get("files") or {}:
            safe_relative(name, f"the manifest's file of shard {key}", where)
    for part in ("bm25", "id_shards"):
        if manifest.get(part):
            safe_relative(manifest[part].get("path"), f"the manifest's {part}.path", where)
            for name in manifest[part].get("files") or {}:
                safe_relative(name, f"the manifest's file of {part}", where)
    template = manifest.get("faiss_template")
    if template:
        path = safe_relative(template.get("path"), "the manifest's faiss_template.path", where)
        if not path.startswith("trained/") or path.count("/") != 1:
            raise IndexingError(
                f"index {where}: its manifest's faiss_template.path {path!r} is not a file under trained/"
            )


def check_format(manifest: dict, where: str) -> None:
    """Refuse a manifest of another format, or one naming a path outside the index root."""
    found = manifest.get("format")
    if found != FORMAT_VERSION:
        raise IndexingError(
            f"index {where} has format {found!r}, this dynrag reads format {FORMAT_VERSION}: rebuild it "
            "into a new directory (`dynrag index build SOURCES --index NEW_DIR`)"
        )
    check_manifest_paths(manifest, where)
