"""The streaming scanner, the record index and the lazy view, against the whole-file reader.

The whole-file reader (`reflector.analysis.traces.read` + `normalize`) is the reference: for every shape that is
indexed, the lazy view read back must equal the canonical view, item for item.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.traces import TraceError, normalize, read_trace_file
from reflector.analysis.traces.budget import EAGER_FACTOR, HOST_BASE_BYTES, HOST_MIN_BYTES, host_memory_bytes
from reflector.analysis.traces.index import INDEX_SUFFIX, TraceIndex, build_index
from reflector.analysis.traces.lazy import LazySeq, open_view
from reflector.analysis.traces.scan import Scanner
from reflector.client import ReflectError, upload_trace
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BlobStore

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"


def scan(data: bytes, name: str = "t.json", chunk: int = 64) -> tuple[list[Any], Scanner]:
    sc = Scanner(io.BytesIO(data), name, chunk=chunk)
    out = []
    for start, end, value in sc.records():
        assert json.loads(data[start:end].decode()) == value  # the offsets delimit the record exactly
        out.append(value)
    return out, sc


def test_scan_matches_json_for_any_buffer_size() -> None:
    rng = random.Random(7)
    for _ in range(200):
        doc = [
            {
                "k": rng.random(),
                "s": "é☃" * rng.randint(0, 20),
                "l": list(range(rng.randint(0, 9))),
                "n": None,
            }
            for _ in range(rng.randint(0, 15))
        ]
        chunk = rng.randint(1, 48)
        raw = json.dumps(doc, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode()
        assert scan(raw, chunk=chunk)[0] == doc
        obj = {"question": "q", "steps": doc, "tail": {"x": [1, 2]}}
        got, sc = scan(
            json.dumps(obj, ensure_ascii=False, indent=rng.choice([None, 2])).encode(), chunk=chunk
        )
        assert (
            got == doc
            and sc.header.outer == {"question": "q", "tail": {"x": [1, 2]}}
            and sc.header.key == "steps"
        )
        if len(doc) > 1:
            lines = "\n".join(json.dumps(d, ensure_ascii=False) for d in doc).encode()
            assert scan(lines, chunk=chunk)[0] == doc


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        (b'[{"a": 1}, {"b": }]', "t.json", "invalid JSON in t.json at byte 17: Expecting value"),
        (b"[1, 2", "t.json", "unterminated array"),
        (b'{"a":1}\n{"b":\n', "t.json", "broken JSONL in t.json: line 2 is not valid JSON"),
        (b"  \n ", "t.json", "trace file is empty"),
        (b"[" * 300 + b"]" * 300, "t.json", "nests deeper than 100 levels"),
        (b'{"x": ' + b"[" * 300 + b"]" * 300 + b"}", "t.json", "nests deeper than 100 levels"),
        (b'{"a":1} {"b":2}', "t.json", "Extra data after the JSON document"),
        (b"not json\nat all\n", "t.jsonl", "no line of t.jsonl parses (line 1"),
        (b'{"steps": [1], "q": 2, "steps": [3]}', "t.json", "the field 'steps' appears twice"),
    ],
)
def test_broken_traces_are_one_line_errors(text: bytes, name: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        scan(text, name)
    assert message in str(err.value) and "\n" not in str(err.value)


def _messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "book a flight"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "error: not found"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "let me"},
                {"type": "tool_use", "id": "t9", "name": "calc", "input": {"x": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t9", "content": "42"},
                {"type": "text", "text": "thanks"},
            ],
        },
        {"role": "assistant", "content": "done é"},
    ]


def _shapes(tmp: Path) -> Iterator[tuple[str, Path]]:
    msgs = _messages()
    ace_steps = [
        {"thought": "a", "action": "search", "args": {"q": 1}, "observation": "error: x"},
        "plain",
        {"role": "assistant", "content": "hi"},
    ]
    files: dict[str, Any] = {
        "msgs.jsonl": "\n".join(json.dumps(m, ensure_ascii=False) for m in msgs) + "\n",
        "msgs_array.json": msgs,
        "msgs_wrapper.json": {"question": "q", "messages": msgs, "reward": 0, "ground_truth": "x"},
        "ace_obj.json": {
            "question": "q",
            "steps": ace_steps,
            "reasoning": "because",
            "agent_output": {"final_answer": "5"},
            "ground_truth": "4",
            "feedback": "wrong",
        },
        "ace_trace.json": {"question": "q", "trace": [{"thought": "a"}], "agent_output": "the answer"},
        "ace_batch.json": [
            {"question": "q1", "reward": 1, "final_answer": "a"},
            {"question": "q2", "reward": 0.0, "steps": [{"action": "x"}]},
        ],
        "unknown.json": [[1], 2, {"x": 3}],
        # a multi-agent conversation (Who&When's shape): one step per message, the speaker its actor,
        # the answer the last message that says something (not TERMINATE), labels after the history
        "whowhen.json": {
            "is_correct": False,
            "question": "q",
            "ground_truth": "4",
            "history": [
                {"content": "solve it", "role": "user", "name": "Manager"},
                {"content": "I will search", "role": "assistant", "name": "Expert_A"},
                *[{"content": f"step {i}", "role": "user", "name": f"Expert_{i % 3}"} for i in range(40)],
                {
                    "role": "assistant",
                    "name": "Coder",
                    "content": [
                        {"type": "text", "text": "run"},
                        {"type": "tool_use", "id": "t1", "name": "python", "input": {"c": 1}},
                    ],
                },
                {
                    "role": "user",
                    "name": "Executor",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "Traceback: error"},
                        {"type": "text", "text": "exit code 1"},
                    ],
                },
                {"content": "the answer is 5", "role": "WebSurfer"},
                {"content": "TERMINATE", "role": "assistant", "name": "Expert_A"},
            ],
            "mistake_agent": "Expert_A",
            "mistake_step": "1",
            "system_prompt": {"Expert_A": "you are"},
        },
        "openclaw.jsonl": "\n".join(
            json.dumps(e)
            for e in [
                {"type": "session", "id": "s1", "cwd": "/w"},
                {
                    "type": "message",
                    "message": {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
                },
                {
                    "type": "message",
                    "message": {
                        "role": "assistant",
                        "model": "m1",
                        "content": [{"type": "toolCall", "name": "bash", "arguments": {"cmd": "ls"}}],
                    },
                },
                {
                    "type": "message",
                    "message": {
                        "role": "toolResult",
                        "toolName": "bash",
                        "isError": True,
                        "content": [{"type": "text", "text": "ENOENT"}],
                    },
                },
                {"type": "custom", "customType": "note", "data": {"a": 1}},
                {
                    "type": "message",
                    "message": {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
                },
            ]
        )
        + "\n",
    }
    for name, content in files.items():
        path = tmp / name
        path.write_text(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
        yield name, path
    for shared in sorted(SHARED.glob("*.json*")) if SHARED.is_dir() else []:
        yield shared.name, shared
    for shared in sorted(SHARED.glob("who-and-when/*/*.json"))[:8] if SHARED.is_dir() else []:
        yield f"who-and-when/{shared.name}", shared


def plain(value: Any) -> Any:
    if isinstance(value, LazySeq):
        return [plain(x) for x in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def lazy_view(path: Path) -> tuple[dict[str, Any], TraceIndex, int]:
    with open(path, "rb") as fh:
        _fmt, index = build_index(fh, str(path))
    assert index is not None, f"{path.name} is not indexed"
    index = TraceIndex.from_bytes(index.to_bytes())  # what a host reads back
    fd = os.open(path, os.O_RDONLY)
    view, _roots = open_view(fd, index)
    return view, index, fd


def test_the_lazy_view_equals_the_canonical_view(tmp_path: Path) -> None:
    names = []
    for name, path in _shapes(tmp_path):
        data, _ = read_trace_file(path, None)
        view, _index, fd = lazy_view(path)
        try:
            assert plain(view) == normalize(data), name
        finally:
            os.close(fd)
        names.append(name)
    assert {"msgs.jsonl", "ace_obj.json", "ace_batch.json", "openclaw.jsonl", "whowhen.json"} <= set(names)


@pytest.mark.parametrize(
    "trace",
    [  # the first array longer than the sample the format is decided on and than a batch
        {
            "history": [{"role": "user", "content": "a"}] * 1500,
            "messages": [{"role": "user", "content": "b"}],
        },
        {"steps": [{"action": "x"}] * 1500, "history": [{"role": "user", "name": "A", "content": "b"}]},
        {"trace": [{"thought": "t"}] * 1500, "steps": [{"action": "x"}], "question": "q"},
        {"messages": [{"role": "user", "content": "a"}] * 1500, "traj": [{"role": "user", "content": "b"}]},
    ],
    ids=["messages-after-history", "history-after-steps", "steps-after-trace", "traj-after-messages"],
)
def test_a_later_field_a_whole_read_prefers_keeps_the_trace_whole(
    trace: dict[str, Any], tmp_path: Path
) -> None:
    """The scanner takes the first record array; when a field after it is the one a whole read takes
    steps from, no index is built (the lazy view would show other steps), and the format is the whole
    read's."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    with open(path, "rb") as fh:
        fmt, index = build_index(fh, str(path))
    assert index is None
    assert fmt == normalize(trace)["format"]


