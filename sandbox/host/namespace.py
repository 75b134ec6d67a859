"""The sandbox namespace: preloaded variables and helpers, cell execution, scaffolding restore.

Lives in the host process only. Everything a cell can call here is trusted code; everything a cell
defines is checked by `sandbox.host.guards` first. After every cell the scaffolding (helpers, modules,
`print`, `traces`, `history`, the extra variables, registered helpers) is put back, so model code
that rebinds `print` or `traces` cannot break later cells or the harness.

`history` is the archive of compacted transcripts: a list (empty at start, changed in place by cells)
that the workflow fills with journaled cells `history.extend(ARCHIVE("<sha256>"))`. `ARCHIVE` reads
one content-addressed blob by its checked name (see `sandbox.archive`; in a locked-down host the
worker reads it, see `sandbox.host`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from reflector.analysis.toolkit import SANDBOX_HELPERS, TOOLKIT_DOC
from reflector.analysis.toolkit.actors import actors_note
from reflector.analysis.traces.lazy import LazySeq
from sandbox.archive import ARCHIVE_MAX_BYTES, read_archive
from sandbox.host.guards import (
    ATTR_HOOK,
    CELL_MODULE,
    DISPLAY_HOOK,
    MUT_HOOK,
    GuardError,
    allowed_modules_text,
    make_builtins,
    prepare,
)
from sandbox.host.hashes import IdentityHashes, cell_hash, with_identity_hash
from sandbox.host.output import Capture
from sandbox.host.safe_modules import ModuleProxy, SafeImporter, check_mutable, guarded_attr

__all__ = [
    "SandboxNamespace",
    "load_traces",
    "read_archive",
    "PRELOADED_MODULES",
    "HISTORY",
    "ARCHIVE_MAX_BYTES",
    "FINAL_ANSWER_MAX_BYTES",
]


PRELOADED_MODULES: tuple[str, ...] = ("json", "re", "math", "collections", "datetime")


SCHEMA_DEPTH = 3


SCHEMA_MAX_KEYS = 25


SCHEMA_MAX_CHARS = 4000


PREVIEW_STR_CHARS = 200


PREVIEW_LIST_ITEMS = 3


_AUTO_FORMATS = frozenset({"", "auto", "json", "jsonl"})  # container formats: let the normaliser detect


HISTORY = "history"  # scaffold list: the archived (compacted) transcripts; snapshotted and exported by value


FINAL_ANSWER_MAX_BYTES = 1024**2  # serialised (JSON) size of one FINAL_ANSWER value


# Frames a cell may nest (counted from where the host runs it), the same in every host: a host forked
# from the zygote starts its cells deeper in the stack than one started directly (`normalise_recursion`).
CELL_RECURSION_DEPTH = 980


LAZY_NOTE = (
    "  (a large trace, read lazily: its lists are lazy sequences that parse items on access. len() is "
    "free; x[i], x[-1], slices (x[a:b] is lazy too), `for` and `in` work; x.grep(regex, limit=100) "
    "returns the positions whose raw JSON matches without parsing the rest; x.to_list(limit) makes a "
    "list. Steps also answer from the index, parsing nothing: steps.where(role=, is_error=, tool_name=) "
    "-> positions, steps.counts('role' | 'tool_name' | 'is_error', is_error=None) -> {value: n}, "
    "steps.tool_call_counts(). Each access parses a fresh copy, so keep what you need in a variable; "
    "they cannot be changed.)"
)


def load_traces(trace_path: str | None, trace_format: str) -> Any:
    """Load the trace for `traces`: the normaliser if available, else plain JSON / JSON lines."""
    if trace_path is None:
        return None
    try:
        from reflector.analysis.traces import load_normalized  # lazy: heavy, and maybe not there yet
    except ImportError:
        pass
    else:
        fmt = None if trace_format in _AUTO_FORMATS else trace_format
        return load_normalized(trace_path, fmt)
    with open(trace_path, encoding="utf-8") as fh:
        if trace_format == "jsonl" or trace_path.endswith(".jsonl"):
            return [json.loads(line) for line in fh if line.strip()]
        return json.load(fh)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _size(value: Any) -> str:
    if isinstance(value, str | bytes):
        return f"{len(value):,} chars"
    if isinstance(value, dict):
        return f"{len(value):,} keys"
    try:
        return f"{len(value):,} items"
    except Exception:  # any user object
        return "-"


def _is_view(value: Any) -> bool:
    """A canonical trace view (`reflector.analysis.traces.view`): its `raw` is the trace as read, the same data again."""
    return isinstance(value, dict) and "raw" in value and ("steps" in value or "runs" in value)


def _named(value: Any) -> str:
    """A view's `raw` in previews and schemas: its type and size only (printing it would repeat the view)."""
    return f"{_type_name(value)} ({_size(value)}; the trace as read: the same data as the fields above)"


