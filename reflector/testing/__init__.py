"""Test doubles for running rr without a model provider: scripted models (`scripted`, a plugin module:
`RR_PLUGINS=reflector.testing.scripted`) and an OpenAI-compatible HTTP server on loopback that
answers from a script (`openai_server`). The test suite and the benchmarks use them; so can users
testing their own deployment offline."""
