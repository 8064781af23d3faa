"""Operators' control of a whole problem set: pause, resume, delete."""

from __future__ import annotations

import click

from stepq.commands.base import friendly, load_settings, main, open_db
from stepq.models import queries
from stepq.models.errors import ConfigError


@main.group("set")
def set_group() -> None:
    """Pause, resume or delete a problem set."""


@set_group.command("pause")
@click.argument("name")
@friendly
def pause(name: str) -> None:
    """Stop dispatching a set's work (running items finish their batch; nothing is lost)."""
    with open_db(load_settings()).session() as s:
        changed = queries.pause_set(s, name, True)
    click.echo(f"set '{name}' {'paused' if changed else 'was already paused'}: its work is not dispatched")


@set_group.command("resume")
@click.argument("name")
@friendly
def resume(name: str) -> None:
    """Dispatch a paused set's work again."""
    with open_db(load_settings()).session() as s:
        changed = queries.pause_set(s, name, False)
    click.echo(f"set '{name}' {'resumed' if changed else 'was not paused'}")


@set_group.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Confirm: the set's problems, trajectories, rollouts and labels go.")
@friendly
def delete(name: str, yes: bool) -> None:
    """Delete a set with everything annotated on it (refused while snapshots hold its chunks)."""
    database = open_db(load_settings())
    if not yes:
        with database.session() as s:
            queries.get_set(s, name)  # a missing set says so first
        raise ConfigError(f"deleting set '{name}' removes all its rows: pass --yes to confirm")
    with database.session() as s:
        gone = queries.delete_set(s, name)
    click.echo(
        f"set '{name}' deleted: {gone['problems']} problems, {gone['trajectories']} trajectories, "
        f"{gone['rollouts_done']} rollouts"
    )