def test_an_object_without_a_record_array_gets_its_format(tmp_path: Path) -> None:
    """A JSON object with no record array is scanned whole: its format is still detected (not "unknown")."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"question": "q", "reasoning": "r" * 5000, "final_answer": "4"}))
    with open(path, "rb") as fh:
        fmt, index = build_index(fh, str(path))
    assert (fmt, index) == ("ace", None)


def test_lazy_sequences_behave_like_read_only_lists(tmp_path: Path) -> None:
    path = tmp_path / "steps.json"
    steps = [{"role": "assistant", "content": f"step {i}"} for i in range(50)]
    path.write_text(json.dumps({"question": "q", "steps": steps}))
    view, index, fd = lazy_view(path)
    try:
        s = view["steps"]
        eager = normalize(json.loads(path.read_text()))["steps"]
        assert len(s) == index.n_steps == 50 and s[-1] == eager[-1] and s[3] == eager[3]
        assert plain(s[10:20:3]) == eager[10:20:3] and plain(s[10:20][::-1][1:3]) == eager[10:20][::-1][1:3]
        assert list(reversed(s))[0] == eager[-1] and eager[7] in s and s.index(eager[7]) == 7
        assert s.grep(r"step 4\d") == list(range(40, 50)) and s.grep("step", limit=2) == [0, 1]
        assert s[5] is not s[5]  # a fresh copy each time: changing it changes nothing
        with pytest.raises(IndexError, match="steps index 50 out of range"):
            s[50]
        with pytest.raises(TypeError):
            s["x"]
        with pytest.raises(ValueError, match="slice first"):
            s.to_list(limit=10)
        assert "lazy steps: 50 items" in repr(s)
    finally:
        os.close(fd)


def test_a_damaged_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in _messages()))
    with open(path, "rb") as fh:
        _fmt, index = build_index(fh, str(path))
    assert index is not None
    data = index.to_bytes()
    with pytest.raises(ValueError, match="truncated"):
        TraceIndex.from_bytes(data[:-8])
    bad = dataclasses.replace(index, size=10)
    with pytest.raises(ValueError, match="outside the trace"):
        TraceIndex.from_bytes(bad.to_bytes())


def test_the_memory_formula() -> None:
    gib = 1024**3
    assert host_memory_bytes(1024**2, None) == HOST_MIN_BYTES  # small traces keep the old limit
    assert host_memory_bytes(2 * gib, None) == HOST_BASE_BYTES + EAGER_FACTOR * 2 * gib
    assert (
        host_memory_bytes(100 * gib, 10 * 1024**2) == HOST_MIN_BYTES
    )  # lazy: the trace's size does not count


def _settings(tmp: Path, **kw: Any) -> Settings:
    os.environ["RR_HOME"] = str(tmp / "home")
    os.environ.pop("RR_BLOB_DIR", None)
    return dataclasses.replace(Settings.from_env(), **kw)


def test_a_large_trace_is_streamed_with_its_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RR_HOME", str(tmp_path / "home"))
    settings = _settings(tmp_path, lazy_trace_bytes=1)
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(m) for m in _messages()) + "\n")
    ref = upload_trace(trace, settings)
    store = BlobStore(settings.blob_dir)
    assert ref.format == "messages" and ref.size == trace.stat().st_size
    assert store.path_for(ref.sha256).read_bytes() == trace.read_bytes()
    index = TraceIndex.from_bytes(store.derived_path(ref.sha256, INDEX_SUFFIX[1:]).read_bytes())
    assert index.n_records == 7 and index.n_steps == 8
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"role": "user", "content": "x"}\n{"role": \n')
    with pytest.raises(TraceError, match="line 2 is not valid JSON"):
        upload_trace(broken, settings)
    assert not [
        p for p in Path(settings.blob_dir).rglob("*") if p.is_file() and p.name.startswith(".incoming")
    ]


def test_a_trace_that_cannot_fit_is_refused_with_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RR_HOME", str(tmp_path / "home"))
    settings = _settings(tmp_path, lazy_trace_bytes=1, sandbox_max_memory=HOST_BASE_BYTES + 1024**2)
    spans = tmp_path / "spans.jsonl"  # OTel spans are ordered across records: read whole, not indexed
    spans.write_text(
        "\n".join(
            json.dumps({"span_id": str(i), "name": "llm", "start_time": i, "x": "y" * 500})
            for i in range(2_000)
        )
        + "\n"
    )
    with pytest.raises(ReflectError) as err:
        upload_trace(spans, settings)
    msg = str(err.value)
    assert f"trace of {spans.stat().st_size:,} bytes needs a sandbox host of" in msg
    assert "read whole (format 'otel' is not indexed): 1.00 GiB + 6 x 1.1 MiB" in msg
    assert "over the limit of 1.00 GiB" in msg and "split the trace" in msg
    assert not list(Path(settings.blob_dir).rglob("*.*")), "a refused trace is not stored"


def test_the_client_memory_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    """Peak RSS of a process uploading a 32 MB trace with the streaming path, against a 3 MB one."""

    def peak_kb(n_steps: int) -> int:
        trace = tmp_path / f"t{n_steps}.json"
        with open(trace, "w") as fh:
            fh.write('{"question": "q", "steps": [')
            for i in range(n_steps):
                fh.write(
                    ("," if i else "") + json.dumps({"role": "assistant", "content": f"{i} " + "w" * 480})
                )
            fh.write("]}")
        code = (
            "import sys, dataclasses; from reflector.client import upload_trace; from reflector.runtime.settings import "
            "Settings; upload_trace(sys.argv[1], dataclasses.replace(Settings.from_env(), lazy_trace_bytes=1))"
        )
        env = {**os.environ, "RR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run([sys.executable, "-c", code, str(trace)], env=env, check=True, timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        trace.unlink()
        return max(after, before)

    small = peak_kb(6_000)
    large = peak_kb(64_000)  # ~32 MB: parsed whole it would take 100-160 MB
    assert large - small < 16 * 1024, (small, large)


def test_step_columns_answer_filters_and_counts_without_parsing(tmp_path: Path) -> None:
    import collections

    for name, path in _shapes(tmp_path):
        data, _ = read_trace_file(path, None)
        eager = normalize(data)
        if "steps" not in eager:
            continue
        view, _index, fd = lazy_view(path)
        try:
            s, e = view["steps"], eager["steps"]
            assert s.where(is_error=True) == [i for i, x in enumerate(e) if x["is_error"]], name
            assert s.where(role="assistant") == [i for i, x in enumerate(e) if x["role"] == "assistant"], name
            for cut in (
                slice(1, None),
                slice(None, None, -1),
                slice(-3, None),
                slice(2, -1, 2),
                slice(None, None, -2),
            ):
                part, want = s[cut], e[cut]
                assert part.where(role="tool") == [i for i, x in enumerate(want) if x["role"] == "tool"], (
                    name,
                    cut,
                )
                assert part.where(role="assistant", is_error=False) == [
                    i for i, x in enumerate(want) if x["role"] == "assistant" and not x["is_error"]
                ], (name, cut)
                assert part.counts("role") == dict(collections.Counter(x["role"] for x in want)), (name, cut)
            assert s.where(role="no such role") == []
            fails = collections.Counter(str(x["tool_name"]) for x in e if x["is_error"])
            assert s.counts("tool_name", is_error=True) == dict(fails), name
            assert s.counts("role") == dict(collections.Counter(x["role"] for x in e)), name
            calls: collections.Counter[str] = collections.Counter()
            for x in e:
                calls.update(str(c["name"]) for c in x["tool_calls"])
            assert s.tool_call_counts() == dict(calls), name
        finally:
            os.close(fd)


async def test_a_worker_indexes_a_large_trace_stored_without_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace put in the store some other way (not by `upload_trace`) gets its index before a host opens it."""
    from activities import sandbox as sandbox_activities
    from reflector.contract import TraceRef
    from reflector.runtime.storage.blobs import blob_uri

    store = BlobStore(tmp_path / "blobs")
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(m) for m in _messages()) + "\n")
    digest, size = store.put_file(trace)
    runtime = sandbox_activities._Runtime(store=store, sessions=None, lazy_trace_bytes=1)  # type: ignore[arg-type]
    monkeypatch.setattr(sandbox_activities, "_runtime", runtime)
    ref = TraceRef(uri=blob_uri(digest), sha256=digest, size=size, format="messages")
    await sandbox_activities.ensure_index(ref)
    index = TraceIndex.from_bytes(store.derived_path(digest, INDEX_SUFFIX[1:]).read_bytes())
    assert index.n_steps == 8 and not list(store.root.glob(".incoming-*"))
    other = tmp_path / "u.jsonl"
    other.write_text(trace.read_text() + "\n")
    d2, s2 = store.put_file(other)
    monkeypatch.setattr(sandbox_activities, "_runtime", dataclasses.replace(runtime, lazy_trace_bytes=s2 + 1))
    await sandbox_activities.ensure_index(TraceRef(uri=blob_uri(d2), sha256=d2, size=s2, format="messages"))
    assert not store.derived_path(d2, INDEX_SUFFIX[1:]).exists()  # under the threshold: read whole


