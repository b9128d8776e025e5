"""The cluster build (indexing/builder/cluster.py) on a local multi-node Ray cluster: a head without CPUs (the
driver's node) and two workers with one CPU each, all on this machine (`ray.cluster_utils.Cluster`).

The corpus is four JSONL files of real HotpotQA paragraphs (ids h0, h1, ...; the last file repeats two
passages of the first, so duplicates cross work units), or one such file cut into several units. The test encoder (`embedding.model=hash`) keeps
embedding cheap; everything else (readers, FAISS, Lucene, checksums, publishing) is the real build.
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from indexing import build_index, open_index
from indexing.errors import IndexingError
from indexing.versions.manifest import read_manifest, verify_version
from pipeline.config import load_config
from platform_shims.raytools import shutdown_ray

pytestmark = [pytest.mark.own_process, pytest.mark.cluster]  # starts Ray in-process (scripts/run_tests.py)

ray = pytest.importorskip("ray")

# loopback only, no token auth, no worker killing by Ray's memory monitor (it counts the shared machine's memory)
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_memory_monitor_refresh_ms": "0"}
PAUSE_POINT = "shard.before_rename"  # armed only by test_killed_worker_is_retried (its marker file is removed)
SHARD = 8
QUERIES = ["football club in Manchester", "a railway station", "American politician", "river", "album by a band"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    pause_dir = tmp_path_factory.mktemp("pause")
    (pause_dir / PAUSE_POINT).write_text("")  # disarmed: fault_point pauses only while this file is absent
    env = {**RAY_ENV, "DYNRAG_PAUSE_AT": PAUSE_POINT, "DYNRAG_PAUSE_DIR": str(pause_dir)}
    server = None
    try:  # S3 on loopback for the remote index test; the workers need its address in their environment
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        host, port = server.get_host_and_port()
        env.update(
            AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=f"http://{host}:{port}"
        )
    except ImportError:
        pass
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)  # before the nodes start: their workers inherit it
        temp = tempfile.mkdtemp(prefix="dynrag-rc-", dir="/tmp")  # short: Ray's socket paths live below it
        # Cluster writes its address to <system temp>/ray/ray_current_cluster without making that folder,
        # which a fresh machine (CI) does not have until some Ray session made it
        Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray").mkdir(exist_ok=True)
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": temp, "include_dashboard": False})
        workers = [c.add_node(num_cpus=1, resources={f"node_{i}": 1}) for i in (1, 2)]
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        try:
            yield {
                "address": c.address,
                "workers": {w.node_id for w in workers},
                "pause_dir": pause_dir,
                "node_2": workers[1].node_id,
                "s3": server is not None,
            }
        finally:
            shutdown_ray()
            c.shutdown()
            if server is not None:
                server.stop()


@pytest.fixture(scope="module")
def rows(data_dir):
    out, seen = [], set()
    for line in (data_dir / "hotpotqa/dev_400.jsonl").read_text(encoding="utf-8").splitlines()[:10]:
        for c in json.loads(line)["contexts"]:
            if (c["title"], c["paragraph_text"]) not in seen:
                seen.add((c["title"], c["paragraph_text"]))
                out.append({"id": f"h{len(out)}", "title": c["title"], "text": c["paragraph_text"]})
    return out


def write_corpus(folder: Path, rows: list[dict]) -> list[str]:
    """Four files; the last one also repeats the first file's first two passages."""
    folder.mkdir(parents=True, exist_ok=True)
    q = len(rows) // 4
    parts = [rows[:q], rows[q : 2 * q], rows[2 * q : 3 * q], rows[3 * q :] + rows[:2]]
    paths = []
    for i, part in enumerate(parts):
        p = folder / f"part{i}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
        paths.append(str(p))
    return paths


def settings(cluster=None, **overrides):
    o = {"runtime.mode": "local", "embedding.model": "hash", "index.shard_size": SHARD, **overrides}
    if cluster:
        o.update({"runtime.mode": "ray", "runtime.ray_address": cluster["address"]})
    return load_config(overrides=[f"{k}={v}" for k, v in o.items()]).index_settings()


