"""The heuristic's inspection cell: the file `reflector/heuristic/findings_cell.py`, read as text."""

from __future__ import annotations

import hashlib
from importlib import resources

from reflector.answers import ANSWER_RULES_SOURCE
from reflector.heuristic import FINDINGS_CELL

# The cell's text is the code argument of an `execute_code` call recorded in every heuristic
# workflow history: a different text is a different program for histories already written. Change
# this pin only together with the cell (and record new histories in tests/replay/histories).
FINDINGS_CELL_SHA256 = "f23836ace53ae212809dfa7998d058703cf655d1abe8bfc045dd992a9772f993"


def test_loaded_cell_compiles() -> None:
    compile(FINDINGS_CELL, "findings_cell", "exec")


def test_loaded_cell_is_the_recorded_program() -> None:
    assert hashlib.sha256(FINDINGS_CELL.encode()).hexdigest() == FINDINGS_CELL_SHA256


def test_stand_in_lines_are_replaced() -> None:
    text = resources.files("reflector.heuristic").joinpath("findings_cell.py").read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    assert first.startswith("from SANDBOX_VARIABLES import ")
    assert FINDINGS_CELL.startswith("\nimport json, re, collections, collections.abc\n")
    assert FINDINGS_CELL.count(ANSWER_RULES_SOURCE) == 1
    assert "SANDBOX_VARIABLES" not in FINDINGS_CELL and "from ANSWER_RULES_SOURCE" not in FINDINGS_CELL
    assert FINDINGS_CELL.endswith('print("RR_FINDINGS " + line[:MAX_LINE])\n')
    head, tail = FINDINGS_CELL.split(ANSWER_RULES_SOURCE)
    assert head[1:] in rest and tail in rest
