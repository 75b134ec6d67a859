"""The production deployment files stay consistent with the code (no docker engine needed).

Why: nothing on CI can run ``docker compose up``, so these checks are the only guard that the
worker still connects to the compose Temporal service, Temporal still persists to the PostgreSQL
service, and the image still installs the project and runs a worker.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the dev extra")

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"


def _env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whether written as a mapping or a KEY=VALUE list."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def _depends_on(service: dict[str, Any]) -> set[str]:
    raw = service.get("depends_on") or []
    return set(raw) if isinstance(raw, list | dict) else set()


def _image_name(service: dict[str, Any]) -> str:
    return str(service.get("image", "")).split(":", 1)[0]


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    result: dict[str, dict[str, Any]] = data["services"]
    return result


def _one(services: dict[str, dict[str, Any]], image: str) -> tuple[str, dict[str, Any]]:
    found = [(name, svc) for name, svc in services.items() if _image_name(svc) == image]
    assert len(found) == 1, f"expected exactly one {image} service, got {[n for n, _ in found]}"
    return found[0]


def test_postgresql_service_has_a_volume(services: dict[str, dict[str, Any]]) -> None:
    assert "postgresql" in services
    pg = services["postgresql"]
    assert _image_name(pg) == "postgres"
    assert any("/var/lib/postgresql" in str(v) for v in pg.get("volumes", []))


def test_temporal_uses_postgres_driver_on_postgresql_service(
    services: dict[str, dict[str, Any]],
) -> None:
    assert "temporal" in services
    temporal = services["temporal"]
    assert _image_name(temporal) in {"temporalio/server", "temporalio/auto-setup"}
    env = _env(temporal)
    assert env["DB"].startswith("postgres")
    assert env["POSTGRES_SEEDS"] == "postgresql"
    # The server must wait for its database (directly or via the schema job that does).
    deps = _depends_on(temporal)
    assert "postgresql" in deps or any(
        "postgresql" in _depends_on(services[d]) for d in deps if d in services
    )


def test_schema_job_targets_postgresql(services: dict[str, dict[str, Any]]) -> None:
    if _image_name(services["temporal"]) == "temporalio/auto-setup":
        pytest.skip("auto-setup creates the schema itself")
    jobs = [
        svc
        for svc in services.values()
        if _image_name(svc) == "temporalio/admin-tools" and "temporal-sql-tool" in str(svc.get("command"))
    ]
    assert jobs, "no admin-tools job creates the Temporal schema"
    command = str(jobs[0]["command"])
    assert "--plugin postgres12" in command and "--ep postgresql" in command
    assert "temporal_visibility" in command


def test_ui_points_at_temporal(services: dict[str, dict[str, Any]]) -> None:
    _, ui = _one(services, "temporalio/ui")
    assert _env(ui)["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_worker_is_built_from_the_project(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    build = worker["build"]
    assert build == "." or (isinstance(build, dict) and build.get("context") == ".")
    assert worker["command"] == ["rr", "worker"]
    env = _env(worker)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert "RR_TASK_QUEUE" in env
    assert env["RR_BLOB_DIR"] == "/data/blobs"
    assert any(str(v).endswith(":/data/blobs") for v in worker.get("volumes", [])), (
        "workers must share the blob store volume"
    )
    assert int(worker["deploy"]["replicas"]) >= 2
    assert "container_name" not in worker, "a fixed container_name prevents replicas"
    assert "temporal" in _depends_on(worker)


def test_published_ports_bind_loopback(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on all interfaces"


def test_dockerfile_installs_project_and_runs_worker() -> None:
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert re.match(r"FROM python:3\.11-slim\b", lines[0])
    assert re.search(r"pip install[^\n]*\s\.(\s|$)", text), "the image must `pip install .` the project"
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"USER root", "USER 0"}, "the worker must not run as root"
    cmd = [line for line in lines if line.startswith("CMD ")]
    assert cmd and cmd[-1] == 'CMD ["rr", "worker"]'


def test_a_one_shot_job_registers_the_search_attributes(services: dict[str, dict[str, Any]]) -> None:
    jobs = [(name, svc) for name, svc in services.items() if svc.get("command") == ["rr", "setup"]]
    assert len(jobs) == 1, "one job must run `rr setup` (rr's search attributes, for `rr list`)"
    name, job = jobs[0]
    build = job["build"]
    assert build == "." or (isinstance(build, dict) and build.get("context") == ".")
    env = _env(job)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["TEMPORAL_NAMESPACE"] == _env(services["worker"])["TEMPORAL_NAMESPACE"]
    # after the namespace exists; the workers start once it has finished
    assert job["depends_on"]["temporal-namespace"]["condition"] == "service_completed_successfully"
    assert services["worker"]["depends_on"][name]["condition"] == "service_completed_successfully"
    assert str(job.get("restart", "")).startswith("on-failure"), "a one-shot job must not restart forever"
