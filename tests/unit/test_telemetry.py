"""RR_OTEL: off installs nothing (and imports no OpenTelemetry SDK); on, spans go out over OTLP/HTTP as the
standard OTEL_EXPORTER_OTLP_* / OTEL_SERVICE_NAME variables say, and `flush` sends them before exit.

Each case runs in a fresh interpreter: tracing is process-wide (a tracer provider is set once per process).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reflector.runtime.settings import SettingError, Settings, parse_otel
from reflector.testing.otlp_collector import OTLPCollector
from tests.support import prefork

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RR_OTEL", "OTEL_"))}
    return prefork.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


OFF_PROBE = """
import json, sys
import opentelemetry.trace
from pydantic_ai import Agent
import worker, reflector.cli
from reflector import client
from reflector.runtime import telemetry
from reflector.runtime.settings import Settings

s = Settings.from_env()
plugins = telemetry.client_plugins(s)
print(json.dumps({
    "mode": s.otel,
    "plugins": [type(p).__name__ for p in plugins],
    "installed": telemetry.installed(),
    "flushed": telemetry.flush(),
    "sdk_imported": sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter",
                                                                    "temporalio.contrib.opentelemetry"))),
    "provider": type(opentelemetry.trace.get_tracer_provider()).__name__,
    "pydantic_ai_instrumented": Agent._instrument_default is not False,
}))
"""


@pytest.mark.parametrize("value", [None, "", "0", "off", "false"])
def test_rr_otel_unset_or_off_installs_nothing(value: str | None) -> None:
    proc = _python(OFF_PROBE, {} if value is None else {"RR_OTEL": value})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if importlib.util.find_spec("logfire") is not None:
        # pydantic-ai imports `logfire_api`, which imports an installed `logfire`, which imports the SDK: not rr
        got.pop("sdk_imported")
    else:
        assert got.pop("sdk_imported") == []
    assert got == {
        "mode": "off",
        "plugins": [],
        "installed": "off",
        "flushed": True,
        "provider": "ProxyTracerProvider",
        "pydantic_ai_instrumented": False,
    }


def test_rr_otel_values() -> None:
    for raw in ("1", "true", "YES", "on", "otlp", " 1 "):
        assert parse_otel(raw) == "otlp"
    assert parse_otel("logfire") == "logfire"
    assert parse_otel(None) == "off"
    for off in ("", "0", "no", "OFF"):
        assert parse_otel(off) == "off"
    with pytest.raises(SettingError, match="RR_OTEL must be 1"):
        parse_otel("jaeger")


def test_a_bad_rr_otel_is_a_setting_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RR_OTEL", "maybe")
    with pytest.raises(SettingError, match="RR_OTEL"):
        Settings.from_env()


def test_logfire_mode_without_logfire_says_what_to_install() -> None:
    code = (
        "from reflector.runtime import telemetry\n"
        "from reflector.runtime.settings import Settings, SettingError\n"
        "try:\n    telemetry.client_plugins(Settings.from_env())\n"
        "except SettingError as e:\n    print('ERROR', e)\n"
    )
    proc = _python(code, {"RR_OTEL": "logfire"})
    assert proc.returncode == 0, proc.stderr
    try:
        import logfire  # noqa: F401
    except ImportError:
        assert "ERROR RR_OTEL=logfire needs the `logfire` package" in proc.stdout
    else:  # pragma: no cover - logfire installed: the plugin is pydantic-ai's LogfirePlugin
        assert "ERROR" not in proc.stdout


def test_rr_otel_without_the_otel_extra_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry.sdk'] = None  # as if opentelemetry-sdk were not installed\n"
        "from reflector.runtime import telemetry\n"
        "from reflector.runtime.settings import Settings, SettingError\n"
        "try:\n    telemetry.client_plugins(Settings.from_env())\n"
        "except SettingError as e:\n    print('ERROR', e)\n"
        "print('installed', telemetry.installed())\n"
    )
    proc = _python(code, {"RR_OTEL": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "ERROR RR_OTEL: tracing needs the OpenTelemetry SDK" in proc.stdout
    assert "[otel]" in proc.stdout and "installed off" in proc.stdout


@pytest.fixture
def collector() -> Iterator[OTLPCollector]:
    with OTLPCollector() as c:
        yield c


ON_PROBE = """
import json, os
import opentelemetry.trace
from pydantic_ai import Agent
from reflector.runtime import telemetry
from reflector.runtime.settings import Settings

plugins = telemetry.client_plugins(Settings.from_env())
again = telemetry.client_plugins(Settings.from_env())
with opentelemetry.trace.get_tracer("probe").start_as_current_span("probe-span"):
    pass
print(json.dumps({
    "plugins": [type(p).__name__ for p in plugins],
    "same": [id(p) for p in plugins] == [id(p) for p in again],
    "installed": telemetry.installed(),
    "provider": type(opentelemetry.trace.get_tracer_provider()).__name__,
    "pydantic_ai_instrumented": Agent._instrument_default is not False,
    "flushed": telemetry.flush(),
}))
os._exit(0)  # as `rr` exits: nothing but the explicit flush can have sent the span
"""


def test_rr_otel_on_exports_over_otlp_from_the_standard_variables(collector: OTLPCollector) -> None:
    env = {
        "RR_OTEL": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20probe-token",
        "OTEL_SERVICE_NAME": "rr-probe",
    }
    proc = _python(ON_PROBE, env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "plugins": ["OpenTelemetryPlugin"],
        "same": True,
        "installed": "otlp",
        "provider": "ReplaySafeTracerProvider",
        "pydantic_ai_instrumented": True,
        "flushed": True,
    }
    assert [
        (e.path, e.headers["authorization"], [(s.name, s.service) for s in e.spans])
        for e in collector.exports
    ] == [("/v1/traces", "Bearer probe-token", [("probe-span", "rr-probe")])]


def test_the_service_is_named_rr_by_default(collector: OTLPCollector) -> None:
    env = {"RR_OTEL": "1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{collector.endpoint}/custom/traces"}
    proc = _python(ON_PROBE, env)
    assert proc.returncode == 0, proc.stderr
    assert [(e.path, [(s.name, s.service) for s in e.spans]) for e in collector.exports] == [
        ("/custom/traces", [("probe-span", "rr")])
    ]
