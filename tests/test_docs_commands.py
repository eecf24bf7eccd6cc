"""Every `sco` command line in README.md and docs/ is one the CLI takes: its command
chain resolves, every option it names is that command's and has its value, and it
gives no argument the command does not take. Read with click's own parser, command by
command, in the fences (`sco ...`, `$ sco ...`, `.venv/bin/sco ...`, also after `;`,
`|`, `do`) and in inline code that starts with `sco ` (there an option may be named
without its value). Placeholders stay as words (`PARTITION`, `<id>`); `...` and the
brackets of optional parts are dropped; `conf|usage` in inline code is either; a
placeholder where a command goes (`sco COMMAND --help`) is every command there."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from sco.apps.cli import cli
from sco_harness import lab_plane

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
SCO = {"sco", ".venv/bin/sco"}
SEPARATORS = {";", "|", "||", "&&", "&", "(", ")", "$(", "`"}
SHELL_WORDS = {"do", "then", "else", "exec", "time", "!"}
# The commands that keep running, serving a port of `http` (`sco score` only with --every).
LONG_RUNNING = {"run", "watch", "score", "history load", "distributor", "status"}


class Line:
    """An `sco` command line as a page gives it: where, and its words after `sco`."""

    def __init__(self, page: Path, line: int, words: list[str], inline: bool, lab: bool):
        self.where = f"{page.name}:{line}"
        self.words, self.inline, self.lab = words, inline, lab

    def __repr__(self) -> str:
        return f"{self.where}: sco {' '.join(self.words)}"


def _words(text: str) -> list[str]:
    """Placeholders kept as one word, optional parts' brackets and `...` dropped."""
    text = re.sub(r"<[^<>\n]*>", "PLACEHOLDER", text)
    out = []
    for word in shlex.split(text, comments=True):
        bare = word.strip("[]")
        if bare and bare not in {"...", "…"}:
            out.append(bare)
    return out


def _commands_in(shell: str) -> Iterator[list[str]]:
    """The `sco` commands in a shell line, each as its words after `sco`."""
    lexer = shlex.shlex(re.sub(r"<[^<>\n]*>", "PLACEHOLDER", shell), posix=True,
                        punctuation_chars=";&|()`")  # fmt: skip
    lexer.whitespace_split = True
    segment: list[str] = []
    for token in [*lexer, ";"]:
        if token not in SEPARATORS and not set(token) <= set(";&|()`"):
            segment.append(token)
            continue
        while segment and (segment[0] in SHELL_WORDS or re.fullmatch(r"\w+=\S*", segment[0])):
            segment.pop(0)
        if segment and segment[0] in SCO:
            yield _words(shlex.join(segment[1:]))
        segment = []


def command_lines() -> Iterator[Line]:
    for page in PAGES:
        text = page.read_text()
        lab = False  # once a page has sourced .lab/env, its commands run on the lab's sco.yaml
        for m in FENCE.finditer(text):
            first = text.count("\n", 0, m.start()) + 2
            logical = re.sub(r"\\\n", " ", m.group(3))  # continuation lines
            for n, raw in enumerate(logical.splitlines()):
                shell = raw.strip().removeprefix("$ ")
                lab = lab or bool(re.match(r"(\.|source) \.lab/env\b", shell))
                for words in _commands_in(shell):
                    yield Line(page, first + n, words, False, lab)
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in re.finditer(r"`((?:\.venv/bin/)?sco [^`]+)`", prose):
            line = prose.count("\n", 0, m.start()) + 1
            words = _words(" ".join(m.group(1).split()).split(" ", 1)[1])
            choices = [w.split("|") if "|" in w and not w.startswith("-") else [w] for w in words]
            for each in itertools.product(*choices):
                yield Line(page, line, list(each), True, False)


LINES = list(command_lines())


def resolve(line: Line) -> list[tuple[str, dict[str, object]]]:
    """The commands a line names (`history load`) with the options given, parsed by
    click; raises click.UsageError where the CLI would refuse it."""
    return list(_resolve(cli, click.Context(cli, info_name="sco"), line.words, "", line.inline))


def _resolve(
    cmd: click.Command, ctx: click.Context, words: list[str], path: str, inline: bool
) -> Iterator[tuple[str, dict[str, object]]]:
    try:
        opts, rest, _ = cmd.make_parser(ctx).parse_args(list(words))
    except click.BadOptionUsage as e:
        if not (inline and "requires an argument" in str(e)):
            raise
        # Inline code may name an option without its value (`sco run --state`).
        opts, rest, _ = cmd.make_parser(ctx).parse_args([*words, "VALUE"])
    if not isinstance(cmd, click.Group):
        if rest:
            raise click.UsageError(f"`sco {path}` takes no argument {rest[0]!r}")
        yield path, opts
        return
    if not rest:  # a group alone (`sco lab`), or with --help
        return
    name, words = rest[0], rest[1:]
    names = cmd.list_commands(ctx) if re.fullmatch(r"[A-Z][A-Z_]*", name) else [name]
    for each in names:
        sub = cmd.get_command(ctx, each)
        if sub is None:
            raise click.UsageError(f"`sco {path}` has no command {each!r}".replace("  ", " "))
        sub_ctx = click.Context(sub, parent=ctx, info_name=each)
        yield from _resolve(sub, sub_ctx, words, f"{path} {each}".strip(), inline)


def test_the_pages_have_command_lines() -> None:
    found = {line.where.split(":")[0] for line in LINES}
    assert {"README.md", "control-plane.md", "evaluation.md", "slurm.md"} <= found, found
    assert any(line.inline for line in LINES)
    assert any(not line.inline for line in LINES)


@pytest.mark.parametrize("line", LINES, ids=repr)
def test_every_command_line_parses_against_the_cli(line: Line) -> None:
    try:
        resolve(line)
    except click.UsageError as e:
        pytest.fail(f"{line!r}: {e.format_message()}")


def test_no_page_starts_a_process_on_the_ports_make_lab_holds() -> None:
    """`make lab` runs the control plane on .lab/sco.yaml: a long-running command started
    beside it on that file needs a port of its own."""
    base = lab_plane.BASE
    held = {*lab_plane.ports(base).values(), *lab_plane.http_section(base).values()}
    held |= set(lab_plane.openbao_ports(base))
    clashing = []
    for line in LINES:
        if line.inline:
            continue
        for path, opts in resolve(line):
            config = opts.get("config")  # given, it is the file; else SCO_CONFIG's
            on_lab = str(config).startswith(".lab/") if config else line.lab
            if path not in LONG_RUNNING or not on_lab or (path == "score" and "every" not in opts):
                continue
            ports = [v for k, v in opts.items() if "port" in k]
            if not ports or any(str(p) in {str(h) for h in held} for p in ports):
                clashing.append(repr(line))
    assert not clashing, f"on the lab's ports (make lab holds {sorted(held)}): {clashing}"
