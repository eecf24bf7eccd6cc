"""Every input kind sco reads, as fuzzing targets."""

from __future__ import annotations

from sco_harness.fuzz import AppHooks, Target
from sco_harness.fuzz.api import api_target
from sco_harness.fuzz.cloud import cloud_target
from sco_harness.fuzz.files import config_target, demand_target, region_target, traces_target
from sco_harness.fuzz.schedulers import kube_target, slurm_target
from sco_harness.fuzz.streams import events_target


def targets(hooks: AppHooks) -> list[Target]:
    return [
        config_target(hooks),
        region_target(),
        demand_target(),
        traces_target(),
        events_target(),
        cloud_target(),
        slurm_target(),
        kube_target(),
        api_target(hooks),
    ]
