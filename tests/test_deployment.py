"""docker-compose.yml stays consistent with the code (Docker itself does not run here)."""

from __future__ import annotations

import re
import tomllib
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
        assert env["STEPQ_BROKER_URL"].startswith("redis://:${REDIS_PASSWORD:?")
        assert env["STEPQ_BROKER_URL"].endswith("@redis:6379/0")
    assert services["dispatcher"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_dockerfile_copies_every_package() -> None:
    """One COPY of the build context, and the context lets in every folder the package-dir
    mapping names, and the files that build it (setup.py derives the package list)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert [line for line in dockerfile.splitlines() if line.startswith("COPY")] == ["COPY . ./"]
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().split() if line.startswith("!")}
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    assert {*folders, "pyproject.toml", "setup.py", "README.md"} <= allowed


def test_the_gpu_and_training_images_have_a_c_compiler() -> None:
    """Triton (vLLM's kernels) builds its launchers with a C compiler at first use; the slim
    base has none, so the image built for each compose service that runs vLLM or trains
    installs one (checked by reading the Dockerfile with that service's EXTRAS)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.MULTILINE), "the base the step below assumes"
    step = re.search(r'RUN case ",\$\{EXTRAS\}," in \\\n(.*?)esac', dockerfile, re.S)
    assert step is not None, dockerfile
    patterns, installs = step.group(1).split(")", 1)
    assert "gcc" in installs and "libc6-dev" in installs
    wanted = [p.strip(" *,\n") for p in patterns.split("|")]
    for name, service in _compose()["services"].items():
        extras = str((service.get("build") or {}).get("args", {}).get("EXTRAS", "flower")).split(",")
        runs_kernels = bool({"vllm", "train"} & set(extras))
        assert runs_kernels == any(w in extras for w in wanted), f"{name} ({extras})"


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


def _secrets(value: object) -> list[str]:
    """Every ``${VAR...}`` in a compose value whose name says it holds a secret."""
    text = yaml.safe_dump(value)
    return re.findall(r"\$\{((?:[A-Z_]*(?:PASSWORD|AUTH|SECRET|TOKEN|KEY)[A-Z_]*)[^}]*)\}", text)


def test_the_compose_file_is_safe_on_a_shared_network() -> None:
    """No port published beyond the host's loopback, no secret with a default (each one is a
    required variable), no secret on a command line, and the stepq image runs unprivileged."""
    compose = _compose()
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        command = " ".join(service.get("command", []) if isinstance(service.get("command"), list) else [])
        assert "PASSWORD}" not in command and "AUTH}" not in command, f"{name}: a secret on its command line"
    secrets = _secrets(compose)
    assert secrets, "the compose file names its secrets"
    for ref in secrets:
        assert ":?" in ref and ":-" not in ref, f"${{{ref}}} has a default: make it required (${{VAR:?message}})"
    assert "ports" not in compose["services"]["postgres"], "PostgreSQL is reached on the compose network only"
    assert compose["services"]["redis"].get("user") == "redis", "Redis runs as the redis user, not root"
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), "the image runs as an unprivileged user"


def _exported_names(db: object) -> set[str]:
    """Every sample name ``stepq metrics`` serves (counters with their ``_total``)."""
    from stepq.metrics import StepqCollector

    names = set()
    for family in StepqCollector(db, lambda: 0).collect():  # type: ignore[arg-type]
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_the_dashboard_queries_only_metrics_stepq_exports(sqlite: object) -> None:
    """Every panel of the shipped Grafana dashboard asks Prometheus for metrics that `stepq
    metrics` serves (a renamed metric would leave a panel empty without a word), from the
    data source Grafana is provisioned with, and the panels cover what an operator watches."""
    import json

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "stepq.json").read_text())
    source = yaml.safe_load(
        (ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = source["datasources"][0]["uid"]
    exported = _exported_names(sqlite)
    asked: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid, panel["title"]
            names = set(re.findall(r"\bstepq_[a-z_]+", target["expr"]))
            assert names, f"{panel['title']}: {target['expr']} names no stepq metric"
            assert names <= exported, f"{panel['title']}: not exported: {names - exported}"
            asked |= names
    watched = {
        "stepq_rollouts_total",
        "stepq_tokens_total",
        "stepq_labelled_chunks",
        "stepq_broker_queue_depth",
        "stepq_broker_queue_bound",
        "stepq_workers",
        "stepq_work_items",
        "stepq_eta_seconds",
        "stepq_training_reward",
        "stepq_training_step",
    }
    assert watched <= asked, f"no panel shows {watched - asked}"
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    described = set(re.findall(r'stepq_workers\{state="(\w+)"\}', (ROOT / "docs" / "operations.md").read_text()))
    assert described and all(f'stepq_workers{{state="{s}"}}' in exprs for s in described), (
        f"docs/operations.md describes worker states {described}; the dashboard must show each"
    )


def test_prometheus_and_grafana_are_provisioned_and_safe() -> None:
    services = _compose()["services"]
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (target,) = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    command = services["metrics"]["command"]
    assert target == f"metrics:{command[command.index('--port') + 1]}", "Prometheus scrapes the metrics service"
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            host = volume.split(":")[0]
            assert not host.startswith("./") or (ROOT / host).exists(), f"{name} mounts {host}, which is not shipped"
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert all(str(p).startswith("127.0.0.1:") for n in ("prometheus", "grafana") for p in services[n]["ports"])
