"""The README stays a short front door and the documentation cannot drift: the
configuration reference is what the settings model accepts, every link lands, every
YAML example is read by what reads such a file, every setting a page names is one
the code reads, and the lists a page gives are the code's. The command lines are
checked in test_docs_commands.py."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from pydantic import BaseModel

from sco.adapters.demandfile.intake import read_demand_file
from sco.adapters.openstack.config import RegionSpec, load_region
from sco.adapters.openstack.resources import server_metadata, server_tags
from sco.apps.cli import cli
from sco.apps.reference import MARKER, reference
from sco.assembly.settings import Settings
from sco.decide.acquirer import Reason
from sco.lab.workload.kubefile import read_kube_workload

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


def fences(page: Path) -> Iterator[tuple[int, str, str]]:
    """(line, language, text) of each fenced block, its indent taken off."""
    text = page.read_text()
    for m in FENCE.finditer(text):
        indent = len(m.group(1))
        body = "".join(line[indent:] for line in m.group(3).splitlines(keepends=True))
        yield text.count("\n", 0, m.start()) + 1, m.group(2), body


def test_the_configuration_reference_is_what_the_settings_model_accepts() -> None:
    written = CONFIGURATION.read_text().partition(MARKER)
    assert written[1], f"{CONFIGURATION}: the generated-reference marker is gone"
    assert MARKER + written[2] == reference(), (
        "docs/configuration.md is out of date: run "
        "`.venv/bin/sco config reference --into docs/configuration.md`"
    )


def test_the_reference_names_every_key_with_its_default_and_environment() -> None:
    text = reference()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", text, re.M)}
    assert "`15.0`" in rows["policy.interval_s"]
    assert "number > 0" in rows["policy.interval_s"]
    # A dataclass knob of the policy, its meaning read from the decision module.
    assert "launch to serving" in rows["policy.hedge.cold_start_s"]
    # Required only when its optional section is given.
    assert "required in `events.kafka`" in rows["events.kafka.brokers"]
    assert "`partitions[].slurm.cpus`" in text
    assert "`slurm.<name>.conf`" in text
    assert "SCO_STATE__URL" in text


def test_config_reference_writes_after_the_marker_and_refuses_a_file_without_one(
    tmp_path: Path,
) -> None:
    page = tmp_path / "conf.md"
    page.write_text(f"# Intro kept\n\n{MARKER}\nstale\n")
    first = CliRunner().invoke(cli, ["config", "reference", "--into", str(page)])
    assert first.exit_code == 0, first.output
    assert page.read_text() == "# Intro kept\n\n" + reference()
    again = CliRunner().invoke(cli, ["config", "reference", "--into", str(page)])
    assert "already current" in again.output
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing generated here\n")
    refused = CliRunner().invoke(cli, ["config", "reference", "--into", str(bare)])
    assert refused.exit_code == 2, refused.output
    assert "no line" in refused.output
    assert bare.read_text() == "# nothing generated here\n"


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: depth goes to docs/"
    head = "\n".join(lines[:60])
    assert "make demo\nmake test" in head, "the quick start's two commands, in the first 60 lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_lands(page: Path) -> None:
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{page.name}: links to nothing: {missing}"


# ---------------------------------------------------------------- YAML examples


# YAML that no sco loader reads: how to tell it, and why it is not checked here.
NOT_READ_BY_SCO: dict[str, Callable[[str, Any], bool]] = {
    "cloud-init user data (a region file's user_data_file): the server's cloud-init "
    "reads it, not sco": lambda text, doc: text.startswith("#cloud-config"),
    "an OpenStack service's policy rules (oslo.policy): Nova or Placement reads them, "
    "not sco": lambda text, doc: (
        isinstance(doc, dict)
        and all(":" in k and str(v).startswith("role:") for k, v in doc.items())
    ),
}


def _config_check(path: Path) -> None:
    done = CliRunner().invoke(cli, ["config", "check", str(path)])
    if done.exit_code != 0:
        raise ValueError(done.output.strip())


def _region_file(path: Path) -> None:
    # A page may show only the part it is about (the pools): the rest is filled in.
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({"region": "doc", "image": "doc", **doc}))
    load_region(path)


def readers(doc: Any) -> list[tuple[str, Callable[[Path], object]]]:
    """What in sco reads a YAML file like `doc`, told by its keys."""
    keys = set(doc) if isinstance(doc, dict) else set()
    found: list[tuple[str, Callable[[Path], object]]] = []
    if keys and keys <= set(Settings.model_fields):
        found.append(("sco.yaml (sco config check)", _config_check))
        if keys == {"partitions"}:
            found.append(("a demand file", lambda path: read_demand_file(path, "doc")))
    if "pools" in keys and keys <= set(RegionSpec.model_fields):
        found.append(("a region file", _region_file))
    if "workloads" in keys and keys <= {"node", "max_nodes", "workloads"}:
        # Within a replay's window, as `sco replay --days 2` reads it: one repeats.
        found.append(("a Kubernetes workload", lambda path: read_kube_workload(path, days=2)))
    if keys == {"metadata", "spec"}:
        found.append(("a pod of a gang (the Kubernetes intake)", _gang_pod))
    return found


def _gang_pod(path: Path) -> None:
    """Three pending copies of the pod, one per node: the intake must tell them a gang,
    with what the page says it reads of them."""
    from sco.adapters.kubernetes.demand import KubePartition, need

    pod = yaml.safe_load(path.read_text())
    pod["metadata"].setdefault("namespace", "doc")
    pod["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pod["status"] = {"phase": "Pending", "conditions": [unschedulable]}
    part = KubePartition(labels={}, allocatable={"cpu": "4", "memory": "8Gi", "pods": "110"})
    got = need([{**pod, "metadata": {**pod["metadata"], "name": f"w{k}"}} for k in range(3)],
               [], part)  # fmt: skip
    if len(got.gangs) != 1 or got.bad_checkpoints:
        raise ValueError(f"not read as one gang: {got.gangs} {got.bad_checkpoints}")


YAML_EXAMPLES = [(p, n, text) for p in PAGES for n, lang, text in fences(p) if lang == "yaml"]


@pytest.mark.parametrize(
    ("page", "line", "text"), YAML_EXAMPLES, ids=[f"{p.name}:{n}" for p, n, _ in YAML_EXAMPLES]
)
def test_every_yaml_example_is_read_by_what_reads_such_a_file(
    page: Path, line: int, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("SCO_")]:
        monkeypatch.delenv(name)  # the example alone, not this shell's settings
    doc = yaml.safe_load(text)
    for why, it_is in NOT_READ_BY_SCO.items():
        if it_is(text, doc):
            pytest.skip(f"{page.name}:{line}: {why}")
    found = readers(doc)
    assert found, (
        f"{page.name}:{line}: YAML this test cannot tell (keys {sorted(doc or ())}): check it "
        "with what reads it in readers(), or say in NOT_READ_BY_SCO what it is and who reads it"
    )
    for what, read in found:
        path = tmp_path / "example.yaml"
        path.write_text(text)
        try:
            read(path)
        except ValueError as e:
            pytest.fail(f"{page.name}:{line}: not valid as {what}: {e}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_an_example_sco_reads_is_fenced_as_yaml(page: Path) -> None:
    """What is not in a ```yaml fence is not checked above."""
    for line, lang, text in fences(page):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        assert lang == "yaml" or not readers(doc), f"{page.name}:{line}: fence it as ```yaml"


