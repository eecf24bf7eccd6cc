"""The `sco` command.

Errors in what the user gave (files, options) print one line naming the file
or option and the field, and exit with status 2 before anything is written.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from sco.apps.common import EXIT_BAD_INPUT
from sco.engine.gcpolicy import tune_gc

# Each command's module, imported when the command runs (or help lists it): `sco agent`
# on every node, and every short command, need not load the database, the cloud's SDK
# and the lab (~0.8 s and ~100 MB a process).
COMMANDS = {
    "run": "sco.apps.commands.serve:run",
    "status": "sco.apps.commands.serve:status",
    "watch": "sco.apps.commands.serve:watch",
    "score": "sco.apps.commands.serve:score",
    "history": "sco.apps.commands.serve:history",
    "explain": "sco.apps.commands.operate:explain",
    "handback": "sco.apps.commands.operate:handback",
    "config": "sco.apps.commands.operate:config_group",
    "slurm": "sco.apps.commands.operate:slurm_group",
    "distributor": "sco.apps.commands.serve:distributor",
    "agent": "sco.apps.commands.node:agent",
    "reclaim": "sco.apps.commands.reclaim:reclaim",
    "tokens": "sco.apps.commands.operate:tokens_group",
    "policies": "sco.apps.commands.simulate:policies",
    "demo": "sco.apps.commands.simulate:demo",
    "simulate": "sco.apps.commands.simulate:simulate",
    "evaluate": "sco.apps.commands.evaluate:evaluate",
    "replay": "sco.apps.commands.replay:replay_command",
    "pools": "sco.apps.commands.operate:pools",
    "lab": "sco.apps.lab:lab_group",
}


class Commands(click.Group):
    """A group whose commands are imported by name, when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: ARG002 (click's)
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: ARG002
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, name = where.split(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command) or command.name != cmd_name:
            raise RuntimeError(f"sco: {where} is not the command {cmd_name!r}")
        return command


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """sco: harvest idle OpenStack capacity as spot instances for Kubernetes and Slurm."""
    tune_gc()
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        click.echo(f"sco: error: {e.format_message()}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.ClickException as e:
        click.echo(f"sco: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("sco: aborted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
