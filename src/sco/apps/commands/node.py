"""`sco agent`: on a node, follow its contract and leave before `drain_by`."""

from __future__ import annotations

from pathlib import Path

import click

from sco.apps.common import BadInput, parse_duration


@click.command()
@click.option(
    "--distributor",
    "url",
    required=True,
    envvar="SCO_AGENT_DISTRIBUTOR",
    help="The distributor's URL, e.g. https://sco-distributor:8443.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="A file holding this node's token.",
)
@click.option(
    "--metadata-url",
    default=None,
    help="Read the token from OpenStack metadata instead, e.g. "
    "http://169.254.169.254/openstack/latest/meta_data.json.",
)
@click.option(
    "--drain-command",
    default=None,
    help="Run when the node must leave, with SCO_DRAIN_BY (Unix time), "
    "SCO_DRAIN_BY_ISO, SCO_INSTANCE_ID, SCO_PARTITION in its environment; "
    "exit 0 once the node is out of its scheduler.",
)
@click.option(
    "--slurm-node",
    default=None,
    help="Instead of a command: drain this Slurm node (DRAIN with the deadline in its "
    "reason; on a reclaim, requeue what would not end in time).",
)
@click.option(
    "--slurm-conf", type=click.Path(path_type=Path), default=None, help="SLURM_CONF for it."
)
@click.option(
    "--requeue-lead", default="30s", show_default=True,
    help="With --slurm-node: requeue this long before drain_by.",
)  # fmt: skip
@click.option(
    "--state-file",
    type=click.Path(path_type=Path),
    default=Path("/var/lib/sco/agent.json"),
    show_default=True,
    help="The last contract and what was done, kept across restarts.",
)
@click.option(
    "--wait", "wait_s", type=float, default=30.0, show_default=True, help="Long-poll seconds."
)
@click.option(
    "--drain-lead",
    default=None,
    help="Start draining this long before drain_by (e.g. 5m: the node serves while its "
    "replacement boots); default: at once.",
)
@click.option(
    "--ca-file",
    type=click.Path(path_type=Path),
    default=None,
    help="CA bundle that signed the distributor's certificate.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
def agent(
    url: str,
    token_file: Path | None,
    metadata_url: str | None,
    drain_command: str | None,
    slurm_node: str | None,
    slurm_conf: Path | None,
    requeue_lead: str,
    state_file: Path,
    wait_s: float,
    drain_lead: str | None,
    ca_file: Path | None,
    log_level: str,
) -> None:
    """The node agent: follow this node's contract and leave before drain_by."""
    import signal
    import threading

    try:
        from sco.agent import Agent, AgentConfig, AgentError
    except ModuleNotFoundError as e:
        raise BadInput(f"{e.name} is not installed (pip install 'sco[agent]')") from None
    from sco.apps import logs

    if (token_file is None) == (metadata_url is None):
        raise BadInput("give one of --token-file and --metadata-url")
    if (drain_command is None) == (slurm_node is None):
        raise BadInput("give one of --drain-command and --slurm-node")
    drainer = None
    if slurm_node is not None:
        from sco.assembly.slurm import drainer as slurm_drainer

        lead = parse_duration(requeue_lead, "--requeue-lead")
        drainer = slurm_drainer(slurm_conf, slurm_node, lead)
    logs.setup("agent", log_level, "text")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config = AgentConfig(
        distributor=url, state_file=state_file, drain_command=drain_command or "",
        token_file=token_file, metadata_url=metadata_url, wait_s=wait_s, ca_file=ca_file,
        drain_lead_s=parse_duration(drain_lead, "--drain-lead") if drain_lead else None,
    )  # fmt: skip
    try:
        Agent(config, drainer=drainer).run_until(stop)
    except AgentError as e:
        raise BadInput(str(e)) from None
