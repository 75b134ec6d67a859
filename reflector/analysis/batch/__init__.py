"""Batch reflection: many runs, one child reflection each, then a synthesis across them.

No temporalio here (the workflow is `workflows/batch.py`, its activities `activities/batch.py`):

- `reflector.runtime.storage.manifest`: turning files, directories and one-file batches into runs, each run its own trace blob, and
  the manifest (a JSONL blob of `BatchRun`s) the workflow reads page by page, and the record pages;
- `records`: a run's compact `RunRecord` (facts from its trace, diagnosis from its reflection) and
  the failure modes it counts toward;
- `synthesis`: the computed synthesis over the records (deterministic: counts of runs, run ids cited);
- `reflector.client.batch_render`: the CLI's text for a batch result and its progress line.
"""
