"""Batch input splitting, the manifest, run records and the computed synthesis (no server)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from reflector.analysis.batch.records import build_record
from reflector.analysis.batch.synthesis import synthesise
from reflector.analysis.traces import TraceError
from reflector.contract import BatchRun, RecordRunInput, ReflectorOutput, RunRecord, SkillTag, TraceRef
from reflector.runtime.storage.blobs import BlobStore
from reflector.runtime.storage.manifest import (
    RunSource,
    expand_paths,
    iter_sources,
    read_manifest_page,
    split_file,
    write_manifest,
)
from reflector.testing.tau_runs import tau_run


def _no_upload(path: Path) -> TraceRef:
    raise AssertionError("split mode never uploads whole files")


def test_a_json_array_splits_into_runs_stored_byte_for_byte(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    runs = [tau_run(1), tau_run(2, book=False), tau_run(1)]  # the third repeats the first's id
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs, indent=2))
    sources = list(split_file(path, store))
    assert [s.run_id for s in sources] == ["task1-trial0", "task2-trial0", "task1-trial0"]
    raw = path.read_bytes()
    for src, run in zip(sources, runs, strict=True):
        assert src.trace is not None and src.trace.format == "tau-bench"
        stored = store.get_bytes(src.trace.sha256)
        assert json.loads(stored) == run and stored in raw  # exactly the record's bytes in the file
        assert src.trace.sha256 == hashlib.sha256(stored).hexdigest()
    manifest = write_manifest(sources, store)
    assert manifest.n_runs == 3
    page = read_manifest_page(store, manifest, 0, 0, 2)
    assert [r.run_id for r in page.runs] == ["task1-trial0", "task2-trial0"]
    rest = read_manifest_page(store, manifest, page.next_offset, 2, 100)
    assert [r.run_id for r in rest.runs] == ["task1-trial0~2"] and rest.next_offset == manifest.size
    with pytest.raises(ValueError, match="out of order"):
        read_manifest_page(store, manifest, page.next_offset, 5, 1)


def test_jsonl_lines_are_runs_and_a_non_run_record_is_broken(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    path = tmp_path / "runs.jsonl"
    path.write_text(
        json.dumps({"id": "r-a", "steps": [{"role": "user", "content": "hi"}]})
        + "\n42\n"
        + json.dumps({"run_id": "r-c", "messages": [{"role": "user", "content": "x"}]})
        + "\n"
    )
    sources = list(iter_sources([path], store, upload=_no_upload, split=True, max_bytes=None))
    assert [s.run_id for s in sources] == ["r-a", f"{path}#1", "r-c"]
    assert sources[1].trace is None and "is not a run" in (sources[1].error or "")
    assert store.get_bytes(sources[2].trace.sha256) == path.read_bytes().splitlines()[2]
    over = list(split_file(path, store, max_bytes=10))
    assert all(s.trace is None for s in over) and "over the limit" in (over[0].error or "")


def test_a_broken_jsonl_line_is_one_broken_run(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    path = tmp_path / "runs.jsonl"
    path.write_text(
        json.dumps({"id": "r-a", "steps": []})
        + '\n{"id": \n'
        + json.dumps({"id": "r-c", "steps": [1]})
        + "\n"
    )
    sources = list(split_file(path, store))
    assert [s.run_id for s in sources] == ["r-a", f"{path}#1", "r-c"]
    assert sources[1].trace is None and "line 2 is not valid JSON" in (sources[1].error or "")
    assert sources[0].trace is not None and sources[2].trace is not None


def test_a_file_that_does_not_parse_stops_a_one_file_batch(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    path.write_text('[{"traj": []}, {"traj": ')
    with pytest.raises(TraceError):
        list(split_file(path, BlobStore(tmp_path / "blobs")))


def test_directories_expand_to_their_trace_files(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for name in ("b.json", "a.jsonl", "sub/c.json", "notes.txt", ".hidden/x.json"):
        (d / name).write_text("{}")
    assert [p.relative_to(d).as_posix() for p in expand_paths([d])] == ["a.jsonl", "b.json", "sub/c.json"]
    with pytest.raises(TraceError, match="not found"):
        expand_paths([tmp_path / "nope.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no .json"):
        expand_paths([tmp_path / "empty"])
    with pytest.raises(TraceError, match="no runs"):
        write_manifest([], BlobStore(tmp_path / "blobs"))


def _output(learning: str, tags: list[SkillTag] | None = None) -> ReflectorOutput:
    return ReflectorOutput(
        reasoning="r",
        error_identification="step 3 failed",
        root_cause_analysis="rc",
        correct_approach="c",
        key_insight="k",
        extracted_learnings=[{"learning": learning, "atomicity_score": 0.8}],
        skill_tags=tags or [],
        raw={"rr_trace": {"stop_reason": "completed"}},
    )


def _record(
    index: int, run: dict[str, object], out: ReflectorOutput | None, error: str | None = None
) -> RunRecord:
    raw = json.dumps(run).encode()
    sha = hashlib.sha256(raw).hexdigest()
    trace = TraceRef(uri=f"blob:sha256:{sha}", sha256=sha, size=len(raw), format="tau-bench")
    batch_run = BatchRun(index=index, run_id=f"task{index}-trial0", trace=trace)
    return build_record(
        RecordRunInput(batch_id="b", run=batch_run, workflow_id=f"b.run{index}", output=out, error=error), raw
    )


def test_the_synthesis_counts_runs_not_errors() -> None:
    harmful = [SkillTag(id="air-00001", tag="harmful")]
    records = [_record(0, tau_run(0, errors={"get_flight_status": 6}), _output("retry less", harmful))]
    records += [
        _record(i, tau_run(i, errors={"get_user_details": 1}, book=False), _output("Read the error.  "))
        for i in range(1, 6)
    ]
    records += [
        _record(6, tau_run(6), _output("keep going")),
        _record(7, tau_run(7), None, error="the reflection failed: boom"),
    ]
    assert records[0].failing_tools == {"get_flight_status": 6} and records[0].outcome == "success"
    s = synthesise(records, n_runs=8)
    assert (s.reflected, s.failed) == (7, 1)
    assert [(m.key, m.runs, m.failing_runs) for m in s.failure_modes] == [
        ("missing_action:book_reservation", 5, 5),
        ("tool_error:get_user_details", 5, 5),
        ("tool_error:get_flight_status", 1, 0),
    ]
    assert s.failure_modes[1].run_ids == [f"task{i}-trial0" for i in range(1, 6)] and s.failure_modes[
        1
    ].share == round(5 / 7, 4)
    assert s.single_run_modes == 1
    assert [(t.text, t.runs) for t in s.recurring_learnings] == [("Read the error.", 5)]
    assert [(t.text, t.runs, t.run_ids) for t in s.harmful_skills] == [("air-00001", 1, ["task0-trial0"])]
    assert [f.run_id for f in s.failed_runs] == ["task7-trial0"] and records[7].failure_modes == []
    assert s.mean_reward == round(2 / 7, 4)
    assert "5 of 7 runs (71%)" in s.summary and "task1-trial0, task2-trial0" in s.summary
    assert (
        synthesise(list(reversed(records)), 8).failure_modes[1].run_ids[0] == "task5-trial0"
    )  # in record order


def test_a_record_without_readable_facts_keeps_its_reflection() -> None:
    run = BatchRun(
        index=0, run_id="x", trace=TraceRef(uri="blob:sha256:" + "1" * 64, sha256="1" * 64, size=3)
    )
    rec = build_record(RecordRunInput(batch_id="b", run=run, output=_output("l")), b"[[[")
    assert rec.status == "reflected" and rec.facts_error and rec.outcome == "unknown"
    assert rec.learnings == ["l"] and rec.what_went_wrong == "step 3 failed"


def test_iter_sources_turns_an_unreadable_file_into_a_broken_run(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text("{}")
    bad.write_text("{")
    ref = TraceRef(uri="blob:sha256:" + "2" * 64, sha256="2" * 64, size=2)

    def upload(path: Path) -> TraceRef:
        if path == bad:
            raise TraceError(f"invalid JSON in {path}")
        return ref

    got = list(iter_sources([good, bad], BlobStore(tmp_path / "b"), upload=upload))
    assert got == [
        RunSource(str(good), str(good), trace=ref),
        RunSource(str(bad), str(bad), error=f"invalid JSON in {bad}"),
    ]


def test_the_reward_is_the_label_when_the_trace_has_one() -> None:
    from reflector.analysis.batch.records import TraceRunFacts, outcome_of

    # a tau-bench run whose calls differ in arguments that leave the same state still earned 1
    assert outcome_of(TraceRunFacts(reward=1.0, answer_correct=False)) == "success"
    assert outcome_of(TraceRunFacts(reward=0.0, answer_correct=True)) == "failure"
    assert outcome_of(TraceRunFacts(answer_correct=False)) == "failure"
    assert outcome_of(TraceRunFacts(answer_correct=True)) == "success"
    assert outcome_of(TraceRunFacts()) == "unknown"
