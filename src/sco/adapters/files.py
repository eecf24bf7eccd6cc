"""Reading the files an operator gives sco (YAML, JSON, CSV text): every way a file
can be unreadable becomes one `UnreadableFile` saying why, which each reader turns
into its own error naming the file (`SettingsError`, `RegionFileError`,
`DemandFileError`, `TraceError`).

What this covers beyond a missing file and a syntax error: a folder or a file that
cannot be opened, bytes that are not UTF-8, nesting deeper than the parser's
recursion allows, and the built-in errors PyYAML's constructors raise for a
malformed scalar (`!!float ''` is an IndexError, `2024-02-30` a ValueError, an
integer of more than 4,300 digits a ValueError, `!!bool x` a KeyError).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


class UnreadableFile(ValueError):
    """A file that cannot be read as its format; `reason` says why, without the path."""

    def __init__(self, reason: str, missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing = missing  # the file does not exist


# What PyYAML's safe constructors raise, besides YAMLError, for a scalar they cannot
# build (see the module's docstring).
_CONSTRUCTOR_ERRORS = (ValueError, LookupError, AttributeError, TypeError, OverflowError)


def read_text(path: Path) -> str:
    """The file's text (UTF-8); raises UnreadableFile."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UnreadableFile("no such file", missing=True) from None
    except OSError as e:
        raise UnreadableFile(f"cannot be read: {e.strerror or type(e).__name__}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFile(f"not UTF-8 text (byte {e.start} is {data[e.start]:#04x})") from None


def parse_yaml(text: str) -> Any:
    """One YAML document; raises UnreadableFile("not YAML: ...")."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UnreadableFile(f"not YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise UnreadableFile("not YAML: nested too deeply") from None
    except _CONSTRUCTOR_ERRORS as e:
        raise UnreadableFile(
            f"not YAML: a value cannot be read ({type(e).__name__}: {e})"
        ) from None


def read_yaml(path: Path) -> Any:
    """The document in a YAML file; raises UnreadableFile."""
    return parse_yaml(read_text(path))


def read_json(path: Path) -> Any:
    """The document in a JSON file; raises UnreadableFile."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UnreadableFile(f"not JSON: {e}") from None
    except RecursionError:
        raise UnreadableFile("not JSON: nested too deeply") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise UnreadableFile(f"not JSON: {e}") from None
