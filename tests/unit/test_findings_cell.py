"""The heuristic's inspection cell: the file `reflector/analysis/heuristic/findings_cell.py`, read as text."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

from reflector.analysis.heuristic import FINDINGS_CELL
from reflector.analysis.toolkit import SANDBOX_HELPERS
from reflector.runtime.storage.payloads import DEFAULT_THRESHOLD_BYTES

# The cell's text is the code argument of an `execute_code` call recorded in every heuristic
# workflow history: a different text is a different program for histories already written. Change
# this pin only together with the cell (and record new histories in tests/replay/histories).
FINDINGS_CELL_SHA256 = "fb2538c0eb6097a08fa129f76de1aa7548346de50067f182b50e87a38d7426c2"


def test_loaded_cell_compiles() -> None:
    compile(FINDINGS_CELL, "findings_cell", "exec")


def test_loaded_cell_is_the_recorded_program() -> None:
    assert hashlib.sha256(FINDINGS_CELL.encode()).hexdigest() == FINDINGS_CELL_SHA256


def test_stand_in_line_is_replaced() -> None:
    text = (
        resources.files("reflector.analysis.heuristic")
        .joinpath("findings_cell.py")
        .read_text(encoding="utf-8")
    )
    first, _, rest = text.partition("\n")
    assert first.startswith("from SANDBOX_VARIABLES import ")
    code_lines = [ln for ln in rest.splitlines(keepends=True) if not ln.lstrip().startswith("#")]
    assert FINDINGS_CELL == "\n" + "".join(code_lines)  # the file's comment lines are for its readers only
    assert "SANDBOX_VARIABLES" not in FINDINGS_CELL
    assert FINDINGS_CELL.endswith('print("RR_FINDINGS " + line[:MAX_LINE])\n')


def test_the_cell_uses_only_names_the_sandbox_preloads() -> None:
    # every name the stand-in line imports is a sandbox variable or a toolkit helper
    text = (
        resources.files("reflector.analysis.heuristic")
        .joinpath("findings_cell.py")
        .read_text(encoding="utf-8")
    )
    names = text.partition(" import ")[2].partition("  #")[0].split(", ")
    assert set(names) <= {"task", "traces", *SANDBOX_HELPERS}


def test_the_cell_stays_inline_in_histories() -> None:
    # larger than the payload threshold, the call would be offloaded to the blob store at every reflection
    assert len(json.dumps({"code": FINDINGS_CELL})) < DEFAULT_THRESHOLD_BYTES - 1024
