"""Operators' files that parse but do not fit: the field as written and a sentence, with
what was most likely meant (issue 28's "did you mean")."""

from __future__ import annotations

from pathlib import Path

import pytest

from sco.assembly.settings import SettingsError, load
from sco.domain.words import closest, unknown
from sco_harness.builders import write_yaml


@pytest.mark.parametrize(
    ("word", "meant"),
    [
        ("stat", "state"),
        ("intervl_s", "interval_s"),
        ("Interval-S", "interval_s"),  # case and '-' for '_'
        ("slrum", "slurm"),
        ("zzz", None),  # nothing near: no guess
    ],
)
def test_closest_names_what_was_meant_or_nothing(word: str, meant: str | None) -> None:
    assert closest(word, ["state", "interval_s", "slurm", "kubernetes"]) == meant


def test_unknown_lists_the_known_names_sorted() -> None:
    assert unknown("policy", "sko", ["sco", "cheapest"]) == (
        "unknown policy 'sko'; did you mean 'sco'? (known: cheapest, sco)"
    )
    assert unknown("x", "q", ["a"]) == "unknown x 'q' (known: a)"


def _error(tmp_path: Path, doc: dict[str, object]) -> str:
    with pytest.raises(SettingsError) as e:
        load(write_yaml(tmp_path / "sco.yaml", doc))
    return str(e.value).removeprefix(f"{tmp_path / 'sco.yaml'}: ")


SLURM = {"partitions": ["batch"], "cpus": 8, "memory_mb": 32000}


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"stat": {}}, "stat: unknown field 'stat'; did you mean 'state'?"),
        ({"state": {"ulr": "x"}}, "state.ulr: unknown field 'ulr'; did you mean 'url'?"),
        (  # in a list's item, and told before the field it misspells is missed
            {"partitions": [{"name": "a", "kind": "slurm", "target_untis": 1}]},
            "partitions[0].target_untis: unknown field 'target_untis'; "
            "did you mean 'target_units'?",
        ),
        (  # in a section under a name of the operator's
            {"slurm": {"main": {"conff": "/etc/slurm.conf"}}},
            "slurm.main.conff: unknown field 'conff'; did you mean 'conf'?",
        ),
        (  # in an optional section
            {"partitions": [{"name": "a", "kind": "slurm", "demand": "slurm",
                             "target_units": 1, "floor_units": 0, "max_units": 2,
                             "slurm": {**SLURM, "cpu": 8}}]},
            "partitions[0].slurm.cpu: unknown field 'cpu'; did you mean 'cpus'?",
        ),
        (
            {"partitions": [{"name": "a", "kind": "slrum", "target_units": 1, "max_units": 2}]},
            "partitions[0].kind: unknown value 'slrum'; did you mean 'slurm'? "
            "(known: kubernetes, slurm)",
        ),
        ({"policy": {"name": "sko"}}, "policy.name: unknown policy 'sko'; did you mean 'sco'?"),
        (
            {"partitions": [{"name": "bad name!", "kind": "slurm", "target_units": 1,
                             "max_units": 2}]},
            "partitions[0].name: 'bad name!' is not a valid name: use letters, digits, '_', "
            "'.' and '-', starting with a letter or digit",
        ),
        (
            {"installation": "Prod_1"},
            "installation: 'Prod_1' is not a valid name: use lowercase letters, digits and "
            "'-', starting and ending with a letter or digit",
        ),
    ],
)  # fmt: skip
def test_a_file_that_does_not_fit_says_the_field_and_what_was_meant(
    tmp_path: Path, doc: dict[str, object], said: str
) -> None:
    assert _error(tmp_path, doc).startswith(said)
