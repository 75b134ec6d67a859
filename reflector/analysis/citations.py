"""Which cells a learning's evidence cites, and whether each citation holds.

Every cell output the model sees starts with a `[cell N]` line (`cell_header`), and the prompt asks it
to cite cells in each learning's `evidence` ("cell 7: \"3 failed calls\""). `check_citations` reads
those references and the quoted text around them, and checks each against the outputs the session
actually showed the model: the cell must exist, and a quote attributed to it must appear in its output
(verbatim up to whitespace and case, or as the JSON/repr-escaped form a cell prints when it prints a
dict or a list). Pure and deterministic: the workflow runs it on its own state when it assembles the
reflection, and `rr audit` runs it on the outputs it reads from a history.

Attribution: the evidence is split into clauses (at `;`, line breaks and sentence ends). A quote belongs
to the cells referenced in its clause, else in the nearest earlier clause that references any, else in
the next one that does. Of several candidate cells it is attributed to the first whose output holds it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from reflector.contract import CellCitation, ExtractedLearning

__all__ = ["cell_header", "header_cell", "check_citations", "cited_cells", "quote_printed"]

_REF = re.compile(r"\bcells?\s*#?\s*(\d+)((?:\s*(?:,|and|&|/)\s*#?\s*\d+)*)", re.IGNORECASE)
_HEADER = re.compile(r"\[cell (\d+)\]\n")
_MORE = re.compile(r"\d+")
_QUOTE = re.compile(r"\"([^\"\n]{1,2000})\"|\u201c([^\u201d\n]{1,2000})\u201d")
_CLAUSE = re.compile(r";|\n|(?<=[^\d\s])\.\s+")
_ELLIPSIS = ("...", "\u2026")
MAX_CITATIONS_PER_LEARNING = 20


def cell_header(seq: int) -> str:
    """The first line of every cell output the model sees: the id it cites the cell by."""
    return f"[cell {seq}]"


def header_cell(output: str) -> int | None:
    """The id on the `cell_header` line that starts `output` (None when it has none)."""
    m = _HEADER.match(output)
    return int(m.group(1)) if m else None


def cited_cells(evidence: str) -> list[int]:
    """The cell ids referenced in `evidence`, in order of first mention."""
    seen: list[int] = []
    for m in _REF.finditer(evidence):
        for n in [int(m.group(1)), *(int(x) for x in _MORE.findall(m.group(2) or ""))]:
            if n not in seen:
                seen.append(n)
    return seen


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def quote_printed(quote: str, output: str) -> bool:
    """Whether `quote` appears in `output`: verbatim up to whitespace and case, or JSON/repr-escaped;
    a quote shortened with a trailing ellipsis matches on what precedes it."""
    q = quote.strip()
    for tail in _ELLIPSIS:
        if q.endswith(tail):
            q = q[: -len(tail)].rstrip()
    if not q:
        return True
    out = _norm(output)
    forms = {q, json.dumps(q, ensure_ascii=False)[1:-1], json.dumps(q)[1:-1], repr(q)[1:-1]}
    return any(_norm(f) in out for f in forms if f.strip())


def _clauses(evidence: str) -> list[tuple[list[int], list[str]]]:
    out = []
    for clause in _CLAUSE.split(evidence):
        quotes = [(a or b) for a, b in _QUOTE.findall(clause)]
        out.append((cited_cells(clause), [q for q in quotes if q.strip()]))
    return out


def _attributed(evidence: str) -> list[tuple[list[int], str | None]]:
    """(candidate cells, quote or None) pairs: each quote with the cells it may come from, and each
    referenced cell with None (dropped later when a quote was attributed to it)."""
    pairs: list[tuple[list[int], str | None]] = []
    pending: list[str] = []  # quotes seen before any reference: they go to the next one
    scope: list[int] = []
    for refs, quotes in _clauses(evidence):
        if refs:
            scope = refs
            pairs += [([cell], None) for cell in refs]
            pairs += [(refs, q) for q in pending]
            pending = []
        if scope:
            pairs += [(scope, q) for q in quotes]
        else:
            pending += quotes
    return pairs


def check_citations(learnings: Sequence[ExtractedLearning], outputs: Mapping[int, str]) -> list[CellCitation]:
    """One `CellCitation` per (learning, cited cell, quote): whether the cell ran (`outputs` holds what
    each cell showed the model, by id) and whether the quote is in its output."""
    result: list[CellCitation] = []
    for i, learning in enumerate(learnings):
        own: list[CellCitation] = []
        for cands, quote in _attributed(learning.evidence):
            if quote is None:
                own.append(CellCitation(learning=i, cell=cands[0], exists=cands[0] in outputs))
                continue
            holder = next((c for c in cands if c in outputs and quote_printed(quote, outputs[c])), None)
            if holder is not None:
                own.append(CellCitation(learning=i, cell=holder, exists=True, quote=quote, printed=True))
            else:
                cell = next((c for c in cands if c in outputs), cands[0])
                own.append(
                    CellCitation(learning=i, cell=cell, exists=cell in outputs, quote=quote, printed=False)
                )
        quoted = {c.cell for c in own if c.quote}
        own = [c for c in own if c.quote or c.cell not in quoted]  # a cell with a quote needs no bare entry
        result += own[:MAX_CITATIONS_PER_LEARNING]
    return result