# ---------------------------------------------------------------- settings a page names


def _section(annotation: Any) -> tuple[str, type] | None:
    """The section a field holds (a model or a dataclass: alone, optional, in a list as
    `[]` or as a map's values as `.<name>`), or None for a value."""
    t, head = annotation, ""
    while True:
        origin, args = typing.get_origin(t), typing.get_args(t)
        values = [a for a in args if a is not type(None)]
        if origin in (typing.Union, types.UnionType) and len(values) == 1:
            t = values[0]
        elif origin is list:
            t, head = args[0], head + "[]"
        elif origin is dict:
            t, head = args[1], head + ".<name>"
        else:
            break
    if isinstance(t, type) and (issubclass(t, BaseModel) or dataclasses.is_dataclass(t)):
        return head, t
    return None


def settings_keys(cls: type = Settings, prefix: str = "") -> dict[str, type]:
    """Every key of sco.yaml, sections too (`policy.hedge`, `partitions[].slurm.cpus`,
    `slurm.<name>.conf`), with the class that declares it."""
    if issubclass(cls, BaseModel):
        fields = {n: f.annotation for n, f in cls.model_fields.items()}
    else:
        hints = typing.get_type_hints(cls)
        fields = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    out: dict[str, type] = {}
    for name, annotation in fields.items():
        out[prefix + name] = cls
        inner = _section(annotation)
        if inner is not None:
            out.update(settings_keys(inner[1], f"{prefix}{name}{inner[0]}."))
    return out


def attribute_reads() -> list[tuple[Path, str]]:
    """(file, attribute) of every attribute read in src/sco, but in pydantic validators
    and in the reference generator, which read every field without using it."""
    reads: list[tuple[Path, str]] = []
    for path in sorted((ROOT / "src" / "sco").rglob("*.py")):
        if path == ROOT / "src" / "sco" / "apps" / "reference.py":
            continue
        tree = ast.parse(path.read_text())
        validators = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and any("validator" in ast.unparse(d) for d in node.decorator_list)
            for inner in ast.walk(node)
        }
        reads += [
            (path, node.attr)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and id(node) not in validators
        ]
    return reads


