"""What every command that reads `sco.yaml` shares: the `--config` option, loading
the settings, and turning start-up errors into a one-line refusal (exit 2)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from sco.apps.common import BadInput, state_url
from sco.assembly.settings import Settings, SettingsError, load
from sco.assembly.wiring import StartError

F = TypeVar("F", bound=Callable[..., Any])


def config_option(fn: F) -> F:
    return click.option(
        "--config",
        "config",
        type=click.Path(path_type=Path),
        envvar="SCO_CONFIG",
        default=None,
        help="sco.yaml (default: $SCO_CONFIG; without one, defaults and SCO_* variables).",
    )(fn)


def settings_of(config: Path | None, overrides: dict[str, Any]) -> Settings:
    try:
        return load(config, overrides)
    except SettingsError as e:
        raise BadInput(str(e)) from None


@contextmanager
def start_errors() -> Iterator[None]:
    try:
        yield
    except StartError as e:
        raise BadInput(str(e)) from None


def verbose_level() -> int:
    ctx = click.get_current_context()
    return int((ctx.find_root().params or {}).get("verbose") or 0)


def state_override(settings_state: str | None) -> str | None:
    return state_url(settings_state, must_exist=False) if settings_state else None
