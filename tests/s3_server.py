"""A real S3 API on loopback for the tests: moto's WSGI application served by werkzeug in a thread, with every
request it answers recorded (method, path), so a test can count the GETs a download made.

Used through the session fixture `s3_server` (conftest.py): one server per pytest process; each test takes
a fresh bucket (moto keeps its state for the process). Subprocesses and Ray workers reach it through
`server.env` (AWS_ENDPOINT_URL and test credentials) in their environment."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any


class S3Server:
    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        moto_app = DomainDispatcherApplication(create_backend_app)
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()

        def app(environ: dict, start_response: Any) -> Any:
            with self._lock:
                self.requests.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
            return moto_app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        # what a client needs to reach it (boto3, s3fs, a subprocess, a Ray worker's runtime env)
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ENDPOINT_URL": self.endpoint,
        }
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def filesystem(self) -> Any:
        """A fresh (uncached) s3fs filesystem on this server."""
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.endpoint, skip_instance_cache=True)

    def new_bucket(self) -> str:
        bucket = f"dynrag-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(bucket)
        return bucket

    def count(self, method: str, path_part: str = "") -> int:
        """Requests of `method` so far whose path holds `path_part` (e.g. a bucket and key prefix)."""
        with self._lock:
            return sum(m == method and path_part in p for m, p in self.requests)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
