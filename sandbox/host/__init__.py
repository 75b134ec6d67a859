"""The sandbox host: the process that runs model-written cells (`python -m sandbox.host`).

`main` is the process (requests, OS isolation, rlimits); `namespace`, `guards`, `classes`, `safe_modules`,
`snapshot` and `output` are what runs inside it. The worker side never runs cells: it starts hosts
(`sandbox.executor`) and talks to them over `sandbox.wire`.
"""