def named_settings() -> dict[str, set[str]]:
    """Settings in backticks on every page (`policy.interval_s`, `partitions[0].floor_units`,
    and the generated reference's rows), with the pages naming each."""
    found: dict[str, set[str]] = {}
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", page.read_text()):
            m = re.match(r"[a-z_]+(?:\[\d*\])?(?:\.[\w<>\[\]-]+)+", span)
            if m and re.split(r"[.\[]", m.group(0))[0] in Settings.model_fields:
                found.setdefault(m.group(0), set()).add(page.name)
    return found


def test_every_setting_a_page_names_is_one_the_code_reads() -> None:
    """A setting nothing reads is a promise nothing keeps (`policy.score_every_s` was the
    default of `sco score --every`, which never read it). A setting of the settings model
    (sco.assembly) can be read only in the layers that import it, apps and assembly; a
    dataclass of a lower layer's (the hedge, the controller), in any."""
    keys = settings_keys()
    written = {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", reference(), re.M)}
    assert written <= set(keys), f"keys this test does not walk: {written - set(keys)}"
    patterns = {
        k: re.compile(re.escape(k).replace(r"\[\]", r"(?:\[\d*\])?").replace("<name>", "[^.]+"))
        for k in keys
    }
    reads = attribute_reads()
    unknown, unread = [], []
    for name, pages in sorted(named_settings().items()):
        bare = name.removesuffix(".<name>")  # a map of sections (`slurm.<name>`): the map
        key = next((k for k, pattern in patterns.items() if pattern.fullmatch(bare)), None)
        if key is None:
            unknown.append(f"{name} ({', '.join(sorted(pages))})")
            continue
        owner = keys[key]
        leaf = key.replace("[]", "").split(".")[-1]
        src = ROOT / "src" / "sco"
        where = (
            [src / "apps", src / "assembly"]
            if owner.__module__.startswith("sco.assembly")
            else [src]
        )
        if not any(a == leaf and any(p.is_relative_to(w) for w in where) for p, a in reads):
            unread.append(f"{name} ({', '.join(sorted(pages))})")
    assert not unknown, f"settings the pages name that sco.yaml does not have: {unknown}"
    assert not unread, f"settings the pages name that no code reads: {unread}"


# ---------------------------------------------------------------- lists a page gives


def test_the_reason_codes_listed_are_the_codes() -> None:
    text = (ROOT / "docs" / "control-plane.md").read_text()
    listed = re.search(r"`sco\.decide\.acquirer\.Reason`:([^)]*)\)", text)
    assert listed, "docs/control-plane.md no longer lists the reason codes"
    assert set(re.findall(r"`(\w+)`", listed.group(1))) == {r.value for r in Reason}


def _leaves(group: click.Group = cli, path: str = "sco") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name in group.list_commands(click.Context(group)):
        cmd = group.get_command(click.Context(group), name)
        assert cmd is not None
        if isinstance(cmd, click.Group):
            out.update(_leaves(cmd, f"{path} {name}"))
        else:
            out[f"{path} {name}"] = cmd
    return out


def test_configuration_says_which_commands_take_config() -> None:
    text = " ".join(CONFIGURATION.read_text().split("\n\n")[1].split())
    taking, found, others = text.partition("The others take no `--config`")
    assert found, "docs/configuration.md: its first paragraph says which commands take --config"

    def named(part: str) -> set[str]:
        return set(re.findall(r"`(sco [a-z][a-z -]*[a-z])(?: [A-Z]+)?`", part))

    with_config = {
        name
        for name, cmd in _leaves().items()
        if any("--config" in p.opts for p in cmd.params if isinstance(p, click.Option))
    }
    assert named(taking) == with_config
    assert named(others) == set(_leaves()) - with_config


def test_the_openstack_page_names_every_tag_and_metadata_key_sco_writes() -> None:
    page = (ROOT / "docs" / "openstack.md").read_text()
    tags = [t.split("=")[0] + "=<" if "=" in t else t for t in server_tags("p", "r", "i")]
    keys = server_metadata("p", "r1/h/f", "spot", "r", 1, "i")
    missing = [t for t in tags if f"`{t}" not in page] + [k for k in keys if f"`{k}`" not in page]
    assert not missing, f"docs/openstack.md does not name: {missing}"


def test_every_bench_in_reliability_names_its_test_tier() -> None:
    rows = re.findall(
        r"^\| `bench/(\w+)\.py` \|.*\| (.*) \|$",
        (ROOT / "docs" / "reliability.md").read_text(),
        re.M,
    )
    assert rows
    for stem, tier in rows:
        tests = re.findall(r"`(tests/\w+\.py)", tier)
        assert tests, f"bench/{stem}.py: no test tier named ({tier!r})"
        for name in tests:
            assert (ROOT / name).exists(), f"bench/{stem}.py: {name} does not exist"
        runs = [
            n for n in tests if re.search(rf'{stem}\.py|bench\("{stem}"\)', (ROOT / n).read_text())
        ]
        assert runs, f"bench/{stem}.py: none of {tests} runs it"
