"""Whether an agent's final answer matches the ground truth (normalised, not exact).

The rules are kept as source text because they run in two places: inside the sandbox, as part of
the heuristic model's inspection cell (cells can only use what they define), and in the worker /
workflow, for the deterministic fallback reflection. One text, executed in both, so they agree.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["ANSWER_RULES_SOURCE", "compare_answers", "answers_match"]

ANSWER_RULES_SOURCE = r'''
NUM_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z ]{0,30}:\s+")

def norm(text):
    return re.sub(r"[\W_]+", "", str(text).lower())

def as_number(text):
    t = str(text).strip().replace("$", "").replace("%", "").strip()
    if re.fullmatch(r"-?\d[\d,]*(?:\.\d+)?", t):
        return float(t.replace(",", ""))
    return None

def compare(final, truth):
    """(matches, missing truth lines). None without a ground truth; a numeric truth is compared
    with the last number of the answer; otherwise every normalised truth line must be contained."""
    if truth is None or not str(truth).strip():
        return None, []
    if final is None or not str(final).strip():
        return False, [short(truth, 300)]
    number = as_number(truth)
    if number is not None:
        found = NUM_RE.findall(str(final))
        if found:
            last = float(found[-1].replace(",", ""))
            ok = abs(last - number) <= 1e-6 * max(1.0, abs(number))
            return ok, [] if ok else [str(truth).strip()]
    lines = [ln.strip() for ln in str(truth).splitlines() if ln.strip()]
    target = norm(final)
    missing = [ln for ln in lines if norm(LABEL_RE.sub("", ln)) and norm(LABEL_RE.sub("", ln)) not in target]
    if not any(norm(LABEL_RE.sub("", ln)) for ln in lines):
        return None, []
    if norm(truth) == target or not missing:
        return True, []
    return False, [short(ln, 300) for ln in missing[:5]]

'''

_rules: dict[str, Any] = {"re": re, "json": json}
exec(compile('\ndef short(value, limit=300):\n    if value is None:\n        return None\n    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)\n    text = " ".join(text.split())\n    return text if len(text) <= limit else text[: limit - 3] + "..."\n' + ANSWER_RULES_SOURCE, "reflector/answers.py:rules", "exec"), _rules)  # noqa: S102


def compare_answers(final: str | None, truth: str | None) -> tuple[bool | None, list[str]]:
    """(matches, missing truth lines); `None` when there is no ground truth to compare with.

    A numeric truth is compared with the last number of the answer; otherwise every normalised
    truth line must be contained in the normalised answer.
    """
    ok, missing = _rules["compare"](final, truth)
    return ok, list(missing)


def answers_match(final: str | None, truth: str | None) -> bool | None:
    return compare_answers(final, truth)[0]
