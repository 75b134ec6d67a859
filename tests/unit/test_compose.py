"""The production deployment files stay consistent with the code (no docker engine needed).

Why: nothing on CI can run ``docker compose up``, so these checks are the only guard that the compose
file does what its header and the README say: Temporal persists to PostgreSQL, the workers (N of them)
and the `client` service share the MinIO bucket that a one-shot job creates, only the workers get the
provider settings, rr's search attributes are registered before the workers start, every published
port is on loopback, and the image installs the project (with the S3 extra) and runs `rr worker`. When
the `docker compose` plugin is on PATH, `docker compose config` validates the file as well.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the dev extra")

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
SETTINGS = REPO_ROOT / "reflector" / "runtime" / "settings.py"

# What only the workers may get: the provider SDKs' keys and endpoints ...
PROVIDER_SECRETS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
)
# ... and, with them, rr's provider-related settings (the whole `x-provider-env` block)
PROVIDER_VARS = (*PROVIDER_SECRETS, "RR_MODEL", "RR_PROVIDER_TIMEOUT_S", "RR_WORKER_MODELS")
# What workers and client must agree on to use the same blob store
BLOB_VARS = (
    "RR_BLOB_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
TEMPORAL_VARS = ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "RR_TASK_QUEUE")

# compose interpolation: `$$` (a literal `$`), `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `$NAME`
_REFERENCE = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


def _references(text: str) -> Iterator[tuple[str, bool]]:
    """Every variable the compose file interpolates, with whether it has a default."""
    for m in _REFERENCE.finditer(text):
        name = m["braced"] or m["bare"]
        if name:
            yield name, m["op"] is not None


def _interpolate(value: object, env: Mapping[str, str] | None = None) -> str:
    """`value` as compose would substitute it, given the variables `env` (the rest unset)."""
    env = env or {}

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m["braced"] or m["bare"]
        if m["op"] == ":-":
            return env.get(name) or m["default"]
        if m["op"] == "-":
            return env[name] if name in env else m["default"]
        return env.get(name, "")

    return _REFERENCE.sub(sub, str(value))


def _env(service: dict[str, Any]) -> dict[str, str | None]:
    """A service's environment as a dict (None: passed through from the host), mapping or KEY=VALUE list."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (str(item).partition("=") for item in raw)
        return {key: value if sep else None for key, sep, value in pairs}
    return {str(k): None if v is None else str(v) for k, v in raw.items()}


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Each dependency of a service with its condition (the short list form means service_started)."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {str(name): "service_started" for name in raw}
    return {str(name): str((spec or {}).get("condition", "service_started")) for name, spec in raw.items()}


def _image_name(service: dict[str, Any]) -> str:
    return str(service.get("image", "")).split(":", 1)[0]


def _built_from_project(service: dict[str, Any]) -> bool:
    build = service.get("build")
    return build == "." or (isinstance(build, dict) and build.get("context") == ".")


def _command_text(service: dict[str, Any]) -> str:
    command = service.get("command") or ""
    return "\n".join(map(str, command)) if isinstance(command, list) else str(command)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def _one(services: dict[str, dict[str, Any]], image: str) -> tuple[str, dict[str, Any]]:
    found = [(name, svc) for name, svc in services.items() if _image_name(svc) == image]
    assert len(found) == 1, f"expected exactly one {image} service, got {[n for n, _ in found]}"
    return found[0]


def _named_volume(compose: dict[str, Any], service: dict[str, Any], target: str) -> str:
    """The top-level named volume `service` mounts at `target` (fails when it is not one)."""
    for mount in service.get("volumes", []):
        if isinstance(mount, dict):
            source, dest = str(mount.get("source", "")), str(mount.get("target", ""))
        else:
            source, _, rest = str(mount).partition(":")
            dest = rest.split(":", 1)[0]
        if dest == target:
            assert source in (compose.get("volumes") or {}), f"{source} is not a declared named volume"
            return source
    raise AssertionError(f"nothing is mounted at {target}")


# -- Temporal on PostgreSQL ------------------------------------------------------------------------------


