"""The cluster build (`runtime.mode=ray`): the build's unit tasks (unit_work.py) as Ray tasks.

The driver (build.py) plans the units, runs the rounds and publishes; here is only who runs a task: a Ray
task of one CPU, spread over the cluster's nodes (scheduling strategy SPREAD); the tasks that embed (train
and build) also ask for `ray.embed_actor_num_gpus` GPUs (1 by default where the driver sees CUDA). A task's
return values stay in Ray's object store on its node: a dedup task takes the scans' id hashes from there,
and a build task its drop lists, so the driver holds a few hundred bytes per shard and object references.
It keeps the build lock for the whole build and publishes itself, so two builders never interleave
versions. The tasks record their node (`tasks_by_node` in the report and the manifest's build record).

Resume: a task that fails (or whose worker dies; Ray retries it) leaves the shards it finished under
`shards/` and staged passages and vectors under `staging/`; the retry or a rerun reuses them. The driver
waits for every task before it raises the first error, so no task writes after the build lock is released.
The index directory must be the same path on every node (one machine, or a shared file system); an fsspec
index (s3://, ...) is written by the tasks through `ShardStorage`.

No wait without a limit (issue 78): the driver waits for its tasks for as long as they make progress (a task
ends, or a running one ticks: executors.tick, counted by a small `_Beats` actor); none for `index.build_stall_s`
(a task never placed, a hung worker) ends the build with one line naming the tasks awaited, and cancels them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from indexing.builder import executors
from indexing.builder.executors import Executor, UnitProgress, stalled, task_name
from indexing.builder.local import Builder, build_local_index
from indexing.builder.shard_storage import ShardStorage
from indexing.errors import IndexingError
from indexing.shards.embed import HASH_ENCODER, EncoderSpec

if TYPE_CHECKING:
    from indexing.settings import IndexSettings

log = logging.getLogger(__name__)

TICK_EVERY_S = 1.0  # a Ray task sends at most one tick a second (its steps may be far shorter)


class _Beats:
    """The build's tick count (a Ray actor of no CPU): running tasks add to it, the driver reads it."""

    def __init__(self) -> None:
        self.count = 0

    def tick(self) -> None:
        self.count += 1

    def seen(self) -> int:
        return self.count


def _ticking(beats: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """A build task on a Ray worker: `fn(*args)`, its executors.tick() sent to `beats` (fire and forget)."""
    last = [0.0]

    def send() -> None:
        if time.monotonic() - last[0] >= TICK_EVERY_S:
            last[0] = time.monotonic()
            beats.tick.remote()

    executors._tick = send
    try:
        return fn(*args)
    finally:
        executors._tick = None


def build_cluster_index(sources: list[str], index_dir: str | os.PathLike, cfg: IndexSettings, **options: Any) -> dict:
    """`build_local_index` with the unit tasks on Ray workers."""
    return build_local_index(sources, index_dir, cfg, builder=_ClusterBuilder, **options)


def embed_actor_gpus(cfg: IndexSettings, driver_device: str) -> float:
    """GPUs per build task that embeds: `cfg.ray.embed_actor_num_gpus`, else 1 when the driver itself sees CUDA."""
    from platform_shims.raytools import gpus_or_fallback

    want = cfg.ray.embed_actor_num_gpus
    if want is None:
        want = 1.0 if driver_device.startswith("cuda") else 0.0
    return gpus_or_fallback(want, cfg.ray.gpu_fallback, "each build task that embeds")


class RayExecutor:
    """Unit tasks as Ray tasks (executors.py's interface)."""

    records_nodes = True

    def __init__(self, cfg: IndexSettings, dense: bool):
        import ray

        from indexing.shards.embed import resolve_device
        from platform_shims.raytools import init_ray

        init_ray(cfg.ray.address, cfg.ray.num_cpus)
        spec = EncoderSpec.from_config(cfg, build=True)
        embeds = dense and spec.model_name != HASH_ENCODER
        gpus = embed_actor_gpus(cfg, resolve_device(spec.device)) if embeds else 0
        self.options = {
            False: ray.remote(num_cpus=1, scheduling_strategy="SPREAD"),
            True: ray.remote(num_cpus=1, num_gpus=gpus, scheduling_strategy="SPREAD"),
        }
        self.remotes: dict[bool, Any] = {}
        self.stall_s = cfg.index.build_stall_s
        self.where = f"on Ray ({cfg.ray.address or 'a local instance'})"
        self.beats = ray.remote(num_cpus=0)(_Beats).remote()
        self.names: dict[Any, str] = {}  # each ref's task, for the stall line

    def submit(self, fn: Callable[..., Any], *args: Any, returns: int = 1, embeds: bool = False) -> list[Any]:
        if embeds not in self.remotes:
            self.remotes[embeds] = self.options[embeds](_ticking)
        name = task_name(fn, args)
        refs = self.remotes[embeds].options(num_returns=returns, name=name).remote(self.beats, fn, *args)
        refs = list(refs) if returns > 1 else [refs]
        self.names.update((r, name) for r in refs)
        return refs

    def _ticks(self) -> int:
        """The tasks' ticks so far; -1 where the actor does not answer in time (no progress seen)."""
        import ray

        try:
            return int(ray.get(self.beats.seen.remote(), timeout=min(10.0, self.stall_s)))
        except Exception:  # noqa: BLE001 - the count is only a sign of progress
            return -1

    def _stalled(self, pending: list[Any], waited_s: float) -> None:
        """No progress for stall_s: the pending tasks are cancelled (none writes after the build lock is
        released) and the build ends with one line."""
        import ray

        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - a task already ended, or a return value of a cancelled one
                pass
        names = {self.names.get(r, "a task") for r in pending}
        raise stalled(names, self.where, waited_s, self.stall_s)

    def gather(self, handles: Sequence[Any], stage: str | None = None) -> list[Any]:
        """Every task's result, in order; after all have ended, the first failure is raised (its own
        IndexingError where a task raised one, so the message is the one-line error of an in-process build)."""
        import ray
        from ray.exceptions import RayTaskError

        results, error, pending = {}, None, list(handles)
        progress = UnitProgress(stage, len(handles)) if stage else None
        last, since = self._ticks(), time.monotonic()
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=executors.LOOK_S)
            if not done:
                now, seen = time.monotonic(), self._ticks()
                if seen != last and seen != -1:
                    last, since = seen, now
                elif now - since > self.stall_s:
                    self._stalled(pending, now - since)
                continue
            since = time.monotonic()
            try:
                results[done[0]] = ray.get(done[0], timeout=self.stall_s)  # ready and local (ray.wait's fetch_local)
            except Exception as exc:  # noqa: BLE001 (re-raised below, once every task has ended)
                error = error or exc
            if progress:
                progress.done()
        if progress:
            progress.close()
        if error is not None:
            cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
            if isinstance(cause, IndexingError):
                raise cause from None
            raise error
        return [results[r] for r in handles]

    def close(self) -> None:
        """Ray stays up for the process (init_ray joins once)."""


