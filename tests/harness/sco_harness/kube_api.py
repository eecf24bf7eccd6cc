"""A Kubernetes API server for tests, over real HTTP: Leases, Pods, Nodes,
PodDisruptionBudgets and Events, with the semantics sco's adapters depend on.

No API server installs from this machine's registries. This one is driven through
the official client, a kubeconfig and HTTP, and keeps these rules of the real one:

- every object carries a `resourceVersion` from one counter; a replace (PUT) must
  carry the current one or is refused with 409 Conflict; a create of an existing
  name is 409 AlreadyExists; a missing object is 404;
- lists carry the list's `resourceVersion`; `labelSelector` (`k=v`, `k!=v`, `k`,
  `!k`, comma-joined) and `fieldSelector` (`metadata.name`, `metadata.namespace`,
  `spec.nodeName`, `status.phase`, with `=`/`==`/`!=`) filter lists and watches;
- `?watch=true&resourceVersion=N` streams (chunked) every change after N as
  `{"type": ADDED|MODIFIED|DELETED, "object": ...}` lines, with
  `allowWatchBookmarks` a BOOKMARK every `bookmark_s`, and ends after
  `timeoutSeconds`; a watch from a version older than the history kept
  (`expire`) gets one ERROR event with a 410 Expired Status, as the real server
  answers a compacted version;
- merge-patch (`application/merge-patch+json`) of nodes and pods (cordon).

Every object written is checked against the Kubernetes OpenAPI schema of
`SCHEMA_VERSION` (`kubernetes-validate`, strict); an invalid one is refused with
422 Invalid, as the real server's validation would.

It lacks: authentication and authorization (any token passes), admission and
defaulting, server-side apply, strategic merge patch, field managers, finalizers,
graceful deletion, generateName, PDB status (budgets are computed on each
eviction), label selectors other than `matchLabels` in budgets, and every other
resource.

- The Eviction subresource deletes a pod unless a PodDisruptionBudget of its
  namespace selecting it (`matchLabels`) would fall below `minAvailable` (or past
  `maxUnavailable`) of Running and Ready pods: then 429 TooManyRequests.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

Obj = dict[str, Any]
SCHEMA_VERSION = "1.30"  # the Kubernetes release whose OpenAPI schemas objects must meet
# (group path, kind plural) -> (apiVersion, Kind, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "leases": ("coordination.k8s.io/v1", "Lease", True),
    "pods": ("v1", "Pod", True),
    "nodes": ("v1", "Node", False),
    "poddisruptionbudgets": ("policy/v1", "PodDisruptionBudget", True),
    "events": ("v1", "Event", True),
}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?:coordination\.k8s\.io|policy)/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<kind>leases|pods|nodes|poddisruptionbudgets|events)"
    r"(?:/(?P<name>[^/?]+))?(?:/(?P<sub>eviction))?$"
)


class KubeApi:
    def __init__(
        self, bookmark_s: float = 1.0, history: int = 10_000, validate: bool = True
    ) -> None:
        """`validate`: check every object written against the Kubernetes OpenAPI
        schema (the `kubernetes-validate` package, strict: unknown fields too)."""
        self.validate = validate
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {k: {} for k in _KINDS}
        self.version = 0
        self.requests = 0
        self.evictions = 0
        self.bookmark_s = bookmark_s
        self._history: deque[tuple[int, str, str, Obj]] = deque(maxlen=history)
        self._oldest = 0  # watches from before this version have expired
        self._changed = threading.Condition()
        self._epoch = 0  # open watches end when it moves (a restart, a compaction)
        self._flowing = threading.Event()  # cleared: open watches deliver nothing
        self._flowing.set()
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()

    # ------------------------------------------------------------ serving

    def start(self) -> KubeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked watch streams

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def setup(self) -> None:
                super().setup()
                api._connections.add(self.connection)

            def finish(self) -> None:
                api._connections.discard(self.connection)
                super().finish()

            def _send(self, status: int, body: Obj) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Obj:
                n = int(self.headers.get("Content-Length") or 0)
                doc: Obj = json.loads(self.rfile.read(n) or b"{}")
                return doc

            def _route(self, method: str) -> None:
                url = urlsplit(self.path)
                m = _PATH.match(url.path)
                if m is None:
                    self._send(404, _status(404, "NotFound", url.path))
                    return
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                kind, ns, name = m.group("kind"), m.group("ns") or "", m.group("name")
                body = self._body() if method in ("POST", "PUT", "PATCH") else {}
                if m.group("sub") == "eviction" and method == "POST" and name:
                    self._send(*api.evict(ns, name))
                    return
                if (
                    method == "GET"
                    and name is None
                    and (query.get("watch") or "").lower() in ("1", "true")
                ):
                    self._stream(api.watch(kind, ns, query))
                    return
                status, doc = api.handle(method, kind, ns, name, body, query)
                self._send(status, doc)

            def _stream(self, events: Iterator[Obj]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in events:
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        """Stop listening and cut every open connection (kept-alive ones too): the
        server is gone for its clients."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._changed:
            self._epoch += 1  # open watches end
            self._changed.notify_all()
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

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

    # ------------------------------------------------------------ the API

    def handle(
        self,
        method: str,
        kind: str,
        namespace: str,
        name: str | None,
        body: Obj,
        query: dict[str, str] | None = None,
    ) -> tuple[int, Obj]:
        query = query or {}
        with self._changed:
            self.requests += 1
            store = self.objects[kind]
            key = (namespace, name or "")
            if method == "GET" and name is None:
                api_version, kind_name, _ = _KINDS[kind]
                items = [
                    o
                    for (ns, _), o in sorted(store.items())
                    if (not namespace or ns == namespace) and _selected(o, query)
                ]
                return 200, {
                    "apiVersion": api_version,
                    "kind": f"{kind_name}List",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": items,
                }
            if method == "GET":
                if key not in store:
                    return 404, _status(404, "NotFound", name or "")
                return 200, store[key]
            if method == "POST":
                key = (namespace, body.get("metadata", {}).get("name", ""))
                if key in store:
                    return 409, _status(409, "AlreadyExists", key[1])
                if invalid := self._invalid(kind, body):
                    return 422, _status(422, "Invalid", invalid)
                return 201, self._store(kind, key, body, "ADDED")
            if key not in store:
                return 404, _status(404, "NotFound", name or "")
            current = store[key]
            if method in ("PUT", "PATCH"):
                proposed = _merge(current, body) if method == "PATCH" else body
                if invalid := self._invalid(kind, proposed):
                    return 422, _status(422, "Invalid", invalid)
            if method == "PUT":
                sent = body.get("metadata", {}).get("resourceVersion")
                if sent != current["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", name or "")
                return 200, self._store(kind, key, body, "MODIFIED")
            if method == "PATCH":
                return 200, self._store(kind, key, _merge(current, body), "MODIFIED")
            if method == "DELETE":
                gone = store.pop(key)
                self._record(kind, "DELETED", gone)
                return 200, gone
            return 405, _status(405, "MethodNotAllowed", method)

    def evict(self, namespace: str, name: str) -> tuple[int, Obj]:
        """The Eviction API: the pod is deleted unless a PodDisruptionBudget selecting
        it would be broken (429, as the real server answers; the caller retries)."""
        with self._changed:
            self.requests += 1
            pod = self.objects["pods"].get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", name)
            for pdb in self.objects["poddisruptionbudgets"].values():
                if pdb["metadata"].get("namespace") == namespace and not self._may_disrupt(
                    pdb, pod
                ):
                    return 429, _status(
                        429,
                        "TooManyRequests",
                        f"Cannot evict pod as it would violate the pod's disruption budget "
                        f"{pdb['metadata']['name']}",
                    )
            self.evictions += 1
            gone = self.objects["pods"].pop((namespace, name))
            self._record("pods", "DELETED", gone)
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _may_disrupt(self, pdb: Obj, pod: Obj) -> bool:
        spec = pdb.get("spec") or {}
        wanted = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = pod["metadata"].get("labels") or {}
        if not wanted or any(labels.get(k) != v for k, v in wanted.items()):
            return True  # not this budget's pod
        ns = pdb["metadata"].get("namespace")
        selected = [
            p
            for (pns, _), p in self.objects["pods"].items()
            if pns == ns
            and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]
        healthy = sum(1 for p in selected if _healthy(p))
        if "minAvailable" in spec:
            return healthy - (1 if _healthy(pod) else 0) >= int(spec["minAvailable"])
        if "maxUnavailable" in spec:
            unavailable = len(selected) - healthy + (1 if _healthy(pod) else 0)
            return unavailable <= int(spec["maxUnavailable"])
        return True

    def put(self, kind: str, obj: Obj) -> Obj:
        """Create or replace an object directly (what a kubelet or scheduler would
        write), as a change watchers see."""
        meta = obj.get("metadata", {})
        key = (meta.get("namespace", "") if _KINDS[kind][2] else "", meta["name"])
        invalid = self._invalid(kind, obj)
        if invalid:
            raise ValueError(f"not a valid {_KINDS[kind][1]}: {invalid}")
        with self._changed:
            change = "MODIFIED" if key in self.objects[kind] else "ADDED"
            return self._store(kind, key, obj, change)

    def list(self, kind: str) -> list[Obj]:
        """A copy of every object of a kind, as it is now."""
        with self._changed:
            return copy.deepcopy(list(self.objects[kind].values()))

    def update(
        self, kind: str, namespace: str, name: str, change: Callable[[Obj], Obj]
    ) -> Obj | None:
        """Replace an object with `change(a copy of it)`, if it is still there and
        `change` leaves it valid (what a kubelet or scheduler writes, without losing
        a race to a delete)."""
        with self._changed:
            current = self.objects[kind].get((namespace, name))
            if current is None:
                return None
            new = change(copy.deepcopy(current))
            invalid = self._invalid(kind, new)
            if invalid:
                raise ValueError(f"not a valid {_KINDS[kind][1]}: {invalid}")
            return self._store(kind, (namespace, name), new, "MODIFIED")

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self._changed:
            gone = self.objects[kind].pop((namespace, name), None)
            if gone is not None:
                self._record(kind, "DELETED", gone)

    def _invalid(self, kind: str, obj: Obj) -> str:
        """What the schema says is wrong with `obj` ("" when it is valid)."""
        if not self.validate:
            return ""
        import kubernetes_validate  # the `dev` extra

        api_version, kind_name, _ = _KINDS[kind]
        doc = dict(obj, apiVersion=api_version, kind=kind_name)
        try:
            kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            return str(e).splitlines()[0]
        return ""

    def expire(self) -> None:
        """Forget the history up to now and end the open watches, as a restarted
        server that compacted would: watches from older versions get 410 Gone."""
        with self._changed:
            self._history.clear()
            self._oldest = self.version
            self._epoch += 1
            self._changed.notify_all()

    def pause_watches(self) -> None:
        """Open watches deliver nothing until `resume_watches` (a slow network)."""
        self._flowing.clear()

    def resume_watches(self) -> None:
        self._flowing.set()

    def _store(self, kind: str, key: tuple[str, str], body: Obj, change: str) -> Obj:
        api_version, kind_name, namespaced = _KINDS[kind]
        self.version += 1
        doc = dict(body, apiVersion=api_version, kind=kind_name)
        meta = dict(body.get("metadata", {}), resourceVersion=str(self.version))
        if namespaced:
            meta["namespace"] = key[0]
        doc["metadata"] = meta
        self.objects[kind][key] = doc
        self._record(kind, change, doc, bump=False)
        return doc

    def _record(self, kind: str, change: str, obj: Obj, bump: bool = True) -> None:
        if bump:
            self.version += 1
            obj = dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(self.version)))
        if len(self._history) == self._history.maxlen:
            self._oldest = self._history[0][0]
        self._history.append((self.version, kind, change, obj))
        self._changed.notify_all()

    def watch(self, kind: str, namespace: str, query: dict[str, str]) -> Iterator[Obj]:
        """The events of a watch request (see the module)."""
        since = int(query.get("resourceVersion") or 0)
        bookmarks = (query.get("allowWatchBookmarks") or "").lower() in ("1", "true")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        with self._changed:
            if since < self._oldest:
                yield {"type": "ERROR", "object": _status(410, "Expired", f"too old: {since}")}
                return
        last_bookmark = time.monotonic()
        epoch = self._epoch
        while time.monotonic() < deadline and epoch == self._epoch:
            if not self._flowing.wait(timeout=0.2):
                continue
            with self._changed:
                fresh = [e for e in self._history if e[0] > since]
                if not fresh:
                    self._changed.wait(timeout=min(0.2, self.bookmark_s))
                    fresh = [e for e in self._history if e[0] > since]
                now_version = self.version
            if epoch != self._epoch:
                return
            for version, k, change, obj in fresh:
                since = version
                ns = obj["metadata"].get("namespace", "")
                if k == kind and (not namespace or ns == namespace) and _selected(obj, query):
                    yield {"type": change, "object": obj}
            if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_s:
                last_bookmark = time.monotonic()
                since = max(since, now_version)
                api_version, kind_name, _ = _KINDS[kind]
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": api_version,
                        "kind": kind_name,
                        "metadata": {"resourceVersion": str(since)},
                    },
                }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a killed process) is not news."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _healthy(pod: Obj) -> bool:
    """Running and Ready: what a disruption budget counts."""
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return status.get("phase") == "Running" and ready


def _merge(current: Obj, patch: Obj) -> Obj:
    """JSON merge patch (RFC 7386): null deletes, objects merge, the rest replaces."""
    out = dict(current)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _selected(obj: Obj, query: dict[str, str]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (query.get("labelSelector") or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term.strip() not in labels:
            return False
    for term in filter(None, (query.get("fieldSelector") or "").split(",")):
        negate = "!=" in term
        k, v = term.replace("!=", "=").replace("==", "=").split("=", 1)
        have = _field(obj, k.strip())
        if (have == v.strip()) == negate:
            return False
    return True


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _status(code: int, reason: str, what: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": f"{reason}: {what}",
    }
