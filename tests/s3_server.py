"""A real S3 API on loopback for the tests: moto's WSGI application served by werkzeug in a process of its own,
with every request it answers recorded (method, path) in a file, so a test can count the GETs a download made.
Its own process: moto imports flask, whose context proxies break vLLM's kernel scan (`hasattr` on every module
attribute raises "Working outside of application context") in a process that starts an in-process engine after it.

Used through the session fixture `s3_server` (conftest.py): one server per pytest process; each test takes
a fresh bucket (moto keeps its state for the server). Subprocesses and Ray workers reach it through
`server.env` (AWS_ENDPOINT_URL and test credentials) in their environment. The server ends with its stdin:
when the test process closes it, or dies."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any


class S3Server:
    def __init__(self) -> None:
        self._log = Path(tempfile.mkstemp(prefix="dynrag-s3-requests-")[1])
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(self._log)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._proc.stdout is not None
        self.endpoint = self._proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            raise RuntimeError(f"the S3 server did not start (exit {self._proc.poll()})")
        # what a client needs to reach it (boto3, s3fs, a subprocess, a Ray worker's runtime env)
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def filesystem(self) -> Any:
        """A fresh (uncached) s3fs filesystem on this server."""
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.endpoint, skip_instance_cache=True)

    def new_bucket(self) -> str:
        bucket = f"dynrag-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(bucket)
        return bucket

    def count(self, method: str, path_part: str = "") -> int:
        """Requests of `method` so far whose path holds `path_part` (e.g. a bucket and key prefix). A request is
        recorded before it is answered, so every request a client has seen answered is counted."""
        rows = (line.split("\t", 1) for line in self._log.read_text().splitlines())
        return sum(m == method and path_part in p for m, p in rows)

    def stop(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.unlink(missing_ok=True)


def serve(log_path: str) -> None:
    """The server process: prints its endpoint, records each request's method and path (one line, flushed before
    the request is answered), and ends when its stdin closes."""
    import os

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    moto_app = DomainDispatcherApplication(create_backend_app)
    lock, log = threading.Lock(), open(log_path, "a", encoding="utf-8")

    def app(environ: dict, start_response: Any) -> Any:
        with lock:
            log.write(f"{environ['REQUEST_METHOD']}\t{environ.get('PATH_INFO', '')}\n")
            log.flush()
        return moto_app(environ, start_response)

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    host, port = server.server_address[:2]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"http://{host}:{port}", flush=True)
    sys.stdin.read()  # until the test process closes it, or ends
    os._exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
