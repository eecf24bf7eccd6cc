"""The signal processes: `sco watch`, `sco score` and `sco history load`, each a
process (`sco.apps.process`) around its loop (`sco.assembly.signals`)."""

from __future__ import annotations

from contextlib import AbstractContextManager

import click

from sco.apps.process import Process, process
from sco.assembly import signals
from sco.assembly.settings import Settings


def _say(text: str) -> None:
    click.echo(text, err=True)


def _process(component: str, settings: Settings, port: int, verbose: int) -> signals.Process:
    def enter() -> AbstractContextManager[Process]:
        return process(component, settings, port, verbose)

    return enter


def watch(settings: Settings, verbose: int = 0) -> None:
    """The exclusion watcher, until stopped."""
    signals.watch(settings, _process("watch", settings, settings.http.watch_port, verbose), _say)


def load_history(settings: Settings, verbose: int = 0, score_every_s: float | None = None) -> None:
    """The history loader, until stopped; with `score_every_s`, the scorer too."""
    port = settings.http.history_port
    signals.load_history(
        settings, _process("history-load", settings, port, verbose), _say, score_every_s
    )


def score(settings: Settings, every_s: float | None, verbose: int = 0) -> int:
    """Score pools once, or every `every_s` until stopped; returns generations written."""
    port = settings.http.score_port if every_s else 0
    return signals.score(settings, every_s, _process("score", settings, port, verbose), _say)
