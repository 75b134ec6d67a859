"""OpenTelemetry tracing of reflections, turned on by RR_OTEL (`Settings.otel`); off by default.

What is traced, once per process (`install`), by the Temporal client plugin that `reflector.client.temporal`
adds (a worker built on that client gets it from the client, so it is never registered twice):

- Temporal: temporalio's `OpenTelemetryPlugin` with its Temporal spans: `StartWorkflow:` on the client,
  `RunWorkflow:` for each workflow run (the root, every child, every continue-as-new run), `StartActivity:`
  / `RunActivity:` for each activity (model requests, cells, summaries), `StartChildWorkflow:` for
  `recurse`. The span context travels in Temporal headers, so a child's and an activity's spans join the
  reflection's trace, across processes and workers.
- pydantic-ai: `Agent.instrument_all` (its agent-run, model-request `chat ...` and `execute_tool ...` spans).
  Those run in workflow code, which is replayed after a cache eviction or on another worker.

Replay safety: the global tracer provider is temporalio's `ReplaySafeTracerProvider`. Span ids made in
workflow code come from the workflow's deterministic random (`TemporalIdGenerator`), so a replayed span
has the id it had the first time (children exported earlier keep a valid parent), and a span is not
exported while its workflow replays history: each span is exported once, whatever the number of replays.
Why not the older `TracingInterceptor`: its workflow spans are created only when not replaying, so they
would shift the deterministic ids of pydantic-ai's spans between the first run and a replay, and break the
tree.

Export: a `BatchSpanProcessor` with the OTLP/HTTP exporter, which reads the standard variables itself
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`, ...);
the resource reads `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` (service name `rr` by default). `flush`
exports what is buffered (the CLI exits with `os._exit`, which skips the SDK's atexit hook).

`RR_OTEL=logfire` (needs `pip install logfire`): the same spans, through the span pipeline of a Logfire
instance of rr's own, `logfire.configure(local=True)`, configured from Logfire's environment (LOGFIRE_TOKEN,
LOGFIRE_SERVICE_NAME, ...; Logfire also honours OTEL_EXPORTER_OTLP_*). Not the global instance: that one
would try to become the global tracer provider, which must be temporalio's replay-safe one. Not pydantic-ai's
`LogfirePlugin` either: it traces Temporal with the older `TracingInterceptor` (the id shift above: with
every workflow task replaying, 44 spans with 36 distinct ids and 5 missing parents for the reflection of
tests/workflows/test_otel.py).

Off (the default), nothing here imports the OpenTelemetry SDK or `temporalio.contrib.opentelemetry`
(which imports it), and no plugin, instrumentation or provider is installed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reflector.contract import PROGRESS_QUERY
from reflector.runtime.settings import OTEL_ENV, OtelMode, SettingError, Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from temporalio.plugin import SimplePlugin

__all__ = ["client_plugins", "install", "installed", "flush", "uninstall", "DEFAULT_SERVICE_NAME"]

DEFAULT_SERVICE_NAME = "rr"
FLUSH_TIMEOUT_MS = 5_000


@dataclass
class _Tracing:
    mode: OtelMode
    plugins: list[SimplePlugin]
    provider: Any  # temporalio's ReplaySafeTracerProvider, the global tracer provider
    processors: list[SpanProcessor] = field(default_factory=list)


_lock = threading.Lock()
_active: _Tracing | None = None
# The global tracer provider can be set once per process: kept across `uninstall` / `install` (tests).
_provider: Any = None


def installed() -> OtelMode:
    """The tracing installed in this process ("off" when none)."""
    return _active.mode if _active is not None else "off"


def client_plugins(settings: Settings) -> list[SimplePlugin]:
    """The Temporal client plugins that trace as `settings.otel` says (none when off; installs once)."""
    if settings.otel == "off":
        return []
    return list(install(settings.otel).plugins)


def install(mode: OtelMode, *, processors: Sequence[SpanProcessor] | None = None) -> _Tracing:
    """Install tracing for this process (idempotent) and return it.

    `processors` replace the default OTLP `BatchSpanProcessor` (tests give an in-memory exporter's); given to
    an installed tracing they are added to it.
    """
    global _active
    if mode == "off":
        raise ValueError("install() needs a tracing mode other than 'off'")
    with _lock:
        if _active is not None:
            if _active.mode != mode:
                raise SettingError(
                    f"{OTEL_ENV}: tracing is already installed in this process as {_active.mode!r}"
                )
            for p in processors or ():
                _active.provider.add_span_processor(_without_polls(p))
                _active.processors.append(p)
            return _active
        try:
            _active = _install(mode, processors)
        except ImportError as e:  # RR_OTEL set, the `otel` extra not installed
            raise SettingError(
                f"{OTEL_ENV}: tracing needs the OpenTelemetry SDK and its OTLP exporter "
                f"(pip install 'durable-recursive-reflector[otel]'): {e}"
            ) from None
        return _active


def _install(mode: OtelMode, processors: Sequence[SpanProcessor] | None) -> _Tracing:
    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin

    if mode == "logfire":
        sdk = _logfire_provider()
        provider = _global_provider(
            resource=_named(sdk.resource), sampler=sdk.sampler, id_generator=sdk.id_generator
        )
        default: list[SpanProcessor] = [sdk._active_span_processor]  # Logfire's pipeline (scrubbing, export)
    else:
        from opentelemetry.sdk.resources import Resource

        provider = _global_provider(resource=_named(Resource.create()))
        if processors is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            default = [BatchSpanProcessor(OTLPSpanExporter())]  # reads the OTEL_EXPORTER_OTLP_* variables
    chosen = list(processors) if processors is not None else default
    for p in chosen:
        provider.add_span_processor(_without_polls(p))
    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))
    return _Tracing(mode, [OpenTelemetryPlugin(add_temporal_spans=True)], provider, chosen)


def _global_provider(**options: Any) -> Any:
    """temporalio's replay-safe tracer provider, made the global one (first call; then the same one)."""
    global _provider
    if _provider is not None:
        return _provider
    import opentelemetry.trace
    from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider, create_tracer_provider

    current = opentelemetry.trace.get_tracer_provider()
    if isinstance(current, ReplaySafeTracerProvider):
        _provider = current
    elif not isinstance(current, opentelemetry.trace.ProxyTracerProvider):
        raise SettingError(
            f"{OTEL_ENV}: this process already has an OpenTelemetry tracer provider "
            f"({type(current).__name__}); rr needs temporalio's replay-safe one and cannot replace it"
        )
    else:
        _provider = create_tracer_provider(**options)
        opentelemetry.trace.set_tracer_provider(_provider)
    return _provider


def _named(resource: Any) -> Any:
    """`resource` (Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES), named `rr` if unnamed."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        return resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _logfire_provider() -> Any:
    """The SDK tracer provider of a Logfire instance of rr's own, configured from Logfire's environment."""
    try:
        import logfire
    except ImportError:
        raise SettingError(f"{OTEL_ENV}=logfire needs the `logfire` package (pip install logfire)") from None
    from opentelemetry.sdk.trace import TracerProvider

    # local=True: not the global instance, which would try to become the global tracer provider (rr's must be
    # temporalio's replay-safe one); its span pipeline is what rr's spans go through
    instance = logfire.configure(local=True)
    sdk = instance.config.get_tracer_provider().provider
    if not isinstance(sdk, TracerProvider):  # pragma: no cover - Logfire always builds an SDK provider
        raise SettingError(f"{OTEL_ENV}=logfire: Logfire's tracer provider is a {type(sdk).__name__}")
    return sdk


# rr's own polling, not worth a trace each: `rr reflect` / `rr status` ask for progress every second
POLL_SPANS = frozenset({f"QueryWorkflow:{PROGRESS_QUERY}", f"HandleQuery:{PROGRESS_QUERY}"})


def _without_polls(inner: SpanProcessor) -> SpanProcessor:
    """`inner`, minus the spans of progress polls (each poll would be a trace of its own: the client's query
    and the workflow's handler)."""
    from opentelemetry.sdk.trace import SpanProcessor as Base

    class WithoutPolls(Base):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            inner.on_start(span, parent_context=parent_context)

        def _on_ending(self, span: Any) -> None:
            inner._on_ending(span)

        def on_end(self, span: Any) -> None:
            if span.name not in POLL_SPANS:
                inner.on_end(span)

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return inner.force_flush(timeout_millis)

    return WithoutPolls()


def flush(timeout_ms: int = FLUSH_TIMEOUT_MS) -> bool:
    """Export the spans still buffered (a no-op when tracing is off); False when it did not finish in time."""
    active = _active
    return True if active is None else bool(active.provider.force_flush(timeout_ms))


def uninstall() -> None:
    """Stop tracing in this process (tests): flush, stop pydantic-ai's instrumentation, shut this tracing's
    span processors down. The global provider stays set (OpenTelemetry allows it once) and is reused."""
    global _active
    with _lock:
        active, _active = _active, None
    if active is None:
        return
    active.provider.force_flush(FLUSH_TIMEOUT_MS)
    from pydantic_ai import Agent

    Agent.instrument_all(False)
    for p in active.processors:
        p.shutdown()
