"""A Kubernetes API server that serves Leases and nothing else, over real HTTP.

No API server installs from this machine's registries; this one keeps the rules
the Lease adapter depends on (a replace must carry the current resourceVersion,
or it is refused with 409 Conflict; create of an existing name is 409; a missing
one is 404), so `leases: kubernetes` in sco.yaml can be driven through the
official client, a kubeconfig and HTTP, end to end.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

_PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/?]+))?")


class LeaseApi:
    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> LeaseApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                n = int(self.headers.get("Content-Length") or 0)
                doc: dict[str, Any] = json.loads(self.rfile.read(n) or b"{}")
                return doc

            def _route(self, method: str) -> None:
                m = _PATH.match(self.path)
                if m is None:
                    self._send(404, _status(404, "NotFound", self.path))
                    return
                status, body = api.handle(method, m.group(1), m.group(2), self._body())
                self._send(status, body)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "sco", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sco"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def handle(
        self, method: str, namespace: str, name: str | None, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests += 1
            key = (namespace, name or "")
            if method == "GET" and name is None:
                items = [v for (ns, _), v in sorted(self.leases.items()) if ns == namespace]
                return 200, {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "LeaseList",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": items,
                }
            if method == "GET":
                if key not in self.leases:
                    return 404, _status(404, "NotFound", name or "")
                return 200, self.leases[key]
            if method == "POST":
                key = (namespace, body["metadata"]["name"])
                if key in self.leases:
                    return 409, _status(409, "AlreadyExists", key[1])
                return 201, self._store(key, body)
            if method == "PUT":
                current = self.leases.get(key)
                if current is None:
                    return 404, _status(404, "NotFound", name or "")
                sent = body.get("metadata", {}).get("resourceVersion")
                if sent != current["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", name or "")
                return 200, self._store(key, body)
            if method == "DELETE":
                if self.leases.pop(key, None) is None:
                    return 404, _status(404, "NotFound", name or "")
                return 200, _status(200, "Success", name or "")
            return 405, _status(405, "MethodNotAllowed", method)

    def _store(self, key: tuple[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        doc = dict(body, apiVersion="coordination.k8s.io/v1", kind="Lease")
        doc["metadata"] = dict(
            body.get("metadata", {}), namespace=key[0], resourceVersion=str(self.version)
        )
        self.leases[key] = doc
        return doc


def _status(code: int, reason: str, what: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": f"{reason}: {what}",
    }
