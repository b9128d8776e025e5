"""What `dynrag conform`'s two harnesses (DRAGIN's, jobs/conform/run.py; ERM4's, jobs/conform/erm4.py) share:
dynrag's traced backends, the retrieval endpoint the reference is served by, the reference's driver process with its
per-question cache, dynrag's side one question at a time, and the float32 copy of the model."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from jobs.conform import record


def git_info(path: Path) -> dict[str, str]:
    """A checkout's path, origin and commit ("unknown" where git cannot say)."""

    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(path), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else "unknown"

    return {"path": str(path), "repository": git("remote", "get-url", "origin"), "commit": git("rev-parse", "HEAD")}


class TracedBackends:
    """dynrag's backends with each generation and search of the current question recorded."""

    def __init__(self, inner):
        self.inner, self.events = inner, []
        # no retrieval cache: each of the method's searches reaches `search` and is recorded, as the reference
        # searches each time (a query the reference or an earlier question asked would be served unseen)
        self.search_cache = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, samplings, chats):
        outs = self.inner.generate(prompts, samplings, chats)
        for prompt, out in zip(prompts, outs):
            text = getattr(out, "text", repr(out))
            self.events.append(
                {"kind": "generate", "prompt_sha": record.prompt_sha(prompt), "prompt": prompt, "text": text}
            )
        return outs

    def search(self, queries, k, retriever):
        hits = self.inner.search(queries, k, retriever)
        for q, hs in zip(queries, hits):
            self.events.append({"kind": "retrieve", "query": q, "ids": [h.id for h in hs][:k]})
        return hits


def serve_json(answer) -> ThreadingHTTPServer:
    """A local HTTP endpoint on a free port: each POST's JSON body -> `answer(body)`, sent back as JSON."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            data = json.dumps(answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_retrieval(backends) -> ThreadingHTTPServer:
    """POST {queries, k} -> {hits: [[{id, title, text}]]} from dynrag's BM25, on a free local port."""

    def answer(body: dict) -> dict:
        hits = backends.search(body["queries"], int(body["k"]), "bm25")
        return {"hits": [[{"id": h.id, "title": h.title, "text": h.text} for h in hs] for hs in hits]}

    return serve_json(answer)


def run_reference(py: Path, job: dict, workdir: Path, log, driver: Path) -> tuple[dict, list[dict]]:
    """`driver` over the questions: (its setup line, one row per question, each with its seconds). Rows of
    the same inputs (checkout commit, config, settings, model, driver, question) are read back from the cache;
    the driver runs the others only."""
    base = {k: v for k, v in job.items() if k not in ("out", "cache", "questions") and not k.endswith("_url")}
    base["driver"] = record.prompt_sha(driver.read_text() + Path(record.__file__).read_text())
    folder = Path(job["cache"]) / record.prompt_sha(json.dumps(base, sort_keys=True))
    keep = job["commit"] != "unknown"

    def kept(q: dict) -> Path:
        return folder / (record.prompt_sha(q["id"] + "\n" + q["question"]) + ".json")

    todo = [q for q in job["questions"] if not (keep and kept(q).is_file())]
    if len(todo) < len(job["questions"]):
        log(f"reference: {len(job['questions']) - len(todo)} questions read from {folder}")
    if todo or not (folder / "setup.json").is_file():
        setup, rows = _drive(py, {**job, "questions": todo}, workdir, log, driver)
        if keep:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "setup.json").write_text(json.dumps(setup))
            for q, row in zip(todo, rows):
                kept(q).write_text(json.dumps(row))
        fresh = {r["id"]: r for r in rows}
    else:
        fresh = {}
    setup = json.loads((folder / "setup.json").read_text()) if keep else setup
    return setup, [fresh.get(q["id"]) or json.loads(kept(q).read_text()) for q in job["questions"]]


def _drive(py: Path, job: dict, workdir: Path, log, driver: Path) -> tuple[dict, list[dict]]:
    cfg_path, out = workdir / "reference.json", Path(job["out"])
    cfg_path.write_text(json.dumps(job))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(workdir / "reference.log", "w") as err:
        proc = subprocess.Popen(
            [str(py), "-P", str(driver), str(cfg_path)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=env,
            start_new_session=True,  # its own process group, which it and its children leave to us to end
        )
        try:
            total, ended = len(job["questions"]), False
            while not ended:  # its progress every 5 s, and once more at its end, which is not waited past
                try:
                    proc.wait(timeout=5)
                    ended = True
                except subprocess.TimeoutExpired:
                    pass
                done = max(0, len(out.read_text().splitlines()) - 1) if out.is_file() else 0
                log(f"reference: {done}/{total} questions")
        finally:  # dynrag stopped (Ctrl-C, SIGTERM: run.py) or the driver ended: nothing of the reference is left
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its rows are in `out` or lost with the run
            proc.wait()
    lines = [json.loads(x) for x in out.read_text().splitlines()] if out.is_file() else []
    if proc.returncode != 0 or not lines:
        tail = (workdir / "reference.log").read_text()[-3000:]
        raise SystemExit(f"the reference's driver failed (exit {proc.returncode}):\n{tail}")
    return lines[0], lines[1:]


def run_dynrag(backends, questions, method: str, params: dict) -> list[dict]:
    from pipeline.engine.core import Engine
    from pipeline.methods.registry import get_method

    spec = get_method(method)
    p = spec.params(params)
    traced = TracedBackends(backends)
    engine = Engine(traced)
    _ = backends.generator  # loaded before the clock starts, as the reference's model is
    rows = []
    for q in questions:
        with record.question_row(q.id, q.question, traced.events) as row:
            o = engine.run([q], spec.program, p)[0]
            if o.error is not None or o.answer is None:
                row["error"] = str(o.error)
            else:
                row.update(prediction=o.answer.prediction, text=o.answer.raw_output)
                if "kept" in o.answer.extra:  # a filter's decisions (ERM4's authors' setting)
                    row["kept"] = o.answer.extra["kept"]
        rows.append(row)
    return rows


def float32_copy(model: str, cache_dir: str) -> str:
    """A folder under `<cache_dir>/conform/models/` holding `model` with its floating weights cast to float32 and
    its config saying so (the reference loads a checkpoint in its own dtype), made once; `model` itself where it
    is float32."""
    from safetensors.torch import load_file, save_file

    src = Path(model)
    config = json.loads((src / "config.json").read_text())
    if (config.get("dtype") or config.get("torch_dtype") or "float32") == "float32":
        return model
    out = Path(cache_dir) / "conform" / "models" / f"{src.name}-float32"
    if (out / "config.json").is_file():
        return str(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            weights = load_file(f)
            save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, tmp / f.name)
        elif f.is_file() and f.name != "config.json":
            shutil.copy2(f, tmp / f.name)
    config.update(dtype="float32", torch_dtype="float32")
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    os.replace(tmp, out)
    return str(out)


def mean_seconds(rows: list[dict]) -> float | None:
    secs = [r["seconds"] for r in rows if "seconds" in r]
    return sum(secs) / len(secs) if secs else None
