"""What a caller of the Python API passes, as a trace file: a path, JSON or JSON-lines text, plain text, a
dict or list, a pydantic model, a dataclass or any object with attributes, or nothing (a minimal trace from
the question and the answer); the answer placed where the trace has none; a skillbook as text."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from reflector.runtime.settings import Settings

Traces = str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | BaseModel | object | None
"""A trace for `reflect`: a file path; a dict or list (e.g. a list of messages or steps); a str holding the
trace's JSON or JSON-lines text (a str naming an existing file is that file), or plain text (a one-step
trace); a pydantic model, a dataclass or any object with attributes (its data); or None (a trace is built
from `question`, `agent_output`, `ground_truth`, `feedback`)."""

IN_MEMORY = "<in-memory trace>"  # how an in-memory trace is named in messages and `rr list`
_TEXT_START = ("{", "[")  # a str trace whose text starts so (after blanks) is JSON / JSONL text


@dataclasses.dataclass(frozen=True)
class _Answer:
    """`agent_output` as the trace readers know it: ACE's `AgentOutput` fields."""

    final_answer: str
    reasoning: str | None = None
    skill_ids: tuple[str, ...] = ()


def _answer(agent_output: object) -> _Answer | None:
    """A str (the final answer), a mapping or an object (ACE's `AgentOutput`) with `final_answer` (and
    optionally `reasoning`, `skill_ids`), or None."""
    if agent_output is None:
        return None
    if isinstance(agent_output, str):
        return _Answer(agent_output)
    get: Callable[[str], Any]
    if isinstance(agent_output, Mapping):
        get = agent_output.get
    else:

        def get(name: str) -> Any:
            return getattr(agent_output, name, None)

    final = get("final_answer")
    if not isinstance(final, str):
        raise ValueError(
            f"agent_output must be a str, or have a str `final_answer` (like ACE's AgentOutput); "
            f"got {type(agent_output).__name__}"
        )
    reasoning = get("reasoning")
    ids = get("skill_ids") or ()
    return _Answer(
        final,
        reasoning if isinstance(reasoning, str) and reasoning else None,
        tuple(str(i) for i in ids) if isinstance(ids, (list, tuple)) else (),
    )


def _minimal_trace(
    question: str, answer: _Answer | None, ground_truth: str | None, feedback: str | None
) -> dict[str, Any]:
    """traces=None: an ACE trace of the answer (the seed's "reflect on an answer")."""
    if answer is None:
        raise ValueError(
            "nothing to reflect on: pass traces= (a path, a dict, a list or JSON text), "
            "or agent_output= (the answer to reflect on)"
        )
    out: dict[str, Any] = {"question": question}
    if answer.reasoning or answer.skill_ids:
        out["agent_output"] = {
            "reasoning": answer.reasoning or "",
            "final_answer": answer.final_answer,
            "skill_ids": list(answer.skill_ids),
        }
    else:
        out["agent_output"] = answer.final_answer
    if ground_truth is not None:
        out["ground_truth"] = ground_truth
    if feedback is not None:
        out["feedback"] = feedback
    return out


def _place_answer(data: Any, answer: _Answer | None) -> Any:
    """`data` with `answer` where the trace readers find the final answer (`data` itself when it already says so).

    - a dict trace (ACE, a messages wrapper, or a shape not recognised): its `final_answer` key (and, when
      absent, `reasoning` / `skill_ids`); a different `final_answer` already there is a `ValueError`;
    - a list of messages: wrapped as `{"messages": [...], "final_answer": ...}`; a list of free-form steps:
      `{"steps": [...], "final_answer": ...}`;
    - a tau-bench, OpenClaw, OTel trace or a batch (a list of runs) whose own final answer differs: a
      `ValueError` (their readers take the final answer from the trace; it cannot be replaced).
    """
    from reflector.analysis.traces import TraceError, detect_format, normalize

    if answer is None:
        return data
    fmt = detect_format(data)
    try:
        view = normalize(data)
    except TraceError:
        view = {}
    if "runs" not in view and (view.get("final_answer") or "").strip() == answer.final_answer.strip():
        return data  # the trace already ends with this answer
    if isinstance(data, Mapping) and fmt in ("ace", "messages", "unknown"):
        given = data.get("final_answer")
        if given is not None and str(given).strip() != answer.final_answer.strip():
            raise ValueError(
                f"agent_output differs from the trace's final_answer ({str(given)[:80]!r}): pass "
                "the answer once, in the trace or as agent_output"
            )
        placed = {**data, "final_answer": answer.final_answer}
        if fmt != "messages":
            if answer.reasoning and "reasoning" not in data:
                placed["reasoning"] = answer.reasoning
            if answer.skill_ids and "skill_ids" not in data:
                placed["skill_ids"] = list(answer.skill_ids)
        return placed
    if isinstance(data, list) and fmt == "messages":
        return {"messages": data, "final_answer": answer.final_answer}
    if isinstance(data, list) and fmt == "unknown":
        return {"steps": data, "final_answer": answer.final_answer}
    what = f"a batch of {len(view['runs'])} runs" if "runs" in view else f"a {fmt} trace"
    raise ValueError(
        f"agent_output cannot be placed in {what}: its reader takes the final answer from the "
        "trace itself; leave agent_output out, or put the answer in the trace"
    )


