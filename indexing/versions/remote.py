"""Index directories on object storage: `s3://`, `gs://`, `az://` (any fsspec URI with a scheme).

The remote layout is the local one (manifest.py): `CURRENT`, `versions/vN/`, `shards/<key>/`.

Build (build.py's `build_remote_index`): the published version is pulled into the local cache (below), a local
working directory is seeded from it (hard links), so the build stays incremental, and `build_index`
runs there. A newly published version is then uploaded in an order that keeps readers consistent:
each new shard (content-addressed; shards already on the store are skipped) with its `checksums.json`
last, then the version's BM25 files with `manifest.json` last, then `CURRENT`, last of all. Old
versions beyond `index.keep_versions` and shards only they used are then removed from the store,
once superseded for a day (manifest.RETIRED_GRACE_S).
Object stores have no lock: run one builder per remote index at a time.

Open (`pull_searchable`, then `open_local_index` on the cache): `CURRENT` and the manifest are read from the
store; the files search reads (each shard's `SEARCH_FILES` and the version's BM25 index; not `vectors.npy` nor
the shards' own Lucene indexes) are pulled once into `<index.remote_cache_dir>/<hash of the URI>/` (same
layout) in one batched `get`, each checked against the manifest's sha256 and then renamed into place (a cached
file is a verified one), under a file lock of the cache (`node_lock`: the processes of one node that open the
index at once download each file once), and reused by every later open of that version on this machine.
`uri@v000003` (pinning.py) opens that version, whatever CURRENT names. Shards are content-addressed, so a new
version downloads only its new shards. A build pulls every file of the published version (each shard's
`checksums.json`, the marker of a complete shard, is written from the manifest, which lists the same)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexing.errors import IndexingError
from indexing.versions.manifest import (
    SHARED_FOLDERS,
    atomic_write,
    check_file,
    check_format,
    check_manifest_paths,
    checksums_text,
    safe_relative,
    used_by,
    version_files,
    version_name,
    versions_to_keep,
)
from indexing.versions.pinning import resolve_version, split_pin

if TYPE_CHECKING:
    from indexing.settings import IndexSettings

log = logging.getLogger(__name__)


def is_remote(path: str | os.PathLike) -> bool:
    """True for an fsspec URI whose scheme is not the local file system (s3://, gs://, az://, memory://)."""
    text = str(path)
    if "://" not in text:
        return False
    return text.split("://", 1)[0].lower() not in ("file", "local")


def filesystem_of(uri: str) -> tuple[Any, str]:
    """The fsspec file system of `uri` and the path of `uri` in it, without a trailing slash."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    return fs, root.rstrip("/")


def current_name(spec: str) -> str | None:
    """What CURRENT of the index `spec` (a local folder or a URI) names now, None where there is none."""
    if not is_remote(spec):
        from indexing.versions.manifest import current_version

        return current_version(Path(spec))
    fs, root = filesystem_of(spec)
    try:
        return fs.cat_file(f"{root}/CURRENT").decode().strip() or None
    except FileNotFoundError:
        return None


def pin_index(spec: str | os.PathLike) -> str:
    """`spec` with the version its CURRENT names now (one read of CURRENT), e.g. "s3://b/idx@v000003"; a
    pinned spec is returned as it is."""
    base, pinned = split_pin(spec)
    if pinned:
        return str(spec)
    name = current_name(base)
    if not name:
        raise IndexingError(f"no published index at {base} (no CURRENT); build one with `dynrag index build`")
    m = re.fullmatch(r"v(\d+)", name)
    if m is None:
        raise IndexingError(f"index {base}: CURRENT names {name!r}, which is not a version")
    return f"{base}@v{int(m[1]):06d}"


def remote_manifest(uri: str, version: str | None = None) -> dict:
    """The manifest of the published version of the remote index at `uri` (or of a named version, or of the
    version `uri` is pinned to: `uri@v000003`)."""
    return _read_manifest(*resolve_version(uri, version))


def _read_manifest(uri: str, version: str | None) -> dict:
    """`remote_manifest` of an unpinned `uri`."""
    fs, root = filesystem_of(uri)
    if version is None:
        try:
            version = fs.cat_file(f"{root}/CURRENT").decode().strip()
        except FileNotFoundError:
            raise IndexingError(
                f"no published index at {uri} (no CURRENT object); build one with `dynrag index build`"
            ) from None
    safe_relative(version, "the version name in CURRENT", uri, single=True)
    try:
        manifest = json.loads(fs.cat_file(f"{root}/versions/{version}/manifest.json"))
    except FileNotFoundError:
        raise IndexingError(f"{uri}: version {version} has no manifest.json") from None
    check_manifest_paths(manifest, uri)  # also for a manifest of another format (garbage collection reads those)
    return manifest


def cache_root(uri: str, cfg: IndexSettings) -> Path:
    """The local cache of the remote index `uri` (one for all its versions, pinned or not)."""
    return _cache_dir(split_pin(uri)[0], cfg)


def _cache_dir(uri: str, cfg: IndexSettings) -> Path:
    """`cache_root` of an unpinned `uri`."""
    key = hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    base = cfg.index.remote_cache_dir or Path(cfg.cache_dir) / "index-cache"
    return Path(base).expanduser() / key


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


@contextlib.contextmanager
def node_lock(local: Path) -> Iterator[None]:
    """Hold the pull lock of one index's local cache (flock on `<cache>/.pull.lock`): processes on one node
    that open the same index pull its files one after another, so each file is downloaded once and the
    later ones find it cached. Released when the holder ends, also when it is killed."""
    local.mkdir(parents=True, exist_ok=True)
    with open(local / ".pull.lock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process on this node to finish pulling into %s", local)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pull_version(
    uri: str, cfg: IndexSettings, version: str | None = None, *, search_only: bool = False
) -> tuple[Path, dict]:
    """Make the version's files (with `search_only`, those search reads) present in the local cache;
    returns (cache root, manifest)."""
    uri, version = resolve_version(uri, version)
    local, manifest = _pull(uri, cfg, version, search_only)
    if not search_only:  # a full copy (a build's seed, verify): each shard's marker of a complete shard
        for shard in manifest["shards"]:
            marker = local / "shards" / shard["key"] / "checksums.json"
            if not marker.is_file():
                atomic_write(marker, checksums_text(shard["files"]))
    return local, manifest


def _pull(uri: str, cfg: IndexSettings, version: str | None, search_only: bool) -> tuple[Path, dict]:
    """`pull_version` of an unpinned `uri`."""
    fs, root = filesystem_of(uri)
    manifest = _read_manifest(uri, version)
    check_format(manifest, uri)
    files, name = version_files(manifest, search_only), version_name(manifest["version"])
    local = _cache_dir(uri, cfg)
    vdir = local / "versions" / name
    with node_lock(local):  # one download per node: the others wait, then find the files cached
        if (vdir / "manifest.json").is_file() and json.loads(
            (vdir / "manifest.json").read_text(encoding="utf-8")
        ) != manifest:
            # the store was rebuilt from scratch since: same version number, other content
            stale = vdir.with_name(f".{name}.{uuid.uuid4().hex[:6]}.stale")
            os.rename(vdir, stale)
            shutil.rmtree(stale, ignore_errors=True)
        t = time.perf_counter()
        wanted = [(f"{root}/{rel}/{f}", local / rel / f, want) for rel, folder in files for f, want in folder.items()]
        pulled = pull_files(fs, wanted)
        pull_files(
            fs, [(f"{root}/versions/{name}/manifest.json", vdir / "manifest.json", None)]
        )  # last: marks the version
        (local / "SOURCE").write_text(uri + "\n", encoding="utf-8")
        log.info(
            "index %s %s: %d of %d files pulled into %s (%.1fs); the rest were cached",
            uri,
            name,
            pulled,
            len(wanted),
            local,
            time.perf_counter() - t,
        )
    return local, manifest


def pull_searchable(uri: str, cfg: IndexSettings, version: str | None = None) -> tuple[Path, str]:
    """What `open_index` opens for a remote index (`uri` unpinned: its version given apart): the version's
    search files pulled into the local cache once; returns (cache root, version name)."""
    local, manifest = _pull(uri, cfg, version, search_only=True)
    return local, version_name(manifest["version"])


def index_manifest(spec: str | os.PathLike, version: str | None = None, check_sizes: bool = False) -> dict:
    """The manifest `open_index(spec)` would open (a local folder or a URI, pinned or not), read from the
    index's storage alone: nothing is pulled. `check_sizes`: a local folder's files that search reads are
    checked at their recorded sizes (no byte read), as opening it checks them."""
    from indexing.versions.manifest import read_manifest, verify_version

    base, version = resolve_version(spec, version)
    if is_remote(base):
        manifest = remote_manifest(base, version)
        check_format(manifest, base)
        return manifest
    manifest = read_manifest(Path(base), version)
    if check_sizes:
        verify_version(Path(base), manifest, full=False, search_only=True)
    return manifest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def seed_build(uri: str, cfg: IndexSettings, work: Path) -> dict | None:
    """Copy the remote's published version into `work` (from the cache) so the build is incremental."""
    fs, root = filesystem_of(uri)
    if not fs.exists(f"{root}/CURRENT"):
        return None
    local, manifest = pull_version(uri, cfg)
    name = version_name(manifest["version"])
    for s in manifest["shards"]:
        if not (work / "shards" / s["key"]).exists():
            shutil.copytree(local / "shards" / s["key"], work / "shards" / s["key"], copy_function=_link_or_copy)
    shutil.copytree(local / "versions" / name, work / "versions" / name, copy_function=_link_or_copy)
    if manifest.get("faiss_template"):
        (work / "trained").mkdir(exist_ok=True)
        _link_or_copy(str(local / manifest["faiss_template"]["path"]), str(work / manifest["faiss_template"]["path"]))
    (work / "CURRENT").write_text(name + "\n", encoding="utf-8")
    return manifest


def upload_dir(fs: Any, local_dir: Path, remote_dir: str, last: str) -> None:
    """Upload every file under `local_dir`, the file named `last` after all others."""
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    for p in sorted(files, key=lambda p: p.name == last):
        fs.put_file(str(p), f"{remote_dir}/{p.relative_to(local_dir).as_posix()}")


def upload_version(work: Path, uri: str, manifest: dict) -> int:
    """Upload a version published in `work`: new shards, then the version, then CURRENT. Returns the
    number of shards uploaded."""
    fs, root = filesystem_of(uri)
    uploaded = 0
    for s in manifest["shards"]:
        remote = f"{root}/shards/{s['key']}"
        if fs.exists(f"{remote}/checksums.json"):
            continue  # content-addressed: an identical shard is already there
        upload_dir(fs, work / "shards" / s["key"], remote, "checksums.json")
        uploaded += 1
    template = (manifest.get("faiss_template") or {}).get("path")
    if template and not fs.exists(f"{root}/{template}"):
        fs.put_file(str(work / template), f"{root}/{template}")
    name = version_name(manifest["version"])
    upload_dir(fs, work / "versions" / name, f"{root}/versions/{name}", "manifest.json")
    fs.pipe_file(f"{root}/CURRENT", (name + "\n").encode())
    log.info("uploaded %s to %s (%d new shards of %d)", name, uri, uploaded, len(manifest["shards"]))
    return uploaded


def collect_remote_garbage(uri: str, keep_versions: int) -> None:
    """Drop the remote versions `versions_to_keep` does not keep, and shards and templates no kept
    version uses (manifest.used_by, as `collect_garbage` does locally)."""
    fs, root = filesystem_of(uri)
    current = fs.cat_file(f"{root}/CURRENT").decode().strip()
    versions = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(f"{root}/versions", detail=False))
    versions = [v for v in versions if v.startswith("v")]
    keep = versions_to_keep(
        versions, current, keep_versions, lambda v: fs.modified(f"{root}/versions/{v}/manifest.json").timestamp()
    )
    used = used_by([remote_manifest(uri, v) for v in versions if v in keep])
    for v in versions:
        if v not in keep:
            fs.rm(f"{root}/versions/{v}", recursive=True)
            log.info("removed old version %s from %s", v, uri)
    for folder in SHARED_FOLDERS:
        for entry in fs.ls(f"{root}/{folder}", detail=False) if fs.exists(f"{root}/{folder}") else ():
            if entry.rstrip("/").rsplit("/", 1)[-1] not in used[folder]:
                fs.rm(entry, recursive=True)
