"""A loopback OTLP/HTTP trace receiver for tests (`RR_OTEL=1` in a subprocess; no network).

It answers `POST …/v1/traces` (protobuf `ExportTraceServiceRequest`, what the OTLP/HTTP exporter sends)
and records, per request, the path, the headers and every span decoded (`CollectedSpan`: ids, parent,
name, service name and string attributes). Needs the `otel` extra (opentelemetry-proto).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

__all__ = ["OTLPCollector", "CollectedSpan", "Export"]


@dataclass(frozen=True)
class CollectedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    service: str
    attributes: dict[str, str]


@dataclass(frozen=True)
class Export:
    path: str
    headers: dict[str, str]
    spans: list[CollectedSpan]


@dataclass
class OTLPCollector:
    """Start with `start()` or as a context manager; `endpoint` is the base URL for OTEL_EXPORTER_OTLP_ENDPOINT."""

    exports: list[Export] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._httpd is not None, "not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def spans(self) -> list[CollectedSpan]:
        with self._lock:
            return [s for e in self.exports for s in e.spans]

    def start(self) -> Self:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path.rstrip("/").endswith("traces"):
                    collector._record(self.path, dict(self.headers.items()), body)
                self.send_response(200)  # metrics and logs (Logfire sends them too) are accepted and dropped
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="otlp-collector", daemon=True)
        self._thread.start()
        return self

    def _record(self, path: str, headers: dict[str, str], body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans = []
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        CollectedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            service=resource.get("service.name", ""),
                            attributes={
                                a.key: a.value.string_value
                                for a in s.attributes
                                if a.value.HasField("string_value")
                            },
                        )
                    )
        with self._lock:
            self.exports.append(Export(path, {k.lower(): v for k, v in headers.items()}, spans))

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
