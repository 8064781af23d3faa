"""docker-compose.yml stays consistent with the code (Docker itself does not run here)."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from stepq.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _resolve(argv: list[str]) -> click.Command:
    """Walk the CLI like the shell would, failing on an unknown command or option."""
    cmd: click.Command = main
    ctx = click.Context(main, info_name="stepq")
    args = list(argv)
    while isinstance(cmd, click.Group):
        assert args, "a group needs a subcommand"
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"stepq has no command {args[0]!r}"
        cmd, args = sub, args[1:]
        ctx = click.Context(cmd, info_name=cmd.name, parent=ctx)
    cmd.make_context(cmd.name, args, parent=ctx)  # raises on unknown options or bad values
    return cmd


def test_services_are_all_there() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "migrate", "dispatcher", "worker", "trainer", "flower", "metrics"} <= set(services)
    trainer_gpu = services["trainer"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert trainer_gpu["capabilities"] == ["gpu"]
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["count"] == 1


def test_every_command_exists_in_the_cli() -> None:
    services = _compose()["services"]
    stepq_services = [n for n, s in services.items() if s.get("image", "").startswith("stepq")]
    assert set(stepq_services) == {"migrate", "dispatcher", "worker", "trainer", "flower", "metrics"}
    for name in stepq_services:
        cmd = _resolve(services[name]["command"])
        assert cmd.callback is not None, name


def test_services_share_one_configuration() -> None:
    services = _compose()["services"]
    for name in ("migrate", "dispatcher", "worker", "trainer", "flower", "metrics"):
        env = services[name]["environment"]
        assert env["STEPQ_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["STEPQ_BROKER_URL"] == "redis://redis:6379/0"
    assert services["dispatcher"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_dockerfile_copies_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("stepq", "models", "workers", "trainer", "migrations"):
        assert f"COPY {package} {package}" in dockerfile


def test_weights_are_mounted_apart_from_the_source_and_kept_out_of_the_image() -> None:
    worker = _compose()["services"]["worker"]
    (volume,) = worker["volumes"]
    assert any(v.endswith(":/weights:ro") for v in _compose()["services"]["trainer"]["volumes"])
    host, container, mode = volume.rsplit(":", 2)
    assert container == "/weights" and mode == "ro"
    assert "models" not in host, "the source tree's models/ package is not a weights folder"
    assert worker["command"][worker["command"].index("--model") + 1].startswith("/weights/")
    ignore = (ROOT / ".dockerignore").read_text().split()
    # everything is ignored but the package sources: weights, data and databases never enter
    assert ignore[ignore.index("*") :][:1] == ["*"]
    assert not any(line.startswith("!") and ("weights" in line or "data" in line) for line in ignore)


def test_the_trainer_launches_one_process_per_reserved_gpu() -> None:
    trainer = _compose()["services"]["trainer"]
    gpus = trainer["deploy"]["resources"]["reservations"]["devices"][0]["count"]
    command = trainer["command"]
    assert int(command[command.index("--processes") + 1]) == gpus
