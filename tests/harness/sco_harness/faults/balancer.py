"""A TCP load balancer in front of several replicas, as a Kubernetes Service is.

Agents know the distributor by one URL (`sco agent --distributor`), a Service
over its replicas. This stands in for it on one host: each new connection goes
to the next backend in turn, and a backend that refuses the connection (its
process is gone) is passed over for the next, as a Service's endpoints drop a
pod that is no longer ready. A connection already open to a replica that dies
is cut, as it is in a cluster: its client reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any


class Balancer:
    """Listens on 127.0.0.1:`port` (0: a free one) and spreads connections over `backends`
    (ports on 127.0.0.1). `connections` counts them by backend port."""

    def __init__(self, backends: list[int], port: int = 0) -> None:
        if not backends:
            raise ValueError("a balancer needs a backend")
        self.backends = list(backends)
        self.port = port
        self.connections: Counter[int] = Counter()
        self.refused: Counter[int] = Counter()
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> Balancer:
        self._thread.start()
        self._call(self._listen())
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _call(self, coro: Any) -> Any:
        done: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return done.result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()

    async def _connect(self) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The next backend that accepts, in turn; None when none does."""
        first = next(self._turn)
        for k in range(len(self.backends)):
            port = self.backends[(first + k) % len(self.backends)]
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                self.refused[port] += 1
                continue
            return port, reader, writer
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            found = await self._connect()
            if found is None:
                return  # no replica at all: the client sees its connection closed
            port, up_reader, upstream = found
            self.connections[port] += 1
            self._writers.add(upstream)
            back = asyncio.ensure_future(_pipe(up_reader, writer, forward=False))
            await _pipe(reader, upstream, forward=True)
            await back
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, forward: bool) -> None:
    with contextlib.suppress(OSError):
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    if forward:
        dst.close()  # the client is done: so is the backend side
    else:
        dst.transport.abort()  # the replica hung up (or died): so does the balancer
