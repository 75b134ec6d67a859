"""Every error message the CLI and the Python API can print, read from the source (for docs/troubleshooting.md).

A message is the text of `_err(...)` in the CLI (reflector/), of a string that starts with `rr: error:`, or of a raised
exception whose text reaches the user (the classes in `USER_FACING`), in the modules a user's machine or a
worker's start runs. Its **skeleton** is the text with every interpolated value (`{...}` in an f-string, or a
name) written as `…`; the troubleshooting page quotes each skeleton verbatim, so a changed message fails the
test until the page says what to do about it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOLE = "…"

# Exceptions whose text `rr` prints as `rr: error: …` or the Python API raises to its caller. Not here: Python's
# protocol errors (KeyError, IndexError, AttributeError: a lookup's miss, not a message) and assertions.
USER_FACING = {
    "ValueError",
    "TypeError",
    "OSError",
    "TimeoutError",
    "RuntimeError",
    "SettingError",
    "ReflectError",
    "TraceError",
    "BundleError",
    "UnknownModelError",
    "DevServerError",
    "HomeServerError",
    "RegistrationError",
    "IsolationUnavailable",
}


# Not a user's: the test doubles, and what runs inside the sandbox host (the toolkit, the lazy trace
# sequences, the heuristic's cell), whose errors are cell output the model reads.
SANDBOX_SIDE = (
    "reflector/testing/",
    "reflector/analysis/toolkit/",
    "reflector/analysis/traces/lazy.py",
    "reflector/analysis/heuristic/findings_cell.py",
)


def source_files() -> list[Path]:
    """The modules whose messages reach a user: reflector/ (but `SANDBOX_SIDE`), worker.py, and the sandbox's
    OS layer (a worker that refuses to start says why)."""
    files = [
        p
        for p in (REPO / "reflector").rglob("*.py")
        if not p.relative_to(REPO).as_posix().startswith(SANDBOX_SIDE)
    ]
    os_layer = (
        "isolation.py",
        "confinement.py",
        "seccomp.py",
        "namespaces.py",
        "cgroups.py",
    )  # sandbox/isolation.py, split
    return sorted([*files, REPO / "worker.py", *(REPO / "sandbox" / name for name in os_layer)])


@dataclass(frozen=True)
class Message:
    where: str  # path:line
    skeleton: str


def skeleton(node: ast.expr) -> str | None:
    """The message's text with `…` for every value filled in at run time; None when it is not text here
    (a variable or `str(e)`: the message is made elsewhere and found there)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            parts.append(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else HOLE)
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = skeleton(node.left), skeleton(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else HOLE) + (right if right is not None else HOLE)
    return None


def _exc_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
    return None


def _messages(path: Path) -> Iterator[Message]:
    tree = ast.parse(path.read_text())
    rel = path.relative_to(REPO).as_posix()
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in parts:  # a piece of an f-string: its whole is read instead
            continue
        text: str | None = None
        if isinstance(node, ast.Raise) and node.exc is not None and _exc_name(node.exc) in USER_FACING:
            call = node.exc
            assert isinstance(call, ast.Call)
            if call.args:
                text = skeleton(call.args[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "_err"
            and node.args
            and rel.startswith("reflector/")
        ):  # the CLI's `_err` (sandbox/isolation.py has an errno formatter)
            text = skeleton(node.args[0])
        elif isinstance(node, (ast.Constant, ast.JoinedStr)):
            s = skeleton(node)
            if s is not None and s.startswith("rr: error: ") and len(s) > len("rr: error: ") + 1:
                text = s[len("rr: error: ") :]
        if text is not None and text.replace(HOLE, " ").strip(" :;"):
            yield Message(f"{rel}:{getattr(node, 'lineno', 0)}", normalise(text))


def normalise(text: str) -> str:
    return " ".join(text.split())


def all_messages() -> list[Message]:
    seen: dict[str, Message] = {}
    for path in source_files():
        for m in _messages(path):
            seen.setdefault(m.skeleton, m)
    return sorted(seen.values(), key=lambda m: m.where)