def hits(root, cfg, retriever):
    with open_index(root, cfg) as idx:
        return [[(h.id, round(h.score, 4)) for h in hs] for hs in idx.search(QUERIES, k=5, retriever=retriever)]


def passages(root, cfg, ids):
    with open_index(root, cfg) as idx:
        return [(h.id, h.title, h.text) if h else None for h in idx.passages(ids)]


@pytest.fixture
def driver_without_corpus(monkeypatch):
    """From here on, this process (the driver) cannot read a corpus nor split passages: workers must."""
    import indexing.corpus.passages
    import indexing.corpus.readers

    def refuse(*a, **k):
        raise AssertionError("the driver read the corpus")

    monkeypatch.setattr(indexing.corpus.readers, "read_corpus", refuse)
    monkeypatch.setattr(indexing.corpus.passages, "passages_of", refuse)


def test_cluster_build_spreads_over_nodes_and_searches_as_in_process(cluster, rows, tmp_path, request):
    sources = write_corpus(tmp_path / "corpus", rows)
    local = build_index(sources, tmp_path / "local", settings())
    request.getfixturevalue("driver_without_corpus")
    report = build_index([str(tmp_path / "corpus" / "part*.jsonl")], tmp_path / "ray", settings(cluster))
    assert report["units"] == 4 and report["published"]  # the glob's four files, in order
    nodes = set(report["tasks_by_node"])
    assert len(nodes) >= 2 and nodes <= cluster["workers"]  # never the driver's (CPU-less) head node
    for k in ("passages", "duplicates_merged", "records", "passages_embedded"):
        assert report[k] == local[k], k
    assert local["duplicates_merged"] == 2
    m = read_manifest(tmp_path / "ray")
    assert m["build"]["tasks_by_node"] == report["tasks_by_node"]
    assert sum(s["passages"] for s in m["shards"]) == m["passages"] == local["passages"] > len(rows)
    verify_version(tmp_path / "ray", m, full=True)
    cfg = settings()
    ids = [r["id"] for r in rows]
    assert passages(tmp_path / "ray", cfg, ids) == passages(tmp_path / "local", cfg, ids)
    for retriever in ("bm25", "dense"):
        assert hits(tmp_path / "ray", cfg, retriever) == hits(tmp_path / "local", cfg, retriever), retriever