def test_grep_finds_exactly_the_records_a_search_of_each_finds(tmp_path: Path) -> None:
    """The block-wise search (one regex pass over neighbouring records) against `re.search` per record,
    with matches that cross record boundaries, non-ASCII records and anchored patterns."""
    import re

    rng = random.Random(11)
    words = ["error", "ok", "Err", "timeout", "é", "a,b", "x1-234", "}{", "\\n"]
    records = [
        {
            "role": rng.choice(["user", "assistant", "tool"]),
            "content": " ".join(rng.choice(words) for _ in range(rng.randint(0, 6))),
        }
        for _ in range(400)
    ]
    path = tmp_path / "g.json"
    path.write_text(json.dumps(records, ensure_ascii=rng.random() < 0.5))
    view, _index, fd = lazy_view(path)
    raw = path.read_bytes()
    try:
        recs = view["raw"]
        texts = [raw[s:e].decode() for s, e in zip(_index.starts, _index.ends, strict=True)]
        for pattern in [
            "error",
            r"\bErr\b",
            r"ok.*timeout",
            r"\}\s*,\s*\{",
            r"^\{",
            r"[0-9]{3}",
            "é",
            r"ok\"\}, \{",
            r"(?<=: )\"ok",
        ]:
            want = [i for i, t in enumerate(texts) if re.search(pattern, t)]
            assert recs.grep(pattern, limit=10**6) == want, pattern
            assert recs[100:300].grep(pattern, limit=10**6) == [i - 100 for i in want if 100 <= i < 300], (
                pattern
            )
            assert recs[::-3].grep(pattern, limit=10**6) == [
                k for k, i in enumerate(range(399, -1, -3)) if i in want
            ]
    finally:
        os.close(fd)
