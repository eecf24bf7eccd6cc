"""One kind of object kept in memory by list-and-watch (extra `kubernetes`).

It lists once, then watches from the list's `resourceVersion` with bookmarks. Each
event moves the cache and the version, and so does each bookmark (a quiet watch
does not fall behind). When the server answers 410 Gone (the version was
compacted away) it lists again. When the connection breaks it watches again from
where it was, after a backoff that doubles up to `max_backoff_s`. Never a poll of
every object each cycle: a controller reads the cache.

Objects stay the API server's JSON: the official client makes the calls (its
configuration, authentication and HTTP), but `_preload_content=False` skips its
model classes, which would cost seconds for ten thousand pods.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Json = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


class Informer:
    """`list_call` is a client list function, such as
    `CoreV1Api.list_pod_for_all_namespaces` or `CoreV1Api.list_node`."""

    def __init__(
        self,
        list_call: Callable[..., Any],
        *,
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout_s: int = 60,
        request_timeout_s: float = 30.0,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        name: str = "",
    ) -> None:
        self._call = list_call
        self._selectors = {
            k: v
            for k, v in (("label_selector", label_selector), ("field_selector", field_selector))
            if v
        }
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s  # a list's, and a watch's to connect
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.name = name or getattr(list_call, "__name__", "informer")
        self.resource_version = ""
        self.lists = 0  # full lists done (1 at start, one more per 410 Gone)
        self.errors = 0  # calls that failed (the informer retries them)
        self.last_error = ""
        self._cache: dict[Key, Json] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._failing_since: float | None = None  # monotonic; None while calls succeed
        self._response: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ reading

    def items(self) -> list[Json]:
        with self._lock:
            return list(self._cache.values())

    def get(self, namespace: str, name: str) -> Json | None:
        with self._lock:
            return self._cache.get((namespace, name))

    def wait_synced(self, timeout_s: float) -> bool:
        """True once the first list has landed."""
        return self._synced.wait(timeout_s)

    def failing_for(self) -> float:
        """Seconds since calls started failing without a success since (0 while the
        list or watch goes through): a cache this old may miss what happened."""
        since = self._failing_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    # ------------------------------------------------------------ running

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            try:
                response.close()  # ends a watch blocked on the socket
            except Exception:  # closing is best effort
                log.debug("informer %s: closing the watch failed", self.name, exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = self.min_backoff_s
        relist = True
        while not self._stopped.is_set():
            try:
                if relist:
                    self._list()
                    relist = False
                relist = self._watch()
                backoff = self.min_backoff_s
            except Exception as e:  # any failure of a call is retried
                if self._stopped.is_set():
                    return
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                log.warning("informer %s: %s; again in %.1fs", self.name, self.last_error, backoff)
                self._stopped.wait(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)

    def _list(self) -> None:
        response = self._call(
            _preload_content=False, _request_timeout=self.request_timeout_s, **self._selectors
        )
        doc = json.loads(response.data)
        self._failing_since = None
        fresh = {_key(o): o for o in doc.get("items") or ()}
        with self._lock:
            self._cache = fresh
            self.resource_version = str(doc.get("metadata", {}).get("resourceVersion", ""))
        self.lists += 1
        self._synced.set()

    def _watch(self) -> bool:
        """Watch until the server ends the stream; True when a new list is needed."""
        from kubernetes.watch.watch import iter_resp_lines

        response = self._call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            # The server ends the stream after timeout_seconds; one that does not is gone.
            _request_timeout=(
                self.request_timeout_s,
                self.watch_timeout_s + self.request_timeout_s,
            ),
            **self._selectors,
        )
        self._response = response
        self._failing_since = None  # the server answered: the watch is open
        try:
            for line in iter_resp_lines(response):
                if self._stopped.is_set():
                    return False
                if line and self._apply(json.loads(line)):
                    return True
        finally:
            self._response = None
            response.close()
            response.release_conn()
        return False

    def _apply(self, event: Json) -> bool:
        """Apply one watch event; True when it says the version has expired."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                log.info(
                    "informer %s: version %s expired; listing again",
                    self.name,
                    self.resource_version,
                )
                return True
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._cache[_key(obj)] = obj
            elif kind == "DELETED":
                self._cache.pop(_key(obj), None)
            if version:
                self.resource_version = version
        return False


def _key(obj: Json) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")