def test_postgresql_persists_to_a_named_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    pg = services["postgresql"]
    assert _image_name(pg) == "postgres"
    _named_volume(compose, pg, "/var/lib/postgresql/data")
    assert pg.get("healthcheck", {}).get("test"), "the schema job waits for a healthy database"


def test_temporal_uses_postgres_driver_on_postgresql_service(services: dict[str, dict[str, Any]]) -> None:
    temporal = services["temporal"]
    assert _image_name(temporal) in {"temporalio/server", "temporalio/auto-setup"}
    env = _env(temporal)
    assert str(env["DB"]).startswith("postgres")
    assert env["POSTGRES_SEEDS"] == "postgresql"
    # The server must wait for its database (directly or via the schema job that does).
    deps = _depends_on(temporal)
    assert "postgresql" in deps or any(
        "postgresql" in _depends_on(services[d]) for d in deps if d in services
    )
    assert temporal.get("healthcheck", {}).get("test"), "workers and client wait for a healthy server"


def test_schema_job_targets_postgresql(services: dict[str, dict[str, Any]]) -> None:
    if _image_name(services["temporal"]) == "temporalio/auto-setup":
        pytest.skip("auto-setup creates the schema itself")
    jobs = [
        svc
        for svc in services.values()
        if _image_name(svc) == "temporalio/admin-tools" and "temporal-sql-tool" in _command_text(svc)
    ]
    assert jobs, "no admin-tools job creates the Temporal schema"
    command = _command_text(jobs[0])
    assert "--plugin postgres12" in command and "--ep postgresql" in command
    assert "temporal_visibility" in command
    assert _depends_on(services["temporal"]).get("temporal-schema") == "service_completed_successfully"


# -- the Web UI ------------------------------------------------------------------------------------------


