"""Values to fuzz with: arbitrary JSON-like documents, the awkward scalars parsers trip
on, mutations of a valid document, and the bytes of a file holding one.

A case is most often a valid document with a few things changed (a key dropped, a
value of another type, a number too large, a string no one expected): that reaches
past the first check of a parser, where arbitrary data would stop.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from hypothesis import strategies as st

Path_ = tuple[object, ...]  # keys and indices from the root of a document

# Numbers that break arithmetic, conversions and comparisons.
AWKWARD_NUMBERS: tuple[object, ...] = (
    0,
    1,
    -1,
    2,
    3,
    7,
    60,
    2**31,
    2**53 + 1,
    2**63,
    2**64 + 1,
    10**30,
    -(10**30),
    10**400,
    0.5,
    -0.0,
    -1.5,
    1e-300,
    1e308,
    math.nan,
    math.inf,
    -math.inf,
    True,
    False,
)
# Strings that look like something else: numbers, digits int() refuses, dates,
# paths, separators, markup, and the characters that end or split things.
AWKWARD_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "0",
    "-1",
    "1.5",
    "1e400",
    "-1e400",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "²",
    "٣",
    "١٢",
    "1.2.3",
    "0x10",
    "1_000",
    "99999999999999999999999999",
    "1" * 5000,
    "a/b",
    "a,b",
    "a:b",
    "a=b",
    "/",
    "\x00",
    "\x85",
    "\u2028",
    "\ufeff",
    "🙂",
    "null",
    "true",
    "~",
    "00:00",
    "24:00",
    "23:60",
    "-1:30",
    "12:00:00",
    "1970-01-01T00:00:00",
    "2024-02-30T00:00:00",
    "0001-01-01T00:00:00+01:00",
    "0001-01-01T00:30:00+23:59",
    "9999-12-31T23:59:59-23:59",
    "9999-12-31T23:59:59.999999",
    "2024-01-01T00:00:00Z",
    "2024-01-01 00:00:00",
    "../../etc",
    "~/x",
    "%s%n",
    "{",
    "[",
    "}",
    "*a",
    "&a",
    "!!python/object:os.system",
    "x" * 300,
    "sqlite:///",
    "sqlite:///:memory:",
    "chdb://",
    "postgresql+psycopg://u:p@h/db",
    "http://u:secret@h:1/",
    "Bearer ",
    "W/",
    '"1"',
)
# Lone surrogates: a JSON document may carry them escaped (\\ud800), never as UTF-8.
SURROGATES: tuple[str, ...] = ("\ud800", "a\udfffb")


def scalars(surrogates: bool = False) -> st.SearchStrategy[object]:
    strings: st.SearchStrategy[str] = st.text(max_size=12) | st.sampled_from(AWKWARD_STRINGS)
    if surrogates:
        strings = strings | st.sampled_from(SURROGATES)
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**66), 2**66),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(AWKWARD_NUMBERS),
        strings,
    )


def keys(vocabulary: Sequence[str]) -> st.SearchStrategy[str]:
    """Keys a document of this kind has (most often), or any other."""
    known = st.sampled_from(list(vocabulary)) if vocabulary else st.nothing()
    return known | st.text(max_size=10) | st.sampled_from(AWKWARD_STRINGS[:20])


def documents(
    vocabulary: Sequence[str] = (), surrogates: bool = False, max_leaves: int = 10
) -> st.SearchStrategy[Any]:
    """Any JSON-like document: null, booleans, numbers, strings, lists and mappings."""
    return st.recursive(
        scalars(surrogates),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(keys(vocabulary), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def paths(doc: Any) -> list[Path_]:
    """Every node of a document, the root first."""
    out: list[Path_] = []
    todo: list[tuple[Path_, Any]] = [((), doc)]
    while todo:
        prefix, node = todo.pop()
        out.append(prefix)
        if isinstance(node, dict):
            todo += [((*prefix, k), v) for k, v in node.items()]
        elif isinstance(node, list):
            todo += [((*prefix, i), v) for i, v in enumerate(node)]
    return out


def _at(doc: Any, path: Path_) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _put(doc: Any, path: Path_, value: Any) -> Any:
    if not path:
        return value
    _at(doc, path[:-1])[path[-1]] = value
    return doc


def _drop(doc: Any, path: Path_) -> Any:
    if not path:
        return None
    parent = _at(doc, path[:-1])
    del parent[path[-1]]
    return doc


MUTATIONS = (
    "replace",
    "awkward",
    "drop",
    "add",
    "wrap",
    "empty",
    "repeat",
    "retype",
)


@st.composite
def mutated(
    draw: st.DrawFn,
    valid: st.SearchStrategy[Any],
    vocabulary: Sequence[str] = (),
    most: int = 3,
    surrogates: bool = False,
) -> Any:
    """A valid document with up to `most` mutations (none, at times: the valid
    document itself is a case too)."""
    doc = copy.deepcopy(draw(valid))
    for _ in range(draw(st.integers(0, most))):
        path = draw(st.sampled_from(paths(doc)))
        node = _at(doc, path)
        op = draw(st.sampled_from(MUTATIONS))
        if op == "replace":
            doc = _put(doc, path, draw(documents(vocabulary, surrogates, max_leaves=4)))
        elif op == "awkward":
            doc = _put(doc, path, draw(scalars(surrogates)))
        elif op == "drop":
            doc = _drop(doc, path)
        elif op == "add" and isinstance(node, dict):
            node[draw(keys(vocabulary))] = draw(documents(vocabulary, surrogates, max_leaves=3))
        elif op == "add" and isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(documents(vocabulary, surrogates, 3)))
        elif op == "wrap":
            wrapped = [node] if draw(st.booleans()) else {draw(keys(vocabulary)): node}
            doc = _put(doc, path, wrapped)
        elif op == "empty":
            doc = _put(doc, path, draw(st.sampled_from([{}, [], "", None, 0])))
        elif op == "repeat" and isinstance(node, list) and node:
            node.extend(copy.deepcopy(node) * draw(st.integers(1, 3)))
        elif op == "retype":
            doc = _put(doc, path, _retyped(node, draw(st.integers(0, 3))))
    if draw(st.integers(0, 15)) == 0:
        # Nested deep, below what serialising it allows (the file's text nests deeper).
        path = draw(st.sampled_from(paths(doc)))
        nest: Any = _at(doc, path)
        for _ in range(draw(st.sampled_from([20, 150]))):
            nest = [nest]
        doc = _put(doc, path, nest)
    return doc


def _retyped(node: Any, how: int) -> Any:
    """The same value as another JSON type: "3" for 3, 3 for "3", 3.0 for 3, [x]..."""
    if isinstance(node, bool):
        return [int(node), str(node).lower(), None, [node]][how]
    if isinstance(node, int | float):
        as_float = float(node) if abs(node) < 2**1023 else math.inf if node > 0 else -math.inf
        return [str(node), as_float, bool(node), [node]][how]
    if isinstance(node, str):
        conversions: list[Callable[[str], Any]] = [
            lambda s: int(s) if s.isascii() and s.isdigit() else len(s),
            lambda s: float(len(s)),
            lambda s: s.split(","),
            lambda s: {s: s},
        ]
        return conversions[how](node)
    if isinstance(node, list):
        return [dict(enumerate(node)), ",".join(map(str, node)), len(node), None][how]
    if isinstance(node, dict):
        return [list(node.values()), list(node), str(node), None][how]
    return [0, "", [], {}][how]


# ---------------------------------------------------------------- files

JUNK: tuple[bytes, ...] = (
    b"\xff",
    b"\xc3",
    b"\x00",
    b"\t",
    b"\r",
    b"\n",
    b"\xef\xbb\xbf",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"!!python/object/apply:os.system ",
    b"!!float ",
    b"{",
    b"[",
    b"]",
    b"}",
    b": ",
    b"- ",
    b"\n  ",
    b"---\n",
    b"...\n",
    b"%YAML 1.1\n",
    b"? ",
    b"|\n",
    b"'",
    b'"',
    b",",
    b"#",
    b"\\u0000",
    b"1e400",
    b"NaN",
    b"-Infinity",
)


def dump_yaml(doc: Any) -> bytes:
    try:
        return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode(
            "utf-8", "surrogatepass"
        )
    except (yaml.YAMLError, RecursionError, ValueError):
        return dump_json(doc)


def dump_json(doc: Any) -> bytes:
    try:
        return json.dumps(doc).encode()
    except (RecursionError, ValueError):
        return b"[]"


@st.composite
def file_bytes(draw: st.DrawFn, doc: Any, dump: Callable[[Any], bytes] = dump_yaml) -> bytes:
    """The file of a document, now and then spoilt as text: cut short, bytes put in
    (invalid UTF-8, YAML markup, a BOM), nested deep, or replaced by noise."""
    data = dump(doc)
    how = draw(st.sampled_from(["as is"] * 6 + ["cut", "insert", "deep", "noise", "json"]))
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "insert":
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(data)))
            junk = draw(st.sampled_from(JUNK) | st.binary(min_size=1, max_size=6))
            data = data[:at] + junk + data[at:]
    elif how == "deep":
        depth = draw(st.sampled_from([100, 1100, 2500]))
        opener = draw(st.sampled_from([b"[", b"{a: ", b"- "]))
        data = opener * depth + data
    elif how == "noise":
        data = draw(st.binary(max_size=200))
    elif how == "json":
        data = dump_json(doc)
    return data
