"""The domain: what a reflection knows and decides, without Temporal, storage or a network.

The trace reader (`traces`), the trace-analysis toolkit the sandbox hands to model-written code
(`toolkit`), the heuristic model (`heuristic`), the prompts (`prompts`), a batch's records and synthesis
rules (`batch`), and the rules for answers, citations, diagnoses, skillbooks, compaction, the budget
ledger, input caps, model names and provider errors.

Nothing is imported here: the sandbox host imports `reflector.analysis.traces` and
`reflector.analysis.toolkit`, which must not pay for anything else. This room imports neither
`reflector.runtime`, `reflector.client` nor `reflector.cli` (tests/unit/test_layout.py).
"""
