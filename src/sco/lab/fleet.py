"""Fleet-scale scenarios built from the bundled traces: thousands of instances of
demand over four partitions, on traces whose every unit stands for many instances.

Two Slurm-like partitions follow a working day; two services hold a steady target.
Guaranteed quota is ample, so the floor is kept or lost by the policy, not by quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sco.lab.region import SimConfig


@dataclass(frozen=True, slots=True)
class FleetScenario:
    name: str
    trace: tuple[str, ...]  # under the package's data/traces
    pool_size: int  # instances one trace unit stands for
    instances: int  # demand at the working-day peak, over the four partitions
    guaranteed_quota_per_hall: int

    def demand(self, instances: int | None = None) -> dict[str, Any]:
        """The four partitions' demand file, scaled to `instances` at the peak."""
        n = instances or self.instances
        quarter = n // 4

        def batch(name: str) -> dict[str, Any]:
            night, day = quarter // 2, quarter
            return {
                "name": name,
                "kind": "slurm",
                "target_units": {"daily": {"00:00": night, "07:00": day, "19:00": night}},
                "floor_units": quarter // 4,
                "max_units": quarter * 6 // 5,
                "guaranteed_budget_units": quarter,
            }

        def service(name: str) -> dict[str, Any]:
            return {
                "name": name,
                "kind": "kubernetes",
                "target_units": quarter,
                "floor_units": quarter * 3 // 5,
                "max_units": quarter * 6 // 5,
                "guaranteed_budget_units": quarter,
            }

        return {"partitions": [batch("batch-a"), batch("batch-b"), service("web"), service("api")]}

    def sim_config(self, pool_size: int | None = None, **fields: Any) -> SimConfig:
        """The simulated region at this scenario's scale (`fields`: the rest)."""
        return SimConfig(
            pool_size=pool_size or self.pool_size,
            guaranteed_quota_per_hall=self.guaranteed_quota_per_hall,
            **fields,
        )

    def write_demand(self, folder: Path, instances: int | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}-demand.yaml"
        path.write_text(yaml.safe_dump(self.demand(instances), sort_keys=False))
        return path


FLEET = {
    s.name: s
    for s in (
        # Each 1 of the 9-zone V100 trace stands for 1,000 instances.
        FleetScenario("v100-9zone-x1000", ("apache", "v100-9zone"), 1000, 5000, 3000),
        # Each unit of the 16-node count trace stands for 100 instances.
        FleetScenario("v100-16node-x100", ("apache", "v100-16node"), 100, 5000, 3000),
    )
}
