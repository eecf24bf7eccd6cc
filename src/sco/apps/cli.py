"""The `sco` command.

Errors in what the user gave (files, options) print one line naming the file
or option and the field, and exit with status 2 before anything is written.
"""

from __future__ import annotations

import logging
import sys

import click

from sco.apps.commands import COMMANDS
from sco.apps.commands.evaluate import evaluate
from sco.apps.commands.operate import pools
from sco.apps.commands.replay import replay_command
from sco.apps.commands.simulate import demo, policies, simulate
from sco.apps.common import EXIT_BAD_INPUT
from sco.apps.lab import lab_group
from sco.engine.gcpolicy import tune_gc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """sco: harvest idle OpenStack capacity as spot instances for Kubernetes and Slurm."""
    tune_gc()
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for _command in (*COMMANDS, policies, demo, simulate, evaluate, replay_command, pools, lab_group):
    cli.add_command(_command)


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