class _ClusterBuilder(Builder):
    """local.Builder whose unit tasks run on Ray."""

    def _executor(self, units: int) -> Executor:
        return RayExecutor(self.cfg, self.dense)


def build_remote_cluster_index(
    sources: list[str],
    uri: str,
    cfg: IndexSettings,
    *,
    fmt: str = "auto",
    fields: dict | None = None,
    on_bad_line: str = "error",
    vectors: str | os.PathLike | None = None,
    normalize_vectors: bool = False,
) -> dict:
    """The cluster build of an fsspec index (s3://, gs://, ...): see `_RemoteClusterBuilder`."""
    import shutil
    import tempfile

    from indexing.versions.remote import cache_root

    cache = cache_root(uri, cfg)
    scratch = cache.with_name("builds")
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=scratch))
    try:
        given = (vectors, normalize_vectors) if vectors is not None else None
        builder = _RemoteClusterBuilder(sources, work, cfg, fmt, fields, on_bad_line, given)
        builder.uri = uri
        builder.store = ShardStorage(uri, str(cache.with_name(cache.name + ".build")))  # the same path on each node
        report = builder.run()
        report.update(index_dir=uri, shards_uploaded=report["shards_built"])
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _RemoteClusterBuilder(_ClusterBuilder):
    """The tasks upload each shard straight to the store (ShardStorage). The driver works in a local folder: it
    pulls the shards' Lucene indexes (postings and docids; never passages nor vectors) and `ids.npy` (8 bytes a
    passage) for the version's BM25 merge and id map, publishes there and uploads the version (remote.upload_version: manifest last, then CURRENT).
    Object stores have no lock: one builder per remote index at a time, as remote.py says."""

    uri: str

    def _previous(self) -> dict | None:
        from indexing.versions.remote import filesystem_of, remote_manifest

        fs, base = filesystem_of(self.uri)
        return remote_manifest(self.uri) if fs.exists(f"{base}/CURRENT") else None

    def _known_template(self, prev: dict | None) -> dict | None:
        t = (prev or {}).get("faiss_template")
        return t if t and t.get("settings_hash") == self.settings_hash else None  # tasks check it when they pull it

    def _publish(self, manifest: dict, metas: list[dict]) -> None:
        from indexing.versions.remote import collect_remote_garbage, filesystem_of, pull_files, upload_version

        fs, base = filesystem_of(self.uri)
        t = time.perf_counter()
        pull_files(
            fs,
            [
                (f"{base}/shards/{m['key']}/{rel}", self.shards_dir / m["key"] / rel, want)
                for m in metas
                for rel, want in m["files"].items()
                if rel.startswith("lucene/") or rel == "ids.npy"  # the BM25 merge's and the id map's inputs
            ],
        )
        self.timings["lucene_pull_s"] = time.perf_counter() - t
        self._publish_here(manifest, metas)
        upload_version(self.root, self.uri, manifest)
        collect_remote_garbage(self.uri, self.cfg.index.keep_versions)
