"""Infrastructure: settings, the blob store and payload storage (`storage`), the Temporal connection,
the dev and home servers, the worker supervisor, admission control, the model registry, telemetry,
search attributes and garbage collection.

Nothing is imported here. This room never imports `reflector.client` or `reflector.cli`
(tests/unit/test_layout.py).
"""
