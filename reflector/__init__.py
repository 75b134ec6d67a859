"""Durable Recursive Reflector: domain code (types, settings, blob store, traces, models, client, CLI)."""
