"""Index directory layout, manifests, checksums and atomic publishing.

    INDEX_DIR/
      CURRENT                      "v000003": the published version (replaced with os.replace)
      versions/v000003/manifest.json   immutable once renamed into place
      versions/v000003/lucene/     the version's BM25 index: the union of its shards' Lucene segments
      versions/v000003/id_shards/  the version's id hash -> shard map (store.py; absent from versions
                                   published before it: their lookups search every shard)
      shards/<key>/                immutable, content-addressed (key = hash of passages + settings + IVF template)
        passages.arrow  ids.npy  faiss.index    what search reads (SEARCH_FILES; store.py, dense.py)
        vectors.npy  lucene/                    what builds read (vector reuse, the version's BM25 merge);
                                                no vectors.npy with index.keep_vectors=false
        checksums.json                          sha256 and size of every file, written last
      trained/<sha>.index          an IVF factory's trained quantizer + codebooks, shared by all shards (dense.py)
      staging/<key>/               shards being built (key without the template); a crash leaves them here,
                                   a rerun resumes; .template.json: the IVF template this build trained
      .build.lock                  one builder at a time (flock)

A shard directory appears under `shards/` only once complete (built in `staging/`, then renamed).
A version appears under `versions/` only once its manifest is fully written (written to a temporary
directory, then renamed), and `CURRENT` moves to it last. A reader resolves `CURRENT` once and from
then on reads only immutable files, so it keeps a consistent view of its version while later
versions are published. Old versions beyond `index.keep_versions` and the shards only they used are
removed after a publish, once superseded for RETIRED_GRACE_S (a day): a reader that opened one goes
on searching it meanwhile.

Checksums (sha256) are computed when a shard or version is written, checked when it is pulled from
a remote store (remote.py) and by `verify_version(full=True)` (`dynrag index verify`); opening an
index only checks that the files search reads are present at their recorded sizes (`index.verify`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from indexing.errors import CorruptIndexError, IndexingError
from platform_shims.faults import fault_point

log = logging.getLogger(__name__)

SEARCH_FILES = ("passages.arrow", "ids.npy", "faiss.index")


# ---- a manifest read from storage: its format, and every path it names inside the index root (issue 47,
# item 7). Whoever can write the bucket writes the manifest; readers join its shard keys, file names, bm25.path,
# id_shards.path and faiss_template.path onto the index root and the local cache, so each must be a relative path
# with no '..', '.', empty part, backslash or scheme, or the manifest is refused as a whole before anything is
# read or written.
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
    """Refuse a manifest that names a path outside its index root (see above)."""
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


HASH_BLOCK = 1 << 18  # one reused buffer: a fresh 4 MiB block per read showed as 4 MiB of a build's peak memory


def sha256_file(path: Path) -> str:
    h, buf = hashlib.sha256(), bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def shard_files(shard_dir: Path) -> list[Path]:
    return sorted(p for p in shard_dir.rglob("*") if p.is_file() and p.name != "checksums.json")


def write_checksums(shard_dir: Path, known: dict[str, dict] | None = None) -> dict[str, dict]:
    """Checksum every file of `shard_dir` into its checksums.json; `known`: entries of files already
    checksummed (hard links to a published version's files), taken as they are."""
    known = known or {}
    sums = {}
    for p in shard_files(shard_dir):
        name = str(p.relative_to(shard_dir))
        sums[name] = known.get(name) or {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    atomic_write(shard_dir / "checksums.json", checksums_text(sums))
    return sums


class ShardFiles(Mapping[str, dict]):
    """A shard's `files` as its `checksums.json`, read on each use: a build's manifest holds one per shard,
    and parsed they were megabytes of dicts held together (3.6 MiB for 643 shards) until it was written;
    `publish` writes each as it reads it, with the same bytes as the dict it stands for."""

    def __init__(self, shard_dir: Path):
        self.path = Path(shard_dir) / "checksums.json"

    def load(self) -> dict[str, dict]:
        return json.loads(self.path.read_text(encoding="utf-8"))

    def __getitem__(self, name: str) -> dict:
        return self.load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.load())

    def __len__(self) -> int:
        return len(self.load())

    def items(self) -> ItemsView[str, dict]:  # one read, not one per key (Mapping's view calls __getitem__)
        return self.load().items()


def _manifest_json(obj: object) -> dict:
    if isinstance(obj, ShardFiles):
        return obj.load()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def checksums_text(sums: dict[str, dict]) -> str:
    """A `checksums.json` (what a manifest lists as a shard's `files`)."""
    return json.dumps(sums, indent=1, sort_keys=True)


def check_file(path: Path, want: dict, *, full: bool = True, name: str | None = None) -> None:
    """Raise CorruptIndexError unless `path` is present with the `bytes` (and, when `full`, the `sha256`)
    of `want`; messages name the file as `name` (default: `path`)."""
    name = name or str(path)
    if not path.is_file():
        raise CorruptIndexError(f"index file {name} is missing")
    size = path.stat().st_size
    if size != want["bytes"]:
        raise CorruptIndexError(f"index file {name} is corrupt: {size} bytes, manifest says {want['bytes']}")
    if full and sha256_file(path) != want["sha256"]:
        raise CorruptIndexError(f"index file {name} is corrupt: its sha256 does not match the manifest")


def verify_shard(shard_dir: Path, expected: dict[str, dict], *, full: bool = True) -> None:
    """Raise CorruptIndexError naming the first file that is missing, extra-sized or changed."""
    for rel, want in sorted(expected.items()):
        check_file(shard_dir / rel, want, full=full)


def atomic_write(path: Path, text: str | Iterable[str]) -> None:
    """Write `text` (a string, or its pieces: a large JSON document is never one string) to `path` atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines([text] if isinstance(text, str) else text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def version_name(n: int) -> str:
    return f"v{n:06d}"


def current_version(root: Path) -> str | None:
    cur = root / "CURRENT"
    if not cur.is_file():
        return None
    return cur.read_text(encoding="utf-8").strip() or None


def read_manifest(root: Path, version: str | None = None) -> dict:
    """The manifest of the published version of the local index `root` (or of `version`, or of the version
    `root` is pinned to: `idx@v000003`, pinning.py)."""
    from indexing.versions.pinning import resolve_version

    base, version = resolve_version(root, version)
    return read_version_manifest(Path(base), version)


def read_version_manifest(root: Path, version: str | None) -> dict:
    """`read_manifest` of an unpinned `root`."""
    if version is None:
        if not root.is_dir():
            raise IndexingError(f"no index at {root}: the directory does not exist")
        version = current_version(root)
        if version is None:
            raise IndexingError(f"no published index at {root} (no CURRENT file); build one with `dynrag index build`")
    path = (
        root
        / "versions"
        / safe_relative(version, "the version name in CURRENT", str(root), single=True)
        / "manifest.json"
    )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexingError(f"{root}/CURRENT names {version}, but {path} is missing") from None
    except json.JSONDecodeError as exc:
        raise CorruptIndexError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    check_format(manifest, str(root))
    return manifest


def version_files(manifest: dict, search_only: bool = False) -> list[tuple[str, dict[str, dict]]]:
    """(directory relative to the index root, {file: {sha256, bytes}}) of every directory of a version;
    with `search_only`, just the files a search reads."""
    out = []
    for s in manifest["shards"]:
        files = s["files"] if not search_only else {k: v for k, v in s["files"].items() if k in SEARCH_FILES}
        out.append((f"shards/{s['key']}", files))
    for part in ("bm25", "id_shards"):  # the version's own folders (every version has a BM25 index)
        if manifest.get(part):
            folder = f"versions/{version_name(manifest['version'])}/{manifest[part]['path']}"
            out.append((folder, manifest[part]["files"]))
    if manifest.get("faiss_template"):  # an IVF quantizer shared by all shards (dense.py)
        t = manifest["faiss_template"]
        out.append((str(Path(t["path"]).parent), {Path(t["path"]).name: {"sha256": t["sha256"], "bytes": t["bytes"]}}))
    return out


def verify_version(root: Path, manifest: dict, *, full: bool, search_only: bool = False) -> tuple[int, int]:
    """Check a version's files (sizes; sha256 too when `full`); returns (files, bytes) checked."""
    files = size = 0
    for rel, expected in version_files(manifest, search_only):
        verify_shard(Path(root) / rel, expected, full=full)
        files, size = files + len(expected), size + sum(v["bytes"] for v in expected.values())
    return files, size


def publish(root: Path, manifest: dict, extra: dict[str, Path] | None = None) -> str:
    """Write versions/<vN>/manifest.json (and move `extra` {name: dir} beside it) via a temporary
    directory, then point CURRENT at it."""
    name = version_name(manifest["version"])
    versions = root / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    tmp = versions / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for sub, path in (extra or {}).items():
        os.rename(path, tmp / sub)
    # written piece by piece: a manifest lists every file of every shard (megabytes as one string)
    atomic_write(tmp / "manifest.json", json.JSONEncoder(indent=1, default=_manifest_json).iterencode(manifest))
    fault_point("publish.manifest_written")
    final = versions / name
    if final.exists():  # an earlier attempt published the directory but crashed before CURRENT
        shutil.rmtree(final)
    os.rename(tmp, final)
    fault_point("publish.before_current")
    atomic_write(root / "CURRENT", name + "\n")
    _fsync_dir(root)
    fault_point("publish.after_current")
    log.info("published %s at %s", name, root)
    return name


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


RETIRED_GRACE_S = 24 * 3600  # how long a superseded version stays for the readers that opened it


def versions_to_keep(
    versions: list[str], current: str | None, keep_versions: int, published_at: Callable[[str], float]
) -> set[str]:
    """CURRENT, the newest `keep_versions` versions, and each version whose successor was published less
    than RETIRED_GRACE_S ago (a reader may still hold it); `versions` sorted, oldest first."""
    now = time.time()
    keep = set(versions[-keep_versions:]) | ({current} if current else set())
    return keep | {v for v, nxt in zip(versions, versions[1:]) if now - published_at(nxt) < RETIRED_GRACE_S}


SHARED_FOLDERS = ("shards", "trained")  # what versions share, by name: removed once no kept version uses it


def used_by(manifests: Iterable[dict]) -> dict[str, set[str]]:
    """The entries of SHARED_FOLDERS that these (kept) versions use: {"shards": shard keys, "trained":
    template file names}; everything else in those folders is garbage (`collect_garbage`, remote.py)."""
    used: dict[str, set[str]] = {folder: set() for folder in SHARED_FOLDERS}
    for m in manifests:
        used["shards"].update(s["key"] for s in m["shards"])
        if m.get("faiss_template"):
            folder, name = m["faiss_template"]["path"].split("/", 1)
            used[folder].add(name)
    return used


def collect_garbage(root: Path, keep_versions: int, published: dict | None = None) -> None:
    """Drop the versions `versions_to_keep` does not keep, and shards and templates no kept version uses.
    `published`: the manifest a build just wrote, used as is rather than read again (a manifest lists every
    file of every shard: megabytes of dicts); the other kept ones are read one at a time."""
    versions = sorted(p.name for p in (root / "versions").iterdir() if p.is_dir() and p.name.startswith("v"))
    keep = versions_to_keep(
        versions,
        current_version(root),
        keep_versions,
        lambda v: (root / "versions" / v / "manifest.json").stat().st_mtime,
    )
    known = {version_name(published["version"]): published} if published else {}
    used = used_by(known.get(v) or read_manifest(root, v) for v in versions if v in keep)
    for v in versions:
        if v not in keep:
            shutil.rmtree(root / "versions" / v, ignore_errors=True)
            log.info("removed old version %s", v)
    for folder in SHARED_FOLDERS:
        for entry in (root / folder).iterdir() if (root / folder).is_dir() else ():
            if entry.name not in used[folder]:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                log.debug("removed unused %s/%s", folder, entry.name)


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    """One builder per index directory; a second one fails at once rather than interleaving. The lock file
    goes when the build ends, and so does the folder if this build created it and leaves it empty."""
    created = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    path = root / ".build.lock"
    while True:
        f = open(path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise IndexingError(f"another build is running on {root} (lock {path})") from None
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()  # locked a file its builder removed on the way out: lock the one there now
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        f.close()
        if created:
            with contextlib.suppress(OSError):
                root.rmdir()