def _schema(value: Any, depth: int = 0) -> str:
    """A compact nested type sketch, e.g. `{steps: list[3] of {role: str, content: str}}`."""
    if isinstance(value, LazySeq):  # sketched from its first item only: reading more costs I/O
        first = _schema(value[0], depth + 1) if len(value) and depth < SCHEMA_DEPTH else "..."
        return f"{_type_name(value)}[{len(value):,}, lazy] of {first}"
    if isinstance(value, dict):
        if depth >= SCHEMA_DEPTH:
            return f"dict[{len(value)} keys]"
        items = list(value.items())
        view = _is_view(value)
        parts = [
            f"{k}: {_named(v) if view and k == 'raw' else _schema(v, depth + 1)}"
            for k, v in items[:SCHEMA_MAX_KEYS]
        ]
        if len(items) > SCHEMA_MAX_KEYS:
            parts.append(f"... +{len(items) - SCHEMA_MAX_KEYS} keys")
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, list | tuple):
        if depth >= SCHEMA_DEPTH or not value:
            return f"{_type_name(value)}[{len(value)}]"
        kinds: list[str] = []
        for item in value[:20]:
            sketch = _schema(item, depth + 1)
            if sketch not in kinds:
                kinds.append(sketch)
        return (
            f"{_type_name(value)}[{len(value)}] of "
            + " | ".join(kinds[:3])
            + (" | ..." if len(kinds) > 3 else "")
        )
    return _type_name(value)