def test_ui_points_at_temporal(services: dict[str, dict[str, Any]]) -> None:
    _, ui = _one(services, "temporalio/ui")
    assert _env(ui)["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert ui.get("ports"), "the UI is published (on loopback)"


# -- N workers, sharing nothing but Temporal and S3 ------------------------------------------------------


def test_workers_are_replicated_from_the_project_image(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert _built_from_project(worker)
    assert worker["command"] == ["rr", "worker"]
    assert int(worker["deploy"]["replicas"]) >= 2
    assert "container_name" not in worker, "a fixed container_name prevents replicas (and --scale)"
    assert not worker.get("ports"), "a published port prevents replicas on one host"
    env = _env(worker)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["RR_TASK_QUEUE"], "workers poll one named task queue"
    assert _depends_on(worker).get("temporal") == "service_healthy"


def test_workers_share_no_blob_volume_but_the_s3_store(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    worker = services["worker"]
    assert not worker.get("volumes"), "workers share the S3 store, not a volume (a volume is one host only)"
    assert "blobs" not in (compose.get("volumes") or {})
    env = _env(worker)
    url = urlparse(_interpolate(env["RR_BLOB_URL"]))
    assert url.scheme == "s3" and url.netloc and url.path.strip("/"), f"RR_BLOB_URL={env['RR_BLOB_URL']}"
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"


# -- the S3-compatible store -----------------------------------------------------------------------------


def test_minio_serves_s3_from_a_named_volume_with_a_healthcheck(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    minio = services["minio"]
    assert _image_name(minio) == "minio/minio"
    command = minio["command"]
    words = command if isinstance(command, list) else str(command).split()
    assert words[:2] == ["server", "/data"] and "--console-address" in words
    assert words[words.index("--console-address") + 1] == ":9001"
    _named_volume(compose, minio, "/data")
    assert minio["healthcheck"]["test"], "minio-setup waits for a healthy MinIO"
    env = _env(minio)
    assert env["MINIO_ROOT_USER"] and env["MINIO_ROOT_PASSWORD"]
    published = {str(p).rsplit(":", 1)[-1] for p in minio.get("ports", [])}
    assert "9000" in published


@pytest.mark.parametrize(
    "host_env", [{}, {"RR_S3_BUCKET": "team-blobs", "RR_S3_PREFIX": "prod"}], ids=["defaults", "overridden"]
)
def test_bucket_job_creates_the_bucket_named_in_rr_blob_url(
    services: dict[str, dict[str, Any]], host_env: dict[str, str]
) -> None:
    bucket = urlparse(_interpolate(_env(services["worker"])["RR_BLOB_URL"], host_env)).netloc
    job = services["minio-setup"]
    assert _image_name(job) == "minio/mc"
    assert _depends_on(job).get("minio") == "service_healthy"
    assert str(job.get("restart", "")).startswith("on-failure"), "a one-shot job must not restart forever"
    command = _interpolate(_command_text(job), host_env)
    alias = re.search(r"mc alias set (\S+) http://minio:9000\b", command)
    assert alias, f"the job must point an mc alias at the minio service: {command}"
    made = re.search(r"mc mb --ignore-existing \"?([^\s\"]+)\"?", command)
    assert made, "the job must create the bucket idempotently (mc mb --ignore-existing)"
    assert made[1] == f"{alias[1]}/{bucket}", f"it creates {made[1]}, the workers use the bucket {bucket}"
    assert command.index(alias[0]) < command.index(made[0])


@pytest.mark.parametrize(
    "host_env",
    [{}, {"MINIO_ROOT_USER": "alice", "MINIO_ROOT_PASSWORD": "s3cret-s3cret"}],
    ids=["defaults", "overridden"],
)
def test_s3_credentials_are_the_minio_credentials(
    services: dict[str, dict[str, Any]], host_env: dict[str, str]
) -> None:
    minio, job, worker = (_env(services[name]) for name in ("minio", "minio-setup", "worker"))
    for ours, theirs in (
        ("AWS_ACCESS_KEY_ID", "MINIO_ROOT_USER"),
        ("AWS_SECRET_ACCESS_KEY", "MINIO_ROOT_PASSWORD"),
    ):
        expected = _interpolate(minio[theirs], host_env)
        assert _interpolate(worker[ours], host_env) == expected, f"worker {ours} != minio {theirs}"
        assert _interpolate(job[theirs], host_env) == expected, f"minio-setup {theirs} != minio {theirs}"
    assert worker["AWS_DEFAULT_REGION"], "boto3 needs a region, also for MinIO (and reads only this name)"


def test_workers_and_client_wait_for_the_bucket(services: dict[str, dict[str, Any]]) -> None:
    for name in ("worker", "client"):
        deps = _depends_on(services[name])
        assert deps.get("minio-setup") == "service_completed_successfully", (
            f"{name} starts before the bucket exists"
        )


# -- the client service ----------------------------------------------------------------------------------


def test_client_service_uses_the_workers_blob_store_and_temporal(services: dict[str, dict[str, Any]]) -> None:
    client, worker = services["client"], services["worker"]
    assert "tools" in client.get("profiles", []), "`docker compose up` must not start the client"
    assert _built_from_project(client) and client.get("image") == worker.get("image")
    client_env, worker_env = _env(client), _env(worker)
    for name in (*BLOB_VARS, *TEMPORAL_VARS):
        assert client_env.get(name) == worker_env.get(name), f"client and workers differ in {name}"
    assert _depends_on(client).get("temporal") == "service_healthy"


def test_client_mounts_the_traces_read_only(services: dict[str, dict[str, Any]]) -> None:
    mounts = [_interpolate(v) for v in services["client"].get("volumes", [])]
    traces = [m.split(":") for m in mounts if ":/traces" in m]
    assert traces, f"the client must mount a host directory at /traces: {mounts}"
    assert traces[0][1:] == ["/traces", "ro"], f"mount it read-only: {traces[0]}"
    assert traces[0][0].startswith("./"), "a directory next to the compose file by default"


def test_client_gets_no_provider_keys(services: dict[str, dict[str, Any]]) -> None:
    env = _env(services["client"])
    leaked = [name for name in env if name in PROVIDER_SECRETS or name.endswith(("_API_KEY", "_BASE_URL"))]
    assert not leaked, f"only workers call the providers; the client got {leaked}"


# -- provider settings -----------------------------------------------------------------------------------


def test_workers_get_every_provider_variable(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert set(compose["x-provider-env"]) == set(PROVIDER_VARS), "the provider settings are written once"
    env = _env(services["worker"])
    missing = [name for name in PROVIDER_VARS if name not in env]
    assert not missing, f"workers do not get {missing}"
    others = [
        (name, var)
        for name, svc in services.items()
        if name != "worker"
        for var in PROVIDER_SECRETS
        if var in _env(svc)
    ]
    assert not others, f"only workers get provider keys: {others}"


def test_provider_variables_are_passed_through_not_set_empty(services: dict[str, dict[str, Any]]) -> None:
    # An unset `${OPENAI_BASE_URL:-}` becomes OPENAI_BASE_URL="" in the container, which the OpenAI and
    # Anthropic SDKs take as the base URL itself; a variable without a value is left unset instead.
    env = _env(services["worker"])
    wrong = {name: env[name] for name in PROVIDER_VARS if env.get(name) is not None}
    assert not wrong, f"pass these through without a value (`NAME:`): {wrong}"


# -- search attributes -----------------------------------------------------------------------------------


def test_a_one_shot_job_registers_the_search_attributes(services: dict[str, dict[str, Any]]) -> None:
    jobs = [(name, svc) for name, svc in services.items() if svc.get("command") == ["rr", "setup"]]
    assert len(jobs) == 1, "one job must run `rr setup` (rr's search attributes, for `rr list`)"
    name, job = jobs[0]
    assert _built_from_project(job)
    env = _env(job)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["TEMPORAL_NAMESPACE"] == _env(services["worker"])["TEMPORAL_NAMESPACE"]
    # after the namespace exists; the workers start once it has finished
    assert _depends_on(job).get("temporal-namespace") == "service_completed_successfully"
    assert _depends_on(services["worker"]).get(name) == "service_completed_successfully"
    assert str(job.get("restart", "")).startswith("on-failure"), "a one-shot job must not restart forever"


# -- the whole file --------------------------------------------------------------------------------------


def test_published_ports_bind_loopback(services: dict[str, dict[str, Any]]) -> None:
    published = 0
    for name, svc in services.items():
        for port in svc.get("ports", []):
            published += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} on all interfaces"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on all interfaces"
    assert published >= 4, "Temporal, the UI and MinIO (API and console) are reachable from the host"


def test_every_variable_has_a_default_or_is_documented() -> None:
    text = COMPOSE.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    undocumented = sorted(
        {name for name, has_default in _references(text) if not has_default}
        - set(re.findall(r"[A-Z][A-Z0-9_]+", header))
    )
    assert not undocumented, f"these have no default and the header does not name them: {undocumented}"
    # and the header's own commands use services that exist
    data = yaml.safe_load(text)
    for service in re.findall(r"docker compose run --rm (?:-T )?(\S+)", header):
        assert service in data["services"], f"the header runs a service {service!r} that does not exist"


def test_header_tells_how_to_submit_through_the_client_service() -> None:
    header = "\n".join(line for line in COMPOSE.read_text().splitlines() if line.startswith("#"))
    assert "docker compose run --rm client rr reflect /traces/" in header
    assert "docker compose run --rm -T client rr reflect - <" in header
    assert "--scale worker=" in header
    assert "127.0.0.1" in header
    assert "TEMPORAL_API_KEY" in header, "how to point the file at Temporal Cloud"
    assert "TEMPORAL_ADDRESS=127.0.0.1" not in header, "a client on the host does not see the workers' blobs"


# -- the image and the code it runs ----------------------------------------------------------------------


def test_dockerfile_installs_the_s3_extra_non_editable_and_runs_an_unprivileged_worker() -> None:
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert re.match(r"FROM python:3\.11-slim\b", lines[0])
    installs = re.findall(r"pip install\s+([^\n&\\]*)", text)
    assert installs, "the image must pip-install the project"
    assert any(re.fullmatch(r"""["']?\.\[s3\]["']?""", arg.strip()) for arg in installs), (
        f"install the project with its S3 extra: pip install '.[s3]' (got {installs})"
    )
    assert not any(re.search(r"(^|\s)(-e|--editable)(\s|$)", arg) for arg in installs), (
        "a regular install, not -e"
    )
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"USER root", "USER 0"}, "the worker must not run as root"
    cmd = [line for line in lines if line.startswith("CMD ")]
    assert cmd and cmd[-1] == 'CMD ["rr", "worker"]'
    assert not any(line.startswith("VOLUME") for line in lines), "with S3 no container needs a blob volume"


def test_the_extra_the_image_installs_exists() -> None:
    import tomllib

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("boto3") for dep in extras["s3"])


def test_the_rr_commands_compose_runs_exist_in_the_cli(
    services: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    from reflector import cli

    used = {
        svc["command"][1]
        for svc in services.values()
        if isinstance(svc.get("command"), list) and svc["command"][:1] == ["rr"]
    }
    header = "\n".join(line for line in COMPOSE.read_text().splitlines() if line.startswith("#"))
    used |= set(re.findall(r"client rr ([a-z]+)", header))
    assert {"worker", "setup", "reflect", "list"} <= used
    for command in sorted(used):
        with pytest.raises(SystemExit) as exc:
            cli.main([command, "--help"])
        assert exc.value.code == 0, f"`rr {command}` is not a command of the CLI"
        assert f"rr {command}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # and the check above can fail
        cli.main(["no-such-command", "--help"])
    assert exc.value.code == 2
    capsys.readouterr()


def _rr_service_names(services: dict[str, dict[str, Any]]) -> set[str]:
    """The variables the rr processes get (workers and client)."""
    return {var for service in ("worker", "client") for var in _env(services[service])}


def _package_sources(package: str, *globs: str) -> str:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    return "\n".join(p.read_text(errors="replace") for g in globs for p in sorted(root.glob(g)))


def test_rr_variables_are_the_ones_settings_reads(services: dict[str, dict[str, Any]]) -> None:
    source = SETTINGS.read_text()
    unread = sorted(n for n in _rr_service_names(services) if n.startswith("RR_") and f'"{n}"' not in source)
    assert not unread, f"reflector/runtime/settings.py does not read {unread}"


def test_temporal_variables_are_the_ones_rr_or_temporalio_reads(services: dict[str, dict[str, Any]]) -> None:
    source = SETTINGS.read_text()
    spec = importlib.util.find_spec("temporalio.bridge.temporal_sdk_bridge")
    assert spec is not None and spec.origin
    bridge = Path(spec.origin).read_bytes()  # temporalio's envconfig is implemented in its native core
    names = sorted(n for n in _rr_service_names(services) if n.startswith("TEMPORAL_"))
    assert names
    unread = [n for n in names if f'"{n}"' not in source and n.encode() not in bridge]
    assert not unread, f"neither reflector/runtime/settings.py nor temporalio reads {unread}"


def test_aws_variables_are_the_ones_boto3_reads(services: dict[str, dict[str, Any]]) -> None:
    pytest.importorskip("botocore", reason="boto3 comes with the s3 extra")
    source = _package_sources("botocore", "*.py") + SETTINGS.read_text()
    names = sorted(n for n in _rr_service_names(services) if n.startswith("AWS_"))
    assert set(BLOB_VARS) - {"RR_BLOB_URL"} <= set(names)
    unread = [n for n in names if f"'{n}'" not in source and f'"{n}"' not in source]
    assert not unread, f"neither botocore nor reflector/runtime/settings.py reads {unread}"


def test_provider_variables_are_the_ones_the_provider_sdks_read() -> None:
    source = "\n".join(
        (
            _package_sources("pydantic_ai", "providers/*.py"),
            _package_sources("openai", "_client.py"),
            _package_sources("anthropic", "_client.py"),
        )
    )
    unread = [n for n in PROVIDER_SECRETS if f"'{n}'" not in source and f'"{n}"' not in source]
    assert not unread, f"no provider SDK reads {unread}"


# -- docker itself, when it is there ---------------------------------------------------------------------


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0
    ):
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    return [standalone] if standalone else None


@pytest.mark.parametrize("profile", [None, "tools"])
def test_docker_compose_accepts_the_file(profile: str | None) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` here (the checks above stand in for it)")
    args = [*cli, "-f", str(COMPOSE), *(["--profile", profile] if profile else []), "config", "--quiet"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
