"""`rr gc` without a server: the decision, the store's layout, the removal protocol, failing closed."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelRequest, UserPromptPart
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.history.v1 import HistoryEvent, MarkerRecordedEventAttributes
from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference
from temporalio.converter import JSONProtoPayloadConverter

from reflector.analysis.compaction import transcript_json
from reflector.analysis.traces.index_file import INDEX_SUFFIX, INDEX_VERSION
from reflector.contract import PAYLOAD_DRIVER_NAME, TraceRef, session_key
from reflector.runtime import gc
from reflector.runtime.storage import inventory as inv
from reflector.runtime.storage.blobs import BlobStore, blob_uri, derived_source
from reflector.runtime.storage.payloads import ForeignReference, stored_digest

NOW = 1_000_000.0
OLD = NOW - 7200
HOUR = 3600.0


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def blob(name: str, *, mtime: float = OLD, kind: str = inv.KIND_OTHER) -> inv.Item:
    h = sha(name)
    return inv.Item(f"sha256/{h[:2]}/{h}", "blob", kind, 10, mtime, h)


def item(path: str, unit: inv.ItemUnit, key: str = "", *, mtime: float = OLD) -> inv.Item:
    return inv.Item(path, unit, unit, 5, mtime, key)


def refs(blobs: set[str] = set(), traces: set[str] = set(), sessions: set[str] = set()) -> gc.References:  # noqa: B006
    return gc.References(frozenset(blobs), frozenset(traces), frozenset(sessions))


def reader(contents: dict[str, set[str]], calls: list[str] | None = None) -> Callable[[inv.Item], inv.Names]:
    def names_in(i: inv.Item) -> inv.Names:
        if calls is not None:
            calls.append(i.path)
        return inv.Names(frozenset(contents.get(i.path, set())))

    return names_in


def removed(plan: gc.Plan) -> set[str]:
    return {i.path for i in plan.removals}


# ----------------------------------------------------------------------------------- decide


def test_referenced_young_and_unknown_items_are_kept_the_rest_removed() -> None:
    kept, young, orphan = blob("kept"), blob("young", mtime=NOW - 60), blob("orphan")
    unknown = item("notes.txt", "unknown")
    temp_old, temp_young = item(".incoming-a", "temp"), item(".incoming-b", "temp", mtime=NOW - 5)
    plan = gc.decide(
        [kept, young, orphan, unknown, temp_old, temp_young],
        refs({kept.key}),
        now=NOW,
        min_age_s=HOUR,
        names_in=reader({}),
    )
    assert removed(plan) == {orphan.path, temp_old.path}
    reasons = {v.item.path: v.reason for v in plan.kept}
    assert reasons == {
        kept.path: gc.REFERENCED,
        young.path: gc.YOUNG,
        unknown.path: gc.UNKNOWN,
        temp_young.path: gc.YOUNG,
    }
    # with no grace period only references protect
    plan0 = gc.decide([kept, young, orphan], refs({kept.key}), now=NOW, min_age_s=0, names_in=reader({}))
    assert removed(plan0) == {young.path, orphan.path}


def test_names_inside_kept_blobs_keep_blobs_transitively_but_traces_are_not_read() -> None:
    manifest, trace, record, deeper, orphan = (
        blob("manifest"),
        blob("trace"),
        blob("record"),
        blob("deeper"),
        blob("o"),
    )
    calls: list[str] = []
    contents = {manifest.path: {trace.key, record.key}, record.path: {deeper.key}, trace.path: {orphan.key}}
    plan = gc.decide(
        [manifest, trace, record, deeper, orphan],
        refs({manifest.key}, traces={trace.key}),
        now=NOW,
        min_age_s=HOUR,
        names_in=reader(contents, calls),
    )
    assert removed(plan) == {orphan.path}  # named only inside a trace: a trace is the agent's data
    assert trace.path not in calls and set(calls) == {manifest.path, record.path, deeper.path}
    assert {v.item.path: v.reason for v in plan.kept}[deeper.path] == gc.NAMED
    assert {v.item.kind for v in plan.kept if v.item.key == trace.key} == {inv.KIND_TRACE}


def test_a_young_blob_keeps_what_it_names() -> None:
    # a batch manifest uploaded a moment ago names traces uploaded long ago: the workflow has not started yet
    manifest, old_trace = blob("manifest", mtime=NOW - 10), blob("old trace")
    plan = gc.decide(
        [manifest, old_trace],
        refs(),
        now=NOW,
        min_age_s=HOUR,
        names_in=reader({manifest.path: {old_trace.key}}),
    )
    assert removed(plan) == set()


def test_derived_files_live_and_die_with_their_source() -> None:
    src, dead = blob("trace"), blob("dead trace")
    index = inv.Item(f"{src.path}.index", "derived", "derived:index", 3, OLD, src.key)
    dead_index = inv.Item(f"{dead.path}.index", "derived", "derived:index", 3, OLD, dead.key)
    gone_src = sha("gone")
    named_index = inv.Item(
        f"sha256/{gone_src[:2]}/{gone_src}.index", "derived", "derived:index", 3, OLD, gone_src
    )
    items = [src, dead, index, dead_index, named_index]
    plan = gc.decide(items, refs({src.key, gone_src}), now=NOW, min_age_s=HOUR, names_in=reader({}))
    assert removed(plan) == {dead.path, dead_index.path}
    # a young derived file (being built) keeps its source
    young_index = inv.Item(dead_index.path, "derived", "derived:index", 3, NOW - 1, dead.key)
    plan = gc.decide([dead, young_index], refs(), now=NOW, min_age_s=HOUR, names_in=reader({}))
    assert removed(plan) == set()
    assert {v.item.path: v.reason for v in plan.kept}[dead.path] == gc.SOURCE
    assert derived_source(Path(index.path).name) == (src.key, "index")


def test_an_index_of_an_older_format_goes_even_beside_a_kept_trace() -> None:
    """rr never reads an index of an older format (it builds the current one): once past the grace
    period it is removed, while the current index of the same trace stays."""
    src = blob("trace")
    old = inv.Item(
        f"{src.path}.index-v{INDEX_VERSION - 1}",
        "derived",
        f"derived:index-v{INDEX_VERSION - 1}",
        3,
        OLD,
        src.key,
    )
    current = inv.Item(f"{src.path}{INDEX_SUFFIX}", "derived", f"derived:{INDEX_SUFFIX[1:]}", 3, OLD, src.key)
    young_old = inv.Item(f"{src.path}.index-v1", "derived", "derived:index-v1", 3, NOW - 1, src.key)
    plan = gc.decide(
        [src, old, current, young_old], refs({src.key}), now=NOW, min_age_s=HOUR, names_in=reader({})
    )
    assert removed(plan) == {old.path}
    assert "older format" in {v.item.path: v.reason for v in plan.verdicts}[old.path]
    # an old index alone does not keep its source alive
    lone = blob("unnamed trace")
    lone_old = inv.Item(f"{lone.path}.index-v1", "derived", "derived:index-v1", 3, OLD, lone.key)
    plan = gc.decide([lone, lone_old], refs(), now=NOW, min_age_s=HOUR, names_in=reader({}))
    assert removed(plan) == {lone.path, lone_old.path}


def test_sessions_of_retained_workflows_are_kept_and_read_for_names() -> None:
    archive = blob("archive")
    mine, ghost = item("sessions/wf-1", "journal", "wf-1"), item("sessions/ghost", "journal", "ghost")
    cache, ghost_cache = (
        item("responses/wf-1", "responses", "wf-1"),
        item("responses/ghost", "responses", "ghost"),
    )
    plan = gc.decide(
        [archive, mine, ghost, cache, ghost_cache],
        refs(sessions={session_key("wf-1")}),
        now=NOW,
        min_age_s=HOUR,
        names_in=reader({mine.path: {archive.key}}),
    )
    assert removed(plan) == {ghost.path, ghost_cache.path}  # an ARCHIVE cell in a kept journal keeps its blob


# ----------------------------------------------------------------------------------- names


def test_names_in_bytes_finds_every_form_of_a_name() -> None:
    a, b, c, d = sha("a"), sha("b"), sha("c"), sha("d")
    known = {a, b, c, d}
    text = (
        f'{{"uri":"{blob_uri(a)}","sha256":"{a}"}} init_ref={b} ARCHIVE("{c.upper()}") '
        f"x{d}{'f' * 10} {sha('unknown')}"
    ).encode()
    found = inv.names_in_bytes(text, known)
    assert found.blobs == {a, b, c, d} and found.traces == {a}
    assert inv.names_in_bytes(b"0" * 63 + b" " + a[:63].encode(), known).blobs == frozenset()


def test_names_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = sha("a")
    monkeypatch.setattr(inv, "_CHUNK", 50)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 37 + json.dumps({"uri": blob_uri(a)}).encode() + b"y" * 101)
    found = inv.names_in_file(path, {a})
    assert found.blobs == {a} and found.traces == {a}


def test_blob_kinds_from_their_first_bytes() -> None:
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b'{"x": 1}').SerializeToString(
        deterministic=True
    )
    transcript = transcript_json([ModelRequest(parts=[UserPromptPart("hi")])]).encode()
    init = json.dumps({"task": {"question": "q"}, "skillbook": ""}, sort_keys=True).encode()
    assert inv.blob_kind(payload) == inv.KIND_PAYLOAD
    assert inv.blob_kind(transcript) == inv.KIND_ARCHIVE
    assert inv.blob_kind(init) == inv.KIND_INIT
    assert inv.blob_kind(b"\x80\x05K\x01.") == inv.KIND_EXPORT
    assert inv.blob_kind(b'{"index":0,"run_id":"r","source":"s","trace":null}\n') == inv.KIND_MANIFEST
    assert inv.blob_kind(b'{"index":0,"run_id":"r","source":"","status":"reflected"}') == inv.KIND_RECORD
    assert inv.blob_kind(b'{"steps": []}') == inv.KIND_OTHER


# ----------------------------------------------------------------------------------- the store


def _old(path: Path) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (OLD, OLD), follow_symlinks=False)


def test_scan_store_sorts_every_file_into_its_unit(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    trace = store.put_bytes(b'{"steps": []}')
    init = store.put_bytes(json.dumps({"skillbook": "", "task": {}}, sort_keys=True).encode())
    index = store.derived_path(trace, "index")
    index.write_bytes(b"idx")
    (store.path_for(trace).parent / ".tmp-x").write_bytes(b"partial")
    (store.path_for(trace).parent / "README").write_text("?")
    (tmp_path / "sessions" / "wf-1").mkdir(parents=True)
    (tmp_path / "sessions" / "wf-1" / "00000001.json").write_text('{"seq": 1, "code": "x"}')
    (tmp_path / "responses" / "wf-1").mkdir(parents=True)
    (tmp_path / ".incoming-abc").write_bytes(b"upload")
    (tmp_path / "mine.txt").write_text("not rr's")
    (tmp_path / "link").symlink_to(tmp_path / "mine.txt")
    items = {i.path: (i.unit, i.kind, i.key) for i in inv.scan_store(tmp_path)}
    fan = f"sha256/{trace[:2]}"
    assert items == {
        f"{fan}/{trace}": ("blob", inv.KIND_OTHER, trace),
        f"sha256/{init[:2]}/{init}": ("blob", inv.KIND_INIT, init),
        f"{fan}/{trace}.index": ("derived", "derived:index", trace),
        f"{fan}/.tmp-x": ("temp", inv.KIND_TEMP, ""),
        f"{fan}/README": ("unknown", inv.KIND_UNKNOWN, ""),
        "sessions/wf-1": ("journal", inv.KIND_JOURNAL, "wf-1"),
        "responses/wf-1": ("responses", inv.KIND_RESPONSES, "wf-1"),
        ".incoming-abc": ("temp", inv.KIND_TEMP, ""),
        "mine.txt": ("unknown", inv.KIND_UNKNOWN, ""),
        "link": ("unknown", inv.KIND_UNKNOWN, ""),
    }
    journal = next(i for i in inv.scan_store(tmp_path) if i.unit == "journal")
    assert journal.size == len('{"seq": 1, "code": "x"}')
    assert inv.scan_store(tmp_path / "nothing-here") == []


def test_storing_again_refreshes_the_blob_mtime(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    digest = store.put_bytes(b"data")
    _old(store.path_for(digest))
    assert store.put_bytes(b"data") == digest
    assert time.time() - store.path_for(digest).stat().st_mtime < 60
    src = tmp_path / "src.json"
    src.write_bytes(b"trace")
    digest2, _ = store.put_file(src)
    _old(store.path_for(digest2))
    store.put_file(src)
    assert time.time() - store.path_for(digest2).stat().st_mtime < 60
    assert not list(tmp_path.glob(".incoming-*"))


def test_remove_item_spares_what_was_written_again(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    a, b = store.put_bytes(b"a"), store.put_bytes(b"b")
    journal = tmp_path / "sessions" / "ghost"
    journal.mkdir(parents=True)
    (journal / "00000001.json").write_text("{}")
    for p in (store.path_for(a), store.path_for(b), journal):
        _old(p)
    items = {i.key or i.path: i for i in inv.scan_store(tmp_path)}
    store.put_bytes(b"b")  # stored again after the listing: its mtime moves on
    done = gc.execute(tmp_path, [items[a], items[b], items["ghost"]], min_age_s=HOUR)
    assert [i.key for i in done.removed] == [a, "ghost"]
    assert [(i.key, why) for i, why in done.spared] == [(b, "written again while gc ran")]
    assert not store.exists(a) and store.exists(b) and not journal.exists()
    assert [p.name for p in store.path_for(b).parent.iterdir()] == [b]  # put back, no trash left
    assert inv.remove_item(tmp_path, items[a], min_age_s=HOUR, clock=time.time) == "gone already"


# ----------------------------------------------------------------------------------- payloads


def _reference(digest: str, driver: str = PAYLOAD_DRIVER_NAME) -> Payload:
    ref = ExternalStorageReference(driver_name=driver, claim_data={"sha256": digest, "size": "1"})
    payload = JSONProtoPayloadConverter().to_payload(ref)
    assert payload is not None
    return payload


def test_stored_digest_reads_references() -> None:
    digest = sha("p")
    assert stored_digest(_reference(digest)) == digest
    legacy = Payload(
        metadata={"encoding": b"json/external-storage-reference"},
        data=json.dumps(
            {"driver_name": PAYLOAD_DRIVER_NAME, "driver_claim": {"claim_data": {"sha256": digest}}}
        ).encode(),
    )
    assert stored_digest(legacy) == digest
    assert stored_digest(Payload(metadata={"encoding": b"json/plain"}, data=b"{}")) is None
    with pytest.raises(ForeignReference):
        stored_digest(_reference(digest, driver="s3"))


# ----------------------------------------------------------------------------------- run_gc


class FakeSource:
    """Executions and histories in memory; `fail_on` makes reading that workflow's history fail."""

    def __init__(
        self, histories: dict[str, list[HistoryEvent]], fail_on: str | None = None, list_fails: bool = False
    ) -> None:
        self.namespace = "test"
        self.histories, self.fail_on, self.list_fails = histories, fail_on, list_fails
        self.listed = 0

    async def executions(self) -> AsyncIterator[gc.Execution]:
        self.listed += 1
        if self.list_fails:
            raise ConnectionError("server unreachable")
        for wid in list(self.histories):
            yield gc.Execution(wid, f"run-{wid}", running=True)

    async def events(self, execution: gc.Execution) -> AsyncIterator[HistoryEvent]:
        if execution.workflow_id == self.fail_on:
            raise ConnectionError("history service unavailable")
        for event in self.histories[execution.workflow_id]:
            yield event