def test_one_file_runs_as_several_unit_tasks(cluster, rows, tmp_path, request):
    """A file larger than index.unit_bytes is several units, each one scan and one build task (spread over
    both workers); ids repeated in a later unit are dropped through the dedup round; the shards and their keys
    are those of the in-process build, which restarts shards at the same units, and so are the hits."""
    path = tmp_path / "one.jsonl"
    repeated = [*rows[:3], {**rows[5], "text": "the same id with another text"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + repeated), encoding="utf-8")
    units = {"index.unit_bytes": path.stat().st_size // 5 + 1}  # five units
    local = build_index([str(path)], tmp_path / "local", settings(**units))
    request.getfixturevalue("driver_without_corpus")
    report = build_index([str(path)], tmp_path / "ray", settings(cluster, **units))
    assert report["units"] == local["units"] == 5
    assert sum(report["tasks_by_node"].values()) == 2 * 5 and set(report["tasks_by_node"]) == cluster["workers"]
    assert report["dedup_s"] > 0 and report["shards"] > 5
    for k in ("passages", "records", "duplicates_merged", "conflicting_duplicates", "passages_embedded"):
        assert report[k] == local[k], k
    assert (report["duplicates_merged"], report["conflicting_duplicates"]) == (4, 1)
    keys = [s["key"] for s in read_manifest(tmp_path / "ray")["shards"]]
    assert keys == [s["key"] for s in read_manifest(tmp_path / "local")["shards"]]
    cfg = settings()
    ids = [r["id"] for r in rows]
    assert passages(tmp_path / "ray", cfg, ids) == passages(tmp_path / "local", cfg, ids)
    assert passages(tmp_path / "ray", cfg, ["h5"])[0][2].startswith(rows[5]["text"][:40])  # the first kept
    for retriever in ("bm25", "dense"):
        assert hits(tmp_path / "ray", cfg, retriever) == hits(tmp_path / "local", cfg, retriever), retriever
    # the units are recorded as in-process (name, digest, shards, counts): an in-process rebuild of the
    # cluster's index takes every unit without reading it (this driver cannot read a corpus)
    assert read_manifest(tmp_path / "ray")["units"] == read_manifest(tmp_path / "local")["units"]
    again = build_index([str(path)], tmp_path / "ray", settings(**units))
    assert again["units_reused"] == 5 and again["shards_built"] == 0


def test_incremental_rebuild_touches_only_the_changed_shard(cluster, rows, tmp_path):
    sources = write_corpus(tmp_path / "corpus", rows)
    first = build_index(sources, tmp_path / "idx", settings(cluster))
    assert first["shards_built"] == first["shards"] and first["version"] == 1
    again = build_index(sources, tmp_path / "idx", settings(cluster))
    assert not again["published"] and again["shards_built"] == 0 and again["passages_embedded"] == 0

    edited = [dict(r) for r in rows]
    edited[len(rows) // 4 + 3]["text"] += " A sentence added in a later revision."  # in the second file
    write_corpus(tmp_path / "corpus", edited)
    before = {s["key"] for s in read_manifest(tmp_path / "idx")["shards"]}
    report = build_index(sources, tmp_path / "idx", settings(cluster))
    after = {s["key"] for s in read_manifest(tmp_path / "idx")["shards"]}
    assert report["version"] == 2 and len(after - before) == 1 and len(before - after) == 1
    assert report["shards_built"] == 1 and report["shards_reused"] == report["shards"] - 1
    assert report["passages_embedded"] == 1 and report["vectors_reused"] >= 1  # the rest came from the old shard
    full = build_index(sources, tmp_path / "full", settings(cluster))  # the same corpus from scratch
    assert [s["key"] for s in read_manifest(tmp_path / "full")["shards"]] == [
        s["key"] for s in read_manifest(tmp_path / "idx")["shards"]
    ]
    assert full["passages_embedded"] == full["passages"]


def comparable(root: Path) -> dict:
    """A manifest without what differs between any two builds, even of one path: when it was built, its build
    record (timings, nodes), and Lucene's files (each segment holds a random id, and the documents indexed by
    `index.threads` threads land in segments in the order the threads take them; the hits are compared)."""
    m = read_manifest(root)
    for s in m["shards"]:
        s["files"] = {name: f for name, f in s["files"].items() if not name.startswith("lucene/")}
    m["bm25"].pop("files")
    return {k: v for k, v in m.items() if k not in ("created", "build")}


def test_cluster_and_in_process_builds_publish_the_same_manifest(cluster, rows, tmp_path):
    """One build path: the units' work as Ray tasks, in a pool of two processes and in this process publishes
    the same manifest (shards, keys, files, units, counts), with the passages embedded and with vectors given
    in a file (`--vectors`, read by the workers on the cluster); ids repeated across units are dropped alike."""
    import numpy as np

    path = tmp_path / "one.jsonl"
    repeated = [*rows[:3], {**rows[5], "text": "the same id with another text"}]
    records = rows + repeated
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    np.save(tmp_path / "v.npy", np.random.default_rng(0).standard_normal((len(records), 384)).astype(np.float32))
    units = {"index.unit_bytes": path.stat().st_size // 3 + 1, "index.passage_words": 10_000}  # one passage a record
    for name, options in (("embedded", {}), ("given", {"vectors": str(tmp_path / "v.npy")})):
        on_ray = build_index([str(path)], tmp_path / f"ray-{name}", settings(cluster, **units), **options)
        assert on_ray["units"] == 3 and on_ray["duplicates_merged"] == 4 and on_ray["published"]
        for workers in (1, 2):
            local = tmp_path / f"local-{name}-{workers}"
            build_index([str(path)], local, settings(**units, **{"index.build_workers": workers}), **options)
            assert comparable(local) == comparable(tmp_path / f"ray-{name}"), (name, workers)
            for retriever in ("bm25", "dense"):
                assert hits(local, settings(), retriever) == hits(tmp_path / f"ray-{name}", settings(), retriever)
    given = read_manifest(tmp_path / "ray-given")
    assert given["settings"]["embedding"]["given"] and given["build"]["vectors"]["taken"] == given["passages"]
    with open_index(tmp_path / "ray-given", settings()) as idx:
        vec = np.load(tmp_path / "v.npy")[7]
        top = idx.retriever("dense")._shards().search(vec[None, :] / np.linalg.norm(vec), 1)
        assert idx.hit(int(top[1][0][0]), int(top[2][0][0]), 0.0).id == "h7"


def test_bad_corpus_line_fails_on_the_worker_with_one_line(cluster, rows, tmp_path, request):
    sources = write_corpus(tmp_path / "corpus", rows)
    with open(sources[2], "a", encoding="utf-8") as f:
        f.write("{not json\n")
    request.getfixturevalue("driver_without_corpus")
    with pytest.raises(IndexingError, match=r"part2\.jsonl:\d+") as err:  # the reader's error, raised by a worker
        build_index(sources, tmp_path / "idx", settings(cluster))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "idx" / "CURRENT").exists()  # nothing published


def test_killed_build_resumes_on_rerun(cluster, rows, tmp_path):
    """The driver (a `dynrag index build` process joined to the cluster) and the worker that was renaming a
    finished shard into place are killed; a rerun reuses the finished shards and the staged vectors."""
    from fault_tools import cli, kill_group, start

    sources = write_corpus(tmp_path / "corpus", rows)
    marker = cluster["pause_dir"] / PAUSE_POINT
    marker.unlink()  # armed
    sets = [
        f"--set={k}={v}"
        for k, v in {
            "runtime.mode": "ray",
            "runtime.ray_address": cluster["address"],
            "embedding.model": "hash",
            "index.shard_size": SHARD,
        }.items()
    ]
    driver = start(cli("index", "build", *sources, "--index", str(tmp_path / "idx"), *sets), {**os.environ, **RAY_ENV})
    try:
        deadline = time.monotonic() + 300
        while not (marker.exists() and marker.read_text()):
            assert driver.poll() is None, driver.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the pause point was not reached"
            time.sleep(0.05)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        os.kill(int(marker.read_text()), signal.SIGKILL)  # the paused worker
    finally:
        kill_group(driver)
    assert not (tmp_path / "idx" / "CURRENT").exists()
    assert any((tmp_path / "idx" / "staging").iterdir())

    report = build_index(sources, tmp_path / "idx", settings(cluster))
    assert report["version"] == 1 and report["passages_embedded"] < report["passages"]
    build_index(sources, tmp_path / "ref", settings(cluster))  # the reference: an uninterrupted build
    assert [s["key"] for s in read_manifest(tmp_path / "idx")["shards"]] == [
        s["key"] for s in read_manifest(tmp_path / "ref")["shards"]
    ]
    verify_version(tmp_path / "idx", read_manifest(tmp_path / "idx"), full=True)
    assert hits(tmp_path / "idx", settings(), "bm25") == hits(tmp_path / "ref", settings(), "bm25")
    assert not (tmp_path / "idx" / "staging").exists()


def test_killed_worker_is_retried(cluster, rows, tmp_path):
    """SIGKILL of a worker just before it renames a finished shard into place: Ray retries the task, which
    finds the staged passages and vectors and finishes; the index is the one an undisturbed build makes."""
    sources = write_corpus(tmp_path / "corpus", rows)
    marker = cluster["pause_dir"] / PAUSE_POINT
    marker.unlink()  # armed
    result = {}
    build = threading.Thread(target=lambda: result.update(build_index(sources, tmp_path / "idx", settings(cluster))))
    build.start()
    deadline = time.monotonic() + 300
    while not (marker.exists() and marker.read_text()):
        assert build.is_alive() and time.monotonic() < deadline, "the pause point was not reached"
        time.sleep(0.05)
    os.kill(int(marker.read_text()), signal.SIGKILL)
    build.join(timeout=600)
    # shards the killed attempt had finished count as reused, as in a rerun
    assert result["published"] and result["shards_built"] + result["shards_reused"] == result["shards"]
    assert result["passages_embedded"] < result["passages"]  # the retry reused the killed attempt's vectors
    build_index(sources, tmp_path / "ref", settings(cluster))  # an undisturbed build
    assert [s["key"] for s in read_manifest(tmp_path / "idx")["shards"]] == [
        s["key"] for s in read_manifest(tmp_path / "ref")["shards"]
    ]
    verify_version(tmp_path / "idx", read_manifest(tmp_path / "idx"), full=True)
    assert hits(tmp_path / "idx", settings(), "bm25") == hits(tmp_path / "ref", settings(), "bm25")


def test_s3_index_built_by_workers_and_a_node_pulls_only_what_it_serves(cluster, rows, tmp_path, request):
    """Corpus and index on S3 (moto on loopback): the workers read the corpus from the bucket and upload their
    shards; the driver pulls only Lucene files. A task on node_2 opens the index and searches: its cache holds
    just what search reads (no vectors.npy, no shard Lucene copies), and its hits are an in-process build's."""
    if not cluster["s3"]:
        pytest.skip("moto[server] is a test dependency (pyproject `test` extra)")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    bucket = f"dynrag-{os.getpid()}-{time.time_ns() % 10**6}"
    fs.mkdir(bucket)
    sources = write_corpus(tmp_path / "corpus", rows)
    for src in sources:
        fs.put_file(src, f"{bucket}/corpus/{Path(src).name}")
    uri, driver_cache = f"s3://{bucket}/idx", tmp_path / "driver-cache"
    cfg = settings(cluster, **{"index.remote_cache_dir": driver_cache})
    local = build_index(sources, tmp_path / "local", settings())
    request.getfixturevalue("driver_without_corpus")
    report = build_index([f"s3://{bucket}/corpus/part*.jsonl"], uri, cfg)
    assert report["units"] == 4 and report["shards_uploaded"] == report["shards"] and len(report["tasks_by_node"]) >= 2
    m = json.loads(fs.cat(f"{bucket}/idx/versions/v000001/manifest.json"))
    for sh in m["shards"]:
        assert json.loads(fs.cat(f"{bucket}/idx/shards/{sh['key']}/checksums.json")) == sh["files"]
    assert not list(driver_cache.glob("*.build/uploading/*/*")) and not list(driver_cache.glob("*.build/staging/*"))

    def serve(uri: str, cache: str, queries: list[str]):
        import ray as r

        from indexing import open_index as open_
        from pipeline.config import load_config as load

        conf = load(overrides=["embedding.model=hash", f"index.remote_cache_dir={cache}"]).index_settings()
        with open_(uri, conf) as idx:
            found = {
                kind: [[(h.id, round(h.score, 4)) for h in hs] for hs in idx.search(queries, k=5, retriever=kind)]
                for kind in ("bm25", "dense")
            }
        files = sorted(str(p.relative_to(cache)) for p in Path(cache).rglob("*") if p.is_file())
        return r.get_runtime_context().get_node_id(), found, files

    on_node_2 = ray.remote(num_cpus=0, resources={"node_2": 1})(serve)
    node_cache = tmp_path / "node-2-cache"
    node, found, files = ray.get(on_node_2.remote(uri, str(node_cache), QUERIES))
    assert node == cluster["node_2"]
    served = {f"shards/{sh['key']}/{f}" for sh in m["shards"] for f in ("passages.arrow", "ids.npy", "faiss.index")}
    lucene = {f"versions/v000001/lucene/{f}" for f in m["bm25"]["files"]}
    id_map = {f"versions/v000001/id_shards/{f}" for f in m["id_shards"]["files"]}
    assert {f.split("/", 1)[1] for f in files} == served | lucene | id_map | {
        "versions/v000001/manifest.json",
        "SOURCE",
        ".pull.lock",  # the node's one-download lock (remote.node_lock)
    }
    assert local["passages"] == report["passages"]
    for kind in ("bm25", "dense"):
        assert found[kind] == hits(tmp_path / "local", settings(), kind), kind

    edited = [dict(r) for r in rows]
    edited[3]["text"] += " A sentence added in a later revision."
    changed = write_corpus(tmp_path / "corpus2", edited)[0]
    fs.put_file(changed, f"{bucket}/corpus/part0.jsonl")
    again = build_index([f"s3://{bucket}/corpus/part*.jsonl"], uri, cfg)
    assert again["version"] == 2 and again["shards_built"] == 1 and again["passages_embedded"] == 1
    _, _, files2 = ray.get(on_node_2.remote(uri, str(node_cache), QUERIES))
    new_shards = {f.split("/")[2] for f in files2 if "/shards/" in f} - {
        f.split("/")[2] for f in files if "/shards/" in f
    }
    assert len(new_shards) == 1  # the node pulled the one new shard; the others were cached


def test_ivf_template_trained_once_on_the_cluster(cluster, rows, tmp_path, request):
    """An IVF factory: a task trains the template on a sample spread over all files before any shard is
    filled from it; hits equal an in-process IVF build's (nprobe covers every list); a refresh reuses it."""
    ivf = {"index.faiss_factory": "IVF2,Flat", "index.faiss_train_size": 60}
    sources = write_corpus(tmp_path / "corpus", rows)
    build_index(sources, tmp_path / "local", settings(**ivf))
    request.getfixturevalue("driver_without_corpus")
    report = build_index(sources, tmp_path / "idx", settings(cluster, **ivf))
    m = read_manifest(tmp_path / "idx")
    template = m["faiss_template"]
    assert report["faiss_train_s"] > 0 and (tmp_path / "idx" / template["path"]).is_file()
    verify_version(tmp_path / "idx", m, full=True)
    for kind in ("bm25", "dense"):
        assert hits(tmp_path / "idx", settings(**ivf), kind) == hits(tmp_path / "local", settings(**ivf), kind), kind
    with open(sources[1], "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "new", "title": "Appendix", "text": "a passage added later"}) + "\n")
    again = build_index(sources, tmp_path / "idx", settings(cluster, **ivf))
    assert "faiss_train_s" not in again and read_manifest(tmp_path / "idx")["faiss_template"] == template
    assert again["shards_built"] == 1


def test_bm25_only_index_on_the_cluster(cluster, rows, tmp_path):
    """index.dense=false: the tasks embed nothing and build no FAISS; BM25 hits are the in-process build's."""
    sources = write_corpus(tmp_path / "corpus", rows)
    build_index(sources, tmp_path / "local", settings(**{"index.dense": False}))
    report = build_index(sources, tmp_path / "idx", settings(cluster, **{"index.dense": False}))
    m = read_manifest(tmp_path / "idx")
    assert report["passages_embedded"] == 0 and m["dim"] is None
    assert all("vectors.npy" not in s["files"] and "faiss.index" not in s["files"] for s in m["shards"])
    cfg = settings(**{"index.dense": False})
    assert hits(tmp_path / "idx", cfg, "bm25") == hits(tmp_path / "local", cfg, "bm25")


def test_cluster_build_without_vectors_reembeds_changed_shards(cluster, rows, tmp_path):
    """index.keep_vectors=false on the workers: no vectors.npy is kept; a refresh embeds the whole changed shard
    (nothing to copy it from) and equals a cluster build that kept its vectors."""
    sources = write_corpus(tmp_path / "corpus", rows)
    dropped, kept = settings(cluster, **{"index.keep_vectors": False}), settings(cluster)
    first = build_index(sources, tmp_path / "idx", dropped)
    build_index(sources, tmp_path / "kept", kept)
    m = read_manifest(tmp_path / "idx")
    assert m["dim"] == 384 and not list((tmp_path / "idx").rglob("vectors.npy"))
    verify_version(tmp_path / "idx", m, full=True)
    edited = [dict(r) for r in rows]
    edited[len(rows) // 4 + 3]["text"] += " A sentence added in a later revision."
    write_corpus(tmp_path / "corpus", edited)
    report = build_index(sources, tmp_path / "idx", dropped)
    assert build_index(sources, tmp_path / "kept", kept)["passages_embedded"] == 1
    changed = [s for s in read_manifest(tmp_path / "idx")["shards"] if s["key"] not in {x["key"] for x in m["shards"]}]
    assert len(changed) == 1 and report["vectors_reused"] == 0
    assert report["passages_embedded"] == changed[0]["passages"] > 1 and first["shards"] == report["shards"]
    for retriever in ("bm25", "dense"):
        assert hits(tmp_path / "idx", settings(), retriever) == hits(tmp_path / "kept", settings(), retriever)


def test_an_answer_jobs_questions_are_read_with_a_head_without_cpus(cluster, data_dir, tmp_path):
    """The question file of an answer job, local to the driver, becomes the same rows as in-process on a
    cluster whose head (the driver's node) has no CPU: the read task asks for none (it asked for one and
    failed the job)."""
    from pipeline.config import DynragConfig
    from pipeline.runtime.ray_questions import QuestionSource, question_dataset

    assert ray.cluster_resources().get("CPU") == 2 and all(
        n["Resources"].get("CPU", 0) == 0 for n in ray.nodes() if "node:__internal_head__" in n["Resources"]
    )
    path, cfg = str(data_dir / "hotpotqa/dev_400.jsonl"), DynragConfig()
    ds = question_dataset(path, cfg, {"5a8c7595554299585d9e36b6"}, 12, 5)
    got = [([json.loads(q)["id"] for q in r["qs"]], r["skipped"]) for r in ds.take_all()]
    local = QuestionSource(path, cfg, {"5a8c7595554299585d9e36b6"}, 12, 5).read_blocks()
    want = [([json.loads(q)["id"] for q in r["qs"]], r["skipped"]) for t in local for r in t.to_pylist()]
    assert got == want and [len(g[0]) for g in got] == [5, 5, 1] and sum(g[1] for g in got) == 1


@pytest.mark.timeout(120)  # without the limit, gather waits for the hung task (600 s)
def test_build_tasks_that_make_no_progress_stop_the_build_with_one_line(cluster):
    """RayExecutor.gather waits while tasks end (six of 1.5 s on the two worker CPUs: longer than the 3 s limit),
    and stops with one line once none has ended nor ticked for index.build_stall_s; the hung task is cancelled."""
    from indexing.builder.cluster import RayExecutor
    from indexing.errors import BuildStalled

    ex = RayExecutor(settings(cluster), dense=False)
    assert ex.gather([ex.submit(time.sleep, 0)[0] for _ in range(2)]) == [None, None]  # workers started
    ex.stall_s = 3.0
    t = time.monotonic()
    assert ex.gather([ex.submit(time.sleep, 1.5)[0] for _ in range(6)], "build") == [None] * 6
    assert time.monotonic() - t > 3.0
    hung = ex.submit(time.sleep, 600)[0]
    with pytest.raises(BuildStalled) as ended:
        ex.gather([hung, ex.submit(time.sleep, 0)[0]], "build")
    assert re.fullmatch(
        r"index build \(pid \d+ on \S+\): waited [\d.]+ s for 1 task on Ray \(\S+\) \(sleep\) with no progress \(no "
        r"task ended, none reported a step; index\.build_stall_s=3\); stopping, nothing published",
        str(ended.value),
    ), str(ended.value)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(hung, timeout=60)