def _jsonable(value: object) -> Any:
    """`json.dumps`' fallback for the objects traces built in Python hold."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    public = _public_vars(value)
    if public is not None:  # an object the agent produced (ACE passes whatever it got): its attributes
        return public
    raise TypeError(
        f"Object of type {type(value).__name__} is not JSON serializable (not a dict, list, str, "
        "number, dataclass, pydantic model or object with attributes)"
    )


def _public_vars(value: object) -> dict[str, Any] | None:
    """An object's public attributes (`__dict__`, else `__slots__`), None when it has neither."""
    if callable(value) or inspect.ismodule(value) or inspect.isgenerator(value) or inspect.iscoroutine(value):
        return None  # code, not data
    names: list[str] | None = None
    if hasattr(value, "__dict__") and isinstance(vars(value), dict):
        names = list(vars(value))
    elif (slots := getattr(type(value), "__slots__", None)) is not None:
        names = [slots] if isinstance(slots, str) else list(slots)
    if names is None:
        return None
    return {n: getattr(value, n) for n in names if not n.startswith("_") and hasattr(value, n)}


def _plain_trace(value: object) -> Any:
    """A trace of another shape than dict / list / str / path / pydantic model, as JSON-able data: a dataclass
    or an object (its attributes), a tuple (a list), a number or bool (text). None: not representable."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, bool | int | float):
        return _text_trace(json.dumps(value))
    if isinstance(value, (bytes, bytearray)):
        return _text_trace(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return _public_vars(value)


def _text_trace(text: str) -> dict[str, Any]:
    """Plain text (not JSON, not a file): a one-step trace, the text as the agent's step."""
    return {"steps": [{"role": "assistant", "content": text}]}


def _looks_like_path(s: str) -> bool:
    """A one-line str with no blanks that names a file (a separator or a trace extension): a mistyped path is
    an error ("trace file not found"), not a trace of that text."""
    text = s.strip()
    return (
        "\n" not in text
        and " " not in text
        and len(text) < 4096
        and (os.sep in text or text.endswith((".json", ".jsonl", ".ndjson", ".txt", ".log")))
    )


def _dump(data: Any) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError) as e:  # ValueError: a circular reference
        raise ValueError(f"the trace cannot be stored as JSON: {e}") from None


@contextlib.contextmanager
def _trace_file(
    traces: Traces,
    answer: _Answer | None,
    question: str,
    ground_truth: str | None,
    feedback: str | None,
    settings: Settings,
) -> Iterator[tuple[Path, str]]:
    """(a file holding the trace, its name for `rr list`): the user's file, or a temporary one in
    RR_HOME/tmp (removed on exit) for an in-memory trace or one `agent_output` was placed in."""
    from reflector.analysis.traces import parse_trace_bytes, read_trace_file

    text: str | None = None
    if traces is None:
        text = _dump(_minimal_trace(question, answer, ground_truth, feedback))
    elif isinstance(traces, os.PathLike) or (isinstance(traces, str) and _is_file(traces)):
        path = Path(traces)
        if answer is None:
            yield path, path.name
            return
        if not path.is_file():
            from reflector.analysis.traces import TraceError

            raise TraceError(f"trace file not found: {path}")
        if path.stat().st_size >= settings.lazy_trace_bytes:
            raise ValueError(
                f"agent_output with the trace file {path} ({path.stat().st_size:,} bytes): put the "
                f"final answer in the file (traces of {settings.lazy_trace_bytes:,} bytes or more are "
                "not rewritten), or leave agent_output out"
            )
        data, _fmt = read_trace_file(path, settings.max_trace_bytes)
        placed = _place_answer(data, answer)
        if placed is data:
            yield path, path.name
            return
        text = _dump(placed)
    elif isinstance(traces, str) and not traces.lstrip().startswith(_TEXT_START):
        if _looks_like_path(traces) or not traces.strip():
            from reflector.analysis.traces import TraceError

            raise TraceError(
                f"trace file not found: {traces[:200]} (a str trace is a file path, the trace's "
                "JSON / JSON-lines text, or plain text with blanks in it)"
            )
        text = _dump(_place_answer(_text_trace(traces), answer))
    elif isinstance(traces, str):
        text = traces
        if answer is not None:
            data, _fmt = parse_trace_bytes(traces.encode("utf-8"), IN_MEMORY)
            placed = _place_answer(data, answer)
            text = traces if placed is data else _dump(placed)
    elif isinstance(traces, (Mapping, list, tuple, BaseModel)):
        data = traces.model_dump(mode="json") if isinstance(traces, BaseModel) else traces
        text = _dump(
            _place_answer(
                list(data) if isinstance(data, tuple) else dict(data) if isinstance(data, Mapping) else data,
                answer,
            )
        )
    else:
        plain = _plain_trace(traces)
        if plain is None:
            raise ValueError(
                f"traces must be a path, a dict, a list, JSON or plain text, a dataclass, a pydantic "
                f"model, an object with attributes, or None; got {type(traces).__name__}, which has "
                "none of those shapes"
            )
        text = _dump(_place_answer(plain, answer))
    from reflector.runtime.settings import usable_dir

    tmp_dir = usable_dir(settings.home / "tmp", "RR_HOME")
    fd, name = tempfile.mkstemp(prefix="api-", suffix=".json", dir=tmp_dir)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        yield tmp, IN_MEMORY
    finally:
        tmp.unlink(missing_ok=True)


def _is_file(s: str) -> bool:
    if "\n" in s or len(s) > 4096 or s.lstrip().startswith(_TEXT_START):
        return False
    try:
        return Path(s).is_file()
    except (OSError, ValueError):
        return False


def _skillbook_text(skillbook: object) -> str:
    """ReflectionInput.skillbook: a str as is; an object with `as_prompt()` (ACE's Skillbook) its prompt; else `str()`."""
    if skillbook is None:
        return ""
    if isinstance(skillbook, str):
        return skillbook
    as_prompt = getattr(skillbook, "as_prompt", None)
    if callable(as_prompt):
        return str(as_prompt() or "")
    return str(skillbook)
