"""The lab's runs as the commands reach them (`sco demo`, `sco simulate`, `sco
evaluate`, `sco replay`, `sco lab swarm`): the lab fills the builder's bundle with
its twins and simulated sides (`sco.lab`); this is the face it shows the commands.

`INPUT_ERRORS` are what bad input to a lab run raises (a trace, a demand file, a
workload, an option out of range): a command turns them into a one-line refusal.
"""

from __future__ import annotations

from sco.adapters.demandfile.intake import DemandFileError
from sco.lab.accounting import PartitionMetrics
from sco.lab.crosscheck import evaluate_all, evaluate_named, factory, suite
from sco.lab.crosscheck_setting import Capacity, EvalConfig, window_starts
from sco.lab.fleet import FLEET
from sco.lab.fleet_eval import DAY_S, RESYNC_S, custom_case, evaluate_fleet, fleet_suite
from sco.lab.region import SimConfig
from sco.lab.simulation import Simulation, SimulationInputError, SimulationResult, SimulationSpec
from sco.lab.swarm.batch import Tally, Trial, fault_names, run_trials, shrink, trials
from sco.lab.swarm.promises import PROMISES
from sco.lab.swarm.spec import ALL_KINDS, Kind
from sco.lab.swarm.world import STATES
from sco.lab.sweep import SweepError, Workers
from sco.lab.traces import TraceError, load_traces
from sco.lab.workload.replay import POLICIES as REPLAY_POLICIES
from sco.lab.workload.replay import Replayed, ReplaySpec, replay

INPUT_ERRORS: tuple[type[Exception], ...] = (
    TraceError,
    DemandFileError,
    SimulationInputError,
    ValueError,
)

__all__ = [
    "ALL_KINDS",
    "DAY_S",
    "FLEET",
    "INPUT_ERRORS",
    "PROMISES",
    "REPLAY_POLICIES",
    "RESYNC_S",
    "STATES",
    "Capacity",
    "EvalConfig",
    "Kind",
    "PartitionMetrics",
    "ReplaySpec",
    "Replayed",
    "SimConfig",
    "Simulation",
    "SimulationInputError",
    "SimulationResult",
    "SimulationSpec",
    "SweepError",
    "Tally",
    "TraceError",
    "Trial",
    "Workers",
    "custom_case",
    "evaluate_all",
    "evaluate_fleet",
    "evaluate_named",
    "factory",
    "fault_names",
    "fleet_suite",
    "load_traces",
    "replay",
    "run_trials",
    "shrink",
    "suite",
    "trials",
    "window_starts",
]
