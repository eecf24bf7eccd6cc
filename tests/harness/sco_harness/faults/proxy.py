"""A TCP proxy that a fault matrix switches between passing, failing and stalling.

sco reaches a service through the proxy (its clouds.yaml or database URL names
the proxy's port); the service itself, and everyone else, go direct. Modes:
- `pass`: bytes flow both ways;
- `error`: every request, on new and open connections alike, is answered with
  HTTP 503 and the connection closed (an API's 5xx storm);
- `slow`: every chunk the client sends waits `delay_s` before it is forwarded
  (an API answering in 10 s);
- `refuse`: open connections are cut and new ones refused, as when a host or
  its port is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import Any, Literal

Mode = Literal["pass", "error", "slow", "refuse"]

_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
)


class FaultProxy:
    """Listens on 127.0.0.1:`port` (0: a free one) and forwards to `upstream`."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.port = port
        self.mode: Mode = "pass"
        self.delay_s = 0.0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def set(self, mode: Mode, delay_s: float = 0.0) -> None:
        """Switch modes; `refuse` cuts every open connection and closes the port."""
        self.delay_s = delay_s
        self.mode = mode
        self._call(self._apply(mode))

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._call(self._apply("refuse"))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _call(self, coro: Any) -> Any:
        done: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return done.result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _apply(self, mode: Mode) -> None:
        if mode == "refuse":
            if self._server is not None:
                self._server.close()
                self._server = None
            for w in list(self._writers):
                w.transport.abort()
        elif self._server is None:
            await self._listen()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.mode == "error":
                await self._unavailable(reader, writer)
                return
            up_reader, upstream = await asyncio.open_connection(*self.upstream)
            self._writers.add(upstream)
            back = asyncio.ensure_future(self._pipe(up_reader, writer, forward=False))
            await self._pipe(reader, upstream, forward=True, client=writer)
            await back
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        *,
        forward: bool,
        client: asyncio.StreamWriter | None = None,
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := await src.read(65536):
                if forward and self.mode == "error" and client is not None:
                    client.write(_UNAVAILABLE)
                    with contextlib.suppress(OSError):
                        await client.drain()
                    break
                if forward and self.mode == "slow":
                    await asyncio.sleep(self.delay_s)
                dst.write(chunk)
                await dst.drain()
        if forward:
            dst.close()  # the client is done: so is the upstream side
        else:
            dst.transport.abort()  # the service hung up: so does the proxy

    @staticmethod
    async def _unavailable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            await reader.read(65536)
            writer.write(_UNAVAILABLE)
            await writer.drain()
