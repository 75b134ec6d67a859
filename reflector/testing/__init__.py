"""Test doubles for running rr without a model provider: scripted models (`scripted`, a plugin module:
`RR_PLUGINS=reflector.testing.scripted`) and an OpenAI-compatible HTTP server on loopback that
answers from a script (`openai_server`), and its Anthropic Messages twin (`anthropic_server`), both
with a fault script (`scripted_http.Fault`: 429 with Retry-After, 5xx, 401, 404, held, truncated or
malformed replies). The test suite and the benchmarks use them; so can users testing their own
deployment offline."""
