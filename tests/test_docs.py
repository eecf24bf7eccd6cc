"""The README stays a short front door and the documentation cannot drift: the
configuration reference is what the settings model accepts, and every link lands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sco.apps.cli import cli
from sco.apps.reference import MARKER, reference

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "configuration.md"


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


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_every_relative_link_lands(page: Path) -> None:
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{page.name}: links to nothing: {missing}"
