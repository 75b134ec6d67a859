"""The citation check: which cells a learning's evidence cites and whether each citation holds."""

from __future__ import annotations

from reflector.analysis.citations import cell_header, check_citations, cited_cells, header_cell, quote_printed
from reflector.contract import ExtractedLearning

OUTPUTS = {
    1: "format: tau-bench, 12 steps",
    3: '[cell 3]\nfailing: {"tool": "book", "msg": "seat \\"12A\\" taken"}\nsteps 12',
    5: "[cell 5]\nanswer was 42",
}


def _check(evidence: str) -> list[tuple[int, bool, str, bool]]:
    learning = ExtractedLearning(learning="l", atomicity_score=0.5, evidence=evidence)
    return [(c.cell, c.exists, c.quote, c.printed) for c in check_citations([learning], OUTPUTS)]


def test_header_round_trips() -> None:
    assert header_cell(cell_header(17) + "\nout") == 17
    assert header_cell("no header") is None


def test_references_in_several_spellings() -> None:
    assert cited_cells("cell 3, cells 5 and 7; Cell #9 and cells 10/11") == [3, 5, 7, 9, 10, 11]
    assert cited_cells("steps 3 and 4") == []


def test_quotes_are_attributed_to_the_cells_of_their_clause() -> None:
    assert _check('cell 3: "steps 12"; cell 5 printed "answer was 42"') == [
        (3, True, "steps 12", True),
        (5, True, "answer was 42", True),
    ]
    # quote before its reference, and a second clause with its own cell
    assert _check('"steps 12" (cell 3); "answer was 43" (cell 5)') == [
        (3, True, "steps 12", True),
        (5, True, "answer was 43", False),
    ]


def test_a_quote_of_several_cells_goes_to_the_one_that_printed_it() -> None:
    assert _check('cells 3 and 5: "answer was 42"') == [(3, True, "", True), (5, True, "answer was 42", True)]


def test_missing_cell_and_unprinted_quote_are_unsupported() -> None:
    assert _check('cell 9: "x"') == [(9, False, "x", False)]
    learning = ExtractedLearning(learning="l", atomicity_score=0.5, evidence='cell 3: "nowhere"')
    (c,) = check_citations([learning], OUTPUTS)
    assert not c.supported


def test_uncited_evidence_yields_no_citation() -> None:
    assert _check('the agent said "x" twice') == []


def test_escaped_and_shortened_quotes_match() -> None:
    assert quote_printed('seat "12A" taken', OUTPUTS[3])  # printed JSON-escaped
    assert quote_printed("steps   12", OUTPUTS[3])  # whitespace
    assert quote_printed("answer wa...", OUTPUTS[5])  # shortened with an ellipsis
    assert quote_printed("it's", "{'k': \"it's\"}") and not quote_printed("its", "it is")
    assert not quote_printed("answer was 4200", OUTPUTS[5])


def test_rendered_reflection_shows_one_checked_entry_per_cited_cell() -> None:
    from reflector.client.render import render_reflection
    from reflector.contract import ReflectorOutput

    learnings = [
        ExtractedLearning(learning="a", atomicity_score=0.5, evidence='cell 3: "steps 12"; cell 3 "tool"'),
        ExtractedLearning(learning="b", atomicity_score=0.5, evidence='cell 5: "answer was 43"; cell 9'),
        ExtractedLearning(learning="c", atomicity_score=0.5, evidence="no citation"),
    ]
    out = ReflectorOutput(
        reasoning="r",
        error_identification="e",
        root_cause_analysis="c",
        correct_approach="a",
        key_insight="k",
        extracted_learnings=learnings,
        citations=check_citations(learnings, OUTPUTS),
    )
    text = render_reflection(out)
    assert "cells: cell 3 ok (2 quotes)" in text
    assert (
        'cells: cell 5 UNSUPPORTED (not printed: "answer was 43"), cell 9 UNSUPPORTED (no such cell)' in text
    )
    assert "cells: none cited" in text
