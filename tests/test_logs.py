"""The log filter that keeps a long outage from flooding the log."""

from __future__ import annotations

import logging

from sco.apps.logs import RepeatFilter


def _record(
    msg: str, *args: object, name: str = "sco.x", level: int = logging.WARNING
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_alike_lines_are_held_for_the_window_then_counted() -> None:
    now = [0.0]
    f = RepeatFilter(every_s=60, clock=lambda: now[0])
    assert f.filter(_record("connect to 127.0.0.1:%d failed after %dms", 9092, 0))
    for ms in range(1, 200):
        now[0] += 0.05
        assert not f.filter(_record("connect to 127.0.0.1:%d failed after %dms", 9092, ms))
    now[0] = 61.0
    r = _record("connect to 127.0.0.1:%d failed after %dms", 9092, 3)
    assert f.filter(r)
    assert r.getMessage() == "connect to 127.0.0.1:9092 failed after 3ms (and 199 like it in 61s)"
    now[0] = 122.0
    r = _record("connect to 127.0.0.1:%d failed after %dms", 9092, 4)
    assert f.filter(r)
    assert "like it" not in r.getMessage()


def test_different_lines_loggers_and_levels_pass() -> None:
    f = RepeatFilter(every_s=60, clock=lambda: 0.0)
    assert f.filter(_record("relay failed: broker down"))
    assert f.filter(_record("relay failed: topic missing"))
    assert f.filter(_record("relay failed: broker down", name="sco.y"))
    assert f.filter(_record("relay failed: broker down", level=logging.ERROR))
    assert not f.filter(_record("relay failed: broker down"))
    # Numbers in names make other lines; information is never held.
    assert f.filter(_record("partition %s degraded", "p1"))
    assert f.filter(_record("partition %s degraded", "p2"))
    assert f.filter(_record("partition hpc-%d degraded", 3))
    assert f.filter(_record("partition hpc-%d degraded", 4))
    for _ in range(3):
        assert f.filter(_record("plan generation 7", level=logging.INFO))


def test_it_forgets_old_lines_so_its_memory_stays_bounded() -> None:
    now = [0.0]
    f = RepeatFilter(every_s=1, clock=lambda: now[0])
    for i in range(20_000):
        now[0] = i * 0.001
        f.filter(_record(f"line {chr(0x4E00 + i)}"))  # no digits: each its own
    assert len(f._seen) <= 10_001


def test_client_libraries_say_only_warnings_at_info() -> None:
    """An agent long-polls every 30 s: httpx logged each request at INFO (the lab's log
    was mostly "HTTP Request: GET ... 304 Not Modified")."""
    from sco.apps.logs import setup

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        setup("agent", "info")
        for name in ("httpx", "httpcore", "urllib3", "kubernetes", "openstack"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
            assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
        assert logging.getLogger("sco.agent").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
