"""The house rules no linter knows, read off the source itself:

- one builder: only `sco.engine.builder` makes partition controllers, replica runners,
  round runners and the executors their calls and cycles run on, so what the lab
  proves is what `sco run` runs;
- no placeholders: no `NotImplementedError` in `src/` but in an abstract port;
- no file of the product over 500 lines.

The import layers and contracts are `lint-imports`' (pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "sco"
BUILDER = SRC / "engine" / "builder.py"
MADE_BY_THE_BUILDER = {
    "PartitionController",
    "ReplicaRunner",
    "RealtimeRunner",
    "InlineCalls",
    "ThreadPoolExecutor",
}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _called(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in MADE_BY_THE_BUILDER:
                out.append((name, node.lineno))
    return out


def test_only_the_builder_makes_runners_controllers_and_executors() -> None:
    made = {
        f"{path.relative_to(SRC)}:{line} {name}"
        for path in _sources()
        if path != BUILDER
        for name, line in _called(ast.parse(path.read_text()))
    }
    assert not made, sorted(made)
    assert {name for name, _ in _called(ast.parse(BUILDER.read_text()))} >= {
        "PartitionController",
        "ReplicaRunner",
        "RealtimeRunner",
        "InlineCalls",
        "ThreadPoolExecutor",
    }


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "Protocol")
        or (isinstance(b, ast.Attribute) and b.attr == "Protocol")
        for b in cls.bases
    )


def test_no_placeholder_stands_in_for_a_part_that_exists() -> None:
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        protocols = {
            id(n)
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef) and _is_protocol(cls)
            for n in ast.walk(cls)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and id(node) not in protocols:
                exc = node.exc
                name = exc.func if isinstance(exc, ast.Call) else exc
                if isinstance(name, ast.Name) and name.id == "NotImplementedError":
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def test_no_product_file_is_over_500_lines() -> None:
    """A file that outgrows 500 lines holds more than one thing (STYLE.md): split it by
    what its parts are for before adding to it."""
    long = {
        str(path.relative_to(SRC)): n
        for path in _sources()
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, long
