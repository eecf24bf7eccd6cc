"""What a file that parsed but does not fit its model says to its operator: the field as
they wrote it (`partitions[1].floor_units`) and a sentence, with the field or value
they most likely meant when they wrote one that does not exist.

Every reader of an operator's file (sco.yaml, demand, region and workload files)
explains pydantic's first error here, so all of them speak alike."""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sco.domain.words import unknown

# What a name pattern of ours allows, said as a sentence.
PATTERNS = {
    r"^[A-Za-z0-9][A-Za-z0-9_.-]*$": "letters, digits, '_', '.' and '-', "
    "starting with a letter or digit",
    r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$": "lowercase letters, digits and '-', "
    "starting and ending with a letter or digit",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "letters, digits and '_', not starting with a digit",
}
# pydantic's names for a union's branches, which say nothing to a user.
_BRANCH = re.compile(r"^(int|float|str|constrained-\w+|function-.*|_\w+)$")


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a user writes it: `partitions[1].floor_units`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _BRANCH.match(part):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "file"


def first(e: ValidationError) -> ErrorDetails:
    """The error to tell: an unknown field before the rest (a misspelt field is also
    a missing one, and the misspelling is the news)."""
    errors = e.errors()
    return next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])


def explain(e: ValidationError, model: type[BaseModel]) -> tuple[str, str]:
    """The error to tell as (field, sentence)."""
    err = first(e)
    loc = tuple(err["loc"])
    kind, given = err["type"], err.get("input")
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden" and loc and isinstance(loc[-1], str):
        names = _field_names(model, loc[:-1])
        msg = unknown("field", loc[-1], names) if names else "unknown field"
    elif kind in ("literal_error", "enum") and isinstance(given, str):
        options = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        if options:
            msg = unknown("value", given, options)
    elif kind == "string_pattern_mismatch" and isinstance(given, str):
        pattern = str(err.get("ctx", {}).get("pattern", ""))
        allowed = PATTERNS.get(pattern, f"must match {pattern}")
        msg = f"{given!r} is not a valid name: use {allowed}"
    return field_path(loc), msg


def _field_names(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The fields a file may give at `loc` in `model` (empty if it cannot be told)."""
    at: Any = model
    for part in loc:
        at = _step(at, part)
        if at is None:
            return []
    found = _models(at)
    return [f.alias or name for name, f in found[0].model_fields.items()] if found else []


def _step(tp: Any, part: int | str) -> Any:
    for option in _options(tp):
        origin = get_origin(option)
        if isinstance(part, int) and origin in (list, tuple, Sequence):
            return get_args(option)[0]
        if isinstance(part, str):
            if origin in (dict, Mapping):
                return get_args(option)[1]
            for m in _models(option):
                if part in m.model_fields:
                    return m.model_fields[part].annotation
                if part == m.__name__:  # a union branch's name
                    return m
    return None


def _options(tp: Any) -> list[Any]:
    """A type's alternatives: Optional and unions opened, Annotated taken off."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _options(get_args(tp)[0])
    if origin is Union or isinstance(tp, types.UnionType):
        return [o for arg in get_args(tp) for o in _options(arg)]
    return [tp]


def _models(tp: Any) -> list[type[BaseModel]]:
    return [o for o in _options(tp) if isinstance(o, type) and issubclass(o, BaseModel)]