def _dump_preview(value: Any) -> str:
    """JSON with one line per key of a dict and per item of its lists (a step, a run): dense and readable."""

    def one(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, default=repr)

    if not isinstance(value, dict):
        return json.dumps(value, indent=1, ensure_ascii=False, default=repr)
    lines = []
    for k, v in value.items():
        if isinstance(v, list) and v:
            lines.append(f" {one(k)}: [\n" + ",\n".join(f"  {one(x)}" for x in v) + "\n ]")
        else:
            lines.append(f" {one(k)}: {one(v)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def _clip(value: Any, depth: int = 0) -> Any:
    """A small copy of `value` for previews: long strings and lists are cut, depth is bounded."""
    if isinstance(value, str):
        extra = len(value) - PREVIEW_STR_CHARS
        return value if extra <= 0 else value[:PREVIEW_STR_CHARS] + f"...(+{extra} chars)"
    if depth > 6:
        return "..."
    if isinstance(value, dict):
        view = _is_view(value)
        out = {
            str(k): _named(v) if view and k == "raw" else _clip(v, depth + 1)
            for k, v in list(value.items())[:SCHEMA_MAX_KEYS]
        }
        if len(value) > SCHEMA_MAX_KEYS:
            out["..."] = f"+{len(value) - SCHEMA_MAX_KEYS} keys"
        return out
    if isinstance(value, list | tuple):
        out_list = [_clip(v, depth + 1) for v in value[:PREVIEW_LIST_ITEMS]]
        if len(value) > PREVIEW_LIST_ITEMS:
            out_list.append(f"... +{len(value) - PREVIEW_LIST_ITEMS} items")
        return out_list
    if isinstance(value, LazySeq):
        items: list[Any] = [_clip(v, depth + 1) for v in value[:PREVIEW_LIST_ITEMS]]
        if len(value) > PREVIEW_LIST_ITEMS:
            items.append(f"... +{len(value) - PREVIEW_LIST_ITEMS:,} items (lazy {_type_name(value)})")
        return items
    if value is None or isinstance(value, bool | int | float):
        return value
    return repr(value)[:PREVIEW_STR_CHARS]


class SandboxNamespace:
    """One session's namespace plus the per-cell machinery (capture, submitted value, restore)."""

    def __init__(self, max_output_chars: int) -> None:
        self.max_output_chars = max_output_chars
        self.importer = SafeImporter()
        self.capture = Capture(max_output_chars)
        self.submitted: Any = None
        self.has_submission = False
        self._helpers: dict[str, tuple[Callable[..., Any], str]] = {}
        self._data_names: list[str] = []
        self._cell_no = 0
        self.hashes = IdentityHashes()  # deterministic hashes for identity-hashed values (see `cell_hash`)
        self.builtins = make_builtins({"print": self._print, "hash": cell_hash(self.hashes)}, self.importer)
        self.builtins["__build_class__"] = with_identity_hash(self.builtins["__build_class__"], self.hashes)
        self.ns: dict[str, Any] = {}
        self._scaffold: dict[str, Any] = {}
        self.archive_root: str | None = None
        self.lazy_roots: dict[str, LazySeq] = {}  # a lazy trace's root sequences (snapshot/export refs)
        self._recursion_limit: int | None = None  # see normalise_recursion

    # -- setup -------------------------------------------------------------------------------------
    def start(
        self,
        traces: Any,
        extra_vars: dict[str, Any],
        archive_root: str | None = None,
        lazy_roots: dict[str, LazySeq] | None = None,
    ) -> None:
        """Populate the namespace; called once per host. `archive_root`: the blob store `ARCHIVE` reads;
        `lazy_roots`: the root sequences of a lazy `traces` (see `reflector.analysis.traces.lazy`)."""
        self.archive_root = archive_root
        self.lazy_roots = dict(lazy_roots or {})
        scaffold: dict[str, Any] = {
            "__builtins__": self.builtins,
            "__name__": CELL_MODULE,
            ATTR_HOOK: guarded_attr,
            MUT_HOOK: check_mutable,
            DISPLAY_HOOK: self._display,
            "print": self._print,
            "SHOW_VARS": self.show_vars,
            "describe_traces": self.describe_traces,
            "register_helper": self.register_helper,
            "list_helpers": self.list_helpers,
            "run_helper": self.run_helper,
            "FINAL_ANSWER": self.final_answer,
            "ARCHIVE": self.archive,
            "traces": traces,
            HISTORY: [],
            **SANDBOX_HELPERS,  # the trace-analysis toolkit (reflector.analysis.toolkit): trusted, returns plain data
        }
        for name in PRELOADED_MODULES:
            scaffold[name] = self.importer.proxy(name)
        for name, value in extra_vars.items():
            if not name.isidentifier() or name.startswith("_") or name in scaffold:
                raise ValueError(f"invalid extra variable name: {name!r}")
            scaffold[name] = value
        self._data_names = ["traces", *extra_vars]
        self._scaffold = scaffold
        self.ns.update(scaffold)

    def restore(self) -> None:
        """Put the scaffolding and registered helpers back after a cell (rebinding is undone)."""
        ns = self.ns
        rebound = [
            name
            for name in SANDBOX_HELPERS
            if name in self._scaffold and ns.get(name) is not self._scaffold[name]
        ]
        for name, value in self._scaffold.items():
            if ns.get(name) is not value:
                ns[name] = value
        if rebound:  # `tool_calls = [...]` is a natural variable name: say it will not last
            self._print(
                f"note: {', '.join(rebound)}: toolkit function name(s), restored after this cell; "
                "keep your own data under another name"
            )
        for name, (fn, _src) in self._helpers.items():
            if ns.get(name) is not fn:
                ns[name] = fn

    # -- cells -------------------------------------------------------------------------------------
    def compile_cell(self, code: str) -> Any:
        """Check and compile a cell (raises SyntaxError / GuardError)."""
        self._cell_no += 1
        filename = f"<cell {self._cell_no}>"
        _remember_source(filename, code)
        return prepare(code, filename)

    def normalise_recursion(self) -> None:
        """Set the recursion limit so that a cell run from the caller's frame may nest exactly
        `CELL_RECURSION_DEPTH` frames, whatever lies below (a zygote's fork server, runpy): a replay in
        another kind of host then hits RecursionError at the same depth. Measured once per host (by
        recursing until the limit; the host always runs cells from the same frame), set before each cell.
        """
        if self._recursion_limit is None:
            self._recursion_limit = sys.getrecursionlimit() - _free_depth() + CELL_RECURSION_DEPTH
        sys.setrecursionlimit(self._recursion_limit)

    def begin_cell(self) -> None:
        """Reset the per-cell capture and submission."""
        self.capture = Capture(self.max_output_chars)
        self.submitted = None
        self.has_submission = False

    # -- preloaded callables -----------------------------------------------------------------------
    def _print(
        self, *args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: bool = False
    ) -> None:
        """print() that writes to the cell's capture (never to a process-global stream)."""
        print(*args, sep=sep, end=end, file=self.capture if file is None else file)

    def _display(self, value: Any) -> None:
        if value is not None:
            self._print(repr(value))

    def show_vars(self) -> None:
        """Print the user's variables (name, type, size), then the preloaded data and helpers."""
        hidden = set(self._scaffold) | set(self._helpers)
        rows = [
            (name, _type_name(value), _size(value))
            for name, value in self.ns.items()
            if name not in hidden and not name.startswith("__") and not isinstance(value, ModuleProxy)
        ]
        if rows:
            width = max(len(r[0]) for r in rows)
            self._print("your variables:")
            for name, kind, size in rows:
                self._print(f"  {name:<{width}}  {kind:<12} {size}")
        else:
            self._print("your variables: (none yet)")
        shown = [*self._data_names, HISTORY]
        data = ", ".join(f"{n} ({_type_name(self.ns[n])}, {_size(self.ns[n])})" for n in shown)
        self._print(f"preloaded: {data}")
        self._print(
            "modules: " + ", ".join(PRELOADED_MODULES) + " (preloaded); importable: " + allowed_modules_text()
        )
        helpers = ", ".join(self._helpers) or "none"
        self._print(
            f"helpers: {helpers}; tools: describe_traces() SHOW_VARS() register_helper() "
            "list_helpers() run_helper() FINAL_ANSWER() ARCHIVE(sha256)"
        )
        self._print(
            "toolkit: " + " ".join(f"{name}()" for name in SANDBOX_HELPERS) + " (see describe_traces())"
        )

    def describe_traces(self, max_preview: int = 1500) -> None:
        """Print the shape of `traces`: type, keys/length, a schema sketch and a bounded preview."""
        traces = self.ns.get("traces")
        self._print(f"traces: {_type_name(traces)} ({_size(traces)})")
        if self.lazy_roots:
            self._print(LAZY_NOTE)
        self._print(TOOLKIT_DOC)  # first, so the prompt's cut preview keeps it
        note = actors_note(traces)  # the agents a multi-agent run names, so the model knows who exists
        if note:
            self._print(note)
        if isinstance(traces, dict):
            for key, value in list(traces.items())[:SCHEMA_MAX_KEYS]:
                self._print(f"  [{key!r}]: {_type_name(value)} ({_size(value)})")
            if len(traces) > SCHEMA_MAX_KEYS:
                self._print(f"  ... +{len(traces) - SCHEMA_MAX_KEYS} more keys")
        elif isinstance(traces, list | tuple):
            kinds: dict[str, int] = {}
            for item in traces:
                kinds[_type_name(item)] = kinds.get(_type_name(item), 0) + 1
            self._print("  element types: " + ", ".join(f"{k} x{v}" for k, v in kinds.items()))
        schema = _schema(traces)
        if len(schema) > SCHEMA_MAX_CHARS:
            schema = schema[:SCHEMA_MAX_CHARS] + " ...(schema cut)"
        self._print(f"schema: {schema}")
        preview = _dump_preview(_clip(traces))
        if len(preview) > max_preview:
            preview = (
                preview[:max_preview] + f"\n...(preview cut at {max_preview} chars; slice `traces` for more)"
            )
        self._print(f"preview:\n{preview}")

    def register_helper(self, name: str, source: str) -> None:
        """Define a reusable function from source (checked like a cell) and keep it across cells."""
        if (
            type(name) is not str or not name.isidentifier() or name.startswith("_")
        ):  # exact str: no lying subclass
            raise GuardError("register_helper: name must be an identifier (a str) not starting with '_'")
        if name in self._scaffold:
            raise GuardError(f"register_helper: '{name}' is a preloaded name; choose another name")
        if not isinstance(source, str):
            raise TypeError("register_helper: source must be a str of Python code defining the function")
        source = str.__str__(source)
        self.define_helper(name, source)
        self._print(f"helper '{name}' registered")

    def define_helper(self, name: str, source: str) -> None:
        """Run a helper's source in the namespace and keep the function (also used by snapshots)."""
        filename = f"<helper {name}>"
        _remember_source(filename, source)
        code = prepare(source, filename, display_last=False)
        exec(code, self.ns)  # checked code, sandbox namespace
        fn = self.ns.get(name)
        if not callable(fn):
            raise GuardError(f"register_helper: the source must define a function named '{name}'")
        self._helpers[name] = (fn, source)

    def list_helpers(self) -> None:
        """Print the registered helpers with their `def` line and first docstring line."""
        if not self._helpers:
            self._print("no helpers registered; use register_helper(name, source)")
            return
        for name, (fn, source) in self._helpers.items():
            header = next(
                (ln.strip() for ln in source.splitlines() if ln.strip().startswith(f"def {name}")), name
            )
            doc = (fn.__doc__ or "").strip().splitlines()
            self._print(f"{header.rstrip(':')}" + (f"  # {doc[0]}" if doc else ""))

    def run_helper(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call a registered helper by name."""
        entry = self._helpers.get(name)
        if entry is None:
            raise NameError(f"no helper named {name!r}; registered: {', '.join(self._helpers) or 'none'}")
        return entry[0](*args, **kwargs)

    def archive(self, sha256_hex: str) -> list[Any]:
        """Load an archived (compacted) transcript: a list of message dicts, e.g. `history.extend(ARCHIVE(sha))`."""
        return read_archive(self.archive_root, sha256_hex)

    def final_answer(self, value: Any) -> None:
        """Record `value` (JSON-serialisable) as this cell's submitted answer."""
        try:
            text = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"FINAL_ANSWER needs a JSON-serialisable value (dict/list/str/number): {exc}"
            ) from None
        if len(text) > FINAL_ANSWER_MAX_BYTES:  # ASCII JSON: characters are bytes
            raise ValueError(
                f"FINAL_ANSWER: the value is {len(text):,} bytes as JSON, the limit is {FINAL_ANSWER_MAX_BYTES:,}; "
                "submit the reflection itself (findings and learnings), not the data it is based on"
            )
        self.submitted = json.loads(text)
        self.has_submission = True
        self._print("FINAL_ANSWER recorded")


def _free_depth() -> int:
    """How many more frames fit below the caller's frame before RecursionError."""
    depth = 0

    def down() -> None:
        nonlocal depth
        depth += 1
        down()

    try:
        down()
    except RecursionError:
        pass
    return depth


def _remember_source(filename: str, source: str) -> None:
    """Let tracebacks show the cell's lines (linecache is imported lazily, only on error paths)."""
    lc = sys.modules.get("linecache")
    if lc is None:
        _PENDING_SOURCES[filename] = source
        return
    lc.cache[filename] = (len(source), None, source.splitlines(True), filename)


_PENDING_SOURCES: dict[str, str] = {}


def format_exception(exc: BaseException) -> str:
    """A traceback restricted to model-written frames (cells, helpers), ending with the error."""
    import linecache
    import traceback

    for filename, source in _PENDING_SOURCES.items():
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    _PENDING_SOURCES.clear()
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(("<cell", "<helper"))
    ]
    head = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) if frames else ""
    return head + "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