def _started(text: str) -> HistoryEvent:
    event = HistoryEvent(event_id=1)
    event.workflow_execution_started_event_attributes.input.CopyFrom(
        Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"}, data=text.encode())])
    )
    return event


def _marker(payload: Payload) -> HistoryEvent:
    marker = MarkerRecordedEventAttributes(marker_name="m", details={"result": Payloads(payloads=[payload])})
    return HistoryEvent(event_id=2, marker_recorded_event_attributes=marker)


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A store with a trace, an offloaded payload naming an init blob, and two orphans, all old."""
    bs = BlobStore(tmp_path)
    names = {
        "trace": bs.put_bytes(b'{"steps": ["' + b"x" * 100 + b'"]}'),
        "init": bs.put_bytes(json.dumps({"skillbook": "", "task": {}}, sort_keys=True).encode()),
        "orphan": bs.put_bytes(b"nobody names me"),
        "orphan2": bs.put_bytes(b"nor me"),
    }
    inner = Payload(
        metadata={"encoding": b"json/plain"}, data=json.dumps({"init_ref": names["init"]}).encode()
    )
    names["payload"] = bs.put_bytes(inner.SerializeToString(deterministic=True))
    (tmp_path / "sessions" / "wf-1").mkdir(parents=True)
    (tmp_path / "sessions" / "wf-1" / "00000001.json").write_text("{}")
    _old(tmp_path)
    return tmp_path, names


def _later() -> float:
    """gc's clock two hours on: the store's items, written just now, are past the 1 h grace period (their age
    counts from their ctime, which no utime moves back: `_old` alone no longer makes them old)."""
    return time.time() + 2 * HOUR


def _history(names: dict[str, str]) -> list[HistoryEvent]:
    trace = TraceRef(uri=blob_uri(names["trace"]), sha256=names["trace"], size=1)
    return [_started(json.dumps({"trace": trace.model_dump()})), _marker(_reference(names["payload"]))]


async def test_run_gc_removes_only_what_no_history_names(store: tuple[Path, dict[str, str]]) -> None:
    root, names = store
    source = FakeSource({"wf-1": _history(names)})
    dry = await gc.run_gc(source, root, dry_run=True, clock=_later)
    assert dry.executions == 1 and dry.running == 1
    assert set(dry.removed_paths) == {f"sha256/{names[k][:2]}/{names[k]}" for k in ("orphan", "orphan2")}
    assert BlobStore(root).exists(names["orphan"])  # a dry run removes nothing
    assert dry.removed == {inv.KIND_OTHER: gc.Tally(2, len(b"nobody names me") + len(b"nor me"))}
    assert dry.kept[inv.KIND_PAYLOAD].count == 1 and dry.kept[inv.KIND_TRACE].count == 1
    assert (
        dry.kept[inv.KIND_JOURNAL].count == 1 and dry.kept[inv.KIND_INIT].count == 1
    )  # named inside the payload
    report = await gc.run_gc(source, root, clock=_later)
    assert report.removed_paths == dry.removed_paths and source.listed == 4  # each run lists twice
    bs = BlobStore(root)
    assert not bs.exists(names["orphan"]) and not bs.exists(names["orphan2"])
    assert all(bs.exists(names[k]) for k in ("trace", "init", "payload"))
    assert "would" not in gc.render_report(report) and "orphan" not in json.dumps(report.to_json())


@pytest.mark.parametrize("failure", ["listing", "history", "missing payload", "foreign payload"])
async def test_run_gc_fails_closed(store: tuple[Path, dict[str, str]], failure: str) -> None:
    root, names = store
    histories = {"wf-1": _history(names), "wf-2": [_started("{}")]}
    source = FakeSource(
        histories, list_fails=failure == "listing", fail_on="wf-2" if failure == "history" else None
    )
    if failure == "missing payload":
        histories["wf-2"].append(_marker(_reference(sha("lost"))))
    if failure == "foreign payload":
        histories["wf-2"].append(_marker(_reference(names["orphan"], driver="s3")))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(gc.GCRefused) as e:
        await gc.run_gc(source, root, min_age_s=0)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    expected = {
        "listing": "could not list",
        "history": "could not read the history of workflow 'wf-2'",
        "missing payload": "not in the store",
        "foreign payload": "driver 's3'",
    }[failure]
    assert expected in str(e.value)


async def test_an_execution_listed_only_the_second_time_is_read(store: tuple[Path, dict[str, str]]) -> None:
    root, names = store
    histories = {"wf-1": _history(names)}

    class Growing(FakeSource):
        async def executions(self) -> AsyncIterator[gc.Execution]:
            if self.listed == 1:  # started while the first listing's histories were read
                self.histories["late"] = [_started(f'{{"inherit_ref": "{names["orphan"]}"}}')]
            async for e in super().executions():
                yield e

    report = await gc.run_gc(Growing(histories), root, clock=_later)
    assert report.executions == 2 and report.removed_paths == [
        f"sha256/{names['orphan2'][:2]}/{names['orphan2']}"
    ]


# ----------------------------------------------------------------------------------- the CLI


def test_cli_refuses_to_guess_without_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reflector import cli
    from reflector import client as rr_client
    from reflector.runtime import devserver

    monkeypatch.setattr(
        rr_client, "configure_core_logging", lambda **_kw: None
    )  # the process's Runtime stays
    monkeypatch.setenv("RR_HOME", str(tmp_path))
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    monkeypatch.setattr(devserver, "is_reachable", lambda _address, timeout=1.0: False)
    assert cli.main(["gc"]) == 2
    assert "nothing can say which blobs are in use" in capsys.readouterr().err
    assert cli.main(["gc", "--min-age", "soon"]) == 2
    assert "--min-age: not a duration" in capsys.readouterr().err
    assert not (tmp_path / "temporal.sqlite").exists()


def test_parse_duration() -> None:
    assert [gc.parse_duration(t) for t in ("30", "90s", "15m", "1h", "2d", "0", "1.5h")] == [
        30,
        90,
        900,
        3600,
        172800,
        0,
        5400,
    ]
    with pytest.raises(ValueError):
        gc.parse_duration("-1h")
